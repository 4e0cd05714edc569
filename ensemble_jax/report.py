"""Cost vs time to a target, from results.json files: Markdown tables and PNGs.

  python -m ensemble_jax.report DIR [--out=DIR]

DIR is one run's workdir (its summary), a folder holding run workdirs at any depth (the
runs side by side), or a sweep's tree (the tables and figures below).

The ratios compare each method with the strongest-baseline frontier: at every budget the
best of all single-model curves (`baseline_curves`), at each method point's own budget
(`matched`), then the best over budgets as a labelled summary, then each point's budget,
resolution and tuning (the chosen values and the tuning runs' compute, summed per curve:
a cost the user pays too), then each baseline alone.

A run lives in `RESULTS_DIR/<curve>/<point>/seed<k>/results.json` (what the sweep writes);
its seeds are one point of its curve: their median and range. A seed that chose the point's
tuned values (the tuning seed, `tune.seed`) is left out when other seeds ran: its run won
the choice, so its steps are biased low (the winner's curse); the tuning table keeps it. Each point is the training compute
spent until the target was first reached (y: XLA FLOPs x steps, measured) against the
critical-path time to it on the cluster the run stands for (x: modelled from the measured
device step time and the collectives of the method's compiled programs, per interconnect
preset; see `ensemble_jax.costs`). Files written before the `ib800` preset was renamed
`ib_xdr800` are read under the new name. Points where some seed missed the target are
left out of the ratios and out of the figure's plane: they are drawn apart, below it,
marked "missed on k of n seeds" (`plot`).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys

from ensemble_jax import config_lib, costs, stored

BASELINE = "data_parallel"
PRESETS = tuple(costs.INTERCONNECTS)
EVALUATION_PRESET = "eth10g"  # the evaluations' column: on the slowest link, where they cost most
CHARGED = f"time {EVALUATION_PRESET}, evaluations charged (s)"  # the column's header
PER_TARGET = "per_target"  # <point>/per_target/<run>/seed<k>: a rung's own choice's seeds
CHECKPOINTS = "checkpoints"  # a run workdir's orbax directory (train.CHECKPOINTS)


def load_runs(results_dir: str, target_value: float | None = None) -> list[dict]:
  """One row per seed run of a study's tree `<curve>/<point>/seed<k>/results.json`; with
  `target_value`, each run read at that rung of its targets (`costs.at_target`: priced to
  it), runs that did not track it left out. Where the rung's own tuning choice differs from
  the point's, its seed runs (`<point>/per_target/<run>/seed<k>`) stand in; a row read at
  another rung's choice says so (`rung_choice` False)."""
  runs = []
  for workdir in sorted(glob.glob(os.path.join(results_dir, "*", "*", "seed*", CHECKPOINTS))):
    _left_out_if_unfinished(os.path.dirname(workdir))
  for path in sorted(glob.glob(os.path.join(results_dir, "*", "*", "seed*", "results.json"))):
    try:
      r = read_run(path)
    except stored.NotARun as e:
      _skipped(path, e)
      continue
    rung_choice = True
    if target_value is not None:
      r, rung_choice = _at_rung_choice(path, r, target_value)
      if (r := costs.at_target(r, target_value)) is None:
        continue
    curve, point, _ = os.path.relpath(os.path.dirname(path), results_dir).split(os.sep)
    t, cost = r["target"], r["cost"]
    runs.append({
        "curve": curve, "point": point, "method": r["method"],
        **dict(zip(("seed", "tuning_seed"), result_seeds(r))),
        "devices": cost["modelled"]["devices"],
        "reached": bool(t["reached"]),
        "steps": cost["measured"]["steps_to_target"],
        "flops": cost["measured"]["flops_to_target"],
        "time_s": {costs.RENAMED_PRESETS.get(k, k): v
                   for k, v in cost["modelled"]["critical_path_s"].items()},
        "host_time_s": t["reached_time_s"] if t["reached"] else r["train_time_s"],
        # the evaluations up to the target, beside the critical path (costs.EVALUATION_RULE)
        "evaluation_s": cost["modelled"].get("evaluation_s", {}).get(EVALUATION_PRESET),
        # the same run with its evaluations charged: they stand on the critical path
        "charged_s": _charged(cost["modelled"]),
        "target_metric": t["metric"], "target_value": t["value"],
        "target": f"{t['metric']} {'<=' if t['metric'] in config_lib.LOWER_IS_BETTER else '>='} "
                  f"{t['value']}",
        "final": r["final"].get(t["metric"]),
        # the examples the final metric was measured on (a miss counted in examples)
        "eval_examples": r["final"].get("num_examples",
                                        r["config"].get("eval", {}).get("num_examples")),
        # the final model on the eval examples no evaluation saw (eval.score_rest_at_end)
        "rest": (r.get("rest") or {}).get(t["metric"]),
        "worker_accuracy": r["final"].get("worker/accuracy_mean"),  # None: one model
        "worker_nll": r["final"].get("worker/nll_mean"),  # None: one model
        "pool_build_s": (r.get("distill") or {}).get("build_time_s", 0.0),
        "pool_build_flops": (r.get("distill") or {}).get("build_flops", 0.0),
        # a pool of synthetic data (a distillation), which a what-if may amortise
        "synthetic": bool((r.get("distill") or {}).get("distillation")),
        # a knowledge-distillation teacher's training (results.json `teacher`), inside
        # `flops` and `time_s`: what a what-if may amortise too
        "teacher_s": {costs.RENAMED_PRESETS.get(k, k): v
                      for k, v in cost["modelled"].get("teacher_s", {}).items()},
        "teacher_flops": cost["measured"].get("teacher_flops", 0.0),
        "step_budget": r.get("step_budget"),
        # passes over the training set to the target (or the run's end), all models together
        "passes": passes(r, cost["measured"]["steps_to_target"]),
        # the crossing lies in (steps - resolution_steps, steps]; None: target missed
        "resolution_steps": t.get("resolution_steps"),
        # the point's tuning (experiments/sweeps/tuning.py): None for untuned runs
        "tuning": _tuning_row(r.get("tuning")),
        # read at this rung's own tuning choice (False: at another rung's, none of its own)
        "rung_choice": rung_choice,
    })
  return runs


def passes(r: dict, steps: int) -> float | None:
  """The passes over the training set that `steps` steps of the run `r` read, all its models
  together (examples, or windows of text); None where the record lacks the sizes."""
  data = r.get("data", {})
  size = data.get("train_examples") or data.get("train_windows")
  return steps * r["examples_per_step"] / size if size and r.get("examples_per_step") else None


def _at_rung_choice(path: str, r: dict, value: float) -> tuple[dict, bool]:
  """The seed run at `path` (`<point>/seed<k>/results.json`) as the rung `value` chose it:
  (the run, whether it is at that rung's own choice). The point's own run where the rung
  chose alike or the record names no per-rung choice; else the rung's seed run under
  `<point>/per_target/`, or the point's own, flagged, when that one is absent."""
  tuning = r.get("tuning") or {}
  rung = next((t for t in tuning.get("chosen_per_target", [])
               if math.isclose(t["value"], value, rel_tol=1e-9)), None)
  if rung is None or rung["chosen_run"] == tuning.get("chosen_run"):
    return r, True
  point_dir, seed_dir = os.path.split(os.path.dirname(path))
  other = os.path.join(point_dir, PER_TARGET, os.path.basename(rung["chosen_run"]), seed_dir,
                       "results.json")
  return (read_run(other), True) if os.path.exists(other) else (r, False)


