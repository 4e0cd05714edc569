"""Routed pools' build time, old and new side by side in one run.

  python -m experiments.bench.pools [--cases=fm8,fm32,fm64,pydocs64] [--rounds=3] \\
      [--out=experiments/results/bench/pools.json]

Cases are the many-worker grids' routed points: the Fashion-MNIST PCA-routed pool
(`fm<N>`, experiments/configs/fashion_mnist.py) and the Python-docs tf-idf pool
(`pydocs<N>`, pydocs_gpt2.py), built by `pools.build` as a run builds them (no cache).
"old" is the previous build: the pair-at-a-time balanced greedy
(`clusters._balanced_assign_pairwise`) at every Lloyd step, and every eval example routed;
"new" is the library's build: the same greedy in numpy rounds (`_balanced_assign`), and
only the examples the evaluation scores routed. Each round builds old then new, or new
then old on odd rounds, so a load that comes and goes on a shared machine falls on both.
Both wall clock and the process's CPU time (time.process_time) are reported: the median
over rounds. Each round also checks the two builds give the same pools, bit for bit, and
the same routing weights on the scored eval examples.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import tempfile
import time

import numpy as np
from absl import flags

from experiments import cli
from experiments.configs import fashion_mnist, pydocs_gpt2
from ensemble_jax import config_lib
from ensemble_jax import data as data_lib
from ensemble_jax.distill import clusters, pools

FLAGS = flags.FlagValues()
flags.DEFINE_string("cases", "fm8,fm32,fm64,pydocs64", "comma-separated fm<N> / pydocs<N>",
                    flag_values=FLAGS)
flags.DEFINE_integer("rounds", 3, "old/new pairs per case", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the rows as JSON here", flag_values=FLAGS)


def case_config(case: str):
  """The many-worker grid's routed point at N = int(case's digits), seed 0."""
  name, n = re.fullmatch(r"([a-z]+)(\d+)", case).groups()
  module, curve = {"fm": (fashion_mnist, "ensemble_pca_routed"),
                   "pydocs": (pydocs_gpt2, "ensemble_tfidf_routed")}[name]
  points = module.sweep_grid("many_workers")[curve]
  variant, overrides = next(v for k, v in points.items() if k.startswith(f"N{n}_"))
  config = module.get_config(variant)
  for key, value in overrides.items():
    config_lib.set_dotted(config, key, value)
  return config


@contextlib.contextmanager
def old_build():
  """The build as it was: the pair-at-a-time greedy, and the whole eval split routed."""
  assign, scored = clusters._balanced_assign, pools._scored_eval
  clusters._balanced_assign = clusters._balanced_assign_pairwise
  pools._scored_eval = lambda config, data: data.eval
  try:
    yield
  finally:
    clusters._balanced_assign, pools._scored_eval = assign, scored


def timed_build(config, data, n: int):
  with tempfile.TemporaryDirectory() as proxy_dir:
    wall, cpu = time.perf_counter(), time.process_time()
    built = pools.build(config, data, n, os.path.join(proxy_dir, "proxy"))
    return built, time.perf_counter() - wall, time.process_time() - cpu


def bench(case: str, rounds: int) -> dict:
  config = case_config(case)
  data = data_lib.load(config)
  n = config.method.num_workers
  scored = len(pools._scored_eval(config, data))
  times = {"old": {"wall_s": [], "cpu_s": []}, "new": {"wall_s": [], "cpu_s": []}}
  timed_build(config, data, n)  # compiles the jitted pieces for both
  for r in range(rounds):
    out = {}
    for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
      with old_build() if which == "old" else contextlib.nullcontext():
        out[which], wall, cpu = timed_build(config, data, n)
      times[which]["wall_s"].append(wall)
      times[which]["cpu_s"].append(cpu)
    (old_pools, _, old_route, _), (new_pools, _, new_route, _) = out["old"], out["new"]
    same_pools = all(np.array_equal(a, b) for a, b in zip(old_pools, new_pools))
    same_route = old_route.shape[1:] == new_route.shape[1:] and np.array_equal(
        old_route[:scored], new_route)
    if not (same_pools and same_route):
      raise SystemExit(f"{case}: the builds differ (pools equal: {same_pools}, routing "
                       f"equal: {same_route})")
  row = {"case": case, "workers": n, "train_examples": len(data.train),
         "eval_routed": {"old": len(data.eval), "new": scored},
         "pools_identical": True, "routing_identical": True, "rounds": rounds}
  for which, t in times.items():
    row[which] = {**t, "median_wall_s": statistics.median(t["wall_s"]),
                  "median_cpu_s": statistics.median(t["cpu_s"])}
  row["speedup_wall"] = row["old"]["median_wall_s"] / row["new"]["median_wall_s"]
  return row


def main(argv):
  cli.parse(FLAGS, argv, __doc__)
  rows = []
  for case in FLAGS.cases.split(","):
    row = bench(case, FLAGS.rounds)
    rows.append(row)
    print(f"{case:>9}: old {row['old']['median_wall_s']:6.2f} s wall "
          f"{row['old']['median_cpu_s']:6.2f} s cpu | new {row['new']['median_wall_s']:5.2f} s "
          f"wall {row['new']['median_cpu_s']:5.2f} s cpu | x{row['speedup_wall']:.1f}; "
          "pools and routing identical", flush=True)
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump({"rows": rows, "cpu_count": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
