"""`fit(config, workdir, pool=None)`: the one training loop for every method.

A method (the interface: `ensemble_jax/methods/base.py`) supplies the state, the compiled
step, the batch layout and the eval reduction; this loop owns data, timing, evaluation,
target tracking, checkpoints, metric files and `results.json`. It knows nothing about
distillation: `ensemble_jax/run.py` builds a distilled pool first and hands it over.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from clu import parameter_overview
from jax.experimental import multihost_utils

from ensemble_jax import checkpoint as checkpoint_lib
from ensemble_jax import config_lib, costs, distributed, optim, writers
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import data as data_lib
from ensemble_jax import models
from ensemble_jax.data import pipeline, samplers
from ensemble_jax.methods import Method, create_method
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
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise config_lib.ConfigError(f"--workdir={workdir!r} cannot be created ({e}); choose "
                                 "another.") from None
  if not os.access(workdir, os.W_OK):
    raise config_lib.ConfigError(f"--workdir={workdir!r} is not writable; choose another.")


def _eval(method, state, eval_batches) -> dict:
  sums = None
  for batch in eval_batches:
    sums = metrics_lib.add_sums(sums, method.eval_step(state, batch))
  return method.finalize_eval(sums)


@dataclasses.dataclass
class Fit:
  results: dict
  state: Any  # the final train state (stacked for the ensemble and DiLoCo)
  method: Method
  data: data_lib.Data


@dataclasses.dataclass
class Setup:
  """What a run is made of, each part checked against the config before the workdir is
  touched: `run.py` builds a pool from it (the data, the method's workers) before `fit`."""
  mesh: Any
  data: data_lib.Data
  method: Method
  num_steps: int
  steps_per_epoch: int
  warm_start: str  # config.train.init_from's checkpoints (used only if init_from is set)
  is_main: bool


def set_up(config: ml_collections.ConfigDict, workdir: str) -> Setup:
  """Validates, loads the data and builds the method; only then creates the workdir, so a
  config that cannot work fails here and leaves no trace."""
  config_lib.validate(config)
  distributed.maybe_initialize(config.distributed)
  mesh = make_mesh(config.mesh)
  data = data_lib.load(config)
  is_main = jax.process_index() == 0

  num_steps = config_lib.num_train_steps(config, len(data.train))
  steps_per_epoch = config_lib.steps_per_epoch(config, len(data.train))
  tx = optim.create_optimizer(config.optim, config.train.batch_size, num_steps, steps_per_epoch)
  model = models.create_model(config.model, data.num_classes, config.data.context)
  method = create_method(config, model, tx, mesh, data.init_input)
  warm_start = os.path.join(config.train.init_from, "checkpoints")
  if config.train.init_from and not os.path.isdir(warm_start):
    raise config_lib.ConfigError(f"config.train.init_from={config.train.init_from!r}: no "
                                 f"checkpoints in {warm_start}; train that run first.")
  _prepare_workdir(workdir)  # only now: a config that cannot work leaves no trace
  return Setup(mesh, data, method, num_steps, steps_per_epoch, warm_start, is_main)


def fit(config: ml_collections.ConfigDict, workdir: str, *,
        pool: samplers.Pool | None = None, setup: Setup | None = None) -> Fit:
  """Trains `config.method` on `config.data`; writes checkpoints, metrics and results.json.

  `pool`: what the workers read (a distilled pool from `run.py`); None: the method's own
  sampler. `setup`: `set_up(config, workdir)`'s result when the caller needed it first.
  Hands back the final state too (proxies for distill pools).
  """
  s = setup or set_up(config, workdir)
  mesh, data, method, num_steps, is_main = s.mesh, s.data, s.method, s.num_steps, s.is_main
  warm_start, steps_per_epoch = s.warm_start, s.steps_per_epoch
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
  method.load_host_state(meta.get("method", {}))
  if is_main:
    logging.info("Parameters:\n%s", parameter_overview.get_parameter_overview(
        jax.eval_shape(lambda s: s.params, state), include_stats=False))
  if start_step:
    logging.info("Resumed from step %d in %s", start_step, workdir)
  elif config.train.init_from:  # weights (and BatchNorm statistics) only; a fresh optimizer
    source = checkpoint_lib.Checkpointer(warm_start, 0, 1)
    warm, _ = source.restore(state)
    source.close()
    state = state.replace(params=warm.params, batch_stats=warm.batch_stats)
    logging.info("Initialised from the weights in %s", warm_start)

  if pool is None:  # no distilled sequence: the method's own sampler
    pool = samplers.Pool(method.sampler(len(data.train), config.seed), None)
  train_batches = pipeline.TrainBatches(
      data.train, pool.sampler,
      data.train_transform, method.train_layout, config.seed)
  if config.model.sparsity > 0 and start_step == 0:  # SNIP on the first batch, fixed after
    state = method.prune(state, pipeline.to_global(train_batches.local_batch(0),
                                                   train_batches.layout),
                         config.model.sparsity)
  eval_batches = pipeline.EvalBatches(
      data.eval, data.eval_transform, method.eval_layout,
      config.eval.num_examples,
      None if pool.eval_route is None else {"route": pool.eval_route})
  writer = writers.MetricWriter(workdir, enabled=is_main)

  wall_start = time.perf_counter() - meta["train_time_s"] - meta["eval_time_s"]
  batches = train_batches.iterate(start_step, num_steps, config.data.prefetch,
                                  config.data.num_threads)
  step_fn, flops_per_step, compile_time_s = None, float("nan"), 0.0
  durations: list[float] = []
  train_time_s, eval_time_s = meta["train_time_s"], meta["eval_time_s"]
  checkpoint_time_s = 0.0  # this session's blocking part of checkpoint saves
  history = meta["history"]
  progress = _progress(start_step, num_steps, is_main)
  preemption = PreemptionWatch()
  last_eval = None
  step = start_step
  # Steps-to-target runs stop at the first eval that reaches the target (or the budget).
  stop_at_target = config.train.stop_at_target
  end_step = start_step if stop_at_target and tracker.reached else num_steps
  steps_done = start_step
  try:
    for step in range(start_step, end_step):
      batch = next(batches)
      if step_fn is None:  # compile once, read XLA's FLOPs off the same executable
        t = time.perf_counter()
        step_fn = method.train_step.lower(state, batch, step_rng).compile()
        # XLA counts the per-device SPMD program; the step costs that on every mesh device.
        flops_per_step = costs.flops(step_fn) * mesh.devices.size
        compile_time_s = time.perf_counter() - t
        t_last = time.perf_counter()
      state, step_metrics = step_fn(state, batch, step_rng)
      # Checked before anything reads the new state (an eval, a sync): a worker that
      # diverged in this very update enters neither. The fetch waits for the step.
      step_metrics = _fetch(step_metrics)
      method.check_step_metrics(step_metrics, step)
      now = time.perf_counter()
      durations.append(now - t_last)
      train_time_s += now - t_last
      t_last = now
      done = step + 1
      progress.update(1)
      if done % config.train.log_every_steps == 0 or done == num_steps:
        scalars = {f"train/{k}": float(np.mean(v)) for k, v in step_metrics.items()}
        writer.write_scalars(done, scalars)
        progress.set_postfix(loss=f"{scalars['train/loss']:.3f}")
      if done % eval_every == 0 or done == num_steps:
        t = time.perf_counter()  # the model at step `done`: what a run stopping now deploys
        eval_metrics = last_eval = _eval(method, method.deployable(state, done, batch),
                                         eval_batches)
        eval_time_s += time.perf_counter() - t
        t_last = time.perf_counter()
        tracker.update(eval_metrics, done, train_time_s, t_last - wall_start)
        history.append({"step": done, "train_time_s": train_time_s, **_scalars(eval_metrics)})
        writer.write_scalars(done, {f"eval/{k}": v for k, v in _scalars(eval_metrics).items()})
        logging.info("step %d eval %s", done, _scalars(eval_metrics))
      reached = stop_at_target and tracker.reached
      # DiLoCo's outer step: every H steps and at the last (the model evaluated above).
      state = jax.block_until_ready(method.after_step(state, done, batch,
                                                      last=done == num_steps or reached))
      now = time.perf_counter()
      train_time_s += now - t_last
      t_last = now
      meta = {"step": done, "train_time_s": train_time_s, "eval_time_s": eval_time_s,
              "history": history, "target": dataclasses.asdict(tracker),
              "method": method.host_state()}
      stop = preemption.requested(done)
      t = time.perf_counter()
      checkpointer.save(done, state, meta, force=done == num_steps or stop or reached)
      t_last = time.perf_counter()  # saving is not training: the next step's clock starts now
      checkpoint_time_s += t_last - t
      steps_done = done
      if stop and done < num_steps:
        message = (f"stopped at step {done} of {num_steps} on a preemption notice (SIGTERM); "
                   f"checkpoint saved in {workdir}/checkpoints. Rerun the same command to "
                   "resume.")
        logging.warning(message)
        raise Preempted(message)
      if reached:
        logging.info("target %s %s reached at step %d: stopping (train.stop_at_target)",
                     tracker.metric, tracker.value, done)
        break
  finally:  # also on preemption or divergence: finish pending saves, restore SIGTERM
    progress.close()
    checkpointer.close()
    writer.close()
    preemption.close()

  if last_eval is None:  # resumed after the last step: evaluate the restored state
    last_eval = _eval(method, method.deployable(state, steps_done, None), eval_batches)
  results = {
      "method": method.name,
      "config": config.to_dict(),
      "num_devices": jax.device_count(),
      "mesh": dict(mesh.shape),
      "data": data.info,
      "steps": steps_done,  # trained; fewer than step_budget when stopped at the target
      "step_budget": num_steps,
      "examples_per_step": method.examples_per_step,
      "wall_time_s": time.perf_counter() - wall_start,
      "train_time_s": train_time_s,
      "eval_time_s": eval_time_s,
      "compile_time_s": compile_time_s,
      "checkpoint_time_s": checkpoint_time_s,
      "flops_per_step": flops_per_step,
      "step_time_s": costs.median_step_time(durations, config.train.timing_warmup_steps),
      "final": _scalars(last_eval),
      "target": {"metric": tracker.metric, "value": tracker.value, "reached": tracker.reached,
                 "reached_step": tracker.reached_step, "reached_time_s": tracker.reached_time_s,
                 "reached_wall_time_s": tracker.reached_wall_time_s},
      "history": history,
      **method.final_results(state, last_eval, steps_done, train_batches, eval_batches),
  }
  if pool.info is not None:
    results["distill"] = pool.info
  results["cost"] = costs.summary(results, costs.param_bytes(results), config.cost.devices,
                                  config.cost.overlap,
                                  simulated=jax.devices()[0].platform == "cpu",
                                  device_step_time_s=config.cost.device_step_time_s)
  if config.task == "lm":
    results["tokens_per_step"] = method.examples_per_step * config.data.context
    results["tokens_per_s"] = results["tokens_per_step"] / results["step_time_s"]
  if is_main:
    with open(os.path.join(workdir, RESULTS_FILE), "w") as f:
      json.dump(_jsonable(results), f, indent=2)
  return Fit(results, state, method, data)


class Preempted(SystemExit):
  """Raised after the checkpoint that a preemption notice asked for; exit status 143."""

  def __init__(self, message: str):
    super().__init__(143)
    self.message = message

  def __str__(self) -> str:
    return self.message


class PreemptionWatch:
  """SIGTERM (a preemption notice) asks the loop to checkpoint and stop at the next step.

  With several processes, JAX's preemption sync point makes them agree on the step.
  """

  def __init__(self):
    self.notified = False
    self._previous = None
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._notify)

  def _notify(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: checkpointing at the end of this step, then stopping")
    self.notified = True

  def requested(self, step: int) -> bool:
    if jax.process_count() > 1:
      return bool(multihost_utils.reached_preemption_sync_point(step))
    return self.notified

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


def _fetch(tree):
  """`jax.device_get`, but gathers arrays split across processes (the ensemble's per-worker
  metrics), which no process can read alone. Every process must call it: it is a collective."""
  def get(x):
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
      return multihost_utils.process_allgather(x, tiled=True)
    return jax.device_get(x)

  return jax.tree.map(get, tree)


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
