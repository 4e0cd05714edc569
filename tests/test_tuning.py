"""The sweeps' one tuning rule picks the planted best rate of a synthetic point."""
import json
import math
import os

import pytest

from ensemble_jax import checkpoint as checkpoint_lib
from ensemble_jax import config_lib, costs
from experiments.sweeps import tuning

pytestmark = pytest.mark.unit

BASE = 3e-3


def _config(fields=("optim.learning_rate",), factors=(0.5, 1.0, 2.0), max_extensions=2):
  c = config_lib.base_config()
  c.optim.learning_rate = BASE
  c.eval.target_metric, c.eval.target_value = "accuracy", 0.85
  c.tune.fields, c.tune.factors, c.tune.max_extensions = fields, factors, max_extensions
  return c


def _results(reached_step, final, budget=1000):
  """A run's results.json as far as the rule and the compute sum read it."""
  presets = tuple(costs.INTERCONNECTS)
  steps = reached_step or budget
  return {
      "target": {"metric": "accuracy", "value": 0.85, "reached": reached_step is not None,
                 "reached_step": reached_step},
      "final": {"accuracy": final}, "step_budget": budget, "steps": steps,
      "flops_per_step": 1e9,
      "cost": {"measured": {"pool_build_time_s": 0.0},
               "modelled": {"devices": 4, "critical_path_s": dict.fromkeys(presets, 0.01 * steps)}},
  }


class FakeTrain:
  """Steps to target grow with |log2(lr / best)|; lr >= `diverge_at` diverges."""

  def __init__(self, best, budget=1000, diverge_at=math.inf, steps=None):
    self.best, self.budget, self.diverge_at, self.steps = best, budget, diverge_at, steps
    self.dirs = []

  def __call__(self, config, run_dir):
    self.dirs.append(run_dir)
    lr = config.optim.learning_rate
    if lr >= self.diverge_at:
      return None
    distance = abs(math.log2(lr / self.best))
    steps = self.steps(lr) if self.steps else 200 + round(300 * distance)
    final = 0.9 - 0.01 * distance
    return _results(steps if steps <= self.budget else None, final, self.budget)


def _tune(fake, **kw):
  return tuning.tune(_config(**kw), "/point", fake)


def test_the_planted_best_inside_the_grid_is_chosen_without_extension():
  fake = FakeTrain(best=BASE)
  chosen, record = _tune(fake)
  assert chosen.optim.learning_rate == BASE
  assert [r["value"] for r in record["axes"][0]["runs"]] == pytest.approx([BASE / 2, BASE,
                                                                           2 * BASE])
  assert record["axes"][0]["extensions"] == {"low": 0, "high": 0}
  assert not record["axes"][0]["at_edge"]
  assert record["chosen_run"] == os.path.join("tune", "lr0.003")
  assert sorted(fake.dirs) == sorted(os.path.join("/point", "tune", n)
                                     for n in ("lr0.0015", "lr0.003", "lr0.006"))
  steps = {r["value"]: r["steps_to_target"] for r in record["axes"][0]["runs"]}
  assert steps[BASE] == 200 and steps[BASE / 2] == 500
  compute = record["compute"]
  assert compute["runs"] == 3 and compute["flops"] == 1e9 * (500 + 200 + 500)
  assert compute["time_s"]["ib_xdr800"] == pytest.approx(0.01 * 1200)
  assert compute["device_seconds"]["ib_xdr800"] == pytest.approx(4 * 0.01 * 1200)


def test_a_best_at_the_edge_extends_the_grid_until_it_is_inside():
  fake = FakeTrain(best=4 * BASE)
  chosen, record = _tune(fake)
  assert chosen.optim.learning_rate == pytest.approx(4 * BASE)
  axis = record["axes"][0]
  assert axis["extensions"] == {"low": 0, "high": 2}  # 4x is best, 8x confirms it
  assert [r["factor"] for r in axis["runs"]] == pytest.approx([0.5, 1, 2, 4, 8])
  assert not axis["at_edge"] and len(fake.dirs) == 5


def test_extensions_are_capped_and_a_best_still_at_the_edge_is_flagged():
  chosen, record = _tune(FakeTrain(best=BASE / 64))
  assert chosen.optim.learning_rate == pytest.approx(BASE / 8)
  assert record["axes"][0]["extensions"] == {"low": 2, "high": 0}
  assert record["axes"][0]["at_edge"]


def test_ties_in_steps_and_missed_targets_go_to_the_better_final_metric():
  tie = FakeTrain(best=2 * BASE, steps=lambda lr: 300)  # every rate: 300 steps
  assert _tune(tie, max_extensions=0)[0].optim.learning_rate == pytest.approx(2 * BASE)
  missed = FakeTrain(best=BASE / 2, budget=100)  # nothing reaches the target in 100 steps
  chosen, record = _tune(missed, max_extensions=0)
  assert chosen.optim.learning_rate == pytest.approx(BASE / 2)
  assert not any(r["reached"] for r in record["axes"][0]["runs"])


def test_a_diverged_rate_loses_and_is_recorded():
  chosen, record = _tune(FakeTrain(best=4 * BASE, diverge_at=5e-3))
  assert chosen.optim.learning_rate == pytest.approx(BASE)
  runs = {r["factor"]: r for r in record["axes"][0]["runs"]}
  assert runs[2.0]["diverged"] and runs[2.0]["steps_to_target"] is None
  assert record["compute"]["diverged"] == 1 and record["compute"]["runs"] == 3


def test_a_second_field_is_tuned_from_the_first_choice_and_shares_its_run():
  c = _config(fields=("optim.learning_rate", "method.outer_learning_rate"), max_extensions=0)
  fake = FakeTrain(best=2 * BASE)
  chosen, record = tuning.tune(c, "/point", fake)
  assert chosen.optim.learning_rate == pytest.approx(2 * BASE)
  assert [a["key"] for a in record["axes"]] == ["optim.learning_rate",
                                                "method.outer_learning_rate"]
  assert len(fake.dirs) == len(set(fake.dirs)) == 5  # 3 + 3, the shared run trained once
  assert os.path.join("/point", "tune", "lr0.006_outer_lr0.7") in fake.dirs


