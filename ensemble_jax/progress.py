"""What the loop accumulates: its clocks, eval history and target trackers.

A checkpoint keeps `Progress.record()` beside the state, so a resumed run continues its
clocks and history; results.json is built from it at the end (`record.build`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

from ensemble_jax import eval_schedule, noise_scale


class Chrono:
  """The run's clocks (after big_vision's `Chrono`): training time runs from lap to lap
  and pauses for what is not training, each pause timed under its own name.

  `lap()` counts the seconds since the previous lap, or since the end of the last pause,
  as training: a step (waiting for its batch included) or an `after_step` (DiLoCo's sync).
  `paused(what)` times compile, eval or checkpoint apart, and the training clock restarts
  when it ends. Host bookkeeping between a lap and a pause (metric logs on eval steps, the
  checkpoint record) counts as neither.
  """

  def __init__(self, train_s: float = 0.0, eval_s: float = 0.0):
    """A resumed run's clocks continue from its checkpoint's train and eval times."""
    now = time.perf_counter()
    self.train_s = train_s
    self.paused_s = {"compile": 0.0, "eval": eval_s, "checkpoint": 0.0}
    self._wall_start = now - train_s - eval_s
    self._mark = now

  def lap(self) -> float:
    """Training seconds since the last mark (a step's duration)."""
    now = time.perf_counter()
    seconds, self._mark = now - self._mark, now
    self.train_s += seconds
    return seconds

  @contextlib.contextmanager
  def paused(self, what: str):
    start = time.perf_counter()
    yield
    self._mark = time.perf_counter()
    self.paused_s[what] += self._mark - start

  def wall_s(self) -> float:
    """Seconds since the run started (a resumed run: its restored times included)."""
    return time.perf_counter() - self._wall_start


@dataclasses.dataclass
class Progress:
  """What the loop accumulates for the checkpoint record and results.json."""
  step: int  # steps trained so far
  trackers: list[eval_schedule.TargetTracker]  # one per rung of the targets, easiest first
  history: list[dict]  # one row of eval scalars per eval
  chrono: Chrono
  config: dict  # this session's config (JSON), kept with every checkpoint
  config_changes: list[dict]  # what each resumed session changed: {"step", "changes"}
  durations: list[float] = dataclasses.field(default_factory=list)  # this session's steps
  flops_per_step: float = float("nan")
  last_eval: dict | None = None
  noise: noise_scale.NoiseScaleTracker | None = None  # config.train.noise_scale

  @staticmethod
  def fresh_record(eval_config) -> dict:
    """A run's record before its first step: no history, a tracker per target."""
    trackers = [dataclasses.asdict(t) for t in eval_schedule.ladder(eval_config)]
    return {"step": 0, "train_time_s": 0.0, "eval_time_s": 0.0, "history": [],
            "target": trackers[0], "targets": trackers}

  def track(self, metrics: dict, step: int) -> None:
    """Each target's tracker reads the eval at `step` (before it joins the history)."""
    for t in self.trackers:
      t.update(metrics, step, self.chrono.train_s, self.chrono.wall_s(),
               self.history[-1]["step"] if self.history else 0)

  @property
  def tracker(self) -> eval_schedule.TargetTracker:
    """The first rung's: the run's target."""
    return self.trackers[0]

  def all_reached(self) -> bool:
    return all(t.reached for t in self.trackers)

  def record(self, method) -> dict:
    """The checkpoint's JSON record: what a resumed run needs besides the state."""
    record = {"step": self.step, "train_time_s": self.chrono.train_s,
              "eval_time_s": self.chrono.paused_s["eval"], "history": self.history,
              "target": dataclasses.asdict(self.tracker),
              "targets": [dataclasses.asdict(t) for t in self.trackers],
              "method": method.host_state(),
              "config": self.config, "config_changes": self.config_changes}
    if self.noise is not None:
      record["noise_scale"] = self.noise.record()
    return record
