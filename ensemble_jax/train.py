"""`train_and_evaluate(config, workdir)`: the one training loop for every method.

A method (see `ensemble_jax/methods/`) supplies the state, the compiled step, the batch
layout and the eval reduction; this loop owns data, timing, evaluation, target tracking,
checkpoints, metric files and `results.json`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from clu import parameter_overview

from ensemble_jax import checkpoint as checkpoint_lib
from ensemble_jax import config_lib, costs, distributed, optim, writers
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import data as data_lib
from ensemble_jax import models
from ensemble_jax.data import pipeline
from ensemble_jax.methods import create_method
from ensemble_jax.sharding import make_mesh

RESULTS_FILE = "results.json"


@dataclasses.dataclass
class TargetTracker:
  """The first eval at which `metric` crosses `value` (>= for accuracy, <= for nll/ppl)."""
  metric: str
  value: float
  reached: bool = False
  reached_step: int | None = None
  reached_time_s: float | None = None  # training time (evals and compile excluded)
  reached_wall_time_s: float | None = None  # wall time since the run started

  def update(self, metrics: dict, step: int, train_time_s: float, wall_time_s: float):
    if self.reached or self.metric not in metrics:
      return
    got = metrics[self.metric]
    lower = self.metric in config_lib.LOWER_IS_BETTER
    crossed = got <= self.value if lower else got >= self.value
    if crossed:
      self.reached, self.reached_step = True, step
      self.reached_time_s, self.reached_wall_time_s = train_time_s, wall_time_s


def _prepare_workdir(workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  if not os.access(workdir, os.W_OK):
    raise config_lib.ConfigError(f"--workdir={workdir!r} is not writable; choose another.")


def _eval(method, state, eval_batches) -> dict:
  sums = None
  for batch in eval_batches:
    sums = metrics_lib.add_sums(sums, method.eval_step(state, batch))
  return method.finalize_eval(sums)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config.method` on `config.data`; writes checkpoints, metrics and results.json."""
  config_lib.validate(config)
  distributed.maybe_initialize(config.distributed)
  mesh = make_mesh(config.mesh)
  data = data_lib.load(config)
  _prepare_workdir(workdir)
  is_main = jax.process_index() == 0

  num_steps = config_lib.num_train_steps(config, len(data.train))
  steps_per_epoch = config_lib.steps_per_epoch(config, len(data.train))
  tx = optim.create_optimizer(config.optim, config.train.batch_size, num_steps, steps_per_epoch)
  model = models.create_model(config.model, data.num_classes, config.data.context)
  method = create_method(config, model, tx, mesh, data.init_input)
  eval_every = config.eval.every_steps or steps_per_epoch

  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state = method.init(init_rng)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                             config.checkpoint.every_steps,
                                             config.checkpoint.max_to_keep)
  state, meta = checkpointer.restore(state)
  meta = meta or {"step": 0, "train_time_s": 0.0, "eval_time_s": 0.0, "history": [],
                  "target": dataclasses.asdict(TargetTracker(config.eval.target_metric,
                                                             config.eval.target_value))}
  start_step = int(meta["step"])
  tracker = TargetTracker(**meta["target"])
  if is_main:
    logging.info("Parameters:\n%s", parameter_overview.get_parameter_overview(
        jax.eval_shape(lambda s: s.params, state), include_stats=False))
  if start_step:
    logging.info("Resumed from step %d in %s", start_step, workdir)

  train_batches = pipeline.TrainBatches(
      data.train, method.sampler(len(data.train), config.seed),
      data.train_transform, method.train_layout, config.seed)
  eval_batches = pipeline.EvalBatches(
      data.eval, data.eval_transform, method.eval_layout,
      config.eval.num_examples)
  writer = writers.MetricWriter(workdir, enabled=is_main)

  wall_start = time.perf_counter() - meta["train_time_s"] - meta["eval_time_s"]
  batches = train_batches.iterate(start_step, num_steps, config.data.prefetch,
                                  config.data.num_threads)
  step_fn, flops_per_step, compile_time_s = None, float("nan"), 0.0
  durations: list[float] = []
  train_time_s, eval_time_s = meta["train_time_s"], meta["eval_time_s"]
  history = meta["history"]
  progress = _progress(start_step, num_steps, is_main)
  last_metrics = last_eval = None
  step = start_step
  for step in range(start_step, num_steps):
    batch = next(batches)
    if step_fn is None:  # compile once, read XLA's FLOPs off the same executable
      t = time.perf_counter()
      step_fn = method.train_step.lower(state, batch, step_rng).compile()
      # XLA counts the per-device SPMD program; the step costs that on every mesh device.
      flops_per_step = costs.flops(step_fn) * mesh.devices.size
      compile_time_s = time.perf_counter() - t
      t_last = time.perf_counter()
    state, step_metrics = step_fn(state, batch, step_rng)
    # Fetched one step late, so the host queues the next step before it waits.
    if last_metrics is not None:
      method.check_step_metrics(jax.device_get(last_metrics), step - 1)
    jax.block_until_ready(step_metrics)
    now = time.perf_counter()
    durations.append(now - t_last)
    train_time_s += now - t_last
    t_last = now
    last_metrics = step_metrics
    done = step + 1
    progress.update(1)
    if done % config.train.log_every_steps == 0 or done == num_steps:
      scalars = {f"train/{k}": float(np.mean(v))
                 for k, v in jax.device_get(step_metrics).items()}
      writer.write_scalars(done, scalars)
      progress.set_postfix(loss=f"{scalars['train/loss']:.3f}")
    if done % eval_every == 0 or done == num_steps:
      t = time.perf_counter()
      eval_metrics = last_eval = _eval(method, state, eval_batches)
      eval_time_s += time.perf_counter() - t
      t_last = time.perf_counter()
      tracker.update(eval_metrics, done, train_time_s, t_last - wall_start)
      history.append({"step": done, "train_time_s": train_time_s, **_scalars(eval_metrics)})
      writer.write_scalars(done, {f"eval/{k}": v for k, v in _scalars(eval_metrics).items()})
      logging.info("step %d eval %s", done, _scalars(eval_metrics))
    meta = {"step": done, "train_time_s": train_time_s, "eval_time_s": eval_time_s,
            "history": history, "target": dataclasses.asdict(tracker)}
    checkpointer.save(done, state, meta, force=done == num_steps)
  if last_metrics is not None:
    method.check_step_metrics(jax.device_get(last_metrics), step)
  progress.close()
  checkpointer.close()
  writer.close()

  if last_eval is None:  # resumed after the last step: evaluate the restored state
    last_eval = _eval(method, state, eval_batches)
  results = {
      "method": method.name,
      "config": config.to_dict(),
      "num_devices": jax.device_count(),
      "mesh": dict(mesh.shape),
      "data": data.info,
      "steps": num_steps,
      "examples_per_step": method.examples_per_step,
      "wall_time_s": time.perf_counter() - wall_start,
      "train_time_s": train_time_s,
      "eval_time_s": eval_time_s,
      "compile_time_s": compile_time_s,
      "flops_per_step": flops_per_step,
      "step_time_s": costs.median_step_time(durations, config.train.timing_warmup_steps),
      "final": _scalars(last_eval),
      "target": {"metric": tracker.metric, "value": tracker.value, "reached": tracker.reached,
                 "reached_step": tracker.reached_step, "reached_time_s": tracker.reached_time_s,
                 "reached_wall_time_s": tracker.reached_wall_time_s},
      "history": history,
      **method.final_results(state, last_eval, num_steps, train_batches, eval_batches),
  }
  if config.task == "lm":
    results["tokens_per_step"] = method.examples_per_step * config.data.context
    results["tokens_per_s"] = results["tokens_per_step"] / results["step_time_s"]
  if is_main:
    with open(os.path.join(workdir, RESULTS_FILE), "w") as f:
      json.dump(_jsonable(results), f, indent=2)
  return results


def _scalars(metrics: dict) -> dict:
  return {k: v for k, v in metrics.items() if np.ndim(v) == 0}


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.floating, float)):
    return None if not math.isfinite(float(x)) else float(x)
  if isinstance(x, np.integer):
    return int(x)
  return x


class _NoProgress:
  def update(self, n): pass
  def set_postfix(self, **kw): pass
  def close(self): pass


def _progress(start: int, total: int, enabled: bool):
  if not enabled:
    return _NoProgress()
  from tqdm.auto import tqdm

  return tqdm(total=total, initial=start, desc="train", dynamic_ncols=True, mininterval=2.0)
