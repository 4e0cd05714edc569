"""Which committed tuning choices the current tuning rule would move, and what re-running
them costs: experiments/results/rerun_plan.{json,md}, read by the background re-run queue.

  python -m experiments.rerun_plan [--results=experiments/results] [--write]

Reads every committed `tuning.json` (nothing trains, nothing is re-tuned) and applies the
two clauses issue 58 added to experiments/sweeps/tuning.py:
  - the schedule's margin: a length whose run on some tuning seed reached the target after
    `tune.schedule_margin` of its schedule's steps counts as a miss, so such a chosen length
    moves;
  - no stop at an edge below the cap: a rate whose best sat at its grid's edge once the
    record's `max_extensions` ran out (fewer than the current cap) is extended further;
  - the schedule's axis extended at its edge as the rate's is (issue 70): a length chosen
    at the shortest fraction tried (or the longest, short of the whole budget) moves to the
    next one past it being tried.
Each moved point's cost is the committed host wall-clock of its runs (its tuning runs: an
upper bound on re-tuning, whose finished runs are read back, and its reported seeds, which
re-run at the new choice), plus the grids that train at its choice (the many-worker grids
read the full grids' N = 8 choices; the one-device grid its namesakes',
`fashion_mnist.ONE_DEVICE_NAMESAKES`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from ensemble_jax import config_lib, report, stored
from experiments.configs import fashion_mnist
from experiments.sweeps import tuning

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SCHEDULE = config_lib.SCHEDULE_FRACTION
DEFAULTS = config_lib.base_config().tune
# grids that train at a full grid's choice: {(workload, point): [their results dirs]}
FEEDS = {("fashion_mnist", "N8_L235"): ["many_workers"],
         ("pydocs_gpt2", "N8_L300"): ["many_workers_pydocs"]}
# grids whose points train at a full grid's (curve, point): {grid: (workload, namesakes)}
NAMESAKES = {"one_device_h200/fashion_mnist": ("fashion_mnist",
                                               fashion_mnist.ONE_DEVICE_NAMESAKES)}


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
    if (edge := _edge(axis, record.get("extend", DEFAULTS.extend), cap)):
      why.append(edge)
    if axis["key"] == SCHEDULE:
      row = next(r for r in axis["runs"] if r["value"] == axis["chosen"])
      if late := [r for r in _seeds(row) if _late(r, margin)]:
        steps = ", ".join(f"{r['steps_to_target']} of {r['step_budget']}" for r in late)
        why.append(f"schedule {axis['chosen']:g} reached the target late on "
                   f"{len(late)}/{len(_seeds(row))} tuning seeds (step {steps}; margin "
                   f"{margin:g})")
  return why


def _edge(axis: dict, extend: float, cap: int) -> str | None:
  """Why an axis' choice at an edge of its values moves (the rule now tries past it while
  fewer than `cap` extensions ran there: the schedule's axis since issue 70), else None."""
  values = sorted(r["value"] for r in axis["runs"])
  if not report.at_edge(axis["key"], values, axis["chosen"]):
    return None
  side = "low" if axis["chosen"] == values[0] else "high"
  if axis["extensions"][side] >= cap:
    return None
  past = tuning.beyond(axis["key"], values, extend)[side == "high"]
  name = "schedule" if axis["key"] == SCHEDULE else axis["key"].rsplit(".", 1)[-1]
  return (f"{name} {axis['chosen']:g} at the {side} edge after {axis['extensions'][side]} "
          f"extensions (cap now {cap}): {past:g} is tried next")


def _wall(paths) -> float:
  total = 0.0
  for path in paths:
    total += stored.load(path).get("wall_time_s") or 0.0
  return total


def _extension_wall(record: dict, point_dir: str, cap: int = DEFAULTS.max_extensions) -> float:
  """The likely host wall-clock of the runs past an edge (`_edge`): the chosen value's
  tuning runs (each tuning seed) once more, scaled by the next value over the chosen one
  on the schedule's axis (a run's time goes with its steps)."""
  total = 0.0
  for axis in record["axes"]:
    if not _edge(axis, record.get("extend", DEFAULTS.extend), cap):
      continue
    values = sorted(r["value"] for r in axis["runs"])
    high = axis["chosen"] != values[0]  # (at an edge: the low one, else the high one)
    past = tuning.beyond(axis["key"], values, record.get("extend", DEFAULTS.extend))[high]
    row = next(r for r in axis["runs"] if r["value"] == axis["chosen"])
    runs = [os.path.join(point_dir, r["run"], "results.json") for r in _seeds(row)]
    wall = _wall(p for p in runs if os.path.exists(p))
    total += wall * (past / axis["chosen"] if axis["key"] == SCHEDULE else 1.0)
  return total


