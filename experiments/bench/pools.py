"""Routed pools' build time: a baseline revision's build, the current one and its opt-in
variants side by side in one run.

  python -m experiments.bench.pools [--cases=fm8,fm32,fm64,pydocs8,pydocs64] [--rounds=3] \\
      [--baseline_rev=main] [--out=experiments/results/bench/pools.json]

Cases are the many-worker grids' routed points: the Fashion-MNIST PCA-routed pool
(`fm<N>`, experiments/configs/fashion_mnist.py) and the Python-docs tf-idf pool
(`pydocs<N>`, pydocs_gpt2.py), built by `pools.build` as a run builds them (no cache).
"old" is the build as of `--baseline_rev`: its `clusters.py` and `pools.py` read with
`git show` and run on the same data. "new" is the library's default build. The opt-in
variants are built too: for the PCA pools "float32_covariance"
(`distill.pca_covariance='float32'`), "sinkhorn_balance" (`distill.kmeans_balance=
'sinkhorn'`: balanced Lloyd on the device) and both; for the docs pools "sinkhorn_balance".
Each round builds them all, its order rotated round by round, so a load that comes and
goes on a shared machine falls on each alike. Wall clock and the process's CPU time (all
threads, time.process_time) are reported: the median over rounds, with the load average
before and after the case.

Where the default build's time goes: one more build, profiled (cProfile), split into its
phases (`PHASES`: the features' fit and the k-means, and within the pixel features the
covariance pass, the eigendecomposition and the projections), beside the floor of the
covariance pass: its FLOPs (P^2 E, the symmetric product's half) at this machine's
float64 and float32 rate for that product (`syrk_rate`, measured on one chunk's shape).

Every round checks that old and new give the same pools, bit for bit, and the same
routing weights; `digest` hashes the new build's, to compare runs in other environments
(OPENBLAS_NUM_THREADS, recorded). A variant's pools are scored by the k-means objective
(the sum of squared distances to their cluster means) in the default build's features,
the standardised PCA projections, against the default's pools: `objective_ratio` > 1 is
worse.
"""
from __future__ import annotations

import copy
import cProfile
import hashlib
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
from absl import flags

from experiments import cli
from experiments.configs import fashion_mnist, pydocs_gpt2
from ensemble_jax import config_lib
from ensemble_jax import data as data_lib
from ensemble_jax import stored
from ensemble_jax.distill import pools

FLAGS = flags.FlagValues()
flags.DEFINE_string("cases", "fm8,fm32,fm64,pydocs8,pydocs64",
                    "comma-separated fm<N> / pydocs<N>", flag_values=FLAGS)
flags.DEFINE_integer("rounds", 3, "rounds of every build per case", flag_values=FLAGS)
flags.DEFINE_string("baseline_rev", "main", "the git revision whose build is 'old'",
                    flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the rows as JSON here", flag_values=FLAGS)

# The opt-in variants, per kind of case: config overrides.
VARIANTS = {"fm": {"float32_covariance": {"distill.pca_covariance": "float32"},
                   "sinkhorn_balance": {"distill.kmeans_balance": "sinkhorn"},
                   "float32_sinkhorn": {"distill.pca_covariance": "float32",
                                        "distill.kmeans_balance": "sinkhorn"}},
            "pydocs": {"sinkhorn_balance": {"distill.kmeans_balance": "sinkhorn"}}}


def case_config(case: str, **overrides):
  """The many-worker grid's routed point at N = int(case's digits), seed 0."""
  name, n = re.fullmatch(r"([a-z]+)(\d+)", case).groups()
  module, curve = {"fm": (fashion_mnist, "ensemble_pca_routed"),
                   "pydocs": (pydocs_gpt2, "ensemble_tfidf_routed")}[name]
  points = module.sweep_grid("many_workers")[curve]
  variant, point = next(v for k, v in points.items() if k.startswith(f"N{n}_"))
  config = module.get_config(variant)
  for key, value in {**point, **overrides}.items():
    config_lib.set_dotted(config, key, value)
  return config


def _module_at(rev: str, path: str, imports: dict | None = None, **globals_):
  """The module at `path` as of git revision `rev`, its named globals replaced. `imports`:
  modules its import statements read instead of this code's (by dotted name). It is in
  sys.modules under its own name, as dataclasses need."""
  source = subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True)
  module = types.ModuleType(f"{path}@{rev}")
  module.__file__ = f"{rev}:{path}"
  sys.modules[module.__name__] = module
  saved = {name: sys.modules.get(name) for name in imports or {}}
  try:
    sys.modules.update(imports or {})
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102
  finally:
    for name, old in saved.items():
      if old is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = old
  for name, value in globals_.items():
    setattr(module, name, value)
  return module


