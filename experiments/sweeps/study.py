"""What a study's workdir holds: the study it records, checked before anything trains.

A study (the cost-vs-time sweep, the critical-batch sweep) trains many runs under one
workdir and reports every run it finds there, so two studies in one workdir would be
reported as one. `<workdir>/study.json` names the study its runs belong to: the config
file, the grid's name, the `--set` values and each point's resolved config (what its runs
train with, but for the seed and the tuned fields). The same study again, a part of it
(`--curves`, `--points`) or its grid grown by new points goes on; another is refused with
each changed field, as `ensemble_jax.main` refuses a workdir of another config's run
(`resume.held_elsewhere`, one message for both), unless `--start_over` moves the old records
aside (never deletes them). A workdir from before the record existed is adopted, the record
written, only when every run in it is one of this study's points trained with its config.
"""
from __future__ import annotations

import contextlib
import copy
import glob
import json
import os
import shutil
import sys
from typing import Callable

import ml_collections

from ensemble_jax import checkpoint, config_lib, resume, stored, train
from ensemble_jax import run as run_lib
from experiments import sweeps
from experiments.sweeps import tuning

STUDY_FILE = "study.json"
# Beside the points: timings and pools, shared by every point and valid for any study.
SHARED_DIRS = ("calibration", "pools")
# What a study counts (`counted`, `counts_line`): runs trained now (tuning runs, seed runs; of
# those, resumed from a checkpoint), seed runs copied from the chosen tuning run, runs read
# back (seed runs finished before: skipped; tuning runs), runs that diverged.
COUNTS = ("tuning_runs", "trained", "resumed", "from_tuning", "skipped", "read_back",
          "diverged")
START_OVER = ("Give this study another --workdir, or rerun with --start_over to move the "
              "old records to {aside} (nothing is deleted) and start this one in {workdir}.")
START_POINTS_OVER = ("Give this study another --workdir, or rerun with --start_over to move "
                     "those points' records to <point>/superseded/start-over (nothing is "
                     "deleted) and train them again; the other points stay.")


def identity(config_path: str, grid: str, settings: dict | None,
             points: dict[str, ml_collections.ConfigDict], **more) -> dict:
  """The study's record: `points` maps each point's directory (relative to the workdir)
  to its config at seed 0; `more` adds what else decides the runs (e.g. tune_schedule)."""
  return json.loads(json.dumps({
      "config": config_path, "grid": grid, "settings": dict(settings or {}), **more,
      "points": {name: c.to_dict() for name, c in points.items()}}, default=str))


def check_workdir(workdir: str, study: dict, start_over: bool = False) -> None:
  """Refuses (ConfigError, listing what changed) a workdir that holds another study, or
  runs no study record vouches for that are not this study's; writes the record otherwise.
  With `start_over`, what another config trained moves aside first: where the held study
  differs from this one only in some points' fields, those points' records
  (`start_points_over`; the rest stays, and the same command again resumes them), else
  whatever the workdir holds."""
  held = read(workdir)
  wide = study_wide_changes(held, study) if held is not None else {}
  if start_over and held is not None and not wide:
    changed = sorted(point_field_changes(held, study))
    start_points_over(workdir, changed)
    held = {**held, "points": {k: v for k, v in held["points"].items() if k not in changed}}
  elif start_over and (held is not None or _runs(workdir)):
    aside = _aside(workdir)
    if sweeps.is_writer():
      shutil.move(workdir, aside)
      print(f"study: --start_over: {workdir}'s records moved to {aside}", flush=True)
    sweeps.sync(f"start over {workdir}")
    held = None
  if held is not None:
    changes = differences(held, study)
    what = (f"the study of {held['config']} --grid={held['grid']}"
            + "".join(f" --set={k}={v}" for k, v in held.get("settings", {}).items()))
    fix = START_OVER if wide else START_POINTS_OVER
  else:
    changes = legacy_changes(workdir, study)
    what = f"runs of another study (no {STUDY_FILE}: from before it was kept)"
    fix = START_OVER
  if changes:
    raise resume.held_elsewhere(workdir, what, changes,
                                fix.format(aside=_aside(workdir), workdir=workdir))
  if held is None and _runs(workdir):
    print(f"study: {workdir} holds runs from before {STUDY_FILE} was kept, all of this "
          f"study's points and configs: {STUDY_FILE} written", flush=True)
  if held != {**study, "points": {**(held or {}).get("points", {}), **study["points"]}}:
    _write(workdir, {**study, "points": {**(held or {}).get("points", {}),
                                         **study["points"]}})