def test_one_factor_means_untuned():
  fake = FakeTrain(best=BASE / 16)
  chosen, record = _tune(fake, factors=(1.0,))
  assert chosen.optim.learning_rate == BASE and len(fake.dirs) == 1
  assert not record["axes"][0]["at_edge"]


def test_the_report_reads_the_tuning_record_budget_and_resolution(tmp_path):
  import json

  from ensemble_jax import report

  _, record = _tune(FakeTrain(best=BASE))
  results = _results(200, 0.86)
  results["target"].update({"resolution_steps": 5, "reached_time_s": 1.0})
  results["cost"]["measured"].update({"steps_to_target": 200, "flops_to_target": 2e11})
  results.update({"method": "data_parallel", "config": {"seed": 0}, "train_time_s": 2.0,
                  "tuning": record})
  run_dir = tmp_path / "data_parallel" / "D4" / "seed0"
  run_dir.mkdir(parents=True)
  (run_dir / "results.json").write_text(json.dumps(results))
  (row,) = report.load_runs(str(tmp_path))
  assert row["step_budget"] == 1000 and row["resolution_steps"] == 5
  assert row["tuning"]["chosen"] == {"optim.learning_rate": BASE}
  assert row["tuning"]["runs"] == 3 and row["tuning"]["flops"] == record["compute"]["flops"]
  assert row["tuning"]["time_s"] == record["compute"]["time_s"]
  assert not row["tuning"]["at_edge"]


def test_a_warm_start_reaches_an_optimum_the_flat_grid_hides():
  # The docs at B = 2,048 (measured): x1/2 and x1 took 260 and 240 steps, a flat, noisy
  # stretch where x1 is an interior best, while B = 1,024's choice x1/4 took 124 steps.
  steps = {0.125: 130, 0.25: 124, 0.5: 260, 1.0: 240, 2.0: 280}
  trap = lambda: FakeTrain(best=BASE, steps=lambda lr: steps[round(lr / BASE, 4)])
  plain, _ = _tune(trap())
  assert plain.optim.learning_rate == pytest.approx(BASE)  # the plain rule stops at x1
  fake = trap()
  chosen, record = tuning.tune(_config(), "/point", fake,
                               warm_start={"optim.learning_rate": 0.25000000000000006})
  assert chosen.optim.learning_rate == pytest.approx(BASE / 4)
  axis = record["axes"][0]
  assert axis["warm_start_factor"] == 0.25  # snapped onto the grid value it names
  # the warm start is best at the low edge: extended once, to x1/8, which confirms it
  assert [r["factor"] for r in axis["runs"]] == pytest.approx([1 / 8, 1 / 4, 0.5, 1, 2])
  assert axis["extensions"] == {"low": 1, "high": 0} and not axis["at_edge"]
  assert len(fake.dirs) == len(set(fake.dirs)) == 5
  assert record["rule"] == tuning.RULE + tuning.WARM_START_RULE
  # a warm start already on the grid adds nothing
  on_grid = FakeTrain(best=BASE)
  _, record = tuning.tune(_config(), "/point", on_grid, warm_start={"optim.learning_rate": 2.0})
  assert len(on_grid.dirs) == 3 and record["axes"][0]["warm_start_factor"] == 2.0
  with pytest.raises(ValueError, match="not tuned fields"):
    tuning.tune(_config(), "/point", FakeTrain(best=BASE), warm_start={"optim.momentum": 1.0})


class StoppingFakeTrain(FakeTrain):
  """FakeTrain that honours train.stop_at_step as the loop does: a run not at the target by
  then ends there, short of it."""

  def __call__(self, config, run_dir):
    results = super().__call__(config, run_dir)
    stop = config.train.stop_at_step
    if results is not None and stop and results["steps"] > stop:
      results = _results(None, results["final"]["accuracy"] - 0.01, self.budget)
      results["steps"] = stop
    if results is not None:
      results["config"] = config.to_dict()
    return results


def test_stopping_losers_early_keeps_the_choice_for_less_compute():
  # The docs at B = 4,096 (measured, seed 0): the warm start x1/8 took 124 steps, x1/2 256,
  # x1 280; full runs would also train x2 and (x1/8 at the low edge) x1/16 to their ends
  # (their 330 and 196 here are made up: those runs were stopped).
  steps = {0.0625: 196, 0.125: 124, 0.5: 256, 1.0: 280, 2.0: 330}
  config = _config()
  warm = {"optim.learning_rate": 0.125}
  full_fake = FakeTrain(best=BASE, steps=lambda lr: steps[round(lr / BASE, 4)])
  full, full_record = tuning.tune(config, "/point", full_fake, warm_start=warm)
  config.tune.stop_losers = True
  fake = StoppingFakeTrain(best=BASE, steps=lambda lr: steps[round(lr / BASE, 4)])
  chosen, record = tuning.tune(config, "/point", fake, warm_start=warm)
  assert chosen.optim.learning_rate == full.optim.learning_rate == pytest.approx(BASE / 8)
  assert fake.dirs[0] == os.path.join("/point", "tune", "lr0.000375")  # the warm start first
  assert sorted(fake.dirs) == sorted(full_fake.dirs)  # the same grid and extension
  stopped = {r["factor"]: r["stopped_at_step"] for r in record["axes"][0]["runs"]}
  assert stopped == {0.0625: 124, 0.125: None, 0.5: 124, 1.0: 124, 2.0: 124}
  assert record["compute"]["flops"] == 1e9 * 124 * 5
  assert full_record["compute"]["flops"] == 1e9 * sum(steps.values())
  assert record["rule"] == tuning.rule(True, True) and "stops" in record["rule"]
  # a run that reaches the target by the stop is trained as in full: a tie stays a tie
  steps[0.5] = 124
  tie = StoppingFakeTrain(best=BASE, steps=lambda lr: steps[round(lr / BASE, 4)])
  _, record = tuning.tune(config, "/point", tie, warm_start=warm)
  row = {r["factor"]: r for r in record["axes"][0]["runs"]}[0.5]
  assert row["steps_to_target"] == 124 and row["stopped_at_step"] is None


