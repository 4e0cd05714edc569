"""The answer at every target up to the ceilings: each model's ceiling, and at each rung of
the ladder the closest method point against the strongest baseline.

  python -m experiments.targets [--workload=fashion_mnist]   # the context, as JSON

Reads only committed JSON: a ceilings study (`sweep_grid('ceilings')`: single models trained
to their end at fixed lengths, every rung tracked, scored on the whole test split) and the
studies whose runs track the ladder's rungs (results.json `targets`), each run priced at a
rung as its own cost block prices it (`costs.at_target`). docs/results/targets.md renders
it (experiments/docs_render.py).
"""
from __future__ import annotations

import collections
import glob
import importlib
import json
import math
import os
import statistics

import ml_collections
from absl import app, flags

from ensemble_jax import config_lib, methods, optim, report, stored
from ensemble_jax import run as run_lib
from experiments import docs_data as data

# Per workload: its ceilings study (`ceiling_curves`: the curves of it that are ceilings; all
# when absent), the studies read at every rung (the first is the one-target study the README's
# answer was measured in), under experiments/results/, the rungs the page reads by name, and
# `below_ceiling`: read too the highest rung this far below the single model's ceiling and
# the lowest above it that the highest ceiling reaches (None: the named rungs only).
WORKLOADS = {
    "fashion_mnist": {"name": "Fashion-MNIST", "ceilings": "fashion_mnist_ceilings",
                      "studies": ("fashion_mnist", "fashion_mnist_ceilings",
                                  "fashion_mnist_ladder"),
                      "named_rungs": (0.85, 0.88, 0.90), "below_ceiling": 0.005,
                      "length": "epochs",
                      # (study, curve, N): the deep ensemble, every worker the single
                      # model's best length on the whole data (`deep_ensemble`)
                      "deep_ensemble": ("fashion_mnist_ladder", "ensemble", 4),
                      # (study, curves): single models whose ladder points trained to their
                      # end are ceilings rows too (`trained_to_end`)
                      "ladder_ceilings": ("fashion_mnist_ladder",
                                          ("data_parallel", "dp_wide_model")),
                      # study -> (config, grid): the points the page waits for (`pending`)
                      "grids": {"fashion_mnist_ceilings": ("fashion_mnist", "ceilings"),
                                "fashion_mnist_ladder": ("fashion_mnist", "ladder")},
                      # how a step's time grows with its size, on the calibration host and
                      # on an accelerator (`step_scaling`): (larger, smaller) run folders
                      "step_scaling": {
                          "host": ("fashion_mnist_ladder/dp_wide_model/D1_E2",
                                   "fashion_mnist_ladder/ensemble/N4_E2"),
                          "accelerator": ("one_device_h200/fashion_mnist/data_parallel/B256",
                                          "one_device_h200/fashion_mnist/data_parallel/B64")}},
    # The docs' ceilings are the ladder's own fixed lengths of the single models (1, 2 and 4
    # budgets: 0.46-1.85 passes): the best within them, a lower bound.
    "pydocs_gpt2": {"name": "the Python docs", "ceilings": "pydocs_gpt2_ladder",
                    "ceiling_curves": ("data_parallel", "dp_small_model"),
                    "studies": ("pydocs_gpt2", "pydocs_gpt2_ladder"),
                    "named_rungs": (14.0, 12.0, 11.0), "below_ceiling": None,
                    "length": "passes over the corpus",
                    "grids": {"pydocs_gpt2_ladder": ("pydocs_gpt2", "ladder")}},
}
# The reported seeds a point needs before the page reads it (every study here reports 1-3).
SEEDS = 3
# A rung's verdict, from its closest method point's ratio and its range over the seeds.
VERDICTS = {"beats": "beats the strongest baseline on every seed",
            "level": "level with it, within the seeds' spread",
            "behind": "behind it on every seed",
            "missed": "no method point reaches it on every seed",
            "unmeasured": "no method point was trained to it",
            # above every baseline's reach: a win in capacity, not in sequential steps
            "unopposed": "a method point reaches it on every seed, no baseline point does",
            # ahead or level against the baselines measured, while baseline points of the
            # grids are pending: a stronger baseline may yet come (behind stays behind)
            "provisional": "ahead of or level with the baselines measured so far; baseline "
                           "points pending"}


