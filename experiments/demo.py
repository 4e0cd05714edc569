"""`make demo`: the headline, offline: cost vs time to a target on embedded Fashion-MNIST.

  python -m experiments.demo --workdir=workdirs/demo [--grid=demo|smoke] [--seeds=0]

A reduced cost-vs-time sweep (experiments/sweeps/cost_vs_time.py, grid `demo` of
experiments/configs/fashion_mnist.py: data-parallel at D = 1, 4, 8; the ensemble at
(N, L) = (4, 469), (8, 235); DiLoCo H = 50; one seed; learning rates as configured, not
tuned as the full grid tunes them): 9 min 15 s on 2 CPU cores before issue 13's longer
ensemble budgets and evaluations near the target (to be re-measured). It prints the
table, writes cost_vs_time_<preset>.png, and says what was measured and what modelled.
Finished points are read back, not retrained. `make sweep-fashion` runs the full grid
with 3 seeds.
"""
from __future__ import annotations

import argparse
import os

from experiments.sweeps import cost_vs_time

CONFIG = os.path.join(os.path.dirname(__file__), "configs", "fashion_mnist.py")

EXPLAINED = """
What this shows. Every point trained to 85% test accuracy (2,000 test images, evaluated
every 25 steps, closer near the target) or to its step budget, on this machine, at its
configured learning rate (the full grid tunes every point's).
  measured: steps to the target, accuracy, FLOPs per step (XLA cost analysis of the
            compiled step) and so compute to target; one device's step time (a separate
            short calibration run of one model at the per-device batch, before the grid).
  modelled: the time axis = steps to target x that device step, plus every collective
            of the programs each method compiles for its D devices (read off their HLO:
            the data-parallel step's gradient and BatchNorm all-reduces, DiLoCo's outer
            steps, the evaluations' reductions over workers), each an alpha-beta time on
            an interconnect preset (nvlink / ib_xdr800 / eth10g, ensemble_jax/costs.py).
            This host cannot run D devices at once: the cluster's time is modelled, not
            observed.
Ratios > 1 favour the method over data-parallel; 'none within budget' means no point of
the method was as cheap (or as fast) as any data-parallel point. One seed: see
experiments/results/fashion_mnist for the 3-seed grid.
"""


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="workdirs/demo")
  p.add_argument("--grid", default="demo", help="demo (the headline) or smoke (seconds)")
  p.add_argument("--seeds", default="0")
  args = p.parse_args(argv)
  counts = cost_vs_time.run(CONFIG, args.workdir, [int(s) for s in args.seeds.split(",")],
                            args.grid)
  print(EXPLAINED)
  trained = counts["tuning_runs"] + counts["trained"]
  print(f"{trained} runs trained, {counts['skipped']} read back; figures: "
        f"{args.workdir}/cost_vs_time_<preset>.png, table: {args.workdir}/table.md")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