def test_a_run_stopped_early_is_continued_when_a_later_bound_lies_beyond_it(tmp_path,
                                                                           monkeypatch):
  """Re-tuned under a later (larger) bound, e.g. another warm start, a run once stopped at 124
  might yet reach the target before it: it is continued, not read back as a loser."""
  import json

  trained = []
  monkeypatch.setattr(tuning.run_lib, "train_and_evaluate",
                      lambda config, run_dir, pool_config=None: trained.append(
                          config.train.stop_at_step) or {"continued": True})
  stopped = _results(None, 0.8, budget=400)
  stopped["steps"], stopped["config"] = 124, {"train": {"stop_at_step": 124}}
  (tmp_path / "results.json").write_text(json.dumps(stopped))
  config, counts = _config(), {"tuning_runs": 0}
  for stop in (124, 100):  # the same or a nearer bound: still a loser, read back
    config.train.stop_at_step = stop
    assert tuning.train_run(config, str(tmp_path), counts, "tuning_runs") == {
        **stopped, "targets": [stopped["target"]],  # read under today's names
        "config": {**stopped["config"], "plugins": ""}}
  for stop in (200, 0):  # a bound beyond it, or none: trained on
    config.train.stop_at_step = stop
    assert tuning.train_run(config, str(tmp_path), counts, "tuning_runs") == {"continued": True}
  assert trained == [200, 0] and counts["tuning_runs"] == 2


def test_a_seed_trained_at_a_superseded_rate_is_set_aside_not_counted(tmp_path):
  import json

  import ml_collections

  chosen = _config()
  chosen.optim.learning_rate = BASE / 4

  def seed_run(name, lr):
    config = _config()
    config.optim.learning_rate = lr
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps({"config": config.to_dict()}))
    return run_dir

  current = seed_run("seed1", BASE / 4)
  tuning._set_aside_if_stale(str(current), chosen, chosen.tune.fields)
  assert (current / "results.json").exists()  # trained at the chosen rate: kept in place
  stale = seed_run("seed2", BASE)
  tuning._set_aside_if_stale(str(stale), chosen, chosen.tune.fields)
  assert not stale.exists()
  aside = tmp_path / "superseded" / "seed2-lr0.003"
  kept = json.loads((aside / "results.json").read_text())
  assert ml_collections.ConfigDict(kept["config"]).optim.learning_rate == BASE
  seed_run("seed2", BASE)  # superseded twice at the same rate: both kept
  tuning._set_aside_if_stale(str(stale), chosen, chosen.tune.fields)
  assert (tmp_path / "superseded" / "seed2-lr0.003.1" / "results.json").exists()


def test_a_seed_stopped_part_way_at_a_superseded_value_is_set_aside_too(tmp_path, monkeypatch):
  # A sweep stopped mid-run, then re-tuned to another schedule: the half-trained run (its
  # checkpoints' config, no results.json) moves aside instead of refusing to resume.
  fields = ("optim.learning_rate", "train.schedule_fraction")
  chosen, trained = _config(fields), _config(fields)
  chosen.train.schedule_fraction, trained.train.schedule_fraction = 0.5, 1.0
  records = {str(tmp_path / "seed3" / "checkpoints"): {"step": 1, "config": trained.to_dict()},
             str(tmp_path / "seed4" / "checkpoints"): {"step": 1, "config": chosen.to_dict()}}
  monkeypatch.setattr(checkpoint_lib, "latest_record", lambda d: records.get(d))
  for name in ("seed3", "seed4", "seed5"):  # seed5: nothing trained yet
    (tmp_path / name / "checkpoints").mkdir(parents=True)
    tuning._set_aside_if_stale(str(tmp_path / name), chosen, chosen.tune.fields)
  assert not (tmp_path / "seed3").exists()
  assert (tmp_path / "superseded" / f"seed3-lr{BASE:.4g}").is_dir()
  assert (tmp_path / "seed4").is_dir() and (tmp_path / "seed5").is_dir()


def test_runs_at_a_former_inherited_choice_are_set_aside_not_another_study(tmp_path):
  """A grid that trains at another grid's tuning choice (the many-worker grid) whose
  choice moved (schedule 0.5 -> 1): its runs at the former choice are no other study's
  (the guard once refused the workdir), and its tuning and seed runs move to superseded/
  before it trains again; a run at the current choice stays."""
  import ml_collections

  from experiments import configs
  from experiments.sweeps import study

  point = _config(factors=(1.0,))
  for key, value in configs.at_choice({"optim.learning_rate": BASE,
                                       config_lib.SCHEDULE_FRACTION: 1.0}).items():
    config_lib.set_dotted(point, key, value)
  former = ml_collections.ConfigDict(point.to_dict())
  former.train.schedule_fraction = 0.5
  point_dir = tmp_path / "ensemble" / "N16_L235"
  for run, trained in (("tune/lr0.003", former), ("seed0", former), ("seed1", former),
                       ("seed2", point)):
    (point_dir / run).mkdir(parents=True)
    (point_dir / run / "results.json").write_text(json.dumps({"config": trained.to_dict()}))
  held = study.identity("c.py", "many_workers", None, {"ensemble/N16_L235": point})
  assert study.legacy_changes(str(tmp_path), held) == {}
  formerly = study.identity("c.py", "many_workers", None, {"ensemble/N16_L235": former})
  assert study.differences(formerly, held) == {}
  tuning.set_aside_inherited(str(point_dir), point)
  tuning.ready_seeds(point, {}, str(point_dir), [0, 1, 2], counts={})
  aside = sorted(os.listdir(point_dir / "superseded"))
  assert aside == ["seed0-lr0.003_sched0.5", "seed1-lr0.003_sched0.5",
                   "tune-lr0.003-lr0.003_sched0.5"], aside
  assert sorted(os.listdir(point_dir)) == ["seed2", "superseded", "tune"]
  assert not os.listdir(point_dir / "tune")


