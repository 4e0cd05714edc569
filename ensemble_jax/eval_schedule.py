"""When the loop evaluates, and the first eval that meets each target.

Evals come every `eval.every_steps`; near a target not yet met, every
`eval.target_resolution` x step steps, so the step each target (each rung of
`eval.target_values`) is first met at is known to that fraction of itself.
"""
from __future__ import annotations

import dataclasses

from typing import Sequence

from ensemble_jax import config_lib


@dataclasses.dataclass
class TargetTracker:
  """The first eval at which `metric` crosses `value` (>= for accuracy, <= for nll/ppl)."""
  metric: str
  value: float
  reached: bool = False
  reached_step: int | None = None
  reached_time_s: float | None = None  # training time (evals and compile excluded)
  reached_wall_time_s: float | None = None  # wall time since the run started
  # The crossing lies in (reached_step - resolution_steps, reached_step]: the eval before
  # it was resolution_steps earlier (or the run's start).
  resolution_steps: int | None = None
  # Set when the loop replayed a too-coarse crossing (`_refine`): the coarse eval's step
  # and resolution, and the training seconds of the steps it threw away.
  refined_from: dict | None = None

  def update(self, metrics: dict, step: int, train_time_s: float, wall_time_s: float,
             previous_eval_step: int = 0):
    if self.reached or self.metric not in metrics:
      return
    got = metrics[self.metric]
    lower = self.metric in config_lib.LOWER_IS_BETTER
    crossed = got <= self.value if lower else got >= self.value
    if crossed:
      self.reached, self.reached_step = True, step
      self.reached_time_s, self.reached_wall_time_s = train_time_s, wall_time_s
      self.resolution_steps = step - previous_eval_step


def ladder(eval_config) -> list[TargetTracker]:
  """A fresh tracker per rung of the run's targets (`config_lib.target_ladder`)."""
  return [TargetTracker(eval_config.target_metric, v)
          for v in config_lib.target_ladder(eval_config)]


def trackers(record: dict) -> list[TargetTracker]:
  """The trackers a checkpoint's record holds (one `target` before the ladder)."""
  return [TargetTracker(**t) for t in record.get("targets", [record["target"]])]


def unreached(trackers: Sequence[TargetTracker]) -> list[float]:
  """The rungs not met yet."""
  return [t.value for t in trackers if not t.reached]


def fine_interval(step: int, eval_config) -> int:
  """The steps between evals near the target after one at `step`: `target_resolution` x
  `step`, at least 1, so a crossing is known to that fraction of its step."""
  return max(1, int(eval_config.target_resolution * step))


def too_coarse(tracker: TargetTracker, eval_config) -> bool:
  """Whether the crossing just found is known less finely than `target_resolution` asks
  (the metric jumped past the near-target window between two regular evals)."""
  return (eval_config.target_resolution > 0 and tracker.reached
          and tracker.resolution_steps > fine_interval(tracker.reached_step, eval_config))


def too_coarse_at(trackers: Sequence[TargetTracker], step: int, eval_config) -> bool:
  """Whether a target first met by the eval at `step` is known too coarsely (`too_coarse`);
  every target met there shares that eval's resolution."""
  return any(t.reached_step == step and too_coarse(t, eval_config) for t in trackers)


def near_target(history: list[dict], metric: str, value: float, eval_config,
                every: int) -> bool:
  """Whether some eval so far came within `near_target_margin` (a fraction of the target)
  of the target `value`, or the last two evals' rate reaches it within
  `near_target_lookahead` intervals of `every` steps."""
  lower = metric in config_lib.LOWER_IS_BETTER
  scores = [(h["step"], h[metric]) for h in history if h.get(metric) is not None]
  gaps = [(step, got - value if lower else value - got) for step, got in scores]
  if any(gap <= eval_config.near_target_margin * abs(value) for _, gap in gaps):
    return True
  if len(gaps) < 2:
    return False
  (s1, g1), (s2, g2) = gaps[-2:]
  rate = (g1 - g2) / max(s2 - s1, 1)  # of the gap closed per step
  return rate > 0 and g2 <= rate * eval_config.near_target_lookahead * every


def next_eval_step(step: int, history: list[dict], metric: str, values: Sequence[float],
                   eval_config, every: int) -> int:
  """The step of the eval after one at `step`: the next multiple of `every`, or, near any of
  the targets `values` not met yet (`near_target`), `target_resolution` x `step` steps
  later (at least 1), so that the step each is first reached at is known to that fraction
  of itself."""
  coarse = (step // every + 1) * every
  if eval_config.target_resolution <= 0 or not any(
      near_target(history, metric, v, eval_config, every) for v in values):
    return coarse
  return min(coarse, step + fine_interval(step, eval_config))
