"""One tuning rule for every point of a cost-vs-time sweep.

For each field of `config.tune.fields` in turn (the peak learning rate `optim.learning_rate`;
DiLoCo's `method.outer_learning_rate` after it), on seed `tune.seed`: one run at each of
`tune.factors` x the configured value; while the best run sits at the lowest or highest
value tried, one more run at that value / or x `tune.extend`: the rule does not stop while
the best sits at an edge (it stops once the best is interior, e.g. when the next value
diverged), up to the cap `tune.max_extensions` per edge, which the record names
(`capped`) when reached: the optimum may lie beyond. The best run reaches the target in the fewest steps;
among runs tied in steps, and among runs that never reach it, the better final metric
wins; a diverged run loses to every other; of equals, the smaller value wins. The next key
is tuned from the chosen values of the previous ones. A caller may pass a warm start, a
factor per key that the first grid holds too (the critical-batch sweep: the factor the next
smaller batch chose, since past the critical batch the configured batch-scaled rate
overshoots); the rule then goes on as above, so it can only choose a run at least as good.

The schedule's length, `train.schedule_fraction` among the fields, is tried at the
values `tune.schedule_fractions` of the point's budget (1, 1/2, 1/4), extended at its edges
as the rate is (`tune.extend`, `tune.max_extensions`): past the shortest (1/8 after 1/4),
and past the longest while it is short of the whole budget (never beyond 1, the budget);
Shallue et al. (2018) tune it per batch size, since a shorter schedule decays sooner. Each length
runs on `tune.seed` and then on each of `tune.schedule_seeds` (seeds never reported), and
counts its worst seed: a short schedule reaches the target only as its rate decays, often
at its last evals, so a length chosen on one seed missed the target on the reported seeds
(measured: data-parallel D = 8 at a quarter schedule reached 85% at step 54 of 59 on the
tuning seed and missed it on three others). A length that misses on one seed loses and is
not run on the next. A length is chosen only with a margin: a run that reaches the target
after `tune.schedule_margin` of its schedule's steps counts as a miss (measured: D = 8's
quarter schedule reached it at step 54 and 48 of 59 on its two tuning seeds, and missed it
on the reported seeds 1-3 by 6 to 20 images of 2,000).

A run lives in `<point_dir>/tune/<name>/`, named by every tuned value (`lr0.003`,
`lr0.003_outer_lr0.7`, `lr0.003_sched0.5`; a whole-budget schedule adds nothing; a run on
another seed than tune.seed adds `_seed<k>`), so a run two keys share is trained once. The chosen run is the
point's seed-`tune.seed` run: the sweep copies it, it does not train it again.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
from typing import Callable

import ml_collections

from ensemble_jax import checkpoint as checkpoint_lib
from ensemble_jax import record as record_lib
from ensemble_jax import config_lib, costs, optim, report, stored
from ensemble_jax import run as run_lib
from ensemble_jax import train as train_lib
from experiments import sweeps

# (config, run_dir) -> the run's results.json, or None when it diverged.
TrainFn = Callable[[ml_collections.ConfigDict, str], "dict | None"]

DIVERGED_FILE = "diverged.json"  # a run whose loss became NaN/inf: what it raised
TUNING_FILE = "tuning.json"  # a point's record: the grid, each run, the choice, the compute
SHORT_NAMES = {"optim.learning_rate": "lr", "method.outer_learning_rate": "outer_lr",
               config_lib.SCHEDULE_FRACTION: "sched"}
# The schedule's length (config_lib.SCHEDULE_FRACTION): tried at tune.schedule_fractions of
# the point's budget, extended at an edge as a rate is but never past 1 (the whole budget);
# at 1 it is left out of a run's name.
SCHEDULE = config_lib.SCHEDULE_FRACTION
RULE = ("per key in turn, on seed tune.seed: factors x the configured value, extended by "
        "`extend` beyond an edge while the best sits there, until it is interior (a diverged "
        "next value bounds it) or the cap max_extensions per edge is reached (recorded as "
        "capped); "
        "best = fewest steps to target, then the better final metric (also for runs that "
        "never reach it); a diverged run loses; of equals the smaller value")
SCHEDULE_RULE = ("; the schedule's length (train.schedule_fraction) at the values "
                 "tune.schedule_fractions of the budget, extended by `extend` beyond an edge "
                 "as the rates are (never past 1, the whole budget), each on tune.seed and "
                 "then on each of tune.schedule_seeds: its steps are its worst seed's, and a "
                 "length that misses the target on one seed loses (not run on the next, nor "
                 "one that already took more steps than another length's worst seed); a run "
                 "that reaches it after tune.schedule_margin of its schedule's steps counts "
                 "as a miss")
FINAL_RULE = ("per key in turn, on seed tune.seed: factors x the configured value, extended "
              "by `extend` beyond an edge while the best sits there, until it is interior or "
              "the cap max_extensions per edge is reached (recorded as capped); best = the "
              "better final metric (tune.objective 'final_metric': a ceiling); a diverged "
              "run loses; of equals the smaller value")
LADDER_RULE = ("; with a ladder of targets (eval.target_values) each rung's choice is read "
               "from the same runs by fewest steps to that rung, then the better final "
               "metric (chosen_per_target), a grid extended past an edge where a rung some "
               "run reached chooses it, as for the point's own choice; with stop_losers a "
               "run stops only once it can win no rung")
WARM_START_RULE = ("; the first grid also holds the key's warm-start factor (the factor the "
                   "next smaller batch chose)")
STOP_LOSERS_RULE = ("; once a run has reached the target, a run trained after it stops at "
                    "its first eval at or past the fewest steps so far (stopped_at_step): "
                    "if it has not reached the target by then it cannot be chosen, so the "
                    "choice is the one full runs would give")


def run_name(config) -> str:
  """`lr0.003`, `lr0.003_outer_lr0.7`: a tuning run's directory, from its tuned values."""
  name = "_".join(f"{SHORT_NAMES.get(k, k.rsplit('.', 1)[-1])}{config_lib.get(config, k):.4g}"
                  for k in config.tune.fields
                  if not (k == SCHEDULE and config_lib.get(config, k) == 1.0))
  return name if config.seed == config.tune.seed else f"{name}_seed{config.seed}"