def start_points_over(workdir: str, points: list[str]) -> None:
  """Each of `points` (directories relative to `workdir`) moves what it holds, its tuning
  and seed runs and records, to `<point>/superseded/start-over[.k]/`: kept, never reported
  (`_runs`), and the point trains again from nothing."""
  if sweeps.is_writer():
    for point in points:
      point_dir = os.path.join(workdir, point)
      held = sorted(set(os.listdir(point_dir)) - {"superseded"}) if os.path.isdir(
          point_dir) else []
      if not held:
        continue
      aside = stem = os.path.join(point_dir, "superseded", "start-over")
      k = 1
      while os.path.exists(aside):
        aside, k = f"{stem}.{k}", k + 1
      os.makedirs(aside)
      for name in held:
        shutil.move(os.path.join(point_dir, name), os.path.join(aside, name))
      print(f"study: --start_over: {point}'s records moved to {aside}", flush=True)
  sweeps.sync(f"start points over {workdir}")


def read(workdir: str) -> dict | None:
  """The workdir's study record, its points' configs under today's names."""
  path = os.path.join(workdir, STUDY_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    study = json.load(f)
  return {**study, "points": {name: stored.migrate_config(c)
                              for name, c in study["points"].items()}}


def _write(workdir: str, study: dict) -> None:
  if not sweeps.is_writer():
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, STUDY_FILE)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(study, f, indent=2)
  os.replace(tmp, path)


def differences(held: dict, study: dict) -> dict[str, tuple]:
  """{what: (held, now)}: the study-wide changes (`study_wide_changes`) and every field a
  point's runs could not continue with (`point_field_changes`). A field changed alike at
  every point is listed once; one that differs per point, per point."""
  changes = study_wide_changes(held, study)
  by_field: dict[str, dict[str, tuple]] = {}
  for name, fields in sorted(point_field_changes(held, study).items()):
    for field, change in fields.items():
      by_field.setdefault(field, {})[name] = change
  for field, per_point in by_field.items():
    if len({repr(c) for c in per_point.values()}) == 1 and len(per_point) > 1:
      changes[f"{field} (at {len(per_point)} points)"] = next(iter(per_point.values()))
    else:
      changes.update({f"{name}: {field}": c for name, c in per_point.items()})
  return changes


def study_wide_changes(held: dict, study: dict) -> dict[str, tuple]:
  """The grid's name, the other study-wide values, and the points the workdir holds that
  the grid lacks."""
  changes = {key: (held.get(key), value) for key, value in study.items()
             if key not in ("config", "settings", "points") and held.get(key) != value}
  if gone := sorted(set(held["points"]) - set(study["points"])):
    changes["points"] = (gone, "not in the grid")
  return changes


def point_field_changes(held: dict, study: dict) -> dict[str, dict[str, tuple]]:
  """{point: {field: (held, now)}}: each field a point's runs could not continue with
  (`resume.blocked_changes`, a longer budget included), but those it inherits from another
  grid's choice (its runs at a former value are set aside as it trains)."""
  out = {}
  for name in sorted(set(held["points"]) & set(study["points"])):
    now = ml_collections.ConfigDict(study["points"][name])
    if fields := {field: change for field, change in point_changes(
        held["points"][name], now).items() if field not in now.tune.inherited}:
      out[name] = fields
  return out


def point_changes(trained: dict, config: ml_collections.ConfigDict) -> dict[str, tuple]:
  """The fields `trained` (a run's or a point's saved config) differs in from `config` that
  its runs could not be continued or read back with."""
  return resume.blocked_changes(resume.config_changes(trained, config), extend=False)