def plan(results: str = RESULTS) -> list[dict]:
  """One row per committed point the current rule would move, with its re-run cost: the
  whole (every tuning run again, an upper bound), and the likely (`extension_wall_s`, the
  runs past an edge; its seeds and the grids trained at its choice run again)."""
  rows = []
  for path in sorted(glob.glob(os.path.join(results, "**", tuning.TUNING_FILE), recursive=True)):
    with open(path) as f:
      record = json.load(f)
    if not (why := moves(record)):
      continue
    point_dir = os.path.dirname(path)
    rel = os.path.relpath(point_dir, results)
    seeds = glob.glob(os.path.join(point_dir, "seed*", "results.json"))
    tune_runs = glob.glob(os.path.join(point_dir, "tune", "*", "results.json"))
    fed = {}  # the grids' points trained at this choice: {label: their seed runs}
    for label, fed_dir, source in _feed_points(results):
      if os.path.normpath(source) == os.path.normpath(point_dir):
        fed.setdefault(label, []).extend(
            glob.glob(os.path.join(fed_dir, "seed*", "results.json")))
    feeds = [{"grid": label, "runs": len(runs), "wall_s": _wall(runs)}
             for label, runs in fed.items() if runs]
    rows.append({"point": rel, "why": why, "chosen": record["chosen"],
                 "seed_runs": len(seeds), "seeds_wall_s": round(_wall(seeds), 1),
                 "tuning_runs": len(tune_runs), "tuning_wall_s": round(_wall(tune_runs), 1),
                 "extension_wall_s": round(_extension_wall(record, point_dir), 1),
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
  """(label, point dir, the full grid's point dir whose tuning.json it trains at) for
  every point of a grid that trains at a full grid's choice: the many-worker grids' by
  curve (each reads its curve's N = 8), the one-device grid's by point (its namesake)."""
  for (workload, source), grids in FEEDS.items():
    for grid in grids:
      for point_dir in sorted(glob.glob(os.path.join(results, grid, "*", "*"))):
        curve = os.path.basename(os.path.dirname(point_dir))
        yield f"{grid}/{curve}", point_dir, os.path.join(results, workload, curve, source)
  for grid, (workload, namesakes) in NAMESAKES.items():
    for curve, points in namesakes.items():
      for point, source in points.items():
        point_dir = os.path.join(results, grid, curve, point)
        if os.path.isdir(point_dir):
          yield (f"{grid}/{curve}/{point}", point_dir,
                 os.path.join(results, workload, *source))


def stale_feeds(results: str = RESULTS) -> list[dict]:
  """The points of the grids trained at a full grid's choice whose runs' values differ from
  that grid's current `tuning.json` choice (it was re-tuned since): they need a re-run."""
  rows = []
  for _, point_dir, source in _feed_points(results):
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


# {a study's results dir: its sweep's command}; `commands` adds the points to re-run
STUDIES = {
    "fashion_mnist": "python -m experiments.sweeps.cost_vs_time "
                     "--config=experiments/configs/fashion_mnist.py "
                     "--workdir=experiments/results/fashion_mnist --seeds=1,2,3",
    "pydocs_gpt2": "python -m experiments.sweeps.cost_vs_time "
                   "--config=experiments/configs/pydocs_gpt2.py "
                   "--workdir=experiments/results/pydocs_gpt2 --seeds=1,2,3",
    "one_device_h200/fashion_mnist": "python -m experiments.sweeps.cost_vs_time "
                                     "--config=experiments/configs/fashion_mnist.py "
                                     "--grid=one_device --workdir=experiments/results/"
                                     "one_device_h200/fashion_mnist --seeds=1,2,3",
    "critical_batch/fashion": "python -m experiments.sweeps.critical_batch --workload=fashion "
                              "--seeds=1,2,3",
    "critical_batch/pydocs": "python -m experiments.sweeps.critical_batch --workload=pydocs "
                             "--seeds=1,2,3",
    "critical_batch/fashion_small_model": (
        "python -m experiments.sweeps.critical_batch "
        "--config=experiments/configs/fashion_mnist.py --grid=small_model "
        "--workdir=experiments/results/critical_batch/fashion_small_model --seeds=1,2,3")}


def commands(rows: list[dict]) -> list[str]:
  """The sweep commands that re-run the moved points and the grids' points trained at their
  choice: one per study and curve (a critical-batch study's points are its batches)."""
  wanted: dict[tuple[str, str], list[str]] = {}
  for r in rows:
    for rel in [r["point"], *(f["grid"] for f in r["feeds"])]:
      study = max((s for s in STUDIES if rel.startswith(s + "/")), key=len, default=None)
      if study is None:
        continue
      *curve, point = rel[len(study) + 1:].split("/")
      wanted.setdefault((study, "/".join(curve)), []).append(point)
  out = []
  # the one-device grid reads the full grid's choices: after them
  for (study, curve), points in sorted(wanted.items(), key=lambda kv: (
      kv[0][0].startswith("one_device"), kv[0])):
    if curve:
      out.append(f"{STUDIES[study]} --curves={curve} --points={','.join(sorted(points))}")
    else:
      batches = sorted(int(p.lstrip("B")) for p in points)
      out.append(f"{STUDIES[study]} --batches={','.join(map(str, batches))}")
  return out


def markdown(rows: list[dict], bn_rows: list[dict] = (), stale: list[dict] = ()) -> str:
  late = sum(any("late" in w for w in r["why"]) for r in rows)
  short = sum(any(w.startswith("schedule") and "edge" in w for w in r["why"]) for r in rows)
  edge = sum(any(not w.startswith("schedule") and "edge" in w for w in r["why"])
             for r in rows)
  feeds = sum(f["wall_s"] for r in rows for f in r["feeds"])
  total = sum(r["seeds_wall_s"] + r["tuning_wall_s"] for r in rows) + feeds
  likely = sum(r["seeds_wall_s"] + r.get("extension_wall_s", 0.0) for r in rows) + feeds
  lines = [
      "# Re-run plan: committed tuning choices the current rule moves",
      "",
      "Generated by `python -m experiments.rerun_plan --write` from the committed "
      "`tuning.json` records (nothing re-tuned or trained). The rule (experiments/sweeps/"
      f"tuning.py, issues 58 and 70): a schedule's length is chosen only if every tuning "
      f"seed reaches the target within {DEFAULTS.schedule_margin:g} of its steps; a rate "
      "or a schedule's length at its axis' edge is extended until interior or diverged, up "
      f"to {DEFAULTS.max_extensions} extensions per edge (a length never past the whole "
      "budget). Until a point is re-run its committed record and seeds stand, and the "
      "reports read them as before (`--recost` keeps a record whose replay moves).",
      ""]
  if not rows:
    lines += ["No committed tuning choice moves under the current rule."]
  else:
    lines += [
        f"{len(rows)} points: {late} schedule choices fail the margin, {short} schedule "
        f"choices and {edge} rate choices sit at an edge. Cost, committed host wall-clock "
        f"on the 2-core host: {likely / 3600:.1f} h likely (the runs past each edge, each "
        "tuning seed's run at the chosen value scaled by its steps; the seeds; the grids "
        f"that train at the choice), {total / 3600:.1f} h upper bound (every tuning run "
        "again). Run by:",
        "",
        *[f"    {c}" for c in commands(rows)],
        "",
        "(the one-device grid on its GPU, after the full grid: it trains at its choices)",
        "",
        "The grids still trained at a full grid's former choice follow, then the "
        "data-parallel points trained with another BatchNorm.",
        "",
        "| point | why it moves | committed choice | seed runs (wall s) | tuning runs (wall "
        "s; past the edge, likely) | grids trained at its choice (runs, wall s) |",
        "|---|---|---|---|---|---|"]
  for r in rows:
    chosen = _values(r["chosen"])
    feeds = "; ".join(f"{f['grid']} ({f['runs']}, {f['wall_s']:.0f})" for f in r["feeds"])
    lines.append(f"| {r['point']} | {'; '.join(r['why'])} | {chosen} | {r['seed_runs']} "
                 f"({r['seeds_wall_s']:.0f}) | {r['tuning_runs']} ({r['tuning_wall_s']:.0f}; "
                 f"{r.get('extension_wall_s', 0.0):.0f}) | {feeds or '-'} |")
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