def rung_of(results: dict, rung: int = 0) -> dict:
  """The run's target at `rung` of its ladder (`targets`; 0: `target`)."""
  return results.get("targets", [results["target"]])[rung]


def rungs(config) -> int:
  """How many targets the point's runs record (eval.target_values, else one)."""
  return len(config_lib.target_ladder(config.eval))


def late(results: dict | None, margin: float | None, rung: int = 0) -> bool:
  """Whether a run reached the target only after `margin` of its schedule's steps (its
  step_budget): a knife-edge reach that other seeds miss. Never with `margin` None."""
  target = rung_of(results, rung) if results else None
  return bool(margin is not None and target and target["reached"]
              and target["reached_step"] > margin * results["step_budget"])


def reached(results: dict | None, margin: float | None = None, rung: int = 0) -> bool:
  """Reached the target, within `margin` of its schedule's steps when given."""
  return bool(results and rung_of(results, rung)["reached"] and not late(results, margin,
                                                                           rung))


def _final_key(results: dict) -> float:
  """The final metric, signed to minimise; inf when not finite."""
  metric = results["target"]["metric"]
  final = results["final"].get(metric)
  if final is None or not math.isfinite(final):
    return math.inf
  return final if metric in config_lib.LOWER_IS_BETTER else -final


def rank(results: dict | None, margin: float | None = None, rung: int = 0) -> tuple:
  """Smaller is better: (missed the target, steps to it, final metric, signed to minimise);
  a diverged run (None) ranks after every other; with `margin`, a run that reached the
  target late (`late`) ranks as one that missed it. `rung`: which of the run's targets."""
  if results is None:
    return (2, 0, math.inf)
  if reached(results, margin, rung):
    return (0, rung_of(results, rung)["reached_step"], _final_key(results))
  return (1, 0, _final_key(results))


def rank_final(results: dict | None, margin: float | None = None) -> tuple:
  """Smaller is better: the final metric alone (tune.objective 'final_metric': a ceiling is
  the best a configuration ends at); a diverged or non-finite run ranks after every other."""
  if results is None:
    return (2, math.inf)
  key = _final_key(results)
  return (0 if math.isfinite(key) else 1, key)


