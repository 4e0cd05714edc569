"""Which committed tuning choices the current tuning rule would move, and what re-running
them costs: experiments/results/rerun_plan.{json,md}, read by the background re-run queue.

  python -m experiments.rerun_plan [--results=experiments/results] [--write]

Reads every committed `tuning.json` (nothing trains, nothing is re-tuned) and applies the
two clauses issue 58 added to experiments/sweeps/tuning.py:
  - the schedule's margin: a length whose run on some tuning seed reached the target after
    `tune.schedule_margin` of its schedule's steps counts as a miss, so such a chosen length
    moves;
  - no stop at an edge below the cap: a rate whose best sat at its grid's edge once the
    record's `max_extensions` ran out (fewer than the current cap) is extended further.
Each moved point's cost is the committed host wall-clock of its runs (its tuning runs: an
upper bound on re-tuning, whose finished runs are read back, and its reported seeds, which
re-run at the new choice), plus the grids that train at its choice (the many-worker grids
read the full grids' N = 8 choices; the demo and one-device grids the full grid's).
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from ensemble_jax import config_lib, stored
from experiments.sweeps import tuning

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SCHEDULE = config_lib.SCHEDULE_FRACTION
DEFAULTS = config_lib.base_config().tune
# grids that train at a full grid's choice: {(workload, point): [their results dirs]}
FEEDS = {("fashion_mnist", "N8_L235"): ["many_workers"],
         ("pydocs_gpt2", "N8_L300"): ["many_workers_pydocs"]}
FEEDS_ANY = {"fashion_mnist": ["one_device_h200/fashion_mnist"]}  # the same (curve, point)


def _seeds(row: dict) -> list[dict]:
  """A schedule row's runs: the tuning seed's, then the other tuning seeds'."""
  return [row, *row.get("other_seeds", [])]


def _late(run: dict, margin: float) -> bool:
  return bool(run["reached"] and run["steps_to_target"] > margin * run["step_budget"])


def moves(record: dict, margin: float = DEFAULTS.schedule_margin,
          cap: int = DEFAULTS.max_extensions) -> list[str]:
  """Why the current rule would move this committed record's choice ([]: it stands)."""
  why = []
  for axis in record["axes"]:
    if axis["key"] == SCHEDULE:
      row = next(r for r in axis["runs"] if r["value"] == axis["chosen"])
      if late := [r for r in _seeds(row) if _late(r, margin)]:
        steps = ", ".join(f"{r['steps_to_target']} of {r['step_budget']}" for r in late)
        why.append(f"schedule {axis['chosen']:g} reached the target late on "
                   f"{len(late)}/{len(_seeds(row))} tuning seeds (step {steps}; margin "
                   f"{margin:g})")
    elif axis["at_edge"]:
      side = "high" if axis["chosen"] == max(r["value"] for r in axis["runs"]) else "low"
      if axis["extensions"][side] < cap:
        why.append(f"{axis['key'].rsplit('.', 1)[-1]} {axis['chosen']:g} at the {side} edge "
                   f"after {axis['extensions'][side]} extensions (cap now {cap})")
  return why


def _wall(paths) -> float:
  total = 0.0
  for path in paths:
    total += stored.load(path).get("wall_time_s") or 0.0
  return total


def plan(results: str = RESULTS) -> list[dict]:
  """One row per committed point the current rule would move, with its re-run cost."""
  rows = []
  for path in sorted(glob.glob(os.path.join(results, "**", tuning.TUNING_FILE), recursive=True)):
    with open(path) as f:
      record = json.load(f)
    if not (why := moves(record)):
      continue
    point_dir = os.path.dirname(path)
    rel = os.path.relpath(point_dir, results)
    workload, *_, curve, point = rel.split(os.sep)
    seeds = glob.glob(os.path.join(point_dir, "seed*", "results.json"))
    tune_runs = glob.glob(os.path.join(point_dir, "tune", "*", "results.json"))
    feeds = []
    for grid in FEEDS.get((workload, point), []):
      runs = glob.glob(os.path.join(results, grid, curve, "*", "seed*", "results.json"))
      if runs:
        feeds.append({"grid": f"{grid}/{curve}", "runs": len(runs), "wall_s": _wall(runs)})
    for grid in FEEDS_ANY.get(workload, []):
      runs = glob.glob(os.path.join(results, grid, curve, point, "seed*", "results.json"))
      if runs:
        feeds.append({"grid": f"{grid}/{curve}/{point}", "runs": len(runs),
                      "wall_s": _wall(runs)})
    rows.append({"point": rel, "why": why, "chosen": record["chosen"],
                 "seed_runs": len(seeds), "seeds_wall_s": round(_wall(seeds), 1),
                 "tuning_runs": len(tune_runs), "tuning_wall_s": round(_wall(tune_runs), 1),
                 "feeds": [{**f, "wall_s": round(f["wall_s"], 1)} for f in feeds]})
  return rows


