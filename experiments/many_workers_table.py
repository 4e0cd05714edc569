"""A many-worker sweep's finished seed runs as one table: steps to target per seed.

  python -m experiments.many_workers_table [--workload=fashion|pydocs] [--workdir=...]

Per N (rows) and curve (the random streams, `ensemble`, and the routed experts: PCA-routed
on Fashion-MNIST, tf-idf-routed on the Python docs, each also with the small model): the
steps to the target of every reported seed (`missed (final metric)` for a seed that did
not reach it, `not in the grid` where the curve's grid has no such N; the seeds the report
keeps, `report.reported`: not the seed the rates were chosen on, where others ran),
then medians over the seeds that reached it of the modelled time to target on ib_xdr800
(pool build included) and the XLA TFLOPs to target, and per curve one more median: the
workers' own accuracy or perplexity (random streams) or the pool build's seconds (routed
experts). The docs' many-worker tables are this table; `ensemble_jax.report` gives the
same runs' median, min and max per point.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
from typing import Callable

from absl import flags

from ensemble_jax import report
from experiments import cli, sweeps
from experiments.configs import WORKLOAD_CONFIGS

RESULTS = os.path.join("experiments", "results")
PRESET = "ib_xdr800"


def _workers(point: str) -> int:
  """N of a point named N<N>_L<L>."""
  return int(re.match(r"N(\d+)_", point).group(1))


def load(workdir: str) -> dict[tuple[int, str], list[dict]]:
  """{(N, curve): its reported seeds' runs by seed}, each as `report.load_runs` reads it."""
  runs = {}
  for run in sorted(report.load_runs(workdir), key=lambda r: r["seed"]):
    runs.setdefault((_workers(run["point"]), run["curve"]), []).append(run)
  return {key: report.reported(rs) for key, rs in runs.items()}


def _median_reached(runs: list[dict], value, digits: int) -> str:
  """The median of `value` over the runs that reached the target; '-' if none did."""
  values = [value(r) for r in runs if r["reached"]]
  return f"{statistics.median(values):.{digits}f}" if values else "-"


def _workers_accuracy(runs: list[dict]) -> str:
  return f"{statistics.median(r['worker_accuracy'] for r in runs):.3f}"


def _workers_perplexity(runs: list[dict]) -> str:
  return f"{statistics.median(math.exp(r['worker_nll']) for r in runs):.2f}"


def _pool_build_s(runs: list[dict]) -> str:
  return f"{statistics.median(r['pool_build_s'] for r in runs):.1f}"


@dataclasses.dataclass(frozen=True)
class Workload:
  workdir: str
  target: str  # as the header says it
  final_digits: int  # a missed seed's final metric
  # curve -> (its name in the header, its extra column, how that column reads the seeds)
  curves: dict[str, tuple[str, str, Callable[[list[dict]], str]]]


WORKLOADS = {
    "fashion": Workload(os.path.join(RESULTS, "many_workers"), "85%", 3, {
        "ensemble": ("ensemble", "its workers' mean accuracy", _workers_accuracy),
        "ensemble_pca_routed": ("PCA-routed", "pool build (s)", _pool_build_s),
        "ensemble_pca_routed_small": ("small-model PCA-routed", "pool build (s)",
                                      _pool_build_s)}),
    "pydocs": Workload(os.path.join(RESULTS, "many_workers_pydocs"), "perplexity 12", 2, {
        "ensemble": ("ensemble", "its workers' perplexity (exp of mean NLL)",
                     _workers_perplexity),
        "ensemble_tfidf_routed": ("tf-idf-routed", "pool build (s)", _pool_build_s),
        "ensemble_tfidf_routed_small": ("small-model tf-idf-routed", "pool build (s)",
                                        _pool_build_s)}),
}


def grid_sizes(workload: str) -> dict[str, set[int]]:
  """{curve: the N its many-worker grid runs}, from the workload's config file."""
  module = sweeps.load_config_module(WORKLOAD_CONFIGS[workload])
  return {curve: {_workers(point) for point in points}
          for curve, points in module.sweep_grid("many_workers").items()}


def table(runs: dict[tuple[int, str], list[dict]], workload: str = "fashion",
          sizes: dict[str, set[int]] | None = None) -> str:
  """The table of `runs`; with `sizes` (`grid_sizes`), a point the grid lacks reads `not in
  the grid`, one it has but no run yet `not run yet`."""
  w = WORKLOADS[workload]
  header = ["N"]
  for name, extra, _ in w.curves.values():
    header += [f"{name}: steps to {w.target} (per reported seed)", extra,
               f"time to target, {PRESET} (s)", "TFLOPs"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for n in sorted({n for n, _ in runs}):
    cells = [str(n)]
    for curve, (_, _, extra) in w.curves.items():
      rs = runs.get((n, curve))
      if not rs:
        planned = sizes is None or n in sizes.get(curve, ())
        cells += ["not run yet" if planned else "not in the grid", "-", "-", "-"]
        continue
      steps = ", ".join(str(r["steps"]) if r["reached"]
                        else f"missed ({r['final']:.{w.final_digits}f})" for r in rs)
      cells += [steps, extra(rs), _median_reached(rs, lambda r: r["time_s"][PRESET], 1),
                _median_reached(rs, lambda r: r["flops"] / 1e12, 2)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


FLAGS = flags.FlagValues()
flags.DEFINE_enum("workload", "fashion", sorted(WORKLOADS), "which many-worker sweep",
                  flag_values=FLAGS)
flags.DEFINE_string("workdir", "", "default: the workload's many-worker workdir",
                    flag_values=FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  print(table(load(FLAGS.workdir or WORKLOADS[FLAGS.workload].workdir), FLAGS.workload,
              grid_sizes(FLAGS.workload)), end="")
  return 0


if __name__ == "__main__":
  cli.run(main)