# tune.objective -> what the point's choice minimises (its other targets' choices are
# recorded beside it, by `rank` at each rung).
OBJECTIVES = {"steps_to_target": rank, "final_metric": rank_final}
assert tuple(OBJECTIVES) == config_lib.TUNE_OBJECTIVES


def _with(config, key: str, value: float):
  c = copy.deepcopy(config)
  config_lib.set_dotted(c, key, float(value))
  return c


def on_seed(config, seed: int):
  c = copy.deepcopy(config)
  c.seed = seed
  return c


def tuning_seeds(config) -> tuple[int, ...]:
  """The seeds the point's choice is made on: tune.seed, and tune.schedule_seeds when the
  schedule's length is tuned."""
  t = config.tune
  return (t.seed, *(t.schedule_seeds if SCHEDULE in t.fields else ()))


def check_seeds(config, seeds) -> None:
  """Reported seeds must have played no part in the choice."""
  if clash := sorted(set(seeds) & set(config.tune.schedule_seeds)):
    raise ValueError(f"seeds {clash} are tune.schedule_seeds {list(config.tune.schedule_seeds)}"
                     ", on which the schedule's length is chosen: report other seeds "
                     "(e.g. --seeds=1,2,3), or set tune.schedule_seeds to others")


def tune(config: ml_collections.ConfigDict, point_dir: str, train: TrainFn,
         warm_start: dict[str, float] | None = None) -> tuple[ml_collections.ConfigDict, dict]:
  """Runs the rule on `config` (the point at seed tune.seed) through `train`; returns the
  config at the chosen values and the record (`tuning.json`, results.json `tuning`).
  `warm_start`: {key: factor of the configured value} added to that key's first grid."""
  t = config.tune
  # a ratio of two rates (e.g. 0.00075 / 0.003 = 0.25000000000000006): snapped, so that it
  # lands on the grid value it names
  warm_start = {k: float(f"{f:.12g}") for k, f in (warm_start or {}).items()}
  if unknown := set(warm_start) - set(t.fields):
    raise ValueError(f"warm_start keys {sorted(unknown)} are not tuned fields {list(t.fields)}")
  runs: dict[str, dict | None] = {}  # run name -> results (None: diverged)
  axes, chosen = [], config

  margin = None  # the schedule's margin while its key is tuned

  objective = OBJECTIVES[t.objective]
  ladder = rungs(config)
  examined = {}  # run name -> (config, its runs on the tuning seeds, its margin)

  def fewest(rivals) -> list[int | None]:
    """Per rung, the fewest steps to it of `rivals` (its own grid's candidates, each a list
    of run names, one per seed: each rung's choice is made among them) run so far."""
    groups = [[runs.get(n, False) for n in group] for group in rivals]
    return [_fewest_steps(groups, margin, i) for i in range(ladder)]

  def bound(rivals) -> int | None:
    """The step past which a run can win no rung: the most of `fewest`; None while some
    rung has none (a run may still win it)."""
    steps = fewest(rivals)
    return None if None in steps else max(steps)

  def lost(results, rivals) -> bool:
    """Whether a run can win no rung against `rivals`: every rung has a rival's steps, and
    the run missed it or took more."""
    return all(f is not None and (not reached(results, margin, i)
                                  or rung_of(results, i)["reached_step"] > f)
               for i, f in enumerate(fewest(rivals)))

  def result(c, rivals=()):
    """The run at `c`; with tune.stop_losers, stopped once it cannot beat `rivals`."""
    name = run_name(c)
    if name not in runs:
      if t.stop_losers:
        c = _stopped_at(c, bound(rivals))
      runs[name] = train(c, os.path.join(point_dir, "tune", name))
    return runs[name]

  def candidate(c, seeds, rivals) -> list:
    """The candidate `c`'s runs on `seeds` in turn, up to the first that misses the target
    (or, with tune.stop_losers, that took more steps than a rival's worst seed: it lost)."""
    done = []
    for seed in seeds:
      if done and not reached(done[-1], margin):
        break
      run = on_seed(c, seed)
      if done and t.stop_losers and lost(done[-1], rivals) and run_name(run) not in runs \
          and not os.path.exists(os.path.join(point_dir, "tune", run_name(run),
                                              run_lib.RESULTS_FILE)):
        break  # (one trained before, by an earlier bound, is read: its compute was spent)
      done.append(result(run, rivals))
    return done

  for key in t.fields:
    seeds = tuning_seeds(config) if key == SCHEDULE else (t.seed,)
    margin = t.schedule_margin if key == SCHEDULE else None
    base = config_lib.get(chosen, key)
    factors = set(t.factors) | ({warm_start[key]} if key in warm_start else set())
    values = sorted(base * f for f in factors)
    if key == SCHEDULE:
      base, values = 1.0, sorted(set(t.schedule_fractions) | {base})
    if t.stop_losers and key in warm_start:  # the likeliest best first: it stops the others
      result(_with(chosen, key, base * warm_start[key]))
    extensions = {"low": 0, "high": 0}
    while True:
      grid = {v: _with(chosen, key, v) for v in values}
      rivals = [[run_name(on_seed(c, s)) for s in seeds] for c in grid.values()]
      tried = {v: candidate(grid[v], seeds, rivals) for v in values}
      for v, c in grid.items():
        examined[run_name(c)] = (c, tried[v], margin)
      best = min(values, key=lambda v: (max(objective(r, margin) for r in tried[v]), v))
      # each rung's choice among the same runs, by steps to that rung; an edge is extended
      # for the point's choice and for each rung some candidate reached whose choice sits
      # there, as the point's own (a rung none reached is chosen by its final metric)
      per_rung = [min(values, key=lambda v: (max(rank(r, margin, i) for r in tried[v]), v))
                  for i in range(ladder)]
      wanted = {best} | {v for i, v in enumerate(per_rung) if ladder > 1 and any(
          reached(r, margin, i) for runs_at in tried.values() for r in runs_at)}
      low, high = beyond(key, values, t.extend)
      if low is not None and values[0] in wanted and extensions["low"] < t.max_extensions:
        values.insert(0, low)
        extensions["low"] += 1
      elif high is not None and values[-1] in wanted and extensions["high"] < t.max_extensions:
        values.append(high)
        extensions["high"] += 1
      else:
        break
    axes.append({
        "key": key, "base": base, "chosen": best, "extensions": extensions,
        **({"chosen_per_target": per_rung} if ladder > 1 or t.objective != "steps_to_target"
           else {}),
        **({"values": values} if key == SCHEDULE else {}),
        **({"warm_start_factor": warm_start[key]} if key in warm_start else {}),
        # the best at an edge once the extensions ran out: the optimum may lie beyond
        "at_edge": report.at_edge(key, values, best),
        # the extensions stopped by their cap with the best still at that edge
        "capped": report.at_edge(key, values, best) and extensions[
            "low" if best == values[0] else "high"] >= t.max_extensions,
        **({"margin": t.schedule_margin} if key == SCHEDULE else {}),
        "runs": [_row(v, base, [(s, n, runs[n]) for s, n in
                                ((s, run_name(on_seed(_with(chosen, key, v), s))) for s in seeds)
                                if n in runs]) for v in values],
    })
    chosen = _with(chosen, key, best)
  record = {
      "rule": rule(bool(warm_start), t.stop_losers, SCHEDULE in t.fields, t.objective,
                   ladder > 1), "seed": t.seed,
      **({"schedule_seeds": list(t.schedule_seeds)} if SCHEDULE in t.fields else {}),
      "factors": list(t.factors), "extend": t.extend, "max_extensions": t.max_extensions,
      **({"schedule_margin": t.schedule_margin} if SCHEDULE in t.fields else {}),
      "axes": axes,
      "chosen": {key: config_lib.get(chosen, key) for key in t.fields},
      "chosen_run": os.path.join("tune", run_name(chosen)),
      **({"chosen_per_target": _per_target(examined, t.fields, ladder)}
         if ladder > 1 or t.objective != "steps_to_target" else {}),
      "peak_learning_rate": optim.peak_learning_rate(chosen.optim, chosen.train.batch_size),
      "compute": compute(list(runs.values())),
  }
  return chosen, record


