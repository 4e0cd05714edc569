"""Cost vs time to a target: DP over data-parallel width, the ensemble over (N, L), DiLoCo over H.

  python -m experiments.sweeps.cost_vs_time --config=experiments/configs/fashion_mnist.py \
      --workdir=experiments/results/fashion_mnist [--seeds=0,1,2] [--grid=full|demo|smoke]

The workload config file owns its grid: `sweep_grid(name)` returns
{curve: {point: (config variant, {dotted key: value})}}, curves being data_parallel, the
survey's strong baselines (a shorter full schedule, a smaller model), ensemble and diloco.
Every point runs `train_and_evaluate` with `train.stop_at_target=True` (the step budget
is the config's duration) in its own directory `<method>/<point>/seed<k>`; a point whose
results.json exists is skipped, so an interrupted sweep resumes where it stopped (and a
half-finished point resumes from its checkpoint). DP at D devices and per-device batch b
is trained as one model at global batch D*b (the same math), with the config's learning
rate scaling rule. Afterwards `ensemble_jax.report` writes table.md and cost_vs_time.png.
"""
from __future__ import annotations

import argparse
import importlib.util
import os

from ensemble_jax import report, train

def _load_config_module(path: str):
  spec = importlib.util.spec_from_file_location("sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _override(config, dotted: str, value):
  *parents, leaf = dotted.split(".")
  node = config
  for p in parents:
    node = node[p]
  node[leaf] = value


def run(config_path: str, workdir: str, seeds: list[int], grid: str) -> dict[str, int]:
  """Runs every (curve, point, seed) not finished yet; returns counts trained/skipped."""
  module = _load_config_module(config_path)
  if not hasattr(module, "sweep_grid"):
    raise SystemExit(f"error: {config_path} defines no sweep_grid(name); see "
                     "experiments/configs/fashion_mnist.py for one")
  curves = module.sweep_grid(grid)
  counts = {"trained": 0, "skipped": 0}
  # Seeds outermost: an interrupted sweep has whole seeds of every point, not some points.
  for seed in seeds:
    for curve, points in curves.items():
      for point, (variant, overrides) in points.items():
        run_dir = os.path.join(workdir, curve, point, f"seed{seed}")
        if os.path.exists(os.path.join(run_dir, train.RESULTS_FILE)):
          counts["skipped"] += 1
          continue
        config = module.get_config(variant)
        config.seed = seed
        config.train.stop_at_target = True
        for key, value in overrides.items():
          _override(config, key, value)
        train.train_and_evaluate(config, run_dir)
        counts["trained"] += 1
  print(report.write(workdir, workdir))
  return counts


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", required=True, help="a workload config file")
  p.add_argument("--workdir", required=True)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--grid", default="full", help="a grid the config's sweep_grid() knows")
  args = p.parse_args(argv)
  counts = run(args.config, args.workdir, [int(s) for s in args.seeds.split(",")], args.grid)
  print(f"sweep: {counts['trained']} runs trained, {counts['skipped']} already finished")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