def verdict_word(ratio: float | None, seed_range: tuple[float, float] | None,
                 measured: bool = True) -> str:
  """The one rule every page words a ratio by (a key of VERDICTS): above 1 over the whole
  seed range beats, below 1 over all of it is behind, a range holding 1 is level."""
  if not measured:
    return "unmeasured"
  if ratio is None or seed_range is None:
    return "missed"
  lo, hi = seed_range
  return "beats" if lo > 1 else "behind" if hi < 1 else "level"


def _epochs(r: dict) -> float:
  """The run's length in passes over the training set (epochs)."""
  return report.passes(r, r["step_budget"])


def ceilings(results_dir: str, curves: tuple[str, ...] | None = None) -> list[dict]:
  """Per model (curve) of a ceilings study: each length's final metric over its reported
  seeds (`_seeded`: not the tuning seed's, whose run chose the rate; none until they have
  run), and the ceiling,
  the best length's median. `plateau`: the first length whose doubling gained less than
  the seeds' spread (max - min of either length), None if every doubling tried gained more
  (the ceiling is then a lower bound). `worse_from`: the first length whose final is worse
  than the shorter length's by more than that spread (more passes over the same data
  hurting what it was not trained on: memorising), None if no doubling measured did."""
  out = []
  for curve_dir in sorted(glob.glob(os.path.join(results_dir, "*", ""))):
    curve = os.path.basename(os.path.dirname(curve_dir))
    if curves is not None and curve not in curves:
      continue
    lengths = []
    for point_dir in glob.glob(os.path.join(curve_dir, "*", "")):
      runs = _seeded(point_dir)
      if not runs:
        continue
      metric = runs[0]["target"]["metric"]
      lengths.append(_length(os.path.basename(os.path.dirname(point_dir)), _epochs(runs[0]),
                             runs, [r["final"][metric] for r in runs]))
    if not lengths:
      continue
    lengths.sort(key=lambda x: x["epochs"])
    lower = lengths[0]["metric"] in config_lib.LOWER_IS_BETTER
    sign = -1 if lower else 1
    best = max(lengths, key=lambda x: sign * x["final"]["median"])
    plateau = worse = None
    for a, b in zip(lengths, lengths[1:]):
      spread = max(x["final"]["max"] - x["final"]["min"] for x in (a, b))
      gain = sign * (b["final"]["median"] - a["final"]["median"])
      if plateau is None and gain < spread:
        plateau = a
      if worse is None and gain < -spread:
        worse = b
    first = stored.load(glob.glob(os.path.join(curve_dir, best["point"], "seed*",
                                               "results.json"))[0])
    out.append({"curve": curve, "model": data.CURVE_NAMES.get(curve, curve),
                "architecture": data.model_name(first["config"]),
                "params": first.get("num_params"), "lengths": lengths,
                "ceiling": best["final"], "best_point": best["point"],
                "best_epochs": round(best["epochs"]),
                "plateau": plateau and plateau["point"], "deep_ensemble": False,
                "single_model": curve == report.BASELINE, "one_length": False,
                "plateau_epochs": plateau and plateau["epochs"],
                "worse_from": worse and worse["point"],
                "worse_from_epochs": worse and worse["epochs"]})
  return out