def beyond(key: str, values: list[float], extend: float) -> tuple:
  """(the value past the low edge of `values`, past the high one): a factor `extend` beyond
  each; None where the axis ends (one value only; a schedule at the whole budget, 1)."""
  if len(values) < 2:
    return None, None
  if key == SCHEDULE:
    return values[0] / extend, (min(1.0, values[-1] * extend) if values[-1] < 1.0 else None)
  return values[0] / extend, values[-1] * extend


def _per_target(examined: dict, fields, ladder: int) -> list[dict]:
  """Each rung's choice among every configuration the rule tried: the fewest steps to that
  rung on every tuning seed (a candidate's worst seed; the schedule's margin where it
  applied), then the better final metric; of equals the first tried."""
  out = []
  for i in range(ladder):
    name = min(examined, key=lambda n: max(rank(r, examined[n][2], i) for r in examined[n][1]))
    c, tried, margin = examined[name]
    target = rung_of(tried[0], i) if tried and tried[0] else None
    out.append({"value": target["value"] if target else None,
                "reached": all(reached(r, margin, i) for r in tried),
                "chosen": {key: config_lib.get(c, key) for key in fields},
                "chosen_run": os.path.join("tune", name)})
  return out


def rule(warm_start: bool, stop_losers: bool, schedule: bool = False,
         objective: str = "steps_to_target", ladder: bool = False) -> str:
  return ((RULE if objective == "steps_to_target" else FINAL_RULE)
          + (SCHEDULE_RULE if schedule else "") + (WARM_START_RULE if warm_start else "")
          + (STOP_LOSERS_RULE if stop_losers else "") + (LADDER_RULE if ladder else ""))


