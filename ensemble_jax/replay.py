"""Replaying a target crossing found too coarsely: the steps since the last eval that left
a target unmet, stepped again with fine evals (`eval.target_resolution`)."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from absl import logging

from ensemble_jax import eval_schedule, noise_scale
from ensemble_jax.eval_schedule import TargetTracker
from ensemble_jax.methods import Method
from ensemble_jax.progress import Progress


@dataclasses.dataclass
class Snapshot:
  """The loop right after an eval that missed the target (its outer step done): what
  replaying the steps after it needs."""
  step: int
  state: Any  # a copy: the step donates its input's buffers
  history_len: int
  train_s: float
  host_state: dict
  noise: dict | None

  @classmethod
  def after_eval(cls, state, p: Progress, method: Method) -> "Snapshot | None":
    """The loop now, if it stands at an eval that left a target unmet (or at the start)."""
    if (p.history[-1]["step"] if p.history else 0) != p.step or p.all_reached():
      return None
    return cls(p.step, jax.tree.map(jnp.copy, state), len(p.history), p.chrono.train_s,
               copy.deepcopy(method.host_state()),
               None if p.noise is None else copy.deepcopy(p.noise.record()))


def refine(config, method: Method, snap: Snapshot, train_batches, p: Progress,
           take_step: Callable, evaluate: Callable, stop_when_all_reached: bool):
  """Targets were first met `resolution_steps` after the previous eval, more coarsely than
  `eval.target_resolution` allows: the metric jumped past the near-target window between
  two regular evals. Rewinds to that eval (`snap`) and replays the same steps (the same
  batches and keys: the same updates) with an eval every target_resolution x step steps, up
  to the first eval that meets every target the coarse eval met. The coarse eval leaves the
  history; the thrown-away steps' training time leaves the training clock (recorded in
  each such target's `refined_from`). If every rung is then met and
  `stop_when_all_reached`, the run ends there; otherwise the replay steps on to the coarse
  eval's step and scores it again (the same state: the same metrics), so the loop goes on
  from where it stood. `take_step(state, batch, step)` and `evaluate(state, batch, step)`
  are the loop's own. Returns (state, batch, step), before that step's `after_step`.
  """
  end = p.history[-1]["step"]
  coarse = [i for i, t in enumerate(p.trackers) if t.reached and t.reached_step == end]
  first = p.trackers[coarse[0]]
  logging.info("targets %s met at step %d, %d steps after the previous eval: replaying "
               "them from step %d with evals every %g x step",
               [p.trackers[i].value for i in coarse], end, first.resolution_steps, snap.step,
               config.eval.target_resolution)
  discarded = p.chrono.train_s - snap.train_s
  for i in coarse:
    t = p.trackers[i]
    p.trackers[i] = TargetTracker(t.metric, t.value, refined_from={
        "step": t.reached_step, "resolution_steps": t.resolution_steps,
        "discarded_train_s": discarded})
  del p.history[snap.history_len:]
  p.chrono.train_s = snap.train_s
  method.load_host_state(copy.deepcopy(snap.host_state))
  if p.noise is not None:
    p.noise = noise_scale.NoiseScaleTracker.from_record(snap.noise, config.train.noise_scale_ema)
  state = snap.state
  batches = train_batches.iterate(snap.step, end, config.data.prefetch,
                                  config.data.num_threads)
  next_eval = snap.step + eval_schedule.fine_interval(snap.step, config.eval)
  fine = True  # until every replayed target is met again
  for step in range(snap.step, end):
    batch = next(batches)
    state, _ = take_step(state, batch, step)
    done = step + 1
    if done == end or (fine and done >= next_eval):
      evaluate(state, batch, done)
      if fine and all(p.trackers[i].reached for i in coarse):
        fine = False
        if stop_when_all_reached and p.all_reached() or done == end:
          return state, batch, done
      next_eval = done + eval_schedule.fine_interval(done, config.eval)
      if done == end:
        break
    state = jax.block_until_ready(method.after_step(state, done, batch))
    p.chrono.lap()
  if fine:
    raise RuntimeError(f"replaying steps {snap.step}..{end} did not meet the targets that "
                       f"step {end} met: the steps are not deterministic on this backend")
  return state, batch, end
