"""Cost vs time to a target: DP over data-parallel width, the ensemble over (N, L), DiLoCo over H.

  python -m experiments.sweeps.cost_vs_time --config=experiments/configs/fashion_mnist.py \
      --workdir=experiments/results/fashion_mnist [--seeds=0,1,2] [--grid=full|smoke]

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

# point name -> (config variant, overrides); per-device batch of the DP points: 128 / 32.
GRIDS = {
    "full": {
        "data_parallel": {f"D{d}": ("", {"train.batch_size": 128 * d}) for d in (1, 2, 4)},
        "ensemble": {f"N{n}_L{l}": ("ensemble", {"method.num_workers": n,
                                                 "method.steps_per_worker": l})
                     for n, l in ((4, 234), (8, 117), (8, 234))},
        "diloco": {f"H{h}": ("diloco", {"method.sync_every": h}) for h in (10, 25, 50)},
    },
    "smoke": {
        "data_parallel": {f"D{d}": ("smoke", {"train.batch_size": 32 * d}) for d in (1, 2)},
        "ensemble": {"N8_L4": ("ensemble,smoke", {})},
    },
}


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
  """Runs every (method, point, seed) not finished yet; returns counts trained/skipped."""
  module = _load_config_module(config_path)
  counts = {"trained": 0, "skipped": 0}
  for method, points in GRIDS[grid].items():
    for point, (variant, overrides) in points.items():
      for seed in seeds:
        run_dir = os.path.join(workdir, method, point, f"seed{seed}")
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
  report.main([workdir])
  return counts


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", required=True, help="a workload config file")
  p.add_argument("--workdir", required=True)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--grid", default="full", choices=sorted(GRIDS))
  args = p.parse_args(argv)
  counts = run(args.config, args.workdir, [int(s) for s in args.seeds.split(",")], args.grid)
  print(f"sweep: {counts['trained']} runs trained, {counts['skipped']} already finished")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