def deep_ensemble(study_dir: str, curve: str, n: int, single: dict) -> list[dict]:
  """The ensemble of `n` whose every worker trained the single model's best length on the
  whole data (its point `N<n>_E<epochs>`) as ceilings rows: its reported seeds' final metric
  at the point's choice, and N = 2 read from workers 0 and 1 of each seed's run where
  `python -m ensemble_jax.evaluate --workers=0,1` has scored them (every seed). Until that
  point has its reported seeds, the longest shorter one that has them, named for what it is
  (each worker fewer epochs than the single model's best length: not the deep ensemble), so
  its measured finals stay on the page; none when no length has them."""
  best = single["best_epochs"]
  measured = {}  # epochs a worker -> (point, reported runs), up to the single model's best
  for point_dir in glob.glob(os.path.join(study_dir, curve, f"N{n}_E*", "")):
    point = os.path.basename(os.path.dirname(point_dir))
    epochs = point[len(f"N{n}_E"):]
    if not epochs.isdigit() or int(epochs) > best:
      continue
    if runs := _seeded(point_dir):
      measured[int(epochs)] = (point, runs)
  if not measured:
    return []
  epochs = max(measured)
  point, runs = measured[epochs]
  deep = epochs == best
  metric = runs[0]["target"]["metric"]

  model = data.model_name(runs[0]["config"])
  params = runs[0].get("num_params_per_worker", 0)

  def row(size: int, finals: list[float]) -> dict:
    what = f"N = {size}" + ("" if size == n else f", workers 0-{size - 1} of the N = {n} runs")
    name = (f"the deep ensemble ({what})" if deep else
            f"the ensemble ({what}, {epochs} epochs a worker: shorter than the single model's "
            f"best length, {best}; not the deep ensemble)")
    label = (f"the deep ensemble (N = {size})" if deep
             else f"the ensemble (N = {size}, {epochs} epochs a worker)")
    return _one_length(curve, name, label, f"{size} x {model}", size * params,
                       _length(point, epochs, runs, finals), deep_ensemble=deep)

  out = [row(n, [r["final"][metric] for r in runs])]
  subsets = [os.path.join(study_dir, curve, point, f"seed{r['config']['seed']}", "subsets",
                          "workers_0_1.json") for r in runs]
  if all(os.path.exists(p) for p in subsets):
    out.append(row(2, [_read(p)["metrics"][metric] for p in subsets]))
  # Each worker is the single model trained alone on the whole data at the worker's batch:
  # a single-model measurement the ceiling may not sit below.
  workers = [w[metric] for r in runs for i, w in enumerate(r.get("per_worker") or [])
             if i not in (r.get("excluded_workers") or ())]
  if workers:
    batch = runs[0]["examples_per_step"] // runs[0]["num_workers"]
    of = "the deep ensemble" if deep else f"the ensemble of {n}, {epochs} epochs"
    out.append(_one_length(
        curve, f"one worker of {of} (alone, {batch} a step; {len(workers)} "
        f"models, {n} per seed)", "one worker alone", model, params,
        _length(point, epochs, runs, workers), single_model=True))
  return out


def _one_length(curve: str, model: str, label: str, architecture: str, params: int,
                length: dict, deep_ensemble: bool = False, single_model: bool = False) -> dict:
  """A ceilings row of one length (`_length`): its ceiling is that length's final, a lower
  bound with no plateau to read; `label` names it on the figure."""
  return {"curve": curve, "model": model, "label": label, "architecture": architecture,
          "params": params, "lengths": [length], "ceiling": length["final"],
          "best_point": length["point"], "best_epochs": round(length["epochs"]),
          "plateau": None, "plateau_epochs": None, "worse_from": None,
          "worse_from_epochs": None, "deep_ensemble": deep_ensemble,
          "single_model": single_model, "one_length": True}


def trained_to_end(study_dir: str, curves: tuple[str, ...], seeds: int = SEEDS) -> list[dict]:
  """The single-model points of a ladder study whose every reported seed trained to the end
  of its budget (no rung stopped it) as ceilings rows, one length each: a final of the model
  too (a lower bound). Of a point's rates with such seeds (its own choice's, and each rung's
  under `per_target/`), the one whose tuning run (seed 0) ended best, as the ceilings tune
  for the final metric: the reported seeds choose nothing. `context` keeps the rows that
  raise their model's ceiling."""
  out = []
  for curve in curves:
    for point_dir in sorted(glob.glob(os.path.join(study_dir, curve, "*", ""))):
      point = os.path.basename(os.path.dirname(point_dir))
      finished = [runs for runs in (_seeded(d, seeds) for d in [point_dir] + sorted(glob.glob(
          os.path.join(point_dir, report.PER_TARGET, "*", ""))))
                  if runs and all(r["steps"] >= r["step_budget"] for r in runs)]
      if not finished:
        continue
      runs = max(finished, key=_tuning_final)
      metric, name = runs[0]["target"]["metric"], data.point_name(curve, point)
      out.append(_one_length(
          curve, f"{name} (the ladder's)", name, data.model_name(runs[0]["config"]),
          runs[0].get("num_params"),
          _length(point, _epochs(runs[0]), runs, [r["final"][metric] for r in runs]),
          single_model=curve == report.BASELINE))
  return out