def run_changes(results: dict, point: ml_collections.ConfigDict) -> dict[str, tuple]:
  """`point_changes` of a finished run against its point's config at the run's seed and
  tuned or inherited values (`tuning.choice_fields`: the only fields in which a point's runs
  differ; a run at another inherited value is set aside before the point trains)."""
  trained = results["config"]
  expected = copy.deepcopy(point)
  expected.seed = trained.get("seed", expected.seed)
  for field in {*tuning.choice_fields(point), *trained.get("tune", {}).get("fields", ())}:
    try:
      config_lib.set_dotted(expected, field, tuning.trained_value(trained, field))
    except (AttributeError, KeyError):
      continue
  return point_changes(trained, expected)


def legacy_changes(workdir: str, study: dict) -> dict[str, tuple]:
  """What keeps a workdir without a record from being this study's: each finished run
  under it that is not one of the study's points, or not trained with its point's config
  ({run: ('another point', ...)} or {run: field: (before, now)})."""
  points = {name: ml_collections.ConfigDict(c) for name, c in study["points"].items()}
  changes = {}
  for path in _runs(workdir):
    run_dir = os.path.relpath(os.path.dirname(path), workdir)
    name = next((p for p in points if run_dir.startswith(p + os.sep)), None)
    if name is None:
      changes[run_dir] = ("a run", "not a point of this grid")
      continue
    results = stored.load(path)
    if not isinstance(results.get("config"), dict):
      continue
    for field, change in run_changes(results, points[name]).items():
      changes[f"{run_dir}: {field}"] = change
  return changes


def _runs(workdir: str) -> list[str]:
  """The results.json of every run under `workdir` but the shared timings and pools and
  the runs a point set aside (`superseded/`)."""
  paths = glob.glob(os.path.join(workdir, "**", run_lib.RESULTS_FILE), recursive=True)
  return sorted(p for p in paths if os.path.relpath(p, workdir).split(os.sep)[0]
                not in SHARED_DIRS and "superseded" not in os.path.relpath(p, workdir).split(
                    os.sep))


def _aside(workdir: str) -> str:
  """`<workdir>.previous`, or `.previous.<k>` beside earlier ones: outside the workdir, so
  nothing of the old study is reported with the new."""
  stem = os.path.normpath(workdir) + ".previous"
  aside, k = stem, 1
  while os.path.exists(aside):
    aside, k = f"{stem}.{k}", k + 1
  return aside


def check_points(points: dict[str, Callable[[], ml_collections.ConfigDict]],
                 selected: list[str], seeds: list[int]) -> dict[str, ml_collections.ConfigDict]:
  """Every point resolved (`points`: name -> its config at seed 0), and each of `selected`
  (those this command trains) checked as its run will check it (`train.check`: config,
  mesh, data, method) with `seeds`, before anything trains or is written: {name: config}.

  Raises ConfigError with one line per bad point (points with the same message share one),
  each naming the point, the field, the value and the fix."""
  configs, errors = {}, {}
  for name, resolve in points.items():
    try:
      configs[name] = resolve()
      if name in selected:
        train.check(configs[name])
        tuning.check_seeds(configs[name], seeds)
    except (*run_lib.USAGE_ERRORS, ValueError, KeyError, AttributeError) as e:
      message = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split())
      errors.setdefault(message.removeprefix("error: "), []).append(name)
  if errors:
    raise config_lib.ConfigError("\n".join(f"{', '.join(names)}: {message}"
                                           for message, names in errors.items()))
  return configs


def run_dirs(workdir: str, point_dirs: list[str] | None = None) -> list[str]:
  """The run directories of `point_dirs` (relative to `workdir`; None: every point there):
  their tuning runs (`tune/*`) and seed runs (`seed*`)."""
  if point_dirs is None:
    point_dirs = sorted({os.path.relpath(os.path.dirname(os.path.dirname(d)), workdir)
                         for d in glob.glob(os.path.join(workdir, "**", "tune", "*"),
                                            recursive=True)}
                        | {os.path.relpath(os.path.dirname(d), workdir)
                           for d in glob.glob(os.path.join(workdir, "**", "seed*"),
                                              recursive=True)})
    point_dirs = [p for p in point_dirs if p.split(os.sep)[0] not in SHARED_DIRS
                  and "superseded" not in p.split(os.sep)]
  return sorted(d for p in point_dirs for d in glob.glob(os.path.join(workdir, p, "tune", "*"))
                + glob.glob(os.path.join(workdir, p, "seed*")))