def config_value(run: dict, key: str):
  """A run's config value at a dotted key (the base config's where its record predates it)."""
  value, default = run["config"], config_lib.base_config()
  for part in key.split("."):
    default = getattr(default, part)
    if not isinstance(value, dict) or part not in value:
      return default
    value = value[part]
  return value


def _feed_points(results: str):
  """(grid, curve, point dir, the full grid's tuning.json it trains at) for every point of
  a grid that trains at a full grid's choice."""
  for (workload, source), grids in FEEDS.items():
    for grid in grids:
      for point_dir in sorted(glob.glob(os.path.join(results, grid, "*", "*"))):
        curve = os.path.basename(os.path.dirname(point_dir))
        yield grid, curve, point_dir, os.path.join(results, workload, curve, source)
  for workload, grids in FEEDS_ANY.items():
    for grid in grids:
      for point_dir in sorted(glob.glob(os.path.join(results, grid, "*", "*"))):
        curve, point = point_dir.split(os.sep)[-2:]
        yield grid, curve, point_dir, os.path.join(results, workload, curve, point)


def stale_feeds(results: str = RESULTS) -> list[dict]:
  """The points of the grids trained at a full grid's choice whose runs' values differ from
  that grid's current `tuning.json` choice (it was re-tuned since): they need a re-run."""
  rows = []
  for grid, curve, point_dir, source in _feed_points(results):
    path = os.path.join(source, tuning.TUNING_FILE)
    runs = sorted(glob.glob(os.path.join(point_dir, "seed*", "results.json")))
    if not runs or not os.path.exists(path):
      continue
    with open(path) as f:
      chosen = json.load(f)["chosen"]
    trained = {tuple(config_value(stored.load(r), k) for k in chosen) for r in runs}
    if trained == {tuple(chosen.values())}:
      continue
    rows.append({"point": os.path.relpath(point_dir, results),
                 "source": os.path.relpath(source, results),
                 "trained": [dict(zip(chosen, values)) for values in sorted(trained)],
                 "chosen": chosen, "runs": len(runs), "wall_s": round(_wall(runs), 1)})
  return rows


def batch_norm_plan(results: str = RESULTS) -> list[dict]:
  """The data-parallel points (D >= 2) whose runs trained with another BatchNorm than their
  study now trains (its `study.json`'s config.method.batchnorm; records from before the
  field read synchronised), with their re-run cost and their steps' all-reduce count. They
  stand, priced as they compiled, until re-run (`cost_vs_time --start_over`)."""
  rows = []
  for study_path in sorted(glob.glob(os.path.join(results, "*", "study.json"))):
    workdir = os.path.dirname(study_path)
    with open(study_path) as f:
      points = json.load(f)["points"]
    for point, config in sorted(points.items()):
      now = stored.migrate_config(config)["method"]["batchnorm"]
      seeds = sorted(glob.glob(os.path.join(workdir, point, "seed*", "results.json")))
      runs = [stored.load(path) for path in seeds]
      trained = {r["config"]["method"]["batchnorm"] for r in runs}
      if not runs or runs[0]["method"] != "data_parallel" or trained == {now}:
        continue
      modelled = runs[0].get("cost", {}).get("modelled", {})
      if modelled.get("devices", 1) < 2:
        continue
      tune_runs = glob.glob(os.path.join(workdir, point, "tune", "*", "results.json"))
      rows.append({"point": os.path.relpath(os.path.join(workdir, point), results),
                   "devices": modelled["devices"], "trained": sorted(trained), "now": now,
                   "all_reduces_per_step": sum(
                       c["count"] for c in modelled.get("collectives", [])
                       if c["per"] == "step" and c["kind"] == "all-reduce"),
                   "seed_runs": len(seeds), "seeds_wall_s": round(_wall(seeds), 1),
                   "tuning_runs": len(tune_runs),
                   "tuning_wall_s": round(_wall(tune_runs), 1)})
  return rows


def _values(choice: dict) -> str:
  return ", ".join(f"{k.rsplit('.', 1)[-1]} {v:g}" for k, v in choice.items())


