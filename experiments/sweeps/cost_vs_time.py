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
rate scaling rule. Afterwards `ensemble_jax.report` writes table.md and the figures.

Calibration first: the time axis needs one device's step time, and every point of a curve
runs the same per-device program (one model at the per-device batch: DP at D devices and
per-device batch b, an ensemble worker at batch b). Before the grid, each distinct
per-device program is timed once, alone, as a short data-parallel run
(`<workdir>/calibration/<key>/results.json`), and that median step is passed to every
point as `cost.device_step_time_s`. The points' own host step times are still recorded
(measured) but do not move the modelled time when something else shares the host.
"""
from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import importlib.util
import json
import os
import shutil

from ensemble_jax import config_lib, costs, report
from ensemble_jax import run as run_lib

def _load_config_module(path: str):
  spec = importlib.util.spec_from_file_location("sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


CALIBRATION_STEPS = 60


def _point_config(module, variant: str, overrides: dict, seed: int):
  config = module.get_config(variant)
  config.seed = seed
  config.train.stop_at_target = True
  for key, value in overrides.items():
    config_lib.set_dotted(config, key, value)
  return config


def device_config(config):
  """One device's program of a point: one model at the per-device (per-worker) batch."""
  c = copy.deepcopy(config)
  if c.method.name == "data_parallel":
    c.train.batch_size //= max(c.cost.devices, 1)
  c.method.name, c.mesh, c.cost.devices = "data_parallel", [("data", -1)], 1
  c.method.aggregation, c.distill.method = "logits", "none"  # the step, not the pool
  c.train.num_steps, c.train.num_epochs = CALIBRATION_STEPS, 0.0
  c.train.stop_at_target, c.train.timing_warmup_steps = False, 20
  c.eval.every_steps, c.eval.num_examples = CALIBRATION_STEPS, c.eval.batch_size
  c.checkpoint.every_steps, c.seed = 0, 0
  return c


def calibrate(config, workdir: str) -> float:
  """The median step of `device_config(config)`, timed once per distinct program."""
  c = device_config(config)
  key = hashlib.sha256(json.dumps({k: c[k].to_dict() for k in ("model", "data", "optim")}
                                  | {"batch": c.train.batch_size, "task": c.task},
                                  sort_keys=True, default=str).encode()).hexdigest()[:12]
  run_dir = os.path.join(workdir, "calibration", key)
  path = os.path.join(run_dir, run_lib.RESULTS_FILE)
  if not os.path.exists(path):
    run_lib.train_and_evaluate(c, run_dir)
  with open(path) as f:
    return json.load(f)["step_time_s"]


def run(config_path: str, workdir: str, seeds: list[int], grid: str,
        curves: list[str] | None = None) -> dict[str, int]:
  """Runs every (curve, point, seed) not finished yet (of `curves`, default all); returns
  counts trained/skipped. The report covers every run under the workdir."""
  module = _load_config_module(config_path)
  if not hasattr(module, "sweep_grid"):
    raise SystemExit(f"error: {config_path} defines no sweep_grid(name); see "
                     "experiments/configs/fashion_mnist.py for one")
  grid_curves = module.sweep_grid(grid)
  unknown = set(curves or ()) - set(grid_curves)
  if unknown:
    raise SystemExit(f"error: --curves {sorted(unknown)} not in the grid {sorted(grid_curves)}")
  curves = {c: p for c, p in grid_curves.items() if not curves or c in curves}
  # All calibrations before any point: they time a quiet host, not one shared with a sweep.
  device_step = {(curve, point): calibrate(_point_config(module, variant, overrides, 0),
                                           workdir)
                 for curve, points in curves.items()
                 for point, (variant, overrides) in points.items()}
  counts = {"trained": 0, "skipped": 0}
  # Seeds outermost: an interrupted sweep has whole seeds of every point, not some points.
  for seed in seeds:
    for curve, points in curves.items():
      for point, (variant, overrides) in points.items():
        run_dir = os.path.join(workdir, curve, point, f"seed{seed}")
        if os.path.exists(os.path.join(run_dir, run_lib.RESULTS_FILE)):
          counts["skipped"] += 1
          continue
        config = _point_config(module, variant, overrides, seed)
        config.cost.device_step_time_s = device_step[curve, point]
        run_lib.train_and_evaluate(config, run_dir)
        counts["trained"] += 1
  print(report.write(workdir, workdir))
  return counts


def recost(config_path: str, workdir: str, grid: str, recalibrate: bool = False) -> int:
  """Recomputes every finished run's `cost` block with its point's calibrated device step
  (after `recalibrate` re-times them all, e.g. on a quiet host); returns runs updated.

  The cost block is derived from results.json and the calibration, so this changes no
  measurement: only which device step time the modelled time axis uses.
  """
  module = _load_config_module(config_path)
  if recalibrate:
    shutil.rmtree(os.path.join(workdir, "calibration"), ignore_errors=True)
  updated = 0
  for curve, points in module.sweep_grid(grid).items():
    for point, (variant, overrides) in points.items():
      step_time = calibrate(_point_config(module, variant, overrides, 0), workdir)
      for path in glob.glob(os.path.join(workdir, curve, point, "seed*", run_lib.RESULTS_FILE)):
        with open(path) as f:
          results = json.load(f)
        cost = results["config"]["cost"]
        cost["device_step_time_s"] = step_time
        # The collectives the run recorded (older results: the legacy model, labelled).
        results["cost"] = costs.summary(results, None, cost["devices"],
                                        cost.get("overlap", 0.0), simulated=True,
                                        device_step_time_s=step_time)
        with open(path, "w") as f:
          json.dump(results, f, indent=2)
        updated += 1
  print(report.write(workdir, workdir))
  return updated


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", required=True, help="a workload config file")
  p.add_argument("--workdir", required=True)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--grid", default="full", help="a grid the config's sweep_grid() knows")
  p.add_argument("--curves", default="", help="comma-separated subset of the grid's curves")
  p.add_argument("--recost", action="store_true",
                 help="train nothing: recompute finished runs' cost blocks from calibration")
  p.add_argument("--recalibrate", action="store_true",
                 help="with --recost: re-time every calibration first")
  args = p.parse_args(argv)
  if args.recost:
    n = recost(args.config, args.workdir, args.grid, args.recalibrate)
    print(f"sweep: {n} runs recosted")
    return 0
  counts = run(args.config, args.workdir, [int(s) for s in args.seeds.split(",")], args.grid,
               [c for c in args.curves.split(",") if c] or None)
  print(f"sweep: {counts['trained']} runs trained, {counts['skipped']} already finished")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