def _fewest_steps(candidates: list[list], margin: float | None = None,
                  rung: int = 0) -> int | None:
  """The fewest steps to the target at `rung` among the candidates that reached it on every
  seed (each a list of results, one per seed; False: not run yet), within `margin` of their
  schedules when given; a candidate's steps are its worst seed's. None if none has."""
  steps = [max(rung_of(r, rung)["reached_step"] for r in c) for c in candidates
           if all(reached(r, margin, rung) for r in c)]
  return min(steps, default=None)


def _stopped_at(config, bound: int | None) -> ml_collections.ConfigDict:
  """`config` stopping at its first eval at or past `bound`, the fewest steps to target of
  its rivals (unchanged if None). Its evals up to there are the full run's, so it has
  reached the target by then exactly when the full run would (and then stops there, as the
  full run does); if not, the full run reaches it later or never: it loses."""
  if bound is None:
    return config
  c = copy.deepcopy(config)
  c.train.stop_at_step = bound
  return c


def _row(value: float, base: float, tried: list[tuple]) -> dict:
  """A candidate's row from its runs `tried`, (seed, run name, results) in seed order: the
  first on tune.seed, then the other tuning seeds it was tried on, if any."""
  (_, name, results), *others = tried
  row = {"run": os.path.join("tune", name), "value": value, "factor": value / base,
         **_outcome(results)}
  if others:
    row["other_seeds"] = [{"seed": s, "run": os.path.join("tune", n), **_outcome(r)}
                          for s, n, r in others]
  return row


def _outcome(results: dict | None) -> dict:
  if results is None:
    return {"diverged": True, "reached": False, "steps_to_target": None, "final": None}
  target = results["target"]
  return {"diverged": False, "reached": bool(target["reached"]),
          "steps_to_target": target["reached_step"] if target["reached"] else None,
          "step_budget": results.get("step_budget"),
          "stopped_at_step": stopped_early(results),
          "final": results["final"].get(target["metric"])}


# What the tuning runs cost together: the record's `compute` (`costs.tuning_compute`, which
# the report sums again from the runs' records, their charges priced then).
compute = costs.tuning_compute


def read_run(run_dir: str) -> tuple[bool, dict | None]:
  """(finished, results): a finished run's results.json, or None for one that diverged."""
  path = os.path.join(run_dir, run_lib.RESULTS_FILE)
  if os.path.exists(path):
    return True, stored.load(path)
  return os.path.exists(os.path.join(run_dir, DIVERGED_FILE)), None


