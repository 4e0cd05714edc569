"""Steps to target resolved to 5%: evaluations come closer together near the target."""
import math
import os

import pytest

from ensemble_jax import config_lib, eval_schedule

pytestmark = pytest.mark.unit
# The runs below train and evaluate on 8 x 8 images: what they check is the loop's replay,
# which no image size changes, and a step or an eval costs a fraction of 28 x 28's (this file
# from a cold compile cache: 56 -> 41 s of CPU). Their nll curves take the shape they take
# at 28 x 28: the crossing and the rungs the tests find are at the same steps.
IMAGE_SIZE = 8


def _eval_config(resolution=0.05, margin=0.05, lookahead=2.0):
  c = config_lib.base_config().eval
  c.target_resolution, c.near_target_margin, c.near_target_lookahead = (resolution, margin,
                                                                        lookahead)
  return c


def _next(step, history, value=0.85, metric="accuracy", **kw):
  return eval_schedule.next_eval_step(step, history, metric, [value], _eval_config(**kw),
                                      every=25)


def test_far_from_the_target_the_cadence_is_every_steps():
  assert _next(0, []) == 25
  assert _next(50, [{"step": 25, "accuracy": 0.40}, {"step": 50, "accuracy": 0.45}]) == 75
  assert _next(60, [{"step": 60, "accuracy": 0.5}]) == 75  # back on the every_steps grid


def test_within_the_margin_the_next_eval_is_a_resolution_of_the_step_away():
  near = [{"step": 100, "accuracy": 0.83}]  # 2 points below 85%, within 5% of it
  assert _next(100, near) == 105
  assert _next(40, near) == 42
  assert _next(10, near) == 11  # at least one step
  assert _next(100, near, resolution=0.0) == 125  # off
  lm = [{"step": 200, "perplexity": 12.5}]  # lower is better: 0.5 above 12, within 0.6
  assert _next(200, lm, value=12.0, metric="perplexity") == 210
  assert _next(200, [{"step": 200, "perplexity": 13.0}], value=12.0,
               metric="perplexity") == 225


def test_a_fast_approach_counts_as_near_before_the_margin():
  """0.70 -> 0.78 in 25 steps: at that rate 85% is 22 steps away, within 2 intervals."""
  history = [{"step": 50, "accuracy": 0.70}, {"step": 75, "accuracy": 0.78}]
  assert _next(75, history) == 78
  assert _next(75, history, lookahead=0.5) == 100  # 22 steps is beyond half an interval


@pytest.mark.parametrize("scale", [40.0, 60.0, 150.0])
def test_the_first_eval_past_the_target_is_within_5_percent_of_the_crossing(scale):
  """A saturating curve evaluated by the cadence: the crossing is pinned to 5% of it."""
  def accuracy(step):
    return 0.9 * (1 - math.exp(-step / scale))

  history, step = [], 0
  while True:
    step = _next(step, history)
    history.append({"step": step, "accuracy": accuracy(step)})
    if accuracy(step) >= 0.85:
      break
  previous = history[-2]["step"]
  crossing = -scale * math.log(1 - 0.85 / 0.9)
  assert previous < crossing <= step
  assert (step - previous) <= 0.05 * step


@pytest.mark.e2e
def test_a_jump_past_the_window_is_replayed_to_the_crossing_a_fine_cadence_finds(tmp_path):
  """Evaluated only at step 4, a run meets its target there 4 steps after the previous eval
  (the start): coarser than 5%. The loop replays steps 1..4 from its copy of the start with
  an eval every step and stops at the first that meets the target, the step and the metric
  a run evaluated every step from the start finds (bit for bit: the same updates, DiLoCo's
  outer steps and host state included: DiLoCo has both). Without the replay it reports
  step 4, resolution 4."""
  from experiments.configs import fashion_mnist
  from ensemble_jax import run

  def config(every, target, stop):
    c = fashion_mnist.get_config("diloco,tiny")  # an outer step every 2 steps
    c.data.image_size = IMAGE_SIZE
    c.eval.every_steps, c.eval.target_metric, c.eval.target_value = every, "nll", target
    c.eval.target_resolution, c.eval.near_target_margin = 0.05, 0.0
    c.eval.near_target_lookahead, c.train.stop_at_target = 0.0, stop
    return c

  fine = run.train_and_evaluate(config(1, 0.0, False), str(tmp_path / "fine"))
  nll = {h["step"]: h["nll"] for h in fine["history"]}
  assert sorted(nll) == [1, 2, 3, 4]
  # The target: what the eval at step 4 scores, so the coarse run meets it there; a run
  # evaluated every step meets it first at `crossing` (the nll need not fall every step: an
  # earlier step may meet it; the replay runs the steps up to it, the outer step at step 2
  # among them whenever the crossing is past it). The coarse run's
  # history holds every replayed eval, which only the replay can give it.
  target = nll[4]
  crossing = min(k for k in nll if nll[k] <= target)
  coarse = run.train_and_evaluate(config(4, target, True), str(tmp_path / "coarse"))
  assert coarse["target"]["reached_step"] == coarse["steps"] == crossing
  assert coarse["target"]["resolution_steps"] == 1
  assert [h["step"] for h in coarse["history"]] == list(range(1, crossing + 1))
  assert [h["nll"] for h in coarse["history"]] == [nll[k] for k in range(1, crossing + 1)]
  refined = coarse["target"]["refined_from"]
  assert refined["step"] == 4 and refined["resolution_steps"] == 4
  assert refined["discarded_train_s"] > 0
  # The coarse pass's checkpoint at step 2 (every 2 steps) was of the rewound trajectory
  # and is gone; the replay's final checkpoint is the crossing's.
  assert sorted(int(d) for d in os.listdir(tmp_path / "coarse" / "checkpoints")
                if d.isdigit()) == [crossing]