def markdown(rows: list[dict], bn_rows: list[dict] = (), stale: list[dict] = ()) -> str:
  schedule = sum(any(w.startswith("schedule") for w in r["why"]) for r in rows)
  edge = sum(any("edge" in w for w in r["why"]) for r in rows)
  total = sum(r["seeds_wall_s"] + r["tuning_wall_s"] + sum(f["wall_s"] for f in r["feeds"])
              for r in rows)
  lines = [
      "# Re-run plan: committed tuning choices the current rule moves",
      "",
      "Generated by `python -m experiments.rerun_plan --write` from the committed "
      "`tuning.json` records (nothing re-tuned or trained). The rule (experiments/sweeps/"
      f"tuning.py, issue 58): a schedule's length is chosen only if every tuning seed "
      f"reaches the target within {DEFAULTS.schedule_margin:g} of its steps; a rate at its "
      f"grid's edge is extended until interior or diverged, up to {DEFAULTS.max_extensions} "
      "extensions per edge. Until a point is re-run its committed record and seeds stand, "
      "and the reports read them as before (`--recost` keeps a record whose replay moves).",
      "",
      f"{len(rows)} points: {schedule} schedule choices fail the margin, {edge} rate choices "
      f"sit at an edge. Cost, committed host wall-clock on the 2-core host: "
      f"{total / 3600:.1f} h upper bound (every tuning run again, the seeds, and the grids "
      "that train at the choice); the grids still trained at a full grid's former choice "
      "follow, then the data-parallel points trained with another BatchNorm.",
      "",
      "| point | why it moves | committed choice | seed runs (wall s) | tuning runs (wall s) "
      "| grids trained at its choice (runs, wall s) |",
      "|---|---|---|---|---|---|"]
  for r in rows:
    chosen = _values(r["chosen"])
    feeds = "; ".join(f"{f['grid']} ({f['runs']}, {f['wall_s']:.0f})" for f in r["feeds"])
    lines.append(f"| {r['point']} | {'; '.join(r['why'])} | {chosen} | {r['seed_runs']} "
                 f"({r['seeds_wall_s']:.0f}) | {r['tuning_runs']} ({r['tuning_wall_s']:.0f}) "
                 f"| {feeds or '-'} |")
  if stale:
    hours = sum(r["wall_s"] for r in stale) / 3600
    lines += [
        "", "## Grids trained at a full grid's former choice", "",
        "These points train at a full grid's tuning choice (`configs.tuned_choice`: the "
        "many-worker grids read the N = 8 point's, the one-device grid its namesake's), and "
        "their runs hold values that are no longer that point's `tuning.json` choice: the "
        "full grid was re-tuned after they ran. They stand for the former choice until "
        f"re-run at the current one: {len(stale)} points, {hours:.1f} h committed host "
        "wall-clock (the one-device grid's on its GPU).", "",
        "| point | trained at | full grid's point | its choice now | runs (wall s) |",
        "|---|---|---|---|---|"]
    lines += [f"| {r['point']} | {'; '.join(_values(c) for c in r['trained'])} | "
              f"{r['source']} | {_values(r['chosen'])} | {r['runs']} ({r['wall_s']:.0f}) |"
              for r in stale]
  if bn_rows:
    hours = sum(r["seeds_wall_s"] + r["tuning_wall_s"] for r in bn_rows) / 3600
    lines += [
        "", "## Data-parallel points trained with another BatchNorm", "",
        "The points below hold runs trained with another BatchNorm (`method.batchnorm`) "
        "than their grid now trains: synchronised statistics hold one all-reduce per "
        "layer's, forward and backward, a chain no compiler combines; per-device ones none "
        "(the grid's data-parallel curves train per device, as the critical-batch runs "
        "behind the projection do, and the `*_sync_bn` curves synchronised). They stand, "
        "priced as they compiled, until re-run (`cost_vs_time --start_over`, which moves "
        f"their records aside): {len(bn_rows)} points, {hours:.1f} h committed host "
        "wall-clock (seeds and tuning).", "",
        "| point | D | trained | now | all-reduces a step | seed runs (wall s) | "
        "tuning runs (wall s) |",
        "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['point']} | {r['devices']} | {', '.join(r['trained'])} | {r['now']} | "
              f"{r['all_reduces_per_step']} | "
              f"{r['seed_runs']} ({r['seeds_wall_s']:.0f}) | {r['tuning_runs']} "
              f"({r['tuning_wall_s']:.0f}) |" for r in bn_rows]
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--results", default=RESULTS)
  parser.add_argument("--write", action="store_true",
                      help="write rerun_plan.json and rerun_plan.md into --results")
  args = parser.parse_args(argv)
  rows, bn_rows = plan(args.results), batch_norm_plan(args.results)
  stale = stale_feeds(args.results)
  text = markdown(rows, bn_rows, stale)
  if args.write:
    with open(os.path.join(args.results, "rerun_plan.json"), "w") as f:
      json.dump({"tuning": rows, "stale_feeds": stale, "batch_norm": bn_rows}, f, indent=2)
      f.write("\n")
    with open(os.path.join(args.results, "rerun_plan.md"), "w") as f:
      f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
