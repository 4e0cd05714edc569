"""`make demo`: the headline, offline: cost vs time to a target on embedded Fashion-MNIST.

  python -m experiments.demo --workdir=workdirs/demo [--grid=demo|smoke] [--seeds=0]

A reduced cost-vs-time sweep (grid `demo` of experiments/configs/fashion_mnist.py):
data-parallel at D = 8, the committed study's strongest baseline and the ensemble at N = 4,
each at the learning rate and schedule length the full grid's tuning chose for it, on one
seed. It ends with a few lines: each run's steps and modelled time to 85% (or by how many
images it missed) beside its committed counterpart's seeds 1-3, then the committed study's
verdict (one seed can miss, or win, by an image: the demo shows the spread, the study gives
the answer); the full tables go to table.md, the figures to
cost_vs_time_<preset>.png. Finished points are read back, not retrained; compiled programs
are kept in --compile_cache. `make sweep-fashion` runs the full grid (every choice tuned on
seed 0, seeds 1-3 reported); docs/methodology.md says what is measured and what modelled.
"""
from __future__ import annotations

import os
import statistics

from absl import flags

from ensemble_jax import report
from experiments import cli, docs_data, sweeps
from experiments.sweeps import cost_vs_time, study

CONFIG = os.path.join(os.path.dirname(__file__), "configs", "fashion_mnist.py")
# The committed full grid the demo's runs are read against, and whose verdict it prints
STUDY = os.path.join(os.path.dirname(__file__), "results", "fashion_mnist")

FLAGS = flags.FlagValues()
flags.DEFINE_string("workdir", "workdirs/demo", "Where the runs, table and figures go.",
                    flag_values=FLAGS)
flags.DEFINE_string("grid", "demo", "demo (the headline) or smoke (seconds).",
                    flag_values=FLAGS)
flags.DEFINE_string("seeds", "0", "Comma-separated seeds.", flag_values=FLAGS)
sweeps.define_flags(FLAGS)

named = docs_data.point_name  # a point as the docs name it


def _runs_line(rs: list[dict]) -> str:
  """Runs of one point: median [min, max] steps and compute to the target when every run
  reached it (not the modelled time: each host prices it with its own calibrated step);
  else how many missed, by how many images."""
  missed = [m for r in rs if (m := report.missed_by(r)) is not None or not r["reached"]]
  if missed:
    by = sorted(m for m in missed if m is not None)
    images = (f", by {by[0]}" + (f"-{by[-1]}" if by[-1] != by[0] else "")
              + (" image" if by[-1] == 1 else " images") if by else "")
    return (f"missed{images}" if len(rs) == 1
            else f"missed on {len(missed)}/{len(rs)} seeds{images}")
  steps = sorted(r["steps"] for r in rs)
  tflops = sorted(r["flops"] / 1e12 for r in rs)
  if len(rs) == 1:
    return f"{steps[0]} steps, {tflops[0]:.2f} TFLOPs"
  return (f"{statistics.median(steps):g} [{steps[0]}, {steps[-1]}] steps, "
          f"{statistics.median(tflops):.2f} [{tflops[0]:.2f}, {tflops[-1]:.2f}] TFLOPs")


def _against(run: dict, committed: list[dict]) -> str:
  """Where one demo run falls against its committed counterpart's seeds."""
  if not committed:
    return "no committed counterpart"
  if not run["reached"] or not all(r["reached"] for r in committed):
    return ("as every committed seed" if not any(r["reached"] for r in committed + [run])
            else "where the committed seeds differ")
  steps = [r["steps"] for r in committed]
  if run["steps"] < min(steps):
    return "faster than every committed seed"
  if run["steps"] > max(steps):
    return "slower than every committed seed"
  return "within the committed seeds' range"


def summary(workdir: str, study: str = STUDY) -> str:
  """The demo's last lines: each run here beside its committed counterpart in the study
  (`study`: the committed full grid, its reported seeds 1-3), then the study's verdict.
  The verdict is the committed study's (`report.verdict`), never this demo's few
  single-seed runs against a partial frontier: one seed can miss, or win, by an image."""
  mine = report.load_runs(workdir)
  every = report.load_runs(study)
  committed: dict[tuple, list] = {}
  for r in every:
    committed.setdefault((r["curve"], r["point"]), []).append(r)
  committed = {k: report.reported(rs) for k, rs in committed.items()}
  v = report.verdict(report.points(every))
  mine = sorted(mine, key=lambda r: report._in_order((r["curve"], r["point"])))
  names = [named(r["curve"], r["point"])
           + (" *" if f"{r['curve']} {r['point']}" == v["strongest"] else "") for r in mine]
  width = max([len("point"), *map(len, names)]) + 1
  lines = [f"{'point':<{width}} {'this run':<34} the committed study (seeds "
           f"{','.join(map(str, sorted({r['seed'] for rs in committed.values() for r in rs})))}"
           f")"]
  for name, r in zip(names, mine):
    theirs = committed.get((r["curve"], r["point"]), [])
    here = f"seed {r['seed']}: {_runs_line([r])}"
    there = (f"{_runs_line(theirs)}; {_against(r, theirs)}" if theirs
             else "no committed counterpart")
    lines.append(f"{name:<{width}} {here:<34} {there}")
  lines.append(f"* the committed study's strongest baseline: {named(*v['strongest'].split())}")
  where = os.path.relpath(study, os.getcwd()) if os.path.isabs(study) else study
  if v["closest"] is None:
    lines.append(f"Verdict (the committed study, {where}): no method point reached the "
                 "target within a baseline's budget.")
  else:
    ratio, curve, point, q, kind, vs, (lo, hi) = v["closest"]
    lines.append(f"Verdict (the committed study, {where}): "
                 + ("a method point beats" if v["beats"] else "no method point beats")
                 + f" the strongest baseline at its own budget on any preset; the closest, "
                 f"{named(curve, point)}, {ratio:.2f}x [{lo:.2f}, {hi:.2f} over the seeds] "
                 f"({kind} ratio on {docs_data.PRESET_NAMES[q]}, vs {named(*vs.split())}). "
                 "The runs "
                 "above are single seeds: they show the spread, not a new answer.")
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