def read_run(path: str) -> dict:
  """A run's results.json as every report reads it: under today's names (`stored.load_run`),
  its teacher's training charged at what the teacher's own results.json prices it now
  (`costs.charged`), not at the copy made when the run trained; for a taught point's seed
  run, its tuning record's `compute` summed again from the tuning runs it names, each read
  so. A relative teacher workdir is read from the working directory, as the study that
  trained it ran (the repository's root)."""
  r = stored.load_run(path)
  teacher = r.get("teacher")
  if not teacher:
    return r
  teacher_path = os.path.join(teacher["workdir"], "results.json")
  if not os.path.isfile(teacher_path):
    raise FileNotFoundError(f"{path} is charged its teacher's training, priced from "
                            f"{teacher_path}, which is not there (run from where it was "
                            "trained, or restore the teacher's results.json)")
  r = costs.charged(r, read_run(teacher_path))
  run_dir = os.path.dirname(path)
  if r.get("tuning") and re.fullmatch(r"seed\d+", os.path.basename(run_dir)):
    # its rows name runs under the point, `chosen_run` (`tune/<run>`) one of them from beside
    # this seed's directory: the point's, or a rung's under the point's `per_target/`
    point_dir = os.path.normpath(os.path.join(
        os.path.dirname(run_dir), os.path.dirname(os.path.dirname(r["tuning"]["chosen_run"]))))
    runs = [None if diverged else read_run(os.path.join(point_dir, run, "results.json"))
            for run, diverged in _tuning_runs(r["tuning"])]
    r["tuning"] = {**r["tuning"], "compute": costs.tuning_compute(runs)}
  return r


def _tuning_runs(record: dict) -> list[tuple[str, bool]]:
  """The runs a tuning record's `compute` sums, each once in the order its axes name them:
  (its directory under the point, whether it diverged)."""
  runs: dict[str, bool] = {}
  for axis in record["axes"]:
    for row in axis["runs"]:
      for run in (row, *row.get("other_seeds", ())):
        runs.setdefault(run["run"], bool(run.get("diverged")))
  return list(runs.items())


def _charged(modelled: dict) -> float | None:
  """A run's time to target on EVALUATION_PRESET with its evaluations up to the target
  charged on the critical path (None: the run records no evaluation time)."""
  evaluation = modelled.get("evaluation_s", {}).get(EVALUATION_PRESET)
  time_s = {costs.RENAMED_PRESETS.get(k, k): v for k, v in modelled["critical_path_s"].items()}
  return None if evaluation is None else time_s[EVALUATION_PRESET] + evaluation


def _tuning_row(record: dict | None) -> dict | None:
  """What a table needs of a point's tuning record: the chosen values and peak learning
  rate, whether a choice sat at the edge of its grid, and the tuning runs' compute."""
  if not record:
    return None
  compute = record["compute"]
  # With the schedule's length tuned: the whole-budget run's steps at the chosen rates
  whole = [r for axis in record["axes"] if axis.get("key") == config_lib.SCHEDULE_FRACTION
           for r in axis["runs"] if r["value"] == 1.0]
  return {"chosen": record["chosen"], "peak_learning_rate": record["peak_learning_rate"],
          "whole_schedule_steps": (whole[0]["steps_to_target"] or "missed") if whole else None,
          "at_edge": any(axis["at_edge"] for axis in record["axes"]),
          "rung_at_edge": _rung_at_edge(record),
          "runs": compute["runs"], "diverged": compute["diverged"], "flops": compute["flops"],
          "time_s": compute["time_s"], "device_seconds": compute["device_seconds"]}


def at_edge(key: str, values: list[float], best: float) -> bool:
  """Whether `best` sits at an edge of a tuned axis' sorted `values` that the axis could be
  extended past (the schedule's whole budget, 1, is no edge: `tuning.beyond`)."""
  return len(values) > 1 and (best == values[0] or (
      best == values[-1] and (key != config_lib.SCHEDULE_FRACTION or values[-1] < 1.0)))


def _rung_at_edge(record: dict) -> dict:
  """{rung: whether that rung's own choice sits at an edge of a tuned axis}: capped, or
  tuned when the rule extended an axis for the first rung's choice alone (a later rung's
  best may lie beyond what was tried)."""
  out = {}
  rungs = [t["value"] for t in record.get("chosen_per_target", [])]
  for axis in record["axes"] if rungs else []:
    tried = sorted({r["value"] for r in axis["runs"]})
    for rung, v in zip(rungs, axis.get("chosen_per_target", [])):
      out[rung] = out.get(rung, False) or at_edge(axis.get("key"), tried, v)
  return out


def missed_by(run: dict) -> int | None:
  """How many eval examples a run that missed an accuracy target was short of it (its final
  accuracy on its `eval_examples`); None for a run that reached it or another metric."""
  if run["reached"] or run["target_metric"] != "accuracy" or not run["eval_examples"]:
    return None
  n = run["eval_examples"]
  return max(1, math.ceil(run["target_value"] * n - 1e-6) - round(run["final"] * n))


def _spread(values: list[float]) -> dict:
  return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def result_seeds(results: dict) -> tuple[int, int | None]:
  """A results.json's (seed, the seed its point was tuned on; None: untuned)."""
  return results["config"]["seed"], (results.get("tuning") or {}).get("seed")


def reported(rs: list, seeds=lambda r: (r["seed"], r["tuning_seed"])) -> list:
  """The runs of one point that its row reports: all but the tuning seed's, when other
  seeds ran (the tuning seed's run won the choice of values, so it is biased low).
  `seeds(run)`: (its seed, the tuning seed); `load_runs` rows by default, `result_seeds`
  for results.json dicts."""
  others = [r for r in rs if seeds(r)[0] != seeds(r)[1]]
  return others or rs


def reported_batch(row: dict) -> bool:
  """Whether a critical-batch summary row is reported (fitted, projected): it has a median
  over reported seeds, not only the tuning run, which won the choice (biased low)."""
  return row["median_steps"] is not None and not row.get("tuning_seed_only")


def _in_order(key: tuple[str, str]) -> tuple:
  """(curve, point) with the point's numbers read as numbers: N2_L300 before N16_L300,
  D4_E0.5 before D4_E1."""
  curve, point = key
  parts = re.split(r"(\d+(?:\.\d+)?)", point)
  return curve, [float(part) if i % 2 else part for i, part in enumerate(parts)]


def points(runs: list[dict]) -> list[dict]:
  """One point per (curve, point), curves by name and points by their numbers: its
  reported seeds' median, min and max, and the tuning seed's steps apart."""
  groups: dict[tuple, list] = {}
  for r in runs:
    groups.setdefault((r["curve"], r["point"]), []).append(r)
  out = []
  for (curve, point), every in sorted(groups.items(), key=lambda item: _in_order(item[0])):
    rs = reported(every)
    tuning_run = [r for r in every if r not in rs]
    out.append({
        "curve": curve, "point": point, "method": rs[0]["method"],
        "devices": rs[0]["devices"], "seeds": len(rs),
        "reached": sum(r["reached"] for r in rs),
        "steps": _spread([r["steps"] for r in rs]),
        "flops": _spread([r["flops"] for r in rs]),
        "time_s": {p: _spread([r["time_s"][p] for r in rs]) for p in PRESETS},
        "host_time_s": _spread([r["host_time_s"] for r in rs]),
        "evaluation_s": (_spread([r["evaluation_s"] for r in rs])
                         if all(r["evaluation_s"] is not None for r in rs) else None),
        "charged_s": (_spread([r["charged_s"] for r in rs])
                      if all(r["charged_s"] is not None for r in rs) else None),
        "final": _spread([r["final"] for r in rs]),
        "rest": _spread(rest) if (rest := [r["rest"] for r in rs if r["rest"] is not None])
                else None,
        "rest_seeds": len(rest),
        "step_budget": rs[0]["step_budget"],
        "passes": (_spread([r["passes"] for r in rs])
                   if all(r.get("passes") is not None for r in rs) else None),
        # the coarsest seed's: None when no seed reached the target
        "resolution_steps": max((r["resolution_steps"] for r in rs
                                 if r["resolution_steps"] is not None), default=None),
        # one record per point: every seed carries the same one
        "tuning": rs[0]["tuning"],
        "seed_list": sorted(r["seed"] for r in rs),
        # the tuning seed's run (the chosen tuning run), when it is left out above
        "tuning_seed_steps": (tuning_run[0]["steps"] if tuning_run and tuning_run[0]["reached"]
                              else None),
    })
  return out


