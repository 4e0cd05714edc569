"""Balanced k-means with fewer host passes: what moving Lloyd's steps onto the device costs
the objective, side by side with today's schedule in one run.

  python -m experiments.bench.kmeans_schedules [--cases=fm8,fm64,pydocs8,pydocs64] \\
      [--balanced_iters=0,1,3] [--rounds=3] [--out=experiments/results/bench/kmeans_schedules.json]

The routed pools cluster with 20 Lloyd steps, each assignment `_balanced_assign`'s host
greedy under capacities (sizes within 1 of E/k), then a final balanced assignment. A
schedule `b` runs the first 20 - b steps unconstrained in one device program
(`clusters.kmeans(balanced_iters=b)`) and only the last b (and the final assignment) under
the capacities: 21 host passes become b + 1. Same features (the default pool build's:
standardised PCA projections of the pixels, or the windows' tf-idf), same seed and
k-means++ start. Reported per case and schedule: the k-means objective (squared distances
to the cluster means, summed) over today's, whether the sizes stay within 1, and the
median wall and CPU time of the clustering alone over the rounds (the load average beside:
a shared machine's timings).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
from absl import flags

from experiments import cli
from experiments.bench import pools as pool_bench
from ensemble_jax import data as data_lib
from ensemble_jax.distill import clusters

FLAGS = flags.FlagValues()
flags.DEFINE_string("cases", "fm8,fm64,pydocs8,pydocs64", "comma-separated fm<N> / pydocs<N>",
                    flag_values=FLAGS)
flags.DEFINE_string("balanced_iters", "0,1,3", "schedules: balanced Lloyd steps at the end",
                    flag_values=FLAGS)
flags.DEFINE_integer("rounds", 3, "timed rounds per schedule", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the rows as JSON here", flag_values=FLAGS)

ITERS = 20  # the pool builds' Lloyd steps (distill/pools.py)


def timed(x_ExD, k: int, seed: int, balanced_iters, rounds: int):
  """(assignment, median wall s, median CPU s) of `rounds` identical clusterings."""
  walls, cpus, out = [], [], None
  for _ in range(rounds):
    wall, cpu = time.perf_counter(), time.process_time()
    a_E, _ = clusters.kmeans(x_ExD, k, seed=seed, iters=ITERS, balanced=True,
                             balanced_iters=balanced_iters)
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
    assert out is None or np.array_equal(out, a_E), "kmeans is not deterministic"
    out = a_E
  return out, statistics.median(walls), statistics.median(cpus)


def bench(case: str, schedules: list[int], rounds: int) -> dict:
  config = pool_bench.case_config(case)
  x_ExD = np.asarray(pool_bench.features(config, data_lib.load(config)), np.float32)
  k = config.method.num_workers
  row = {"case": case, "points": len(x_ExD), "dim": x_ExD.shape[1], "k": k,
         "loadavg_1_5_15": {"before": list(os.getloadavg())}}
  base = None
  for b in [None, *schedules]:
    a_E, wall, cpu = timed(x_ExD, k, config.seed, b, rounds)
    sizes = np.bincount(a_E, minlength=k)
    value = pool_bench.objective(x_ExD, [np.flatnonzero(a_E == i) for i in range(k)])
    base = value if b is None else base
    row["today" if b is None else f"balanced_last_{b}"] = {
        "host_passes": ITERS + 1 if b is None else b + 1, "objective": value,
        "objective_ratio": value / base, "sizes_within_one": int(sizes.max() - sizes.min()) <= 1,
        "median_wall_s": wall, "median_cpu_s": cpu}
  row["loadavg_1_5_15"]["after"] = list(os.getloadavg())
  return row


def main(argv):
  cli.parse(FLAGS, argv, __doc__)
  schedules = [int(b) for b in FLAGS.balanced_iters.split(",") if b]
  rows = []
  for case in FLAGS.cases.split(","):
    row = bench(case, schedules, FLAGS.rounds)
    rows.append(row)
    print(f"{case:>9} (E={row['points']}, k={row['k']}, load "
          f"{row['loadavg_1_5_15']['before'][0]:.1f}): " + " | ".join(
              f"{name} {r['host_passes']} host passes {r['median_wall_s']:.2f} s wall, "
              f"objective x{r['objective_ratio']:.4f}"
              for name, r in row.items() if isinstance(r, dict) and "objective" in r),
          flush=True)
  if FLAGS.out:
    cli.write_json(FLAGS.out, {"rows": rows, "iters": ITERS, "rounds": FLAGS.rounds,
                               "cpu_count": os.cpu_count()})


if __name__ == "__main__":
  cli.run(main)