def train_run(config, run_dir: str, counts: dict, what: str,
              pool_config=None) -> dict | None:
  """The run's results, trained unless finished (`counts[what]` += 1 when trained); None
  when it diverged (recorded in `diverged.json`, so that a resumed sweep does not train it
  again; `counts['diverged']` += 1). A run stopped early (tune.stop_losers) before the step
  `config` stops at is continued: under a later bound it might yet win. Finished is
  `run_lib.finished_results`' judgement: another config's run is refused, as main.py does."""
  sweeps.sync(f"train_run {run_dir}")  # every process reads what process 0 wrote
  if (results := run_lib.finished_results(config, run_dir)) is not None:
    return results
  if os.path.exists(os.path.join(run_dir, DIVERGED_FILE)):
    return None
  try:
    results = run_lib.train_and_evaluate(config, run_dir, pool_config=pool_config)
  except FloatingPointError as e:  # a rate too high for this point: a result, not a crash
    if sweeps.is_writer():
      record_lib.write_json(os.path.join(run_dir, DIVERGED_FILE), {"error": str(e)})
    counts["diverged"] += 1
    results = None
  counts[what] += 1
  return results


def stopped_early(results: dict | None) -> int | None:
  """The step a run stopped at early (train.stop_at_step, tune.stop_losers), short of the
  target (its last rung) and of its budget: it had lost by then. None for any other run."""
  if results is None or rung_of(results, -1)["reached"]:
    return None
  stop = results.get("config", {}).get("train", {}).get("stop_at_step", 0)
  steps = results["steps"]
  return steps if stop and steps < results["step_budget"] else None


def write_record(point_dir: str, record: dict) -> None:
  if not sweeps.is_writer():
    return
  record_lib.write_json(os.path.join(point_dir, TUNING_FILE), record)


PER_TARGET = report.PER_TARGET  # <point>/per_target/<run name>/seed<k>: a rung's choice


def rung_choices(chosen: ml_collections.ConfigDict,
                 record: dict) -> dict[str, tuple[ml_collections.ConfigDict, dict]]:
  """{directory under the point: (config, record)} for each rung's choice
  (`chosen_per_target`, among tune.report_targets; every rung if empty) that differs from
  the point's: its seeds run there, at the rung's chosen values, the record pointing
  `chosen_run` at that choice's tuning run."""
  wanted = [float(v) for v in chosen.tune.report_targets]
  out = {}
  for rung in record.get("chosen_per_target", []):
    if rung["chosen_run"] == record["chosen_run"] or (
        wanted and not any(math.isclose(rung["value"], v) for v in wanted)):
      continue
    name = os.path.basename(rung["chosen_run"])
    c = copy.deepcopy(chosen)
    for key, value in rung["chosen"].items():
      config_lib.set_dotted(c, key, value)
    out[os.path.join(PER_TARGET, name)] = (c, {
        **record, "chosen_run": os.path.join("..", "..", rung["chosen_run"])})
  return out


def run_seed(chosen: ml_collections.ConfigDict, record: dict, point_dir: str, seed: int,
             counts: dict, pool_config=None) -> None:
  """The point's run at `seed` in `<point_dir>/seed<k>/`, at the chosen values: read if
  finished (`skipped`), the chosen tuning run copied for seed tune.seed (`from_tuning`),
  else trained (`trained`); each carries the point's tuning record as `tuning`."""
  # (a rung's choice names it from under per_target/, `../../tune/<run>`: normalised, as
  # the kernel will not walk `..` out of a folder not made yet)
  chosen_results = os.path.normpath(os.path.join(point_dir, record["chosen_run"],
                                                 run_lib.RESULTS_FILE))
  if not os.path.exists(chosen_results):
    print(f"sweep: every rate tried diverged at {point_dir} ({TUNING_FILE}); no seeds run")
    return
  run_dir = os.path.join(point_dir, f"seed{seed}")
  path = os.path.join(run_dir, run_lib.RESULTS_FILE)
  writer = sweeps.is_writer()
  config = copy.deepcopy(chosen)
  config.seed = seed
  if run_lib.finished_results(config, run_dir) is not None:
    counts["skipped"] += 1
  elif seed == chosen.tune.seed:  # the chosen tuning run is this seed's run
    if writer:
      os.makedirs(run_dir, exist_ok=True)
      with open(chosen_results) as f:  # as written (not through `stored.load`)
        record_lib.write_json(path, json.load(f))
    counts["from_tuning"] += 1
  else:
    train_run(config, run_dir, counts, "trained", pool_config)
  if writer and os.path.exists(path):
    attach(path, record)