def pareto(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
  """The points no other point beats in both time and cost, sorted by time."""
  front, best_cost = [], float("inf")
  for time_s, flops in sorted(pts):
    if flops < best_cost:
      front.append((time_s, flops))
      best_cost = flops
  return front


def baseline_curves(pts: list[dict]) -> list[str]:
  """The single-model curves (every run `data_parallel`: DP itself, the short schedules,
  the small models, and whatever single-model curve a workload adds): the baselines."""
  return sorted({p["curve"] for p in pts}
                - {p["curve"] for p in pts if p["method"] != BASELINE})


def _reached(pts: list[dict], curves, preset: str) -> list[tuple[float, float, str]]:
  """(time, compute, 'curve point') of the points of `curves` that reached in every seed."""
  return [(p["time_s"][preset]["median"], p["flops"]["median"], f"{p['curve']} {p['point']}")
          for p in pts if p["curve"] in curves and p["reached"] == p["seeds"]]


def frontier(pts: list[dict], preset: str, baselines=None):
  """The strongest baseline at each budget, over every point of `baselines` (default: all
  single-model curves) that reached the target in every seed. Returns two functions:
  time_at(compute) -> (fastest time with compute <= it, its point) and compute_at(time) ->
  (cheapest compute with time <= it, its point); each None when no point is that cheap
  (fast)."""
  base = _reached(pts, baseline_curves(pts) if baselines is None else baselines, preset)

  def time_at(compute: float):
    within = [(t, name) for t, c, name in base if c <= compute]
    return min(within) if within else None

  def compute_at(time_s: float):
    within = [(c, name) for t, c, name in base if t <= time_s]
    return min(within) if within else None

  return time_at, compute_at


def matched(pts: list[dict], curve: str, preset: str, baselines=None) -> list[dict]:
  """`curve`'s points against the strongest-baseline frontier at each point's own budget:
  time ratio = the frontier's fastest time within the point's compute / the point's time;
  compute ratio = the frontier's cheapest compute within the point's time / the point's
  compute. Above 1 the point is better; None with `why` when it cannot be computed.
  Where no baseline reaches the target within the point's budget at the seeds' medians,
  `margin[kind]` says by how much the closest one exceeds it (`beyond`), and `ahead` names
  the kinds where none does on any seed (the point's dearest seed against every baseline
  seed): an unbounded ratio, a win. Short of that the point is level, within the seeds'
  spread, not a win and not a loss."""
  time_at, compute_at = frontier(pts, preset, baselines)
  named = {f"{p['curve']} {p['point']}": p for p in pts}
  curves = baseline_curves(pts) if baselines is None else baselines
  reached = [q for q in pts if q["curve"] in curves and q["reached"] == q["seeds"]]
  out = []
  for p in pts:
    if p["curve"] != curve:
      continue
    row = {"point": p["point"], "time": None, "compute": None, "why": None,
           "time_range": None, "compute_range": None, "margin": {}, "ahead": []}
    if p["reached"] < p["seeds"]:
      row["why"] = f"missed ({p['reached']}/{p['seeds']})"
    else:
      t, c = p["time_s"][preset]["median"], p["flops"]["median"]
      if (best := time_at(c)) is not None:
        row["time"] = (best[0] / t, best[1])
        row["time_range"] = seed_range(named[best[1]]["time_s"][preset], p["time_s"][preset])
      elif reached:
        row["margin"]["time"] = beyond(reached, p, lambda q: q["flops"])
      if (best := compute_at(t)) is not None:
        row["compute"] = (best[0] / c, best[1])
        row["compute_range"] = seed_range(named[best[1]]["flops"], p["flops"])
      elif reached:
        row["margin"]["compute"] = beyond(reached, p, lambda q: q["time_s"][preset])
      row["ahead"] = [kind for kind, (_, _, (low, _)) in row["margin"].items() if low > 1]
    out.append(row)
  return out


def beyond(reached: list[dict], point: dict, budget) -> tuple[float, str, tuple[float, float]]:
  """A point that no baseline of `reached` (those that reached the target on every seed)
  reaches the target within, at the seeds' medians, in `budget` (a point's compute or its
  time on a preset): the closest baseline's budget over the point's (medians), that
  baseline, and the ratio's range over the seeds, from the baselines' cheapest seed against
  the point's dearest to their cheapest at their dearest seeds against the point's cheapest
  (as `seed_range`, over the frontier). Above 1 over all of it, no baseline reaches the
  target within the point's budget on any seed: the point is ahead."""
  closest = min(reached, key=lambda q: budget(q)["median"])
  spread = (min(budget(q)["min"] for q in reached) / budget(point)["max"],
            min(budget(q)["max"] for q in reached) / budget(point)["min"])
  return (budget(closest)["median"] / budget(point)["median"],
          f"{closest['curve']} {closest['point']}", spread)


def seed_range(baseline: dict, point: dict) -> tuple[float, float]:
  """A ratio baseline / point (time or compute: above 1 the point is better) over the
  seeds of each: from the baseline's fastest (cheapest) seed against the point's slowest
  (dearest) to the other way round. A range that holds 1 is within the seeds' spread."""
  return baseline["min"] / point["max"], baseline["max"] / point["min"]


def ratios(pts: list[dict], curve: str, preset: str, baselines=None) -> dict:
  """`curve` against the baselines (default: every single-model curve), frontier to
  frontier, on the seed medians of the points that always reached the target; the best
  over the baselines' budgets, a summary beside `matched`.

  At each baseline point's compute c_p: the baselines' fastest time at compute <= c_p over
  `curve`'s fastest time at compute <= c_p (time ratio at fixed compute); at each baseline
  point's time t_p: the baselines' cheapest compute at time <= t_p over `curve`'s (compute
  ratio at fixed time). The best of each over the baseline points is reported with the
  baseline point it compares (the frontier's point at that budget, which need not be the
  point whose budget it is). Above 1, `curve` is better; None where no point of `curve` is
  within the budget.
  """
  base = _reached(pts, baseline_curves(pts) if baselines is None else baselines, preset)
  mine = _reached(pts, [curve], preset)
  time_at, compute_at = frontier(pts, preset, baselines)
  named = {f"{p['curve']} {p['point']}": p for p in pts}
  time_ratio = compute_ratio = time_range = compute_range = None
  for t_p, c_p, _ in base:
    faster = [(t, name) for t, c, name in mine if c <= c_p]
    if faster:
      best_t, compared = time_at(c_p)
      t, name = min(faster)
      if time_ratio is None or best_t / t > time_ratio[0]:
        time_ratio = (best_t / t, compared)
        time_range = seed_range(named[compared]["time_s"][preset], named[name]["time_s"][preset])
    cheaper = [(c, name) for t, c, name in mine if t <= t_p]
    if cheaper:
      best_c, compared = compute_at(t_p)
      c, name = min(cheaper)
      if compute_ratio is None or best_c / c > compute_ratio[0]:
        compute_ratio = (best_c / c, compared)
        compute_range = seed_range(named[compared]["flops"], named[name]["flops"])
  return {"time_at_fixed_compute": time_ratio, "compute_at_fixed_time": compute_ratio,
          "time_range": time_range, "compute_range": compute_range,
          "fastest_s": min((t for t, _, _ in mine), default=None),
          "cheapest_flops": min((c for _, c, _ in mine), default=None)}


FLOP_UNITS = (("TFLOPs", 1e12), ("GFLOPs", 1e9), ("MFLOPs", 1e6), ("kFLOPs", 1e3),
              ("FLOPs", 1.0))


def flop_unit(values) -> tuple[str, float]:
  """The largest unit in which a column's smallest nonzero count reads at least 0.1 at two
  decimals (a column of 0.00 TFLOPs says nothing): (name, FLOPs per unit)."""
  small = min((v for v in values if v), default=None)
  for name, scale in FLOP_UNITS:
    if small is None or small / scale >= 0.1:
      return name, scale
  return FLOP_UNITS[-1]


def verdict(pts: list[dict]) -> dict:
  """A study's answer from its points (seed medians, each method point at its own budget,
  on every preset): whether some method point beats the strongest-baseline frontier (a
  matched time or compute ratio above 1), its closest point (the best matched ratio, its
  preset, the frontier point it is measured against and its range over the seeds: a win
  only where all of it is above 1), and the strongest baseline (the
  frontier point the closest time ratio names; else the fastest baseline that always
  reached)."""
  baselines = baseline_curves(pts)
  closest = None  # (ratio, curve, point, preset, 'time' | 'compute', vs, seed range)
  beats = False  # a matched ratio above 1 over the whole seed range
  for curve in sorted({p["curve"] for p in pts} - set(baselines)):
    for preset in PRESETS:
      for row in matched(pts, curve, preset):
        beats = beats or bool(row["ahead"])
        for kind in ("time", "compute"):
          if row[kind] is None:
            continue
          beats = beats or row[f"{kind}_range"][0] > 1
          if closest is None or row[kind][0] > closest[0]:
            closest = (row[kind][0], curve, row["point"], preset, kind, row[kind][1],
                       row[f"{kind}_range"])
  best_time = None  # the strongest baseline: the point the best time ratio is measured against
  for curve in sorted({p["curve"] for p in pts} - set(baselines)):
    for row in matched(pts, curve, PRESETS[0]):
      if row["time"] is not None and (best_time is None or row["time"][0] > best_time[0]):
        best_time = row["time"]
  fastest = min(_reached(pts, baselines, PRESETS[0]), default=None)
  strongest = best_time[1] if best_time else (fastest[2] if fastest else None)
  return {"beats": beats, "closest": closest,
          "strongest": strongest}


def calibrations(results_dir: str, calibration_dir: str) -> list[dict]:
  """Which calibrated device step prices which runs of a sweep, from the JSON: per device
  step its runs record (`cost.modelled.device_step_time_s`), the model (parameters) and
  per-device batch, the calibration run under `calibration_dir` that timed it, and the
  points it prices; then each calibration run that prices none of them."""
  steps: dict[float, dict] = {}
  for path in sorted(glob.glob(os.path.join(results_dir, "*", "*", "seed*", "results.json"))):
    r = stored.load(path)
    modelled = r["cost"]["modelled"]
    curve, point = os.path.relpath(path, results_dir).split(os.sep)[:2]
    per_device = r["config"]["train"]["batch_size"] // (
        1 if "num_workers" in r else modelled["devices"])  # a worker's, or one model's split
    row = steps.setdefault(modelled["device_step_time_s"], {
        "device_step_s": modelled["device_step_time_s"],
        "params": r.get("num_params", r.get("num_params_per_worker")),
        "per_device_batch": per_device, "calibration": None, "points": set(), "runs": 0})
    row["points"].add(f"{curve} {point}")
    row["runs"] += 1
  timed = {}
  for path in sorted(glob.glob(os.path.join(calibration_dir, "*", "results.json"))):
    r = stored.load(path)
    timed[r["step_time_s"]] = (os.path.basename(os.path.dirname(path)), r.get("num_params"))
  rows = []
  for step, row in sorted(steps.items(), key=lambda kv: -kv[0]):
    row["calibration"] = timed.pop(step, (None,))[0]
    row["points"] = len(row["points"])
    rows.append(row)
  for step, (fingerprint, params) in sorted(timed.items(), key=lambda kv: -kv[0]):
    rows.append({"device_step_s": step, "params": params, "per_device_batch": None,
                 "calibration": fingerprint, "points": 0, "runs": 0})
  return rows