def baseline_build(rev: str):
  """`pools.build` as of `rev`, with that revision's `clusters` and, where it has one, its
  builder registry (its builders registered there, not beside this code's). Its config
  carries each renamed field under its former name too (`stored.RENAMED`), as it read it."""
  old_clusters = _module_at(rev, "ensemble_jax/distill/clusters.py")
  imports = {}
  registry = "ensemble_jax/distill/registry.py"
  if subprocess.run(["git", "cat-file", "-e", f"{rev}:{registry}"],
                    capture_output=True).returncode == 0:
    imports["ensemble_jax.distill.registry"] = _module_at(rev, registry)
  build = _module_at(rev, "ensemble_jax/distill/pools.py", imports,
                     clusters=old_clusters).build

  def build_under_its_names(config, *args):
    config = copy.deepcopy(config)
    for old, new in stored.RENAMED.items():
      *path, old_field = old.split(".")
      parent = config
      for key in path:
        parent = parent[key]
      with parent.unlocked():
        parent[old_field] = parent[new.split(".")[-1]]
    return build(config, *args)

  return build_under_its_names


def timed_build(build, config, data, n: int):
  with tempfile.TemporaryDirectory() as proxy_dir:
    wall, cpu = time.perf_counter(), time.process_time()
    built = build(config, data, n, os.path.join(proxy_dir, "proxy"))
    if not isinstance(built, tuple):  # a `registry.Built`; revisions before it: a tuple
      built = (built.pools, built.weights, built.route, built.info)
    return built, time.perf_counter() - wall, time.process_time() - cpu


# A phase: the functions whose cumulative time it is, by (file's tail, function name).
PHASES = {"features": [("distill/pools.py", "pixel_embedding"),
                       ("distill/pools.py", "text_embedding")],
          "covariance": [("distill/clusters.py", "_accumulate")],
          "eigh": [("linalg/_linalg.py", "eigh"), ("linalg/_decomp.py", "eigh")],
          "projection": [("distill/clusters.py", "_project")],
          "kmeans": [("distill/clusters.py", "kmeans")],
          "routing": [("distill/pools.py", "routing")]}


def phases(build, config, data, n: int) -> dict[str, float]:
  """One build, profiled: {phase: its functions' cumulative seconds} (`PHASES`), and the
  build's total. The profile's overhead is in them (the build makes ~20k Python calls)."""
  profile = cProfile.Profile()
  profile.enable()
  timed_build(build, config, data, n)
  profile.disable()
  stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
  out = {}
  for phase, functions in PHASES.items():
    out[phase] = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                     if any(file.endswith(f) and name == fn for f, fn in functions))
  out["build"] = max(ct for (_, _, name), (_, _, _, ct, _) in stats.items()
                     if name == "timed_build")
  return out


def syrk_rate(rows: int, cols: int, dtype, repeats: int = 5) -> float:
  """FLOP/s of x.T @ x (numpy's symmetric product: rows x cols^2 multiply-adds) on a
  random [rows, cols] of `dtype`, the median of `repeats`."""
  x = np.random.default_rng(0).standard_normal((rows, cols)).astype(dtype)
  x.T @ x
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    x.T @ x
    times.append(time.perf_counter() - start)
  return rows * cols * cols / statistics.median(times)


def objective(x_ExD: np.ndarray, pools_: list[np.ndarray]) -> float:
  """k-means' objective of a partition: squared distances to the cluster means, summed."""
  total = 0.0
  for p in pools_:
    x = x_ExD[p].astype(np.float64)
    total += float(((x - x.mean(0)) ** 2).sum())
  return total


def features(config, data) -> tuple:
  """The default build's k-means features: (the fitted embedding, its rows [E, D])."""
  embedding = pools.text_embedding if config.task == "lm" else pools.pixel_embedding
  return embedding(config, data)[:2]


def digest(built) -> str:
  """A hash of a build's pools and routing weights: builds in other processes compared."""
  pools_, _, route, _ = built
  h = hashlib.sha256()
  for p in pools_:
    h.update(np.asarray(p, np.int64).tobytes() + b"|")
  h.update(np.ascontiguousarray(route).tobytes())
  return h.hexdigest()[:16]