def test_the_schedule_length_is_tried_at_its_fractions_after_the_rate():
  """A half-length schedule reaches the target sooner: chosen, inside the grid of
  (1, 1/2, 1/4), so not extended; the whole-budget runs keep the rate-only names."""
  def steps(config):
    return {1.0: 300, 0.5: 240, 0.25: None}[config.train.schedule_fraction]

  fake = FakeTrain(best=BASE)
  fake.steps = None
  calls = []

  def train(config, run_dir):
    calls.append(os.path.basename(run_dir))
    results = fake(config, run_dir)
    if config.optim.learning_rate == BASE:
      reached = steps(config)
      results = _results(reached, 0.9, 1000)
    return results

  chosen, record = tuning.tune(
      _config(fields=("optim.learning_rate", "train.schedule_fraction")), "/point", train)
  assert chosen.optim.learning_rate == BASE and chosen.train.schedule_fraction == 0.5
  schedule = record["axes"][1]
  assert schedule["key"] == "train.schedule_fraction" and schedule["values"] == [0.25, 0.5, 1.0]
  assert schedule["extensions"] == {"low": 0, "high": 0} and not schedule["at_edge"]
  assert "lr0.003" in calls and "lr0.003_sched0.5" in calls and "lr0.003_sched0.25" in calls
  assert calls.count("lr0.003") == 1  # the rate's chosen run is the full schedule's
  assert record["chosen_run"] == os.path.join("tune", "lr0.003_sched0.5")


def test_the_schedule_length_counts_its_worst_seed_and_reported_seeds_cannot_choose_it():
  """A quarter schedule that reaches the target at its last eval on the tuning seed and
  misses it on the other (data-parallel D = 8 on Fashion-MNIST: step 54 of 59 on seed 0,
  missed on seeds 1-3) loses to the whole schedule, which reaches it on both; a length
  that misses on the first seed is not run on the second; stopped losers are bounded by
  the worst seed's steps."""
  reached = {(1.0, 0): 72, (1.0, 1000): 80, (0.5, 0): None, (0.25, 0): 54, (0.25, 1000): None,
             (0.125, 0): None}  # (the eighth, tried once the quarter wins: it misses)
  calls = []

  def train(config, run_dir):
    calls.append((os.path.basename(run_dir), config.train.stop_at_step))
    return _results(reached[config.train.schedule_fraction, config.seed], 0.86, 1000)

  config = _config(fields=("optim.learning_rate", "train.schedule_fraction"), factors=(1.0,))
  config.tune.stop_losers = True
  chosen, record = tuning.tune(config, "/point", train)
  assert chosen.train.schedule_fraction == 1.0 and chosen.seed == 0
  assert record["chosen_run"] == os.path.join("tune", "lr0.003")
  assert record["schedule_seeds"] == [1000] and "worst seed" in record["rule"]
  names = [name for name, _ in calls]
  assert names == ["lr0.003", "lr0.003_sched0.25", "lr0.003_sched0.25_seed1000",
                   "lr0.003_sched0.5", "lr0.003_seed1000"]  # sched0.5 missed seed 0
  assert dict(calls)["lr0.003_seed1000"] == 0  # no length had reached on both seeds: no stop
  rows = {r["value"]: r for r in record["axes"][1]["runs"]}
  assert rows[0.25]["steps_to_target"] == 54
  assert [(s["seed"], s["reached"]) for s in rows[0.25]["other_seeds"]] == [(1000, False)]
  assert rows[1.0]["other_seeds"][0]["steps_to_target"] == 80 and "other_seeds" not in rows[0.5]
  # once a length reached on both seeds, later runs stop at its worst seed's steps, and a
  # length whose first seed already took more is not run on the second
  reached[0.25, 1000] = 60
  calls.clear()
  chosen, _ = tuning.tune(config, "/point", train)
  assert chosen.train.schedule_fraction == 0.25
  assert dict(calls)["lr0.003_sched0.5"] == 60
  assert "lr0.003_seed1000" not in dict(calls)  # 72 steps on seed 0 > 60: lost
  # one seed: the single-seed choice, knife-edge as it was
  config.tune.schedule_seeds = ()
  reached[0.25, 1000] = None
  assert tuning.tune(config, "/point", train)[0].train.schedule_fraction == 0.25
  with pytest.raises(ValueError, match=r"seeds \[1000\].*--seeds=1,2,3"):
    tuning.check_seeds(_config(), [1, 1000])


def test_the_tuning_compute_counts_one_pool_per_tuning_seed():
  """Runs on one seed read one pool, built once; the schedule's second tuning seed has its
  own pool, and its build is a cost too (once only the last run's pool was counted)."""
  def run(seed, build):
    r = _results(100, 0.9)
    r["config"], r["distill"] = {"seed": seed}, {"build_flops": 1e6 * build}
    r["cost"]["measured"]["pool_build_time_s"] = build
    for p in r["cost"]["modelled"]["critical_path_s"]:
      r["cost"]["modelled"]["critical_path_s"][p] += build  # a run's path holds its build
    return r

  compute = tuning.compute([run(0, 2.0), run(0, 2.0), run(1000, 3.0)])
  assert compute["pool_build_time_s"] == pytest.approx(5.0)
  assert compute["flops"] == pytest.approx(3 * 1e9 * 100 + 5e6)
  assert compute["time_s"]["ib_xdr800"] == pytest.approx(3 * 0.01 * 100 + 5.0)


def test_a_schedule_is_chosen_only_with_a_margin_on_every_tuning_seed():
  """Data-parallel D = 8 on Fashion-MNIST (tuning.json, issue 58): the quarter schedule (59
  steps) reached 85% at step 54 and 48 on its two tuning seeds, the whole (235) at 72 and
  80; the quarter was chosen and then missed on seeds 1-3. Past tune.schedule_margin of its
  steps a reach counts as a miss: the whole schedule is chosen."""
  reached = {(1.0, 0): 72, (1.0, 1000): 80, (0.5, 0): None, (0.25, 0): 54, (0.25, 1000): 48,
             (0.125, 0): None}
  budget = {1.0: 235, 0.5: 118, 0.25: 59, 0.125: 29}

  def train(config, run_dir):
    f = config.train.schedule_fraction
    return _results(reached[f, config.seed], 0.86, budget[f])

  config = _config(fields=("optim.learning_rate", "train.schedule_fraction"), factors=(1.0,))
  assert config.tune.schedule_margin == 0.8
  chosen, record = tuning.tune(config, "/point", train)
  assert chosen.train.schedule_fraction == 1.0
  assert record["schedule_margin"] == 0.8 and record["axes"][1]["margin"] == 0.8
  assert "schedule_margin" in record["rule"]
  # the margin is a config value: at 0.95 the quarter's 54 of 59 passes
  config.tune.schedule_margin = 0.95
  assert tuning.tune(config, "/point", train)[0].train.schedule_fraction == 0.25
  # one late seed is enough to lose
  config.tune.schedule_margin = 0.8
  reached[0.25, 0] = 40
  assert tuning.tune(config, "/point", train)[0].train.schedule_fraction == 1.0
  reached[0.25, 1000] = 40
  assert tuning.tune(config, "/point", train)[0].train.schedule_fraction == 0.25


