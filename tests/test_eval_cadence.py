"""Steps to target resolved to 5%: evaluations come closer together near the target."""
import math
import os

import pytest

from ensemble_jax import config_lib, eval_schedule

pytestmark = pytest.mark.unit


def _eval_config(resolution=0.05, margin=0.05, lookahead=2.0):
  c = config_lib.base_config().eval
  c.target_resolution, c.near_target_margin, c.near_target_lookahead = (resolution, margin,
                                                                        lookahead)
  return c


def _next(step, history, value=0.85, metric="accuracy", **kw):
  return eval_schedule.next_eval_step(step, history, metric, value, _eval_config(**kw), every=25)


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
    c.eval.every_steps, c.eval.target_metric, c.eval.target_value = every, "nll", target
    c.eval.target_resolution, c.eval.near_target_margin = 0.05, 0.0
    c.eval.near_target_lookahead, c.train.stop_at_target = 0.0, stop
    return c

  fine = run.train_and_evaluate(config(1, 0.0, False), str(tmp_path / "fine"))
  nll = {h["step"]: h["nll"] for h in fine["history"]}
  assert sorted(nll) == [1, 2, 3, 4]
  # The target: what the eval at step 4 scores, so the coarse run meets it there; a run
  # evaluated every step meets it first at `crossing` (step 4 today: the nll falls, and the
  # replay runs all four steps, the outer step at step 2 among them). The coarse run's
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