def calibration_table(sweeps: list[tuple[str, str]], root: str = ".") -> str:
  """`calibrations` of each (results dir, calibration dir), relative to `root`, as one
  Markdown table."""
  lines = ["| results | model params | per-device batch | device step (s) | calibration run "
           "| points priced | runs priced |", "|---|---|---|---|---|---|---|"]
  for results_dir, calibration_dir in sweeps:
    for row in calibrations(os.path.join(root, results_dir), os.path.join(root, calibration_dir)):
      where = (f"{calibration_dir}/{row['calibration']}" if row["calibration"]
               else "none found")
      batch = "-" if row["per_device_batch"] is None else str(row["per_device_batch"])
      lines.append(f"| {results_dir} | {row['params']:,} | {batch} | "
                   f"{row['device_step_s']:.4f} | {where} | {row['points']} | "
                   f"{row['runs'] or 'none (not used)'} |")
  return "\n".join(lines) + "\n"


def _fmt(s: dict, scale: float = 1.0, digits: int = 1) -> str:
  return (f"{s['median'] / scale:.{digits}f} [{s['min'] / scale:.{digits}f}, "
          f"{s['max'] / scale:.{digits}f}]")


def _show(ratio, why=None, spread=None) -> str:
  """A ratio, its range over the seeds (`seed_range`; "within the spread" where it holds
  1: no win, no loss) and the baseline point compared."""
  if ratio is None:
    return why or "no baseline within budget"
  if spread is None:
    return f"{ratio[0]:.2f}x (vs {ratio[1]})"
  within = ", within the spread" if spread[0] <= 1 <= spread[1] else ""
  return f"{ratio[0]:.2f}x [{spread[0]:.2f}, {spread[1]:.2f}{within}] (vs {ratio[1]})"


AHEAD = "ahead of every baseline (none within its budget on any seed): a win"


def _matched_table(pts, curves, baselines) -> list[str]:
  lines = ["", "Against the strongest-baseline frontier (at each budget the best of "
           f"{', '.join(baselines)}), at each point's own budget: the frontier's fastest time "
           "within the point's compute / the point's time, and the frontier's cheapest "
           "compute within the point's time / the point's compute (> 1: the point is better; "
           "the frontier point named; 'no baseline within budget': no baseline reached the "
           "target that cheaply / fast; 'missed (k/n)': the point reached it on k of its n "
           "seeds, so it has no ratio):", "",
           "| curve | point | " + " | ".join(f"time ratio {q}" for q in PRESETS) + " | "
           + " | ".join(f"compute ratio {q}" for q in PRESETS) + " |",
           "|---|---|" + "---|" * (2 * len(PRESETS))]
  for curve in curves:
    rows = {q: matched(pts, curve, q) for q in PRESETS}
    for i, row in enumerate(rows[PRESETS[0]]):
      cells = [_show(rows[q][i][kind], rows[q][i]["why"] or (
                         AHEAD if kind in rows[q][i]["ahead"] else None),
                     rows[q][i][f"{kind}_range"])
               for kind in ("time", "compute") for q in PRESETS]
      lines.append(f"| {curve} | {row['point']} | " + " | ".join(cells) + " |")
  return lines