def holdings(workdir: str, point_dirs: list[str] | None = None) -> str:
  """'<k> finished runs' of `point_dirs` (`run_dirs`), read back and not trained again,
  and the runs stopped part-way, each with its checkpoint's step, resumed from there."""
  finished, part_way = 0, []
  for run_dir in run_dirs(workdir, point_dirs):
    if tuning.read_run(run_dir)[0]:
      finished += 1
    elif step := checkpointed_step(run_dir):
      part_way.append(f"{os.path.relpath(run_dir, workdir)} at step {step}")
  return f"{finished} finished run{'' if finished == 1 else 's'}" + (
      f" and {len(part_way)} checkpointed part-way ({', '.join(part_way)})" if part_way else "")


def say_holdings(workdir: str, point_dirs: list[str]) -> None:
  """The study's first line: its points, and what it reads back and resumes."""
  print(f"study: {len(point_dirs)} points in {workdir}; it holds "
        f"{holdings(workdir, point_dirs)}: finished runs are read back, part-way ones resume "
        "from their checkpoints", flush=True)


def checkpointed_step(run_dir: str) -> int | None:
  """The step of an unfinished run's newest checkpoint; None without one."""
  if tuning.read_run(run_dir)[0]:
    return None
  saved = checkpoint.latest_record(os.path.join(run_dir, train.CHECKPOINTS))
  return saved.get("step") if saved else None


def counted(counts: dict, what: str, run_dir: str, train_fn: Callable):
  """`train_fn()`, which trains the run in `run_dir` (`counts[what]` += 1) or reads it back,
  counted: a tuning run read back in `read_back`, a run trained on from a checkpoint also
  in `resumed`. Stops first if a stop signal came since the last run."""
  checkpoint.PreemptionWatch.stop_before(run_dir)
  part_way = checkpointed_step(run_dir) is not None
  trained = counts[what]
  results = train_fn()
  if counts[what] > trained:
    counts["resumed"] += part_way
  elif what == "tuning_runs":
    counts["read_back"] += 1
  return results


def counts_line(counts: dict) -> str:
  """The study's last line: what it trained, resumed, copied and read back."""
  return (f"study: {counts['tuning_runs']} tuning runs and {counts['trained']} seed runs "
          f"trained ({counts['resumed']} of them resumed from a checkpoint, "
          f"{counts['diverged']} diverged), {counts['from_tuning']} seed runs taken from "
          f"tuning; read back: {counts['read_back']} finished tuning runs and "
          f"{counts['skipped']} finished seed runs")


def guarded(workdir: str, study_fn: Callable) -> tuple[int, object]:
  """(exit status, `study_fn()`'s result), as `ensemble_jax.main` runs one run: a bad point
  or another study's workdir is one `error:` line each and status 2; SIGTERM or Ctrl-C
  (`checkpoint.PreemptionWatch`) stops the current run at the end of its step, or before
  the next run, with one line saying where and what the workdir keeps, status 143 / 130.
  A second Ctrl-C aborts at once (status 130)."""
  # A watch installed above (the SLURM launcher's) is the study's: its caller decides what a
  # stop means (a USR2 requeues the job).
  watch, owned = checkpoint.PreemptionWatch.current()
  try:
    with contextlib.closing(watch) if owned else contextlib.nullcontext():
      return 0, study_fn()
  except run_lib.USAGE_ERRORS as e:
    for line in str(e).splitlines():
      print(f"error: {line}", file=sys.stderr)
    return 2, None
  except checkpoint.Preempted as e:
    print(f"study: {e} Kept in {workdir}: {holdings(workdir)}; the same command reads them "
          "back and resumes.", file=sys.stderr, flush=True)
    if not owned:
      raise
    return e.code, None
  except KeyboardInterrupt:
    print(f"study: interrupted; what the current run trained since its last checkpoint is "
          f"lost. Kept in {workdir}: {holdings(workdir)}; the same command reads them back "
          "and resumes.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)  # aborted mid-step: skip the interpreter's teardown of XLA's threads
