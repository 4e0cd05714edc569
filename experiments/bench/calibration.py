"""The committed device steps, timed again on this machine: how much the time axis moves
with the host that calibrates it.

  python -m experiments.bench.calibration [--workload=fashion_mnist]
      [--points=ensemble/N8_L235,dp_small_model/D8] [--out=experiments/results/bench/calibration.json]

Each point's device program (`cost_vs_time.device_config`: one model at the per-device
batch on one device) is calibrated afresh in a temporary directory, as the sweeps
calibrate, and set beside the step its committed seed runs were priced at. Every point of a
study shares its calibration, so its ratios hold whichever host timed it; what the host
moves is the balance between the devices' steps and the interconnects' fixed costs (a
faster step makes every collective weigh more). The load average is recorded beside each
case: run it on a quiet machine.
"""
from __future__ import annotations

import os
import subprocess
import tempfile

import jax
from absl import flags

from experiments import cli, sweeps

FLAGS = flags.FlagValues()
flags.DEFINE_string("workload", "fashion_mnist", "the grid's config (experiments/configs/)",
                    flag_values=FLAGS)
flags.DEFINE_list("points", ["ensemble/N8_L235", "dp_small_model/D8"],
                  "curve/point of the full grid, one per distinct program", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the cases as JSON here", flag_values=FLAGS)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def committed_step(workload: str, curve: str, point: str) -> float:
  """The device step the point's committed seed runs were priced at (one for all)."""
  from experiments.sweeps import cost_vs_time

  config = sweeps.load_config_module(
      os.path.join(REPO, "experiments", "configs", f"{workload}.py")).get_config("sweep")
  config.cost.price_like = f"{curve}/{point}"
  return cost_vs_time.device_step_time(
      config, "/nonexistent", os.path.join(REPO, "experiments", "results", workload))


def measure(workload: str, curve: str, point: str) -> dict:
  from experiments.sweeps import cost_vs_time

  module = sweeps.load_config_module(
      os.path.join(REPO, "experiments", "configs", f"{workload}.py"))
  variant, overrides = module.sweep_grid("full")[curve][point]
  with tempfile.TemporaryDirectory() as tmp:
    config = cost_vs_time._point_config(module, variant, overrides, 0, tmp)
    step = cost_vs_time.calibrate(config, os.path.join(tmp, "calibration"))
  committed = committed_step(workload, curve, point)
  return {"workload": workload, "point": f"{curve}/{point}", "device_step_s": step,
          "committed_device_step_s": committed, "committed_over_now": committed / step,
          "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count(),
          "jax": jax.__version__,
          "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                   capture_output=True, text=True).stdout.strip()}


def main(argv) -> int:
  cli.parse(FLAGS, argv, __doc__)
  cases = []
  for name in FLAGS.points:
    curve, point = name.split("/")
    case = measure(FLAGS.workload, curve, point)
    print(f"{FLAGS.workload} {name}: device step {case['device_step_s']:.4f} s here, "
          f"{case['committed_device_step_s']:.4f} s committed "
          f"({case['committed_over_now']:.2f}x); load {case['load_average']:.1f}", flush=True)
    cases.append(case)
  if FLAGS.out:
    cli.write_json(FLAGS.out, cases)
  return 0


if __name__ == "__main__":
  cli.run(main)