def absent_ratio(pts: list[dict], curve: str, preset: str, baselines=None) -> tuple[str, str]:
  """Why `ratios` has no (time ratio, compute ratio) for `curve`: every point of it missed
  the target on some seed; no baseline reached it; or no point of it is as cheap (for the
  time ratio) or as fast (for the compute ratio) as any baseline point that did."""
  if not _reached(pts, [curve], preset):
    missed = [p for p in pts if p["curve"] == curve]
    why = ("every point missed the target (" + ", ".join(
        f"{p['point']} on {p['seeds'] - p['reached']} of {p['seeds']} seeds" for p in missed)
        + ")")
    return why, why
  if not _reached(pts, baseline_curves(pts) if baselines is None else baselines, preset):
    return ("no baseline reached the target",) * 2
  return "no point within a baseline's compute", "no point within a baseline's time"


def _ratio_table(pts, curves, baselines, caption: str) -> list[str]:
  unit, scale = flop_unit(ratios(pts, c, q, baselines)["cheapest_flops"] or 0
                          for c in curves for q in PRESETS)
  lines = ["", caption, "",
           f"| curve | preset | fastest time (s) | cheapest {unit} | time ratio at fixed "
           "compute | compute ratio at fixed time |", "|---|---|---|---|---|---|"]
  for curve in curves:
    for preset in PRESETS:
      r = ratios(pts, curve, preset, baselines)
      fastest = "-" if r["fastest_s"] is None else f"{r['fastest_s']:.1f}"
      cheapest = "-" if r["cheapest_flops"] is None else f"{r['cheapest_flops'] / scale:.2f}"
      no_time, no_compute = absent_ratio(pts, curve, preset, baselines)
      lines.append(f"| {curve} | {preset} | {fastest} | {cheapest} | "
                   f"{_show(r['time_at_fixed_compute'], no_time, r['time_range'])} | "
                   f"{_show(r['compute_at_fixed_time'], no_compute, r['compute_range'])} |")
  return lines


def _value(v) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


def _steps(p: dict) -> str:
  """A point's median steps to target over its reported seeds ('-': some seed missed)."""
  return f"{p['steps']['median']:g}" if p["reached"] == p["seeds"] else "-"


def _tuning_table(pts) -> list[str]:
  """Each point's budget, resolution and tuning (the chosen values and what the tuning runs
  cost, their compute spent before any seed ran), then each curve's total tuning cost."""
  unit, scale = flop_unit(p["tuning"]["flops"] for p in pts if p["tuning"])
  lines = ["", "Budgets and tuning, per point: the step budget; the resolution of the "
           "steps to target (the crossing lies within that many steps before the reported "
           "step; the coarsest seed's); the tuned values (experiments/sweeps/tuning.py, one "
           "rule for every point; * a value at the edge of its extended grid); the tuning "
           "runs (on the tuning seed) and their training compute and modelled time, one run "
           "after another, on " + PRESETS[0] + "; the chosen tuning run's steps to target "
           "beside the reported seeds' median (the tuning seed is not among them where "
           "others ran); where the schedule's length was tuned, the chosen rates' run over "
           "the whole budget:", "",
           "| curve | point | step budget | resolution (steps) | tuned values | tuning runs "
           f"| tuning {unit} | tuning time " + PRESETS[0] + " (s) | chosen run's steps | "
           "reported seeds' median | whole-budget schedule's steps |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  totals: dict[str, list] = {}
  for p in pts:
    res = "-" if p["resolution_steps"] is None else str(p["resolution_steps"])
    budget = "-" if p["step_budget"] is None else str(p["step_budget"])
    t = p["tuning"]
    if t is None:
      lines.append(f"| {p['curve']} | {p['point']} | {budget} | {res} | untuned | 0 | 0 | 0 "
                   f"| - | {_steps(p)} | - |")
      continue
    chosen = ", ".join(f"{k.rsplit('.', 1)[-1]} {_value(v)}" for k, v in t["chosen"].items())
    edge = " *" if t["at_edge"] else ""
    runs = f"{t['runs']} ({t['diverged']} diverged)" if t["diverged"] else str(t["runs"])
    lines.append(f"| {p['curve']} | {p['point']} | {budget} | {res} | {chosen}{edge} | {runs} "
                 f"| {t['flops'] / scale:.2f} | {t['time_s'][PRESETS[0]]:.1f} "
                 f"| {_value(p['tuning_seed_steps']) if p['tuning_seed_steps'] else '-'} "
                 f"| {_steps(p)} | {_value(t['whole_schedule_steps'] or '-')} |")
    total = totals.setdefault(p["curve"], [0, 0.0, 0.0])
    total[0] += t["runs"]
    total[1] += t["flops"]
    total[2] += t["time_s"][PRESETS[0]]
  if totals:
    lines += ["", "Tuning, per curve (the cost a user pays to find the points above):", "",
              f"| curve | tuning runs | tuning {unit} | tuning time " + PRESETS[0] + " (s) |",
              "|---|---|---|---|"]
    lines += [f"| {c} | {n} | {f / scale:.2f} | {t:.1f} |" for c, (n, f, t) in totals.items()]
  return lines


def _rest(p: dict) -> str:
  """The final model on the eval examples no evaluation saw, over the seeds that have it."""
  if p["rest"] is None:
    return "-"
  seeds = "" if p["rest_seeds"] == p["seeds"] else f" ({p['rest_seeds']}/{p['seeds']} seeds)"
  return _fmt(p["rest"], digits=4) + seeds


def table(runs: list[dict]) -> str:
  pts = points(runs)
  targets = sorted({r["target"] for r in runs})
  rest = any(p["rest"] is not None for p in pts)
  unit, scale = flop_unit(p["flops"]["min"] for p in pts)
  taught = any(r.get("teacher_s") for r in runs)
  lines = [f"Target: {', '.join(targets)}. Measured on this host: steps to target, XLA FLOPs, "
           "host train time, one device's step (cost.device_step_time_s: a calibration run "
           "timed apart; else host step / D). Modelled: the critical-path time on D devices "
           "= steps x device step + the training collectives of the method's compiled "
           "programs per interconnect preset (runs without them: one ring all-reduce per "
           "step or outer step, labelled legacy) + pool building"
           + (" + a distillation teacher's training" if taught else "")
           + " (ensemble_jax/costs.py). "
           "The evaluations up to the target (measured eval time per device plus their "
           "collectives) are off the critical path for every method and reported beside it, "
           f"and charged on it in the next column ({EVALUATION_PRESET}): the answer does not "
           "turn on leaving them out. Each cell: "
           "median [min, max] over the seeds reported: every seed but the tuning seed "
           "(whose run won the choice of values; its steps are in the tuning table) when "
           "others ran." + (" Final: the metric at the stop on the evaluated examples; "
                            "on the rest: the same model on the eval split's examples that "
                            "no evaluation, stop or tuning choice saw." if rest else ""), "",
           f"| curve | point | D | seeds reached | steps to target | {unit} to target | "
           + " | ".join(f"time {p} (s)" for p in PRESETS)
           + f" | evaluations {EVALUATION_PRESET} (s) | {CHARGED} | host train s | final |"
           + (" final on the rest |" if rest else ""),
           "|---|---|---|---|---|---|" + "---|" * len(PRESETS) + "---|---|---|---|"
           + ("---|" if rest else "")]
  for p in pts:
    lines.append(f"| {p['curve']} | {p['point']} | {p['devices']} | {p['reached']}/{p['seeds']} "
                 f"| {_fmt(p['steps'], digits=0)} | {_fmt(p['flops'], scale, 2)} | "
                 + " | ".join(_fmt(p["time_s"][q]) for q in PRESETS)
                 + f" | {'-' if p['evaluation_s'] is None else _fmt(p['evaluation_s'])}"
                 + f" | {'-' if p['charged_s'] is None else _fmt(p['charged_s'])}"
                 + f" | {_fmt(p['host_time_s'])} | {_fmt(p['final'], digits=4)} |"
                 + (f" {_rest(p)} |" if rest else ""))
  baselines = baseline_curves(pts)
  curves = sorted({p["curve"] for p in pts} - set(baselines))
  if baselines and curves:
    lines += _matched_table(pts, curves, baselines)
    lines += _ratio_table(pts, curves, None,
                          "Summary against the same frontier: the best ratio over the "
                          "baselines' budgets (a second number, not the matched one), the "
                          "baseline point compared named; an absent ratio says why (every "
                          "point missed the target, no baseline reached it, or no point is "
                          "as cheap / fast as any baseline point):")
  lines += _tuning_table(pts)
  if baselines and curves:
    for b in baselines:
      lines += _ratio_table(pts, curves, [b], f"Against `{b}` alone (best over its budgets):")
  lines += _amortised_table(runs, baselines)
  return "\n".join(lines) + "\n"


# A what-if curve's suffix: its synthetic sets built once, its teacher trained once, reused
AMORTISED = "_amortised"


def amortised(runs: list[dict]) -> list[dict]:
  """The runs on synthetic sets or with a teacher as a what-if: the sets built once and the
  teacher trained once, reused by many trainings, so neither's time nor compute is charged
  (curve + AMORTISED). Never part of a study's answer, which charges every build and every
  teacher."""
  out = []
  for r in runs:
    teacher_s = r.get("teacher_s") or {}
    if not (r.get("synthetic") or teacher_s):
      continue
    pool_s, pool_flops = ((r["pool_build_s"], r["pool_build_flops"]) if r.get("synthetic")
                          else (0.0, 0.0))
    reused_s = {p: pool_s + teacher_s.get(p, 0.0) for p in r["time_s"]}
    out.append({**r, "curve": r["curve"] + AMORTISED,
                "time_s": {p: t - reused_s[p] for p, t in r["time_s"].items()},
                "flops": r["flops"] - pool_flops - r.get("teacher_flops", 0.0),
                "charged_s": None if r["charged_s"] is None
                else r["charged_s"] - reused_s[EVALUATION_PRESET]})
  return out


def _amortised_table(runs: list[dict], baselines: list[str]) -> list[str]:
  whatif = amortised(runs)
  if not whatif or not baselines:
    return []
  pts = points([r for r in runs if r["curve"] in baselines] + whatif)
  curves = sorted({r["curve"] for r in whatif})
  reused = [what for what, runs_of in (
      ("on synthetic distilled sets with the sets built once", "synthetic"),
      ("with a distillation teacher trained once", "teacher_s")) if any(r.get(runs_of)
                                                                      for r in whatif)]
  return ["", f"What-if, not the answer: the curves {' or '.join(reused)} and reused by many "
          "trainings, their distillation's or teacher's time and compute not charged (the "
          "tables above charge them)."] + _matched_table(pts, curves, baselines)


def plain_log_ticks(ax, axes: str = "xy") -> None:
  """Label log axes 3, 10, 30 rather than 3x10^0: ticks at 1, 2, 5 times each power of
  ten (more on a short range; every power of two on a base-2 axis), as plain numbers."""
  from matplotlib import ticker

  plain = ticker.FuncFormatter(lambda v, _: f"{v:,g}")
  for name in axes:
    axis = ax.xaxis if name == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if name == "x" else ax.get_ylim())
    if axis.get_scale() != "log" or lo <= 0:
      continue
    if getattr(axis.get_transform(), "base", 10) == 2:
      axis.set_major_locator(ticker.LogLocator(base=2))
    else:
      subs = ((1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0) if hi / lo < 5 else
              (1.0, 2.0, 3.0, 5.0) if hi / lo < 30 else (1.0, 2.0, 5.0))
      axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(ticker.NullFormatter())