def test_the_rate_is_never_left_at_its_grids_edge_below_the_cap():
  """The routed small-model experts at N = 8 (issue 58): 0.003-0.024 took 143/131/125/110
  steps, the best at the edge once 2 extensions ran out. The rule extends until the best is
  interior, here at 16x; a diverged next value bounds it; a cap that stops it says so."""
  config = config_lib.base_config()
  config.optim.learning_rate = BASE
  config.eval.target_metric, config.eval.target_value = "accuracy", 0.85
  assert config.tune.max_extensions >= 4
  chosen, record = tuning.tune(config, "/point", FakeTrain(best=16 * BASE))
  axis = record["axes"][0]
  assert chosen.optim.learning_rate == pytest.approx(16 * BASE)
  assert axis["extensions"] == {"low": 0, "high": 4}  # 32x confirms 16x
  assert not axis["at_edge"] and not axis["capped"]
  # the next value diverges: the best is bounded, not at an edge, not capped
  chosen, record = tuning.tune(config, "/point", FakeTrain(best=64 * BASE, diverge_at=8 * BASE))
  assert chosen.optim.learning_rate == pytest.approx(4 * BASE)
  assert not record["axes"][0]["at_edge"] and not record["axes"][0]["capped"]
  assert record["axes"][0]["runs"][-1]["diverged"]
  # the cap reached with the best at the edge: recorded
  config.tune.max_extensions = 1
  chosen, record = tuning.tune(config, "/point", FakeTrain(best=16 * BASE))
  assert chosen.optim.learning_rate == pytest.approx(4 * BASE)
  assert record["axes"][0]["at_edge"] and record["axes"][0]["capped"]
  assert "capped" in record["rule"]


def test_the_schedule_length_is_extended_past_its_edge_like_the_rate(tmp_path, monkeypatch):
  """Data-parallel D = 1 on Fashion-MNIST (tuning.json, issue 70 item 15): the quarter
  schedule (469 steps) reached 85% at 262 and 210 on its two tuning seeds and was chosen at
  the short edge of (1, 1/2, 1/4), an edge the rule never extended. Planted: the eighth
  (234 steps) reaches it sooner, within the margin, on both seeds; the sixteenth misses. The
  rule now tries past the edge as it does a rate's, records the extensions, and chooses the
  eighth, inside its axis. Fails on the old code (it chose the quarter, at_edge)."""
  budget = {1.0: 1875, 0.5: 938, 0.25: 469, 0.125: 234, 0.0625: 117}
  reached = {(1.0, 0): 315, (1.0, 1000): None, (0.5, 0): None, (0.25, 0): 262,
             (0.25, 1000): 210, (0.125, 0): 180, (0.125, 1000): 170, (0.0625, 0): None}
  trained = []

  def train_and_evaluate(config, run_dir, pool_config=None):
    f = config.train.schedule_fraction
    trained.append(os.path.basename(run_dir))
    return _results(reached[f, config.seed], 0.86, budget[f])

  monkeypatch.setattr(tuning.run_lib, "train_and_evaluate", train_and_evaluate)
  counts = {"tuning_runs": 0, "diverged": 0}

  def train(config, run_dir):
    return tuning.train_run(config, run_dir, counts, "tuning_runs")

  config = _config(fields=("optim.learning_rate", "train.schedule_fraction"), factors=(1.0,))
  config.optim.learning_rate = 0.006
  chosen, record = tuning.tune(config, str(tmp_path), train)
  assert chosen.train.schedule_fraction == 0.125
  assert record["chosen"]["train.schedule_fraction"] == 0.125
  assert record["chosen_run"] == os.path.join("tune", "lr0.006_sched0.125")
  axis = record["axes"][1]
  assert axis["values"] == [0.0625, 0.125, 0.25, 0.5, 1.0]
  assert axis["extensions"] == {"low": 2, "high": 0}  # the sixteenth confirms the eighth
  assert not axis["at_edge"] and not axis["capped"]
  rows = {r["value"]: r for r in axis["runs"]}
  assert rows[0.125]["steps_to_target"] == 180 and rows[0.125]["step_budget"] == 234
  assert rows[0.125]["other_seeds"][0]["steps_to_target"] == 170
  assert not rows[0.0625]["reached"] and "lr0.006_sched0.0625" in trained
  assert "extended by `extend` beyond an edge as the rates are" in record["rule"]
  # the cap reached with the best still at the short edge: at_edge and capped, recorded
  config.tune.max_extensions = 1
  trained.clear()
  chosen, record = tuning.tune(config, str(tmp_path / "capped"), train)
  assert chosen.train.schedule_fraction == 0.125 and "lr0.006_sched0.0625" not in trained
  assert record["axes"][1]["at_edge"] and record["axes"][1]["capped"]
  # the long edge short of the whole budget (a point configured at half its budget, tried
  # at (1/4, 1/2)) is extended too, never past 1
  config.tune.max_extensions, config.tune.schedule_fractions = 6, (0.25, 0.5)
  config.train.schedule_fraction = 0.5
  reached[0.5, 0], reached[0.5, 1000], reached[0.25, 0] = 200, 210, 300
  chosen, record = tuning.tune(config, str(tmp_path / "long"), train)
  axis = record["axes"][1]
  assert axis["values"][-1] == 1.0 and axis["extensions"]["high"] == 1
  assert chosen.train.schedule_fraction == 0.5 and not axis["at_edge"]


