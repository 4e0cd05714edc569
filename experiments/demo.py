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

RUNS = {"data_parallel": ""}  # run name -> config argument (plus the variant)


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
  header = (f"{'run':<16}{'accuracy':>9}{'nll':>8}{'steps':>7}{'ex/step':>8}{'TFLOPs':>9}"
            f"{'train s':>9}{'wall s':>8}{'step ms':>9}  target")
  lines = [header, "-" * len(header)]
  for name, r in results.items():
    total_tflops = (r["flops_per_step"] or float("nan")) * r["steps"] / 1e12
    t = r["target"]
    reached = (f"{t['metric']}>={t['value']} at step {t['reached_step']}, "
               f"{t['reached_time_s']:.0f} s" if t["reached"] else "not reached")
    lines.append(f"{name:<16}{r['final']['accuracy']:>9.4f}{r['final']['nll']:>8.3f}"
                 f"{r['steps']:>7}{r['examples_per_step']:>8}{total_tflops:>9.2f}"
                 f"{r['train_time_s']:>9.1f}{r['wall_time_s']:>8.1f}"
                 f"{1e3 * r['step_time_s']:>9.1f}  {reached}")
  return "\n".join(lines)


def main(argv):
  del argv
  results = run_all(_WORKDIR.value, _VARIANT.value)
  print("\nFashion-MNIST test set; times measured on this machine (train s excludes evals "
        "and compilation); FLOPs from XLA's cost analysis of the compiled step.\n")
  print(table(results))


if __name__ == "__main__":
  app.run(main)