def label_points(ax, labels: list[tuple[float, float, str, str]], fontsize: float = 7) -> None:
  """Write each (x, y, text, colour) beside its point, at the first of a few offsets where
  it overlaps no label already placed and no other point (the first offset if none is
  free)."""
  fig = ax.figure
  renderer = fig.canvas.get_renderer()
  to_px = ax.transData.transform
  dots = [to_px((x, y)) for x, y, _, _ in labels]
  placed = []
  for (x, y, text, color), (px, py) in zip(labels, dots):
    best = None
    for dx, dy, ha, va in ((4, 3, "left", "bottom"), (4, -3, "left", "top"),
                           (-4, 3, "right", "bottom"), (-4, -3, "right", "top"),
                           (0, 7, "center", "bottom"), (0, -7, "center", "top")):
      note = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                         ha=ha, va=va, fontsize=fontsize, color=color,
                         bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none",
                               "alpha": 0.7})
      box = note.get_window_extent(renderer).expanded(1.05, 1.1)
      clear = (not any(box.overlaps(b) for b in placed)
               and not any(box.contains(qx, qy) for qx, qy in dots if (qx, qy) != (px, py)))
      if clear or best is None:
        if best is not None:
          best[0].remove()
        best = (note, box)
      else:
        note.remove()
      if clear:
        break
    placed.append(best[1])


MISSED_CAPTION = ("points that missed the target on some seed are drawn apart, below the "
                  "plane, at the time their runs spent (not a time to the target)")