def _seeded(run_dir: str, seeds: int = SEEDS) -> list[dict]:
  """The seed runs under `run_dir` other than the tuning seed's, once there are `seeds` of
  them; else none. The tuning seed's run won the choice of rate (for a ceiling, the best
  final on that seed: biased high), and one run is no spread: a length is read from its
  reported seeds alone, as a ladder point is (`pending`, `at_rung`)."""
  runs = [r for r in map(stored.load, glob.glob(os.path.join(run_dir, "seed*", "results.json")))
          if report.result_seeds(r)[0] != report.result_seeds(r)[1]]
  return runs if len(runs) >= seeds else []


def _tuning_final(runs: list[dict]) -> float:
  """The final metric of the tuning run (seed 0) at the rate `runs` trained with: the run
  of the point's tuning record whose value is that rate."""
  rate = runs[0]["config"]["optim"]["learning_rate"]
  axes = (runs[0].get("tuning") or {}).get("axes", [])
  finals = [run["final"] for axis in axes if axis["key"] == "optim.learning_rate"
            for run in axis["runs"] if math.isclose(run["value"], rate, rel_tol=1e-9)
            and run.get("final") is not None]
  return max(finals, default=-math.inf)


def _length(point: str, epochs: float, runs: list[dict], finals: list[float]) -> dict:
  """One length of a ceilings row: `finals` (one per reported seed run of `runs`) and what
  the runs say of their seeds, eval set and tuning; the peak rate is the one they trained
  at (their config's, a rung's own choice too)."""
  tuning, config = runs[0].get("tuning") or {}, runs[0]["config"]
  return {"point": point, "epochs": epochs,
          "final": {**data.spread(finals), "seeds": len(finals)},
          "seed_list": sorted(r["config"]["seed"] for r in runs),
          "eval_examples": (runs[0]["final"].get("num_examples")
                            or config["eval"]["num_examples"]),
          "peak_learning_rate": optim.peak_learning_rate(
              ml_collections.ConfigDict(config["optim"]), config["train"]["batch_size"]),
          "at_edge": _trained_at_edge(tuning, config),
          "tuning_runs": (tuning.get("compute") or {}).get("runs", 0),
          "metric": runs[0]["target"]["metric"],
          "objective": config["tune"]["objective"]}


def _trained_at_edge(tuning: dict, config: dict) -> bool:
  """Whether a value the runs trained with (the point's own choice or a rung's) sits at an
  edge of the values its tuned axis tried (`report.at_edge`)."""
  def trained(key: str) -> float:
    try:
      return config_lib.get(config, key)
    except KeyError:  # a field its record predates: the run trained at its default
      return config_lib.get(config_lib.base_config(), key)

  def edge(axis: dict) -> bool:
    tried = sorted({r["value"] for r in axis["runs"]})
    value = min(tried, key=lambda v: abs(v - trained(axis["key"])), default=None)
    return report.at_edge(axis["key"], tried, value)

  return any(map(edge, tuning.get("axes", [])))