def test_the_rerun_plan_lists_the_committed_choices_the_rule_moves():
  """The committed tuning records the margin and the edge rules do not move (issue 58: the
  critical-batch points and the full grid's were re-tuned under it; issue 70: the five
  Fashion-MNIST data-parallel points whose schedule sat at its low edge were re-run past
  it, D1 moving to the eighth, and the four critical-batch points whose schedule sat there,
  none moving), and the grids still trained at a full grid's former choice
  (the small-model routed experts' N8_L235 chose its half schedule before its re-run and
  its whole one since: the one-GPU grid's point still holds the former, as its B64 holds
  D1's quarter; the many-worker grid's N = 128 was re-run at the current one), in the
  committed plan the re-run queue reads."""
  from experiments import rerun_plan
  rows = rerun_plan.plan()
  moved = {r["point"]: r["why"] for r in rows}
  for point in ("critical_batch/fashion/B2048", "critical_batch/fashion/B256",
                *(f"critical_batch/fashion/B{b}" for b in (64, 128, 8192, 16384)),
                "critical_batch/fashion_small_model/B64", "fashion_mnist/data_parallel/D8",
                "fashion_mnist/ensemble_pca_routed_small/N8_L235",
                *FASHION_SCHEDULE_EDGE):
    assert point not in moved  # re-tuned under the rule
  stale = {r["point"]: r for r in rerun_plan.stale_feeds()}
  assert "many_workers/ensemble_pca_routed_small/N128_L235" not in stale  # re-run
  for point, source, trained, chosen in (
      ("one_device_h200/fashion_mnist/ensemble_pca_routed_small/N8_L235",
       "fashion_mnist/ensemble_pca_routed_small/N8_L235", (0.024, 0.5), 1.0),
      ("one_device_h200/fashion_mnist/data_parallel/B64", "fashion_mnist/data_parallel/D1",
       (0.006, 0.25), 0.125)):
    assert stale[point]["source"] == source
    assert stale[point]["trained"] == [dict(zip(("optim.learning_rate",
                                                 "train.schedule_fraction"), trained))]
    assert stale[point]["chosen"]["train.schedule_fraction"] == chosen
  assert not any("/ensemble/" in p for p in stale)  # still current
  assert "one_device_h200/fashion_mnist/data_parallel/B256" not in stale  # D4 kept its choice
  with open(os.path.join(rerun_plan.RESULTS, "rerun_plan.json")) as f:
    committed = json.load(f)  # regenerate: python -m experiments.rerun_plan --write
  assert committed["tuning"] == rows
  assert committed["stale_feeds"] == list(stale.values())
  assert committed["batch_norm"] == rerun_plan.batch_norm_plan()


FASHION_SCHEDULE_EDGE = tuple(f"fashion_mnist/{c}/{d}" for c, ds in (
    ("data_parallel", "D1 D2 D4"), ("data_parallel_sync_bn", "D2 D4")) for d in ds.split())


def test_an_empty_rerun_plan_says_nothing_moves_and_lists_no_command():
  """With no committed choice to move, the plan says so in one line: no empty command
  block, cost or table (it printed 'Run by:' over nothing)."""
  from experiments import rerun_plan
  text = rerun_plan.markdown([])
  assert "No committed tuning choice moves under the current rule." in text
  assert "Run by:" not in text and "| point | why it moves |" not in text


def test_the_rerun_plan_lists_the_schedule_choices_at_the_axis_edge_and_their_heirs(tmp_path):
  """Issue 70 item 15: a point that chose the quarter schedule, the shortest tried, is
  listed (the rule now tries the eighth past it), with the one-device point trained at its
  choice (B64 at D1's, `fashion_mnist.ONE_DEVICE_NAMESAKES`) and the commands that re-run
  both. Planted: the committed D1 and its one-device heir, D1's record put back as it was
  before its re-run (the quarter chosen, nothing shorter tried). Fails on the old code,
  whose plan listed none."""
  import shutil

  from experiments import rerun_plan
  results = tmp_path / "results"
  ignore = shutil.ignore_patterns("checkpoints", "events.out.*", "superseded")
  for rel in ("fashion_mnist/data_parallel/D1", "one_device_h200/fashion_mnist/data_parallel/B64"):
    shutil.copytree(os.path.join(rerun_plan.RESULTS, rel), results / rel, ignore=ignore)
  path = results / "fashion_mnist/data_parallel/D1" / "tuning.json"
  record = json.loads(path.read_text())
  [axis] = [a for a in record["axes"] if a["key"] == "train.schedule_fraction"]
  axis["runs"] = [r for r in axis["runs"] if r["value"] >= 0.25]
  axis.update(chosen=0.25, values=[0.25, 0.5, 1.0], extensions={"low": 0, "high": 0},
              at_edge=True)
  record["chosen"]["train.schedule_fraction"] = 0.25
  path.write_text(json.dumps(record))
  [row] = rerun_plan.plan(str(results))
  assert row["point"] == "fashion_mnist/data_parallel/D1"
  assert any(w.startswith("schedule 0.25 at the low edge") and "0.125 is tried next" in w
             for w in row["why"]), row["why"]
  assert [f["grid"] for f in row["feeds"]] == ["one_device_h200/fashion_mnist/data_parallel/B64"]
  assert row["extension_wall_s"] > 0
  commands = rerun_plan.commands([row])
  assert commands[0].endswith("--curves=data_parallel --points=D1")
  assert commands[-1].endswith("--grid=one_device --workdir=experiments/results/"
                               "one_device_h200/fashion_mnist --seeds=1,2,3 "
                               "--curves=data_parallel --points=B64")


