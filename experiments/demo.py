"""`make demo`: the headline comparison on embedded Fashion-MNIST, offline, one table.

  python -m experiments.demo --workdir=workdirs/demo [--variant=smoke]

Runs each method's config through `train_and_evaluate` (a finished run is read back
from its results.json instead of retrained) and prints accuracy, steps, FLOPs and time.
"""
from __future__ import annotations

import json
import os

from absl import app, flags

from ensemble_jax import train
from experiments.configs import fashion_mnist

_WORKDIR = flags.DEFINE_string("workdir", "workdirs/demo", "One sub-directory per run.")
_VARIANT = flags.DEFINE_string("variant", "", "Config variant: '' (full) or 'smoke'.")

RUNS = {"data_parallel": "", "ensemble": "ensemble"}  # run name -> config variant


def run_all(workdir: str, variant: str) -> dict[str, dict]:
  results = {}
  for name, arg in RUNS.items():
    config_arg = ",".join(a for a in (arg, variant) if a)
    run_dir = os.path.join(workdir, name if not variant else f"{name}_{variant}")
    path = os.path.join(run_dir, train.RESULTS_FILE)
    if os.path.exists(path):
      with open(path) as f:
        results[name] = json.load(f)
    else:
      results[name] = train.train_and_evaluate(fashion_mnist.get_config(config_arg), run_dir)
  return results


def table(results: dict[str, dict]) -> str:
  header = (f"{'run':<15}{'accuracy':>9}{'nll':>7}{'ece':>7}{'models':>7}{'steps/model':>12}"
            f"{'TFLOPs':>8}{'train s':>9}{'wall s':>8}{'step ms':>9}  worker acc mean [min, max]")
  lines = [header, "-" * len(header)]
  for name, r in results.items():
    f = r["final"]
    total_tflops = (r["flops_per_step"] or float("nan")) * r["steps"] / 1e12
    workers = (f"{f['worker/accuracy_mean']:.4f} [{f['worker/accuracy_min']:.4f}, "
               f"{f['worker/accuracy_max']:.4f}]" if "worker/accuracy_mean" in f else "-")
    lines.append(f"{name:<15}{f['accuracy']:>9.4f}{f['nll']:>7.3f}{f['ece']:>7.3f}"
                 f"{r.get('num_workers', 1):>7}{r['steps']:>12}{total_tflops:>8.2f}"
                 f"{r['train_time_s']:>9.1f}{r['wall_time_s']:>8.1f}{1e3 * r['step_time_s']:>9.1f}  "
                 f"{workers}")
  for name, r in results.items():
    t = r["target"]
    lines.append(f"{name}: target {t['metric']} {t['value']} " + (
        f"reached at step {t['reached_step']} after {t['reached_time_s']:.0f} s of training"
        if t["reached"] else "not reached"))
  return "\n".join(lines)


def main(argv):
  del argv
  results = run_all(_WORKDIR.value, _VARIANT.value)
  print("\nFashion-MNIST test set (10k). Measured on this machine: train s excludes evals and "
        "compilation; step ms is the median step; TFLOPs = XLA cost analysis of the compiled "
        "step x steps. The ensemble's workers share this machine's devices, so its train s "
        "is the serial sum of all workers' steps, not its critical path on N devices.\n")
  print(table(results))


if __name__ == "__main__":
  app.run(main)