def _read(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def pending(grids: dict, seeds: int = SEEDS) -> dict:
  """The points of the workload's ceilings and ladder grids ({study: (config, grid)}) with
  fewer than `seeds` reported seeds' results.json (the tuning seed's does not count), by
  curve, and how many points the grids hold: {"total": n, "count": pending,
  "curves": {curve name: [point names]}}."""
  out, total, baselines = {}, 0, 0
  for study, (config, grid) in grids.items():
    points = importlib.import_module(f"experiments.configs.{config}").sweep_grid(grid)
    for curve, names in points.items():
      for point in names:
        total += 1
        if not _seeded(os.path.join(data.RESULTS, study, curve, point), seeds):
          out.setdefault(data.CURVE_NAMES.get(curve, curve), []).append(point)
          variant = names[point][0]
          baselines += not any(v in methods.METHODS and v != report.BASELINE
                               for v in variant.split(","))
  return {"total": total, "count": sum(map(len, out.values())), "curves": out,
          "seeds": seeds, "baselines": baselines}


def rungs(dirs: list[str]) -> tuple[list[float], str | None]:
  """Every rung some committed run of `dirs` tracked, easiest first, and their metric (None
  where no run has finished)."""
  values, metric = set(), None
  for d in dirs:
    for path in glob.glob(os.path.join(d, "*", "*", "seed*", "results.json")):
      r = stored.load(path)
      metric = r["target"]["metric"]
      values |= {t["value"] for t in r["targets"]}
  return sorted(values, reverse=metric in config_lib.LOWER_IS_BETTER), metric


def best_matched(pts: list[dict], methods: list[str], kind: str) -> dict | None:
  """The method point with the best matched `kind` ('time' or 'compute') ratio over every
  preset (`report.matched`: at its own budget against the strongest-baseline frontier). A
  point that no baseline reaches the target within the budget of, at the seeds' medians,
  has no ratio, only its margin (`report.beyond`: the closest baseline's budget over its):
  `margin` says so, `ahead` where that holds on every seed (it comes first)."""
  best = None
  for curve in methods:
    for preset in report.PRESETS:
      for row in report.matched(pts, curve, preset):
        if row[kind] is not None:
          (ratio, vs), spread = row[kind], row[f"{kind}_range"]
        elif kind in row["margin"]:
          ratio, vs, spread = row["margin"][kind]
        else:
          continue
        ahead = kind in row["ahead"]
        if best is None or (ahead, ratio) > (best["ahead"], best["ratio"]):
          best = {"ratio": ratio, "point": f"{curve} {row['point']}", "ahead": ahead,
                  "margin": row[kind] is None, "kind": kind,
                  "name": data.point_name(curve, row["point"]),
                  "preset": data.PRESET_NAMES[preset], "vs": vs,
                  "vs_name": data.point_name(*vs.split()), "range": list(spread)}
  if best is not None:
    best["verdict"] = "beats" if best["ahead"] else verdict_word(best["ratio"], best["range"])
  return best


def closest(pts: list[dict]) -> dict:
  """The one reading of a study's points every page quotes: the closest method point in
  time and in compute (each the best matched ratio over every preset, `best_matched`), the
  strongest baseline (the frontier point the closest time ratio is measured against; with
  none, the fastest baseline that reached the target on every seed, on the first preset),
  whether a method point beats it (a matched ratio above 1 over its whole seed range, or a
  point ahead of every baseline) and the verdict's key in VERDICTS."""
  baselines = set(report.baseline_curves(pts))
  methods = sorted({p["curve"] for p in pts} - baselines)
  rows = [row for curve in methods for preset in report.PRESETS
          for row in report.matched(pts, curve, preset)]
  beats = any(row["ahead"] or any(row[k] is not None and row[f"{k}_range"][0] > 1
                                  for k in ("time", "compute")) for row in rows)
  out = {"time": best_matched(pts, methods, "time"),
         "compute": best_matched(pts, methods, "compute"),
         "beats": beats, "methods": methods, "baselines": sorted(baselines)}
  fastest = min(report._reached(pts, baselines, report.PRESETS[0]), default=None)
  strongest = out["time"]["vs"] if out["time"] else fastest[2] if fastest else None
  out["strongest"] = strongest and data.point_name(*strongest.split())
  out["strongest_point"] = strongest
  best = max((b for b in (out["time"], out["compute"]) if b), key=lambda b: b["ratio"],
             default=None)
  out["best"] = best
  # the method points that reach it on every seed where no baseline point does
  out["unopposed"] = [] if fastest else [data.point_name(p["curve"], p["point"]) for p in pts
                                         if p["curve"] in methods and p["reached"] == p["seeds"]]
  out["verdict"] = "beats" if beats else "unopposed" if out["unopposed"] else verdict_word(
      best["ratio"] if best else None, best["range"] if best else None,
      measured=bool(methods))
  return out


def at_rung(dirs: list[str], value: float, seeds: int = SEEDS) -> dict:
  """One rung: the points of every study in `dirs` priced to it (a run that did not track it
  is left out; a point with fewer than `seeds` reported seeds is pending, not read), read by
  `closest`: the closest method point in time and in compute, the strongest baseline and
  the rung's verdict in VERDICTS' words."""
  runs = []
  for d in dirs:
    if os.path.isdir(d):
      runs += report.load_runs(d, target_value=value)
  # reported seeds only: a point whose tuning seed alone ran (it won the choice: biased) is
  # pending, not read
  runs = [r for r in runs if r["seed"] != r["tuning_seed"]]
  counts = collections.Counter((r["curve"], r["point"]) for r in runs)
  runs = [r for r in runs if counts[r["curve"], r["point"]] >= seeds]
  pts = report.points(runs)
  baselines = set(report.baseline_curves(pts))
  methods = sorted({p["curve"] for p in pts} - baselines)
  c = closest(pts)
  # the passes over the training set each named point took to the rung (median of its seeds)
  passes = {f"{p['curve']} {p['point']}": p["passes"] and p["passes"]["median"] for p in pts}
  for best in (c["time"], c["compute"]):
    if best:
      best["passes"], best["vs_passes"] = passes.get(best["point"]), passes.get(best["vs"])
  row = {"value": value, "method_points": sum(p["curve"] in methods for p in pts),
         "baseline_points": sum(p["curve"] in baselines for p in pts),
         "baselines_reaching": sum(p["curve"] in baselines and p["reached"] == p["seeds"]
                                   for p in pts),
         # points some of whose seeds stand at another rung's choice (none of its own)
         "off_choice_points": len({(r["curve"], r["point"]) for r in runs
                                   if not r["rung_choice"]}),
         # points whose choice for this rung sits at an edge of their tuning grid (capped, or
         # tuned when the rule extended a grid for the first rung's choice alone)
         "edge_choice_points": sum(bool(p["tuning"] and p["tuning"]["rung_at_edge"].get(
             value, p["tuning"]["at_edge"])) for p in pts),
         "strongest": c["strongest"],
         "strongest_passes": c["strongest_point"] and passes.get(c["strongest_point"]),
         "time": c["time"], "compute": c["compute"],
         "verdict": c["verdict"], "unopposed": c["unopposed"]}
  return row


def study_rungs(values: list[float], named: tuple[float, ...], single_ceiling: float | None,
                top_ceiling: float | None, below_ceiling: float | None) -> list[float]:
  """The rungs the page reads (every other stays in the JSON): the `named` ones tracked and,
  with `below_ceiling`, the highest rung at least that far below the single model's ceiling
  and the lowest above it that the highest ceiling (a wider model's, a deep ensemble's) still
  reaches (accuracy: higher is harder)."""
  out = [v for v in named if any(math.isclose(v, t) for t in values)]
  if below_ceiling is not None and single_ceiling is not None:
    below = [v for v in values if v <= single_ceiling - below_ceiling + 1e-9]
    between = [v for v in values if single_ceiling < v <= (top_ceiling or 0.0)]
    out += [max(below)] if below else []
    out += [min(between)] if between else []
  lower = bool(values) and values[0] > values[-1]  # listed easiest first
  return sorted(set(out), reverse=lower)


def context(workload: str = "fashion_mnist") -> dict:
  """What docs/results/targets.md is rendered from."""
  w = WORKLOADS[workload]
  dirs = [os.path.join(data.RESULTS, s) for s in w["studies"]]
  ceiling_rows = ceilings(os.path.join(data.RESULTS, w["ceilings"]), w.get("ceiling_curves"))
  single = next((c for c in ceiling_rows if c["curve"] == report.BASELINE), None)
  if single and w.get("deep_ensemble"):
    study, curve, n = w["deep_ensemble"]
    ceiling_rows += deep_ensemble(os.path.join(data.RESULTS, study), curve, n, single)
  if w.get("ladder_ceilings"):
    study, curves = w["ladder_ceilings"]
    # those that end above every row of their model so far: they raise its ceiling
    for row in trained_to_end(os.path.join(data.RESULTS, study), curves):
      if all(row["ceiling"]["median"] > c["ceiling"]["median"] for c in ceiling_rows
             if c["architecture"] == row["architecture"]):
        ceiling_rows.append(row)
  values, metric = rungs(dirs)
  lower = bool(values) and values[0] > values[-1]  # rungs listed easiest first
  best_of = min if lower else max
  top_ceiling = best_of((c["ceiling"]["median"] for c in ceiling_rows), default=None)
  # the sweep model's ceiling: the best of its single-model rows (data-parallel's lengths, the
  # deep ensemble's workers, each trained alone)
  single = best_of((c for c in ceiling_rows if c["single_model"]),
                   key=lambda c: c["ceiling"]["median"], default=None)
  single_ceiling = single["ceiling"]["median"] if single else None
  ladder = [at_rung(dirs, v) for v in study_rungs(
      values, w["named_rungs"], single_ceiling, top_ceiling, w["below_ceiling"])]
  deep = next((f"{c['curve']} {c['best_point']}" for c in ceiling_rows
               if c["deep_ensemble"]), None)
  for row in ladder:  # harder than the single model's ceiling
    for best in (row["time"], row["compute"]):
      if best and best["point"] == deep:
        best["name"] += " (the deep ensemble)"
    row["above_single_ceiling"] = bool(single) and (
        row["value"] < single_ceiling if lower else row["value"] > single_ceiling)
  waiting = pending(w["grids"])
  for row in ladder:  # a win or a draw stands once every baseline point has its seeds
    row["measured_verdict"] = row["verdict"]
    if waiting["baselines"] and row["verdict"] in ("beats", "level", "unopposed"):
      row["verdict"] = "provisional"
  by_verdict = {k: [r["value"] for r in ladder if r["verdict"] == k] for k in VERDICTS}
  return {"workload": workload, "workload_name": w["name"], "ceilings": ceiling_rows, "ladder": ladder,
          "by_verdict": by_verdict, "step_scaling": step_scaling(w.get("step_scaling")),
          "above_single": [r["value"] for r in ladder if r["above_single_ceiling"]],
          "studies": [s for s, d in zip(w["studies"], dirs) if os.path.isdir(d)],
          "tracked_rungs": values, "single": single,
          "figure": f"experiments/results/targets/{workload}.png", "length": w["length"],
          "pending": waiting, "metric": metric,
          # the kinds of ceilings rows beside the ceilings study's own that it may have
          "row_kinds": {"deep_ensemble": bool(w.get("deep_ensemble")),
                        "ladder": bool(w.get("ladder_ceilings"))}}


def step_scaling(pairs: dict | None) -> dict | None:
  """How much a larger device step costs in time against a smaller one, from the calibrated
  steps the runs are priced by: {kind: {larger, smaller: {name, ms (median over the seed
  runs), examples and FLOPs per device step}, time, examples, flops: the ratios}}; each
  kind ('host', 'accelerator') a (larger, smaller) pair of run folders under results/.
  FLOPs are read from runs on a CPU alone (on a GPU, XLA's cost analysis misses the
  convolutions cuDNN runs): an accelerator's pair is the same model at two batches,
  compared by examples. None: a run is missing."""
  if not pairs:
    return None
  out = {}
  for kind, folders in pairs.items():
    sides = []
    for folder in folders:
      runs = data.results(os.path.join(folder, "seed[1-9]*", run_lib.RESULTS_FILE))
      if not runs:
        return None
      r = runs[0]  # (every seed of a point runs the same program at the same step)
      devices = r["cost"]["modelled"]["devices"]
      cpu = r["host"]["device_kind"] == "cpu"  # (the only cost analysis that sees them all)
      sides.append({"name": data.point_name(*folder.split("/")[-2:]),
                    "ms": 1e3 * statistics.median(x["cost"]["modelled"]["device_step_time_s"]
                                                  for x in runs),
                    "examples": r["examples_per_step"] / devices,
                    "flops": r["flops_per_step"] / devices if cpu else None,
                    "device": r["host"].get("cpu") or r["host"]["device_kind"]})
    larger, smaller = sides
    out[kind] = {"larger": larger, "smaller": smaller, "time": larger["ms"] / smaller["ms"],
                 "examples": larger["examples"] / smaller["examples"],
                 "flops": larger["flops"] / smaller["flops"]
                          if larger["flops"] and smaller["flops"] else None}
  return out


def page_context() -> dict:
  """docs/results/targets.md's context: every workload, those whose ladder has not run
  with the rungs their other studies tracked and their points pending."""
  return {"workloads": [context(w) for w in WORKLOADS]}


def plot(ctx: dict, path: str) -> None:
  """The best matched time and compute ratios (median, seeds' range) at every rung read,
  the 1x line, the ceilings measured marked."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  accuracy = ctx["metric"] in (None, "accuracy")
  x = (lambda v: 100 * v) if accuracy else (lambda v: v)  # the axis's units
  step = 0.08 if accuracy else 0.08 * (ctx["tracked_rungs"][0] - ctx["tracked_rungs"][-1]) / 9
  fig, ax = plt.subplots(figsize=(8.4, 3.8))
  for kind, marker, color, shift in (("time", "o", "tab:blue", -step),
                                     ("compute", "s", "tab:green", step)):
    for margin in (False, True):
      rows = [r for r in ctx["ladder"] if r[kind] and r[kind]["margin"] == margin]
      if not rows:
        continue
      xs = [x(r["value"]) + shift for r in rows]
      ys = [r[kind]["ratio"] for r in rows]
      err = [[y - r[kind]["range"][0] for y, r in zip(ys, rows)],
             [r[kind]["range"][1] - y for y, r in zip(ys, rows)]]
      budget = "compute" if kind == "time" else "time"
      ax.errorbar(xs, ys, yerr=err, fmt=marker, color=color, capsize=3,
                  mfc="white" if margin else color,
                  label=(f"{kind}: no baseline within its {budget} at the seeds' medians "
                         f"(the closest baseline's {budget} / its; seeds' range)") if margin
                  else f"best matched {kind} ratio (seeds' range)")
  ax.axhline(1.0, color="black", lw=0.8, ls="--", label="1x: level with the strongest baseline")
  ax.set_yscale("log")
  # the ceilings, close together near the top rungs: one line style each, named in the legend
  styles = [(color, ls) for ls in (":", "-.", "--") for color in
            ("gray", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")]
  for c, (color, ls) in zip(ctx["ceilings"], styles):
    ax.axvline(x(c["ceiling"]["median"]), color=color, lw=1.0, ls=ls,
               label=f"ceiling: {c.get('label', c['model'])}, "
                     + data.final_text(c["ceiling"]["median"], ctx["metric"])
                     + ("" if c["plateau"] else " (a lower bound)"))
  unmeasured = [x(r["value"]) for r in ctx["ladder"] if r["verdict"] == "unmeasured"]
  if unmeasured:
    ax.plot(unmeasured, [1.0] * len(unmeasured), "x", color="red",
            label="no method point trained to this target")
  unopposed = [x(r["value"]) for r in ctx["ladder"] if r["measured_verdict"] == "unopposed"]
  if unopposed:
    ax.plot(unopposed, [1.0] * len(unopposed), "^", color="green",
            label="reached by a method point, by no baseline point")
  ax.set_xlabel("target: test accuracy (%)" if accuracy else
                f"target: {ctx['metric']} (harder to the right)")
  if not accuracy:
    ax.invert_xaxis()
  ax.set_ylabel("baseline / method (above 1: method better)")
  report.plain_log_ticks(ax, "y")
  handles, labels = ax.get_legend_handles_labels()  # the readings first, then the ceilings
  order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("ceiling: "))
  ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7,
            loc="upper left", bbox_to_anchor=(0.0, -0.17), ncol=1)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Software": None})
  plt.close(fig)


FLAGS = flags.FLAGS
flags.DEFINE_string("workload", "fashion_mnist", "a key of WORKLOADS")
flags.DEFINE_bool("plot", False, "also draw the figure of every workload on the page (each "
                  "context's `figure`)")


def main(argv) -> None:
  del argv
  if FLAGS.plot:
    for ctx in page_context()["workloads"]:
      plot(ctx, os.path.join(data.REPO, ctx["figure"]))
  print(json.dumps(context(FLAGS.workload), indent=1))


if __name__ == "__main__":
  app.run(main)