def plot(runs: list[dict], path: str, preset: str) -> None:
  """Compute vs time to the target, one colour per curve, each point labelled with its
  name; the strongest baseline's frontier drawn, and the region it beats shaded.

  Only points that reached the target on every seed stand in the plane: a point that
  missed on any seed has no time to the target, and placed at its budget it could read as
  a win (left of the frontier, outside the shaded region). Those are drawn in a strip
  below the plane, at the time their runs spent, marked 'missed on k of n seeds'."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  pts = points(runs)
  missed = [p for p in pts if p["reached"] < p["seeds"]]
  rows = [(p["curve"], p["point"]) for p in missed]  # the strip's: one per missed point
  if missed:
    fig, (ax, strip) = plt.subplots(
        2, 1, figsize=(8.6, 5.5 + 0.25 * len(rows)), sharex=True,
        gridspec_kw={"height_ratios": [5.2, 0.3 + 0.25 * len(rows)]})
  else:
    (fig, ax), strip = plt.subplots(figsize=(8.6, 5.2)), None
  labels, strip_labels = _plot_curves(ax, strip, pts, rows, preset)
  _shade_baseline(ax, pts, preset)
  _describe_axes(ax, strip, runs, pts, rows, preset)
  fig.tight_layout()
  label_points(ax, labels)
  if strip is not None:
    label_points(strip, strip_labels)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _plot_curves(ax, strip, pts: list[dict], rows: list[tuple], preset: str):
  """Each curve's points (in the plane, or in the strip where a seed missed) and its
  frontier; (the plane's labels, the strip's labels)."""
  labels, strip_labels, named = [], [], set()
  curves = sorted({p["curve"] for p in pts})
  for i, curve in enumerate(curves):
    color, mine = f"C{i}", [p for p in pts if p["curve"] == curve]
    for p in mine:
      t, c = p["time_s"][preset], p["flops"]
      label = curve if curve not in named else None
      named.add(curve)
      xerr = [[t["median"] - t["min"]], [t["max"] - t["median"]]]
      if p["reached"] < p["seeds"]:
        row = len(rows) - 1 - rows.index((curve, p["point"]))  # the first at the top
        strip.errorbar(t["median"], row, xerr=xerr, fmt="x", color=color, ms=6, capsize=2,
                       label=label)
        strip_labels.append((t["median"], row,
                             f"{p['point']}: missed on {p['seeds'] - p['reached']} of "
                             f"{p['seeds']} seeds", color))
        continue
      ax.errorbar(t["median"], c["median"] / 1e12, xerr=xerr,
                  yerr=[[(c["median"] - c["min"]) / 1e12], [(c["max"] - c["median"]) / 1e12]],
                  fmt="o", color=color, ms=5, capsize=2, label=label)
      labels.append((t["median"], c["median"] / 1e12, p["point"], color))
    front = pareto([(p["time_s"][preset]["median"], p["flops"]["median"]) for p in mine
                    if p["reached"] == p["seeds"]])
    ax.plot([f[0] for f in front], [f[1] / 1e12 for f in front], color=color, lw=1)
  return labels, strip_labels


def _shade_baseline(ax, pts: list[dict], preset: str) -> None:
  """Log axes with room for the labels, the strongest baseline's frontier and the region
  it beats."""
  ax.set_xscale("log")
  ax.set_yscale("log")
  (left, right), (bottom, top) = ax.get_xlim(), ax.get_ylim()
  right, top = right * 1.08, top * 1.15  # room for the labels of the outermost points
  base = pareto([(t, c) for t, c, _ in _reached(pts, baseline_curves(pts), preset)])
  if base:  # the strongest baseline: the frontier of every single-model curve's points
    xs = [t for t, _ in base]
    ys = [c / 1e12 for _, c in base]
    ax.step(xs, ys, where="post", color="k", ls="--", lw=1.2,
            label="strongest baseline (frontier)")
    # every point up and to the right of the frontier is slower and costlier than a baseline
    ax.fill_between(xs + [right], ys + [ys[-1]], top, step="post", color="0.5", alpha=0.12,
                    lw=0, label="beaten by the strongest baseline")
  ax.set_xlim(left, right)
  ax.set_ylim(bottom, top)
  plain_log_ticks(ax)


def _describe_axes(ax, strip, runs: list[dict], pts: list[dict], rows: list[tuple],
                   preset: str) -> None:
  """The axes' labels, the title (targets, preset, seeds) and the legend of both panels."""
  xlabel = f"time to target on D devices (s; modelled from measured steps, {preset})"
  if strip is not None:
    strip.set_ylim(-0.7, len(rows) - 0.3)
    strip.set_yticks([])
    strip.set_ylabel("missed", fontsize=8)
    strip.set_xlabel(f"time on D devices (s; modelled from measured steps, {preset}): "
                     "to target in the plane, spent below", fontsize=9)
  else:
    ax.set_xlabel(xlabel)
  ax.set_ylabel("training compute to target (TFLOPs, XLA)")
  targets = ", ".join(sorted({r["target"] for r in runs}))
  seeds = sorted({p["seeds"] for p in pts})
  spread = ("one seed per point" if seeds == [1] else
            "median and min-max over seeds")
  apart = f"; {MISSED_CAPTION}" if rows else ""
  ax.set_title(f"cost vs time to {targets}; interconnect {preset}; lower left is better\n"
               f"{spread}; in the plane only points that reached the target on every seed"
               f"{apart}", fontsize=8, wrap=True)
  handles = [h for a in (ax, strip) if a is not None for h in a.get_legend_handles_labels()[0]]
  names = [n for a in (ax, strip) if a is not None for n in a.get_legend_handles_labels()[1]]
  ax.legend(handles, names, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0)


def _whole_budget_seeds(point_dir: str, tuning_seed: int) -> list[int | None]:
  """Steps to target (None: missed) of the point's runs over the whole budget on seeds
  other than the tuning seed: its seed runs, or those set aside once a shorter schedule
  was chosen (`superseded/`)."""
  steps = []
  for path in sorted(glob.glob(os.path.join(point_dir, "seed*", "results.json"))
                     + glob.glob(os.path.join(point_dir, "superseded", "seed*", "results.json"))):
    r = stored.load(path)
    fraction = r["config"].get("train", {}).get("schedule_fraction", 1.0)
    if r["config"]["seed"] != tuning_seed and fraction == 1.0:
      steps.append(r["target"]["reached_step"] if r["target"]["reached"] else None)
  return steps


def schedule_check(results_dir: str) -> str:
  """Does tuning the schedule's length move a point? Per point whose tuning record has the
  schedule axis: its chosen rates' tuning runs at each fraction of the budget (tune.seed,
  then tune.schedule_seeds where run), the fraction chosen, and the whole-budget runs' range
  over the reported seeds."""
  records = sorted(glob.glob(os.path.join(results_dir, "*", "*", "tuning.json")),
                   key=lambda p: _in_order(tuple(os.path.relpath(p, results_dir).split(os.sep)[:2])))
  axes = {}
  for path in records:
    with open(path) as f:
      record = json.load(f)
    axis = next((a for a in record["axes"]
                 if a.get("key") == config_lib.SCHEDULE_FRACTION), None)
    if axis is not None:
      axes[path] = (record, axis)
  # every fraction some point tried (the axis is extended past its edges), longest first
  fractions = sorted({r["value"] for _, a in axes.values() for r in a["runs"]} or
                     {1.0, 0.5, 0.25}, reverse=True)
  lines = ["| curve | point | " + " | ".join(f"schedule x{f:g} (steps, tuning seeds)"
                                             for f in fractions)
           + " | chosen | whole budget, other seeds (steps) |",
           "|---|---|" + "---|" * len(fractions) + "---|---|"]
  for path, (record, axis) in axes.items():
    curve, point = os.path.relpath(path, results_dir).split(os.sep)[:2]
    by_value = {r["value"]: r for r in axis["runs"]}

    def outcome(r):
      if r["reached"]:
        return str(r["steps_to_target"])
      return f"lost (stopped at {r['stopped_at_step']})" if r.get("stopped_at_step") else "missed"

    def cell(fraction):  # the tuning seed's run, then the other tuning seeds' (if run)
      r = by_value.get(fraction)
      return "-" if r is None else " / ".join(map(outcome, [r, *r.get("other_seeds", ())]))

    seeds = _whole_budget_seeds(os.path.dirname(path), record["seed"])
    reached = [s for s in seeds if s is not None]
    spread = ("-" if not seeds else f"{min(reached)}-{max(reached)} ({len(seeds)} seeds)"
              if len(reached) == len(seeds) else f"{len(reached)}/{len(seeds)} reached")
    lines.append(f"| {curve} | {point} | " + " | ".join(cell(f) for f in fractions)
                 + f" | x{axis['chosen']:g} | {spread} |")
  return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def table_md(results_dir: str, runs: list[dict]) -> str:
  """table.md's text: the grid's table and, where its tuning varied the schedule's length,
  the schedule check."""
  text = table(runs)
  check = schedule_check(results_dir)
  if check:
    text += ("\nDoes the schedule's length move a point? The chosen rates' tuning runs at "
             "each fraction of the budget (on the tuning seeds, 0 then 1000 where a length "
             "reached the target on 0; 'lost': stopped once it could no longer be chosen), "
             "and the whole-budget runs of the reported seeds:\n\n" + check)
  return text