def test_the_rerun_plan_lists_data_parallel_runs_of_another_batchnorm(tmp_path):
  """A data-parallel point whose study now trains per-device BatchNorm but whose runs are
  from before the field (synchronised) is listed for a re-run; one trained as its study
  says, or on one device, is not."""
  import copy

  from ensemble_jax import config_lib
  from experiments import rerun_plan
  config = config_lib.base_config().to_dict()
  old = copy.deepcopy(config)
  del old["method"]["batchnorm"]  # a record from before the field
  per_device = copy.deepcopy(config)
  per_device["method"]["batchnorm"] = "per_device"
  workdir = tmp_path / "grid"
  points = {"data_parallel/D8": (per_device, old, 8), "dp_sync/D8": (old, old, 8),
            "data_parallel/D1": (per_device, old, 1)}
  for point, (now, trained, devices) in points.items():
    run = workdir / point / "seed1"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "method": "data_parallel", "config": trained, "wall_time_s": 5.0,
        "cost": {"modelled": {"devices": devices, "collectives": [
            {"per": "step", "kind": "all-reduce", "count": 35}]}}}))
  (workdir / "study.json").write_text(json.dumps(
      {"points": {p: now for p, (now, _, _) in points.items()}}, default=str))
  [row] = rerun_plan.batch_norm_plan(str(tmp_path))
  assert (row["point"], row["trained"], row["now"], row["all_reduces_per_step"]) == (
      "grid/data_parallel/D8", ["synchronised"], "per_device", 35)


def test_recosting_keeps_a_committed_record_whose_replay_moves(tmp_path):
  """Re-costing replays the rule on finished runs; where the rule changed since (the
  margin), the committed record stays with the seeds trained at its choice."""
  from experiments.sweeps import cost_vs_time
  path = tmp_path / tuning.TUNING_FILE
  committed = {"chosen": {"optim.learning_rate": 0.006, "train.schedule_fraction": 0.25}}
  path.write_text(json.dumps(committed))
  moved = {"chosen": {"optim.learning_rate": 0.006, "train.schedule_fraction": 1.0}}
  assert cost_vs_time._moved(str(tmp_path), moved)
  assert not cost_vs_time._moved(str(tmp_path), committed)
  assert json.loads(path.read_text()) == committed


def test_a_rungs_choice_runs_its_seeds_under_per_target_before_that_folder_exists(tmp_path):
  """A rung whose choice differs from the point's gets its seeds in per_target/<run>/, its
  record naming the tuning run as ../../tune/<run>: the tuning seed's run is that tuning
  run, copied, though per_target/<run>/ did not exist yet (it was read as 'every rate
  diverged' and no seed of any rung's choice ran)."""
  chosen = _config()
  (tmp_path / "tune" / "lr0.006").mkdir(parents=True)
  (tmp_path / "tune" / "lr0.006" / "results.json").write_text(json.dumps({"steps": 3}))
  record = {"chosen_run": os.path.join("..", "..", "tune", "lr0.006")}
  counts = dict.fromkeys(("skipped", "from_tuning", "trained"), 0)
  rung_dir = tmp_path / "per_target" / "lr0.006"
  tuning.run_seed(chosen, record, str(rung_dir), chosen.tune.seed, counts)
  assert counts["from_tuning"] == 1
  assert json.loads((rung_dir / f"seed{chosen.tune.seed}" / "results.json").read_text())[
      "steps"] == 3


def test_the_sweeps_records_are_replaced_whole_never_rewritten_in_place(tmp_path,
                                                                        monkeypatch):
  """Another process of a multi-process study reads a run's results.json (finished or not)
  while process 0 writes it: the seed run taken from tuning, its tuning record attached, the
  point's tuning.json are each written beside and renamed over, never truncated in place (a
  reader once read an empty file and the study died with a JSONDecodeError)."""
  import builtins
  real_open = builtins.open
  in_place = []

  def watched_open(file, mode="r", *args, **kwargs):
    name = os.path.basename(str(file))
    if any(m in mode for m in "wa") and name in ("results.json", tuning.TUNING_FILE):
      in_place.append(str(file))
    return real_open(file, mode, *args, **kwargs)

  chosen = _config()
  (tmp_path / "tune" / "lr0.006").mkdir(parents=True)
  (tmp_path / "tune" / "lr0.006" / "results.json").write_text(json.dumps({"steps": 3}))
  record = {"chosen_run": os.path.join("tune", "lr0.006"), "chosen": {}}
  counts = dict.fromkeys(("skipped", "from_tuning", "trained"), 0)
  monkeypatch.setattr(builtins, "open", watched_open)
  tuning.run_seed(chosen, record, str(tmp_path), chosen.tune.seed, counts)
  tuning.attach(str(tmp_path / f"seed{chosen.tune.seed}" / "results.json"), {"chosen": 1})
  tuning.write_record(str(tmp_path), record)
  monkeypatch.undo()
  assert counts["from_tuning"] == 1 and in_place == []
  seed_run = json.loads((tmp_path / f"seed{chosen.tune.seed}" / "results.json").read_text())
  assert seed_run == {"steps": 3, "tuning": {"chosen": 1}}
  assert json.loads((tmp_path / tuning.TUNING_FILE).read_text()) == record


def test_a_seed_run_of_another_config_is_refused_not_counted_as_finished(tmp_path):
  # `run.finished_results` decides a seed run's "finished" as every entry point does: a
  # results.json trained at an untuned field's other value is not this point's run.
  chosen = _config()
  (tmp_path / "lr0.003").mkdir()
  (tmp_path / "lr0.003" / "results.json").write_text("{}")
  other = _config()
  other.model.width = 2 * chosen.model.width
  (tmp_path / "seed2").mkdir()
  (tmp_path / "seed2" / "results.json").write_text(json.dumps(
      {"config": other.to_dict(), "steps": 10, "step_budget": 10}))
  counts = dict.fromkeys(("skipped", "from_tuning", "trained"), 0)
  with pytest.raises(config_lib.ConfigError, match=r"model\.width"):
    tuning.run_seed(chosen, {"chosen_run": "lr0.003"}, str(tmp_path), 2, counts)
  assert counts["skipped"] == 0


class LadderFakeTrain:
  """Planted eval histories on a ladder of two accuracy rungs: `steps[factor]` = (steps to
  0.85, steps to 0.90 or None), final accuracy `finals[factor]`; honours stop_at_step as
  the loop does (a rung not met by then is unmet)."""

  def __init__(self, steps, finals, budget=1000):
    self.steps, self.finals, self.budget, self.dirs = steps, finals, budget, []

  def __call__(self, config, run_dir):
    self.dirs.append(run_dir)
    factor = round(config.optim.learning_rate / BASE, 4)
    stop = config.train.stop_at_step or self.budget
    reached = [s if s is not None and s <= stop else None for s in self.steps[factor]]
    r = _results(reached[0], self.finals[factor], self.budget)
    r["targets"] = [{"metric": "accuracy", "value": v, "reached": s is not None,
                     "reached_step": s} for v, s in zip((0.85, 0.90), reached)]
    r["steps"], r["config"] = min(stop, self.budget), config.to_dict()
    return r


