"""`make demo`: the headline, offline: cost vs time to a target on embedded Fashion-MNIST.

  python -m experiments.demo --workdir=workdirs/demo [--grid=demo|smoke] [--seeds=0]

A reduced cost-vs-time sweep (grid `demo` of experiments/configs/fashion_mnist.py):
data-parallel at D = 1 and 8 and the ensemble at N = 4, each at the learning rate and
schedule length the full grid's tuning chose for it, on one seed. It ends with a
few lines: each point's steps, compute and modelled time to 85%, and how the best method
point compares with the strongest baseline; the full tables go to table.md, the figures to
cost_vs_time_<preset>.png. Finished points are read back, not retrained; compiled programs
are kept in --compile_cache. `make sweep-fashion` runs the full grid (every choice tuned on
seed 0, seeds 1-3 reported); docs/methodology.md says what is measured and what modelled.
"""
from __future__ import annotations

import os

from absl import flags

from ensemble_jax import report
from experiments import cli, sweeps
from experiments.sweeps import cost_vs_time, study

CONFIG = os.path.join(os.path.dirname(__file__), "configs", "fashion_mnist.py")
PRESET = "ib_xdr800"  # the interconnect the summary's time axis models

FLAGS = flags.FlagValues()
flags.DEFINE_string("workdir", "workdirs/demo", "Where the runs, table and figures go.",
                    flag_values=FLAGS)
flags.DEFINE_string("grid", "demo", "demo (the headline) or smoke (seconds).",
                    flag_values=FLAGS)
flags.DEFINE_string("seeds", "0", "Comma-separated seeds.", flag_values=FLAGS)
sweeps.define_flags(FLAGS)


def summary(workdir: str, preset: str = PRESET) -> str:
  """The demo's last lines: each point to the target, then the best method point against
  the strongest baseline (ratios > 1: the method wins)."""
  pts = report.points(report.load_runs(workdir))
  baselines = report.baseline_curves(pts)
  lines = [f"{'point':<22} {'steps':>6} {'TFLOPs':>8} {'time (s)':>9}   to the target, "
           f"time modelled on {preset}"]
  for p in pts:
    reached = p["reached"] == p["seeds"]
    lines.append(f"{p['curve'] + ' ' + p['point']:<22} "
                 + (f"{p['steps']['median']:>6.0f} {p['flops']['median'] / 1e12:>8.2f} "
                    f"{p['time_s'][preset]['median']:>9.1f}" if reached else
                    f"{'missed the target within its budget':>25}"))
  best = None
  for curve in sorted({p["curve"] for p in pts} - set(baselines)):
    for row in report.matched(pts, curve, preset):
      if row["time"] is not None and (best is None or row["time"][0] > best[1]["time"][0]):
        best = (curve, row)
  if best is None:
    lines.append("No method point reached the target within a baseline's compute.")
  else:
    curve, row = best
    compute = f"{row['compute'][0]:.2f}x" if row["compute"] else "none (no baseline as fast)"
    lines.append(f"Best method point {curve} {row['point']}: time ratio {row['time'][0]:.2f}x "
                 f"at equal compute (vs {row['time'][1]}), compute ratio {compute} at equal "
                 "time.")
    lines.append("Above 1 the method wins: "
                 + ("it beats" if row["time"][0] > 1 else "it does not beat")
                 + " the strongest baseline here.")
  lines.append(f"Full tables: {workdir}/table.md; figures: {workdir}/cost_vs_time_<preset>.png")
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  sweeps.use_compile_cache(FLAGS.compile_cache)
  code, counts = study.guarded(FLAGS.workdir, lambda: cost_vs_time.run(
      CONFIG, FLAGS.workdir, [int(s) for s in FLAGS.seeds.split(",")], FLAGS.grid,
      write_report=False))
  if code:  # a workdir of another grid, Ctrl-C: said in one line
    return code
  report.write(FLAGS.workdir, FLAGS.workdir)
  trained = counts["tuning_runs"] + counts["trained"]
  print(f"\n{trained} runs trained, {counts['skipped']} read back (one seed, the full grid's "
        "tuned choices; measured: steps, FLOPs, one device's step; modelled: the time axis).")
  print(summary(FLAGS.workdir))
  return 0


if __name__ == "__main__":
  cli.run(main)