def _ladder(values, metric="accuracy"):
  c = _eval_config()
  c.target_metric, c.target_value, c.target_values = metric, values[0], tuple(values)
  return eval_schedule.ladder(c)


def test_a_ladder_records_each_rung_at_its_first_crossing_in_a_planted_history():
  """A planted history that rises, dips and rises again: each rung is first met at its own
  eval (the dip does not unmeet one), with the resolution of that eval's gap."""
  history = [(25, 0.80), (50, 0.86), (53, 0.87), (56, 0.861), (60, 0.885), (63, 0.91)]
  trackers = _ladder((0.85, 0.87, 0.88, 0.90, 0.95))
  previous = 0
  for step, accuracy in history:
    for t in trackers:
      t.update({"accuracy": accuracy}, step, train_time_s=step / 10, wall_time_s=step / 5,
               previous_eval_step=previous)
    previous = step
  got = [(t.value, t.reached_step, t.resolution_steps, t.reached_time_s) for t in trackers]
  assert got == [(0.85, 50, 25, 5.0), (0.87, 53, 3, 5.3), (0.88, 60, 4, 6.0),
                 (0.90, 63, 3, 6.3), (0.95, None, None, None)]
  assert eval_schedule.unreached(trackers) == [0.95]


def test_evals_come_close_near_any_rung_not_yet_met():
  """The loop asks about the rungs not met yet (`unreached`): near one of them the cadence
  is fine; once every rung is met, it is the regular one again."""
  history = [{"step": 400, "accuracy": 0.89}]
  assert eval_schedule.next_eval_step(400, history, "accuracy", [0.90, 0.95], _eval_config(),
                                      every=25) == 420
  assert eval_schedule.next_eval_step(400, history, "accuracy", [], _eval_config(),
                                      every=25) == 425


@pytest.mark.e2e
@pytest.mark.parametrize("stop", [True, False])
def test_a_ladder_run_replays_each_coarse_rung_and_stops_at_the_last(tmp_path, stop):
  """Evaluated only at step 4, a ladder of two nll rungs set between the nll a run evaluated
  every step scores at steps 2 and 3, each met first where that run meets it: the loop
  replays finely and records both; stopping at the target stops at the last rung, otherwise
  the run trains to its budget. `target` is the first rung; results.json `targets` has
  both."""
  from experiments.configs import fashion_mnist
  from ensemble_jax import run

  def config(every, rungs, stop_at_target, steps=4):
    c = fashion_mnist.get_config("tiny")
    c.data.image_size = IMAGE_SIZE
    c.train.num_steps = steps
    c.eval.every_steps, c.eval.target_metric = every, "nll"
    c.eval.target_value, c.eval.target_values = rungs[0], tuple(rungs)
    c.eval.target_resolution, c.eval.near_target_margin = 0.05, 0.0
    c.eval.near_target_lookahead, c.train.stop_at_target = 0.0, stop_at_target
    return c

  fine = run.train_and_evaluate(config(1, (99.0,), False, steps=6), str(tmp_path / "fine"))
  nll = {h["step"]: h["nll"] for h in fine["history"]}
  rungs = (max(nll[2], nll[3]) + 1e-6, min(nll[2], nll[3]) - 1e-6)
  firsts = [min(k for k in nll if nll[k] <= r) for r in rungs]
  coarse = run.train_and_evaluate(config(4, rungs, stop, steps=6), str(tmp_path / "coarse"))
  assert [t["reached_step"] for t in coarse["targets"]] == firsts
  assert coarse["target"] == coarse["targets"][0]
  assert all(t["refined_from"]["step"] == 4 for t in coarse["targets"])
  assert coarse["steps"] == (firsts[-1] if stop else 6)
  assert [h["nll"] for h in coarse["history"]] == [nll[h["step"]] for h in coarse["history"]]