def _ladder_config(**kw):
  c = _config(**kw)
  c.eval.target_values = (0.85, 0.90)
  return c


# x0.5 is first to 85% and never reaches 90%; x1 is first to 90%; x2 ends best; x0.25 and
# x4 bound the edges.
LADDER_STEPS = {0.5: (100, None), 1.0: (150, 400), 2.0: (300, 500)}
LADDER_FINALS = {0.5: 0.88, 1.0: 0.905, 2.0: 0.91, 4.0: 0.85}
LADDER_STEPS[4.0] = (600, None)
LADDER_STEPS[0.25], LADDER_FINALS[0.25] = (120, None), 0.87  # bounds the low edge


def test_each_rung_is_chosen_from_the_same_runs_by_its_own_steps():
  fake = LadderFakeTrain(LADDER_STEPS, LADDER_FINALS)
  chosen, record = tuning.tune(_ladder_config(), "/point", fake)
  assert chosen.optim.learning_rate == pytest.approx(BASE / 2)  # the first rung's choice
  per_target = record["chosen_per_target"]
  assert [t["value"] for t in per_target] == [0.85, 0.90]
  assert [t["chosen"]["optim.learning_rate"] for t in per_target] == pytest.approx(
      [BASE / 2, BASE])
  assert per_target[1]["chosen_run"] == os.path.join("tune", "lr0.003")
  assert all(t["reached"] for t in per_target)
  assert record["axes"][0]["chosen_per_target"] == pytest.approx([BASE / 2, BASE])
  assert len(fake.dirs) == 4 and "rung" in record["rule"]


def test_a_ceiling_chooses_the_best_final_metric_and_records_each_rungs_choice():
  config = _ladder_config()
  config.tune.objective = "final_metric"
  chosen, record = tuning.tune(config, "/point", LadderFakeTrain(LADDER_STEPS, LADDER_FINALS))
  # x2 ends best at the edge: extended to x4 (planted to end worse), then chosen
  assert chosen.optim.learning_rate == pytest.approx(2 * BASE)
  assert [t["chosen"]["optim.learning_rate"] for t in record["chosen_per_target"]] == (
      pytest.approx([BASE / 2, BASE]))
  assert record["rule"].startswith(tuning.FINAL_RULE)


def test_a_rung_whose_choice_sits_at_an_edge_extends_the_grid_as_the_points_own():
  """The first rung's choice, x0.5, is interior; 90% is reached first by x2, the top of the
  grid: the rule tries x4 (faster to 90% here) and x8 (slower), as it would for the point's
  own choice, and 90% chooses x4. The point's choice does not move."""
  steps = {0.25: (120, None), 0.5: (100, None), 1.0: (150, 400), 2.0: (300, 350),
           4.0: (320, 330), 8.0: (600, None)}
  finals = {0.25: 0.87, 0.5: 0.88, 1.0: 0.905, 2.0: 0.91, 4.0: 0.91, 8.0: 0.85}
  fake = LadderFakeTrain(steps, finals)
  chosen, record = tuning.tune(_ladder_config(), "/point", fake)
  assert chosen.optim.learning_rate == pytest.approx(BASE / 2)
  assert [t["chosen"]["optim.learning_rate"] for t in record["chosen_per_target"]] == (
      pytest.approx([BASE / 2, 4 * BASE]))
  assert sorted(r["factor"] for r in record["axes"][0]["runs"]) == [
      0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
  assert record["axes"][0]["extensions"] == {"low": 1, "high": 2}


def test_a_ladder_stops_a_run_only_once_it_can_win_no_rung():
  """With stop_losers, x1 (first to 90% at 400) must not be stopped at 100 (the fewest steps
  to 85%): it can still win 90%. Once both rungs have a finisher, later runs stop at the
  most of the two bounds. Same choices as full runs."""
  config = _ladder_config()
  config.tune.stop_losers = True
  fake = LadderFakeTrain(LADDER_STEPS, LADDER_FINALS)
  chosen, record = tuning.tune(config, "/point", fake)
  stopped = {r["factor"]: r["stopped_at_step"] for r in record["axes"][0]["runs"]}
  assert stopped == {0.25: 400, 0.5: None, 1.0: None, 2.0: 400}
  assert [t["chosen"]["optim.learning_rate"] for t in record["chosen_per_target"]] == (
      pytest.approx([BASE / 2, BASE]))


def test_a_schedule_seed_that_missed_the_last_rung_is_not_read_as_a_number():
  """Schedule lengths tried on two tuning seeds with stop_losers: once each rung has a
  rival's steps, a length whose first seed met 85% but missed 90% has lost every rung it
  can: its second seed is not trained. Fails on 3981cc38 with a TypeError (None > int)."""
  steps = {0.25: (100, 450), 0.5: (200, 400), 1.0: (300, None),  # fraction -> rung steps
           0.125: (None, None)}  # (tried past the quarter, the edge: it misses)

  class ScheduleFake(LadderFakeTrain):
    def __call__(self, config, run_dir):
      self.steps = {1.0: steps[config.train.schedule_fraction]}
      return super().__call__(config, run_dir)

  config = _ladder_config(fields=("optim.learning_rate", "train.schedule_fraction"),
                          factors=(1.0,))
  config.tune.stop_losers = True
  fake = ScheduleFake({}, {1.0: 0.9})
  chosen, record = tuning.tune(config, "/point", fake)
  assert chosen.train.schedule_fraction == 0.25  # first to 85% on both seeds
  # the whole length lost every rung on seed 0: not trained on seed 1000
  assert os.path.join("/point", "tune", "lr0.003_seed1000") not in fake.dirs
  assert [t["chosen"]["train.schedule_fraction"] for t in record["chosen_per_target"]] == [
      0.25, 0.5]