def bench(case: str, rounds: int, old_build) -> dict:
  kind = re.match(r"[a-z]+", case).group()
  configs = {"old": case_config(case), "new": case_config(case)}
  configs.update({name: case_config(case, **o) for name, o in VARIANTS[kind].items()})
  builds = {name: old_build if name == "old" else pools.build for name in configs}
  config = configs["new"]
  data = data_lib.load(config)
  n = config.method.num_workers
  load_before = os.getloadavg()
  for name in configs:  # compiles each build's jitted pieces
    timed_build(builds[name], configs[name], data, n)
  names = list(configs)
  times = {name: {"wall_s": [], "cpu_s": []} for name in names}
  out = {}
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      out[name], wall, cpu = timed_build(builds[name], configs[name], data, n)
      times[name]["wall_s"].append(wall)
      times[name]["cpu_s"].append(cpu)
    (old_pools, _, old_route, _), (new_pools, _, new_route, _) = out["old"], out["new"]
    same_pools = len(old_pools) == len(new_pools) and all(
        np.array_equal(a, b) for a, b in zip(old_pools, new_pools))
    same_route = old_route.shape == new_route.shape and np.array_equal(old_route, new_route)
    if not (same_pools and same_route):
      raise SystemExit(f"{case}: the builds differ (pools equal: {same_pools}, routing "
                       f"equal: {same_route})")
  profiled = phases(pools.build, config, data, n)
  load_after = os.getloadavg()
  fitted, x_ExD = features(config, data)
  default_objective = objective(x_ExD, out["new"][0])
  row = {"case": case, "workers": n, "train_examples": len(data.train),
         "eval_routed": int(out["new"][2].shape[0]), "pools_identical": True,
         "routing_identical": True, "digest": digest(out["new"]), "rounds": rounds,
         "loadavg_1_5_15": {"before": list(load_before), "after": list(load_after)},
         "objective": {"new": default_objective}, "phases_s": profiled}
  if kind == "fm":  # the covariance's floor: P^2 E / 2 multiply-adds x 2, at each rate
    p, e = fitted.components_PxD.shape[0], len(data.train)
    flop = float(p) * p * e
    row["covariance_floor"] = {"pixels": p, "examples": e, "flop": flop, **{
        f"{name}_s": flop / syrk_rate(4096, p, dtype)
        for name, dtype in (("float64", np.float64), ("float32", np.float32))}}
  for name, t in times.items():
    row[name] = {**t, "median_wall_s": statistics.median(t["wall_s"]),
                 "median_cpu_s": statistics.median(t["cpu_s"])}
    if name not in ("old", "new"):
      pools_ = out[name][0]
      sizes = [len(p) for p in pools_]
      row[name].update(config=VARIANTS[kind][name],
                       objective=objective(x_ExD, pools_),
                       objective_ratio=objective(x_ExD, pools_) / default_objective,
                       sizes_within_one=max(sizes) - min(sizes) <= 1)
  row["speedup_wall"] = row["old"]["median_wall_s"] / row["new"]["median_wall_s"]
  row["speedup_cpu"] = row["old"]["median_cpu_s"] / row["new"]["median_cpu_s"]
  return row


def main(argv):
  cli.parse(FLAGS, argv, __doc__)
  rev = subprocess.check_output(["git", "rev-parse", FLAGS.baseline_rev], text=True).strip()
  old_build = baseline_build(rev)
  rows = []
  for case in FLAGS.cases.split(","):
    row = bench(case, FLAGS.rounds, old_build)
    rows.append(row)
    line = [f"{case:>9}: load {row['loadavg_1_5_15']['before'][0]:.1f}"]
    for name in [k for k in row if isinstance(row[k], dict) and "median_wall_s" in row[k]]:
      line.append(f"{name} {row[name]['median_wall_s']:.2f} s wall "
                  f"{row[name]['median_cpu_s']:.2f} s cpu"
                  + (f" (objective x{row[name]['objective_ratio']:.4f})"
                     if "objective_ratio" in row[name] else ""))
    line.append("phases " + ", ".join(f"{k} {v:.2f}" for k, v in row["phases_s"].items()
                                      if v))
    if "covariance_floor" in row:
      f = row["covariance_floor"]
      line.append(f"covariance floor {f['flop'] / 1e9:.0f} GFLOP: {f['float64_s']:.2f} s "
                  f"float64, {f['float32_s']:.2f} s float32")
    print(" | ".join(line) + f" | new x{row['speedup_wall']:.2f} wall, "
          f"x{row['speedup_cpu']:.2f} cpu; old and new identical", flush=True)
  if FLAGS.out:
    cli.write_json(FLAGS.out, {"rows": rows, "baseline_rev": rev, "cpu_count": os.cpu_count(),
                               "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS",
                                                                      "")})


if __name__ == "__main__":
  cli.run(main)