def write(results_dir: str, out: str, runs: list[dict] | None = None) -> str:
  """Writes table.md (`table_md`) and one cost-vs-time figure per preset into `out`."""
  runs = load_runs(results_dir) if runs is None else runs
  if not runs:
    raise FileNotFoundError(f"no results.json under {results_dir}")
  os.makedirs(out, exist_ok=True)
  text = table_md(results_dir, runs)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text)
  for preset in PRESETS:
    plot(runs, os.path.join(out, f"cost_vs_time_{preset}.png"), preset)
  return text


def _plural(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _skipped(path: str, why) -> None:
  """One line on stderr for what a folder of runs holds besides runs, so that the report on
  stdout stays a report."""
  print(f"skipped {path}: {why}", file=sys.stderr)


_SAID_UNFINISHED: set[str] = set()  # said once per process: one reading loads a tree often


def _left_out_if_unfinished(workdir: str) -> bool:
  """Says so of a workdir with checkpoints and no results.json: a run not finished yet."""
  unfinished = (os.path.isdir(os.path.join(workdir, CHECKPOINTS))
                and not os.path.exists(os.path.join(workdir, "results.json")))
  if unfinished and workdir not in _SAID_UNFINISHED:
    _SAID_UNFINISHED.add(workdir)
    print(f"left out {workdir}: unfinished (checkpoints, no results.json yet); rerun its "
          "command to finish it", file=sys.stderr)
  return unfinished


def find_runs(folder: str) -> list[str]:
  """The run workdirs below `folder` (any depth, symlinked ones followed): each directory
  holding a results.json, tuning runs (`tune/`) left out, unfinished ones said so."""
  found, seen = [], set()
  for root, dirs, files in os.walk(folder, followlinks=True):
    seen.add(os.path.realpath(root))  # a link back up is walked once
    dirs[:] = sorted(d for d in dirs if d not in ("tune", CHECKPOINTS)
                     and not d.startswith(".")  # .git, .venv: no runs
                     and os.path.realpath(os.path.join(root, d)) not in seen)
    if "results.json" in files:
      found.append(root)
    else:
      _left_out_if_unfinished(root)
  return found


def _ending(results: dict) -> str:
  """How a run ended: at its target, at its budget, or earlier on purpose."""
  steps, budget = results["steps"], results.get("step_budget", results["steps"])
  if steps >= budget:
    return "full budget"
  if results["target"]["reached"] and results["target"]["reached_step"] == steps:
    return "stopped at target"
  return f"stopped at step {steps}"


def compare_runs(folder: str, preset: str = "ib_xdr800") -> str:
  """The runs below `folder` side by side, whatever their layout: each run's method and
  config say what it is. Runs stopped at their target and runs trained to their budget are
  told apart, since their final metrics are not comparable."""
  rows = []
  for workdir in find_runs(folder):
    try:
      r = read_run(os.path.join(workdir, "results.json"))
    except stored.NotARun as e:
      _skipped(os.path.join(workdir, "results.json"), e)
      continue
    t, cost, method = r["target"], r["cost"], r["config"]["method"]
    who = (f"N={method['num_workers']}" if "num_workers" in r  # a stacked method's workers
           else f"D={cost['modelled']['devices']}")
    time_s = cost["modelled"]["critical_path_s"]
    time_s = time_s.get(preset, next(iter(time_s.values())))
    rows.append(
        f"| {os.path.relpath(workdir, folder)} | {r['method']} {who} | {r['config']['seed']} "
        f"| {r['steps']} / {r.get('step_budget')} | {_ending(r)} | "
        f"{t['reached_step'] if t['reached'] else 'not reached'} | "
        f"{r['final'].get(t['metric'], float('nan')):.4g} | "
        + (f"{cost['measured']['flops_to_target'] / 1e12:.3g} | {time_s:.1f}"
           f"{legacy_label(cost)} |" if t["reached"] else "- | - |"))
  if not rows:
    return ""
  metric = t["metric"]
  ended = {row.split(" | ")[4] for row in rows}
  note = ("\nSome runs stopped at their target and others trained to their budget: compare "
          "their steps to the target, not their final " + metric + ".\n"
          if "stopped at target" in ended and "full budget" in ended else "")
  head = ["| run | method | seed | steps / budget | ended | target reached at step | "
          f"final {metric} | TFLOPs to target | time to target (s, {preset}, modelled) |",
          "|---|---|---|---|---|---|---|---|---|"]
  return f"Target: {metric} {t['value']}.{note}\n" + "\n".join(head + rows)


def legacy_label(cost: dict) -> str:
  """' (legacy communication model)' for a run priced by the single-all-reduce model (its
  programs' collectives never read: `costs.legacy_communication`), else ''."""
  source = cost.get("modelled", {}).get("collectives_source", "legacy")
  return " (legacy communication model)" if source.startswith("legacy") else ""


def run_summary(results: dict) -> str:
  """One run's results.json as Markdown: what ran, its target, cost and eval history."""
  t, cost = results["target"], results["cost"]
  metric = t["metric"]
  reached = (f"reached at step {t['reached_step']} ({t['reached_time_s']:.1f} s of training)"
             if t["reached"] else "not reached")
  lines = [f"{results['method']}, {results['steps']} of {results.get('step_budget')} steps, "
           f"mesh {results['mesh']}",
           f"target {metric} {t['value']}: {reached}; final {metric} "
           f"{results['final'].get(metric)}",
           f"to target: {cost['measured']['steps_to_target']} steps, "
           f"{cost['measured']['flops_to_target'] / 1e12:.3g} TFLOPs; modelled time on "
           f"{_plural(cost['modelled']['devices'], 'device')}: "
           + ", ".join(f"{k} {v:.1f} s" for k, v in
                       cost["modelled"]["critical_path_s"].items()) + legacy_label(cost),
           "", "| step | train time (s) | " + metric + " |", "|---|---|---|"]
  lines += [f"| {h['step']} | {h['train_time_s']:.1f} | {h.get(metric)} |"
            for h in results["history"]]
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("results_dir", help="a sweep's results tree, or one run's workdir")
  p.add_argument("--out", default="", help="where table.md and the PNGs go")
  args = p.parse_args(argv)
  one_run = os.path.join(args.results_dir, "results.json")
  try:
    if os.path.isfile(one_run):
      print(run_summary(read_run(one_run)))
      return 0
    runs = load_runs(args.results_dir)
    if runs:
      print(write(args.results_dir, args.out or args.results_dir, runs))
      return 0
    compared = compare_runs(args.results_dir)
    if not compared:
      raise FileNotFoundError(
          f"no results.json under {args.results_dir}. Give one run's workdir, a folder "
          "holding run workdirs (at any depth), or a sweep's tree "
          "<curve>/<point>/seed<k>/results.json.")
    print(compared)
  except stored.NotARun as e:  # one run's workdir only: a folder's are skipped
    print(f"error: {one_run}: {e}")
    return 2
  except FileNotFoundError as e:
    print(f"error: {e}")
    return 2
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