def ready_seeds(chosen: ml_collections.ConfigDict, record: dict, point_dir: str,
                seeds: list[int], counts: dict) -> None:
  """Before any seed of the point trains: its seed runs at other values than the choice
  (finished or not) move aside (`_set_aside_if_stale`) and the tuning seed's run is the
  chosen tuning run, so that a point never reports runs of two choices, even mid-sweep."""
  if sweeps.is_writer():
    for seed in sorted({chosen.tune.seed, *seeds}):
      _set_aside_if_stale(os.path.join(point_dir, f"seed{seed}"), chosen, choice_fields(chosen))
  sweeps.sync(f"ready_seeds {point_dir}")
  if chosen.tune.seed not in seeds:
    run_seed(chosen, record, point_dir, chosen.tune.seed, counts)


def choice_fields(config) -> tuple[str, ...]:
  """The fields in which a point's runs may differ from its config: its tuned fields and
  those it takes from another grid's tuning choice (`tune.inherited`)."""
  return tuple(dict.fromkeys((*config.tune.fields, *config.tune.inherited)))


def set_aside_inherited(point_dir: str, config: ml_collections.ConfigDict) -> None:
  """Before a point tunes: its tuning runs trained at other values of `tune.inherited` than
  `config`'s (the other grid's choice moved since) move to `<point>/superseded/`, kept, and
  train again (the seed runs follow in `ready_seeds`)."""
  fixed = tuple(k for k in config.tune.inherited if k not in config.tune.fields)
  if fixed and sweeps.is_writer():  # (a tuned field's other values are other tuning runs)
    tune_dir = os.path.join(point_dir, "tune")
    for name in sorted(os.listdir(tune_dir)) if os.path.isdir(tune_dir) else ():
      _set_aside_if_stale(os.path.join(tune_dir, name), config, fixed,
                          aside_dir=os.path.join(point_dir, "superseded"), prefix="tune-")
  sweeps.sync(f"set_aside_inherited {point_dir}")


def _set_aside_if_stale(run_dir: str, chosen: ml_collections.ConfigDict,
                        fields: tuple[str, ...], aside_dir: str | None = None,
                        prefix: str = "") -> None:
  """A run at other values of `fields` than `chosen` (the point was tuned again, e.g. under
  a wider grid, or the choice it inherits moved), finished or stopped part-way (its
  checkpoints' config), moves to `<point>/superseded/<prefix><run dir>-<its values>`: it is
  kept, and the run trains again at the chosen values."""
  _, results = read_run(run_dir)
  if results is None:  # not finished: its newest checkpoint says what it was trained at
    results = checkpoint_lib.latest_record(os.path.join(run_dir, train_lib.CHECKPOINTS))
  if not results or not isinstance(results.get("config"), dict):
    return  # nothing trained (or diverged: nothing was counted)
  trained = ml_collections.ConfigDict(results["config"])
  if all(math.isclose(trained_value(trained, k), config_lib.get(chosen, k), rel_tol=1e-9)
         for k in fields):
    return
  point_dir, seed_dir = os.path.split(os.path.normpath(run_dir))
  values = "_".join([run_name(on_seed(trained, trained.tune.seed)),  # (the seed: its dir)
                     *(f"{SHORT_NAMES.get(k, k.rsplit('.', 1)[-1])}{trained_value(trained, k):.4g}"
                       for k in fields if k not in trained.tune.fields)])
  aside = os.path.join(aside_dir or os.path.join(point_dir, "superseded"),
                       f"{prefix}{seed_dir}-{values}")
  stem, k = aside, 1
  while os.path.exists(aside):
    aside, k = f"{stem}.{k}", k + 1
  os.makedirs(os.path.dirname(aside), exist_ok=True)
  shutil.move(run_dir, aside)
  print(f"sweep: {run_dir} was trained at {values}, not the chosen "
        f"{run_name(chosen)}: moved to {aside}; it runs again")


def trained_value(trained, key: str) -> float:
  """A tuned field's value in a finished run's config; runs from before the schedule was
  tunable spanned their whole budget."""
  try:
    return config_lib.get(trained, key)
  except (AttributeError, KeyError):
    if key == SCHEDULE:
      return 1.0
    raise


def attach(path: str, record: dict) -> None:
  """Writes the point's tuning record into a run's results.json (if it differs), its other
  fields as written (read without `stored.load`, which would rename them)."""
  with open(path) as f:
    results = json.load(f)
  record = json.loads(json.dumps(record))
  if results.get("tuning") != record:
    results["tuning"] = record
    record_lib.write_json(path, results)
