"""`fit(config, workdir, pool=None)`: the one training loop for every method.

A method (`methods/base.py`) supplies the state, the compiled step, the batch layouts and
the eval reduction. This loop owns data, evaluation, checkpoints and metric files. It
knows nothing about distillation: `run.py` builds a pool first and hands it over.

`fit` runs in phases: `set_up` (everything a config can get wrong, before the workdir is
touched), `_restore`, `_streams`, `_train` (the steps), then `record.build`. The rooms
beside it: `eval_schedule` (when to evaluate), `replay` (a too-coarse crossing stepped
again finely), `progress` (clocks and history), `resume`
(what a rerun does), `record` (results.json), `checkpoint` (saves and stop requests).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from ensemble_jax import checkpoint as checkpoint_lib
from ensemble_jax import config_lib, costs, distributed, eval_schedule, noise_scale, optim
from ensemble_jax import record, replay, resume, validation, writers
from ensemble_jax import teacher as teacher_lib
from ensemble_jax import sharding as sharding_lib
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import data as data_lib
from ensemble_jax import methods as methods_lib
from ensemble_jax.data import pipeline
from ensemble_jax.distill import pool as pool_lib
from ensemble_jax.methods import Method
from ensemble_jax.methods import step as step_lib
from ensemble_jax.progress import Chrono, Progress
from ensemble_jax.sharding import make_mesh

CHECKPOINTS = "checkpoints"  # the workdir's orbax directory


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
  mesh: jax.sharding.Mesh
  data: data_lib.Data
  method: Method
  num_steps: int
  steps_per_epoch: int
  eval_every: int
  warm_start: str  # config.train.init_from's checkpoints (read only if init_from is set)
  is_main: bool
  # train.microbatches > 1: one model's abstract state, to count a microbatch's FLOPs
  one_model: Any = None
  # config.distill.teacher's finished run, found and checked (its weights not yet read)
  teacher: teacher_lib.Teacher | None = None


def set_up(config: ml_collections.ConfigDict, workdir: str) -> Setup:
  """Validates, loads the data and builds the method; only then creates the workdir, so a
  config that cannot work fails here and leaves no trace."""
  resume.check_workdir_is_a_path(workdir)
  s = _assemble(config, workdir)
  if config.train.init_from and not os.path.isdir(s.warm_start):
    raise config_lib.ConfigError(f"config.train.init_from={config.train.init_from!r}: no "
                                 f"checkpoints in {s.warm_start}; train that run first.")
  resume.prepare_workdir(workdir)  # only now: a config that cannot work leaves no trace
  return s


def check(config: ml_collections.ConfigDict) -> None:
  """Everything `set_up` checks before it writes (the config, the mesh, the data found and
  read, the method built on them), nothing written: a study checks each of its points
  with it before anything trains. Raises ConfigError or the data's errors."""
  _assemble(config)


def fit_layout(config: ml_collections.ConfigDict) -> str | None:
  """Joins the multi-process runtime (if configured), then fits an ensemble's or DiLoCo's
  default mesh to its workers on the devices present (`methods.fit_workers_to_devices`,
  in place); the line saying what it chose, logged, or None."""
  distributed.maybe_initialize(config.distributed)
  layout = methods_lib.fit_workers_to_devices(config, jax.device_count())
  if layout:
    logging.info("%s", layout)
  return layout


def _assemble(config: ml_collections.ConfigDict, workdir: str | None = None) -> Setup:
  """The run's mesh, data and method, checked against the config (and against the
  checkpoints in `workdir`, if given); nothing written."""
  validation.validate(config)
  fit_layout(config)
  mesh = make_mesh(config.mesh)
  if workdir is not None:  # before any data: another config's checkpoints are an error
    saved = checkpoint_lib.latest_record(os.path.join(workdir, CHECKPOINTS))
    resume.changed_fields(saved, config, workdir)
  data = data_lib.load(config)
  validation.check_batch_fits(config, len(data.train))
  num_steps = methods_lib.num_train_steps(config, len(data.train))
  steps_per_epoch = config_lib.steps_per_epoch(config, len(data.train))
  built = methods_lib.build(config, mesh, num_classes=data.num_classes,
                            init_input=data.init_input, num_steps=num_steps,
                            steps_per_epoch=steps_per_epoch)
  method = built.method
  method.cluster_mesh(config.cost.devices)  # the cluster the cost report models must fit
  one_model = None
  if config.train.microbatches > 1:
    one_model = jax.eval_shape(functools.partial(
        step_lib.create_train_state, built.model, built.tx, init_input=data.init_input,
        sparse=config.model.sparsity > 0), jax.random.key(0))
  teacher = teacher_lib.find(config, CHECKPOINTS) if config.distill.teacher else None
  return Setup(mesh, data, method, num_steps, steps_per_epoch,
               config.eval.every_steps or steps_per_epoch,
               os.path.join(config.train.init_from, "checkpoints"), jax.process_index() == 0,
               one_model, teacher)


def _first_batch(config: ml_collections.ConfigDict, s: Setup, synthetic: bool = False):
  """The run's first train batch (without a pool); `synthetic`: as a distilled set's
  arrives, float images each marked `synthetic` (the step augments them: `step.augmented`)."""
  batches = pipeline.TrainBatches(s.data.train, s.method.sampler(len(s.data.train), config.seed),
                                  s.data.train_transform, s.method.train_layout, config.seed)
  local = batches.local_batch(0)
  if synthetic:
    local = {**local, "image": local["image"].astype(np.float32),
             "synthetic": np.ones(len(local["label"]), np.float32)}
  return pipeline.to_global(local, batches.layout)


def compile_step(config: ml_collections.ConfigDict) -> jax.stages.Compiled:
  """`config`'s train step compiled as `fit` compiles it, on an abstract state and the
  first train batch, without training or writing anything (the sweeps fingerprint it)."""
  s = _assemble(config)
  init_rng, step_rng = _rngs(config)
  state = jax.eval_shape(s.method.init, init_rng)
  batch = _first_batch(config, s)
  return s.method.train_step.lower(*s.method.step_args(state, batch, step_rng)).compile()


def step_runner(config: ml_collections.ConfigDict, synthetic: bool = False):
  """`config`'s train step compiled as `fit` compiles it, and a function taking one step on
  the first train batch (`_first_batch`) and waiting for it: the sweeps time two programs
  side by side with it (`cost_vs_time.augment_factor`). -> (compiled step, function)."""
  s = _assemble(config)
  init_rng, step_rng = _rngs(config)
  state = s.method.init(init_rng)
  batch = _first_batch(config, s, synthetic)
  step = s.method.train_step.lower(*s.method.step_args(state, batch, step_rng)).compile()

  def run() -> None:
    nonlocal state
    state = jax.block_until_ready(step(*s.method.step_args(state, batch, step_rng)))[0]
  return step, run


def fit(config: ml_collections.ConfigDict, workdir: str, *,
        pool: pool_lib.Pool | None = None, setup: Setup | None = None) -> Fit:
  """Trains `config.method` on `config.data`; writes checkpoints, metrics and results.json.

  `pool`: what the workers read (a distilled pool from `run.py`); None: the method's own
  sampler. `setup`: `set_up(config, workdir)`, when the caller needed it first. Hands back
  the final state too (proxies for distill pools).
  """
  s = setup or set_up(config, workdir)
  state = s.method.init(_rngs(config)[0])
  checkpointer = checkpoint_lib.Checkpointer(
      os.path.join(workdir, CHECKPOINTS), config.checkpoint.every_steps,
      config.checkpoint.max_to_keep, config.checkpoint.every_minutes)
  finished = resume.finished_results(config, workdir, s.num_steps)
  state, meta = _restore(config, workdir, s, state, checkpointer)
  if finished is not None:  # its results stand; the state is the final checkpoint's
    checkpointer.close()
    return Fit(finished, state, s.method, s.data)
  if s.teacher is not None:  # frozen, replicated: an input of every step
    s.method.teacher = teacher_lib.load(s.teacher, s.method.abstract_teacher())
  pool = _pool_or_own(config, s, pool)
  train_batches, eval_batches = _streams(config, s, pool)
  comm = record.communication_of(config, s, train_batches, eval_batches)  # before training
  if config.model.sparsity > 0 and meta["step"] == 0:  # SNIP on the first batch, fixed after
    state = s.method.prune(state, pipeline.to_global(train_batches.local_batch(0),
                                                     train_batches.layout),
                           config.model.sparsity)
  writer = writers.MetricWriter(workdir, enabled=s.is_main, start_step=int(meta["step"]))
  progress = Progress(int(meta["step"]), eval_schedule.trackers(meta), meta["history"],
                      Chrono(meta["train_time_s"], meta["eval_time_s"]), record.as_json(config),
                      meta.get("config_changes", []))
  if config.train.noise_scale:
    progress.noise = noise_scale.NoiseScaleTracker.from_record(meta.get("noise_scale"),
                                                   config.train.noise_scale_ema)
  writer.write_hparams(config.to_dict(), [f"eval/{config.eval.target_metric}", "train/loss"])
  state = _train(config, workdir, s, state, train_batches, eval_batches, progress,
                 checkpointer, writer)
  if progress.last_eval is None:  # resumed after the last step: evaluate the restored state
    progress.last_eval = _eval(s.method, s.method.deployable(state, progress.step, None),
                               eval_batches)
  results = record.build(config, s, pool, state, progress, train_batches, eval_batches, comm)
  if config.eval.score_rest_at_end:
    results["rest"] = _score_rest(config, s, pool, state, progress.step)
  if s.is_main:
    record.write(workdir, results)
  return Fit(results, state, s.method, s.data)


def _restore(config, workdir: str, s: Setup, state, checkpointer) -> tuple[Any, dict]:
  """The state to train from and the run's record: the workdir's latest checkpoint, else
  `state` (with config.train.init_from's weights if set) and a fresh record."""
  state, meta = checkpointer.restore(state)
  meta = meta or Progress.fresh_record(config.eval)
  changes = resume.changed_fields(meta, config, workdir)
  if changes:  # allowed ones, kept in the record and results.json
    logging.info("Resuming at step %d with changed fields: %s", meta["step"],
                 resume.listed(changes))
    meta["config_changes"] = meta.get("config_changes", []) + [
        {"step": meta["step"], "changes": {k: list(v) for k, v in changes.items()}}]
  s.method.load_host_state(meta.get("method", {}))
  if s.is_main:
    record.write_parameter_table(workdir, jax.eval_shape(s.method.trained_params, state))
  if meta["step"]:
    logging.info("Resumed from step %d in %s", meta["step"], workdir)
  else:
    logging.info("no checkpoint in %s: starting from step 0", workdir)
  if not meta["step"] and config.train.init_from:  # weights and BatchNorm statistics only
    source = checkpoint_lib.Checkpointer(s.warm_start, 0, 1)
    warm, _ = source.restore(state)
    source.close()
    state = state.replace(params=warm.params, batch_stats=warm.batch_stats)
    logging.info("Initialised from the weights in %s", s.warm_start)
  return state, meta


def _pool_or_own(config, s: Setup, pool: pool_lib.Pool | None) -> pool_lib.Pool:
  """`pool`, or without a distilled sequence the method's own sampler."""
  return pool if pool is not None else pool_lib.Pool(
      s.method.sampler(len(s.data.train), config.seed), None)


def _streams(config, s: Setup, pool: pool_lib.Pool):
  """(train batches, eval batches): what each worker reads, in the method's layouts."""
  source = s.data.train if pool.source is None else pool.source
  sampler = (pool.sampler.for_run(s.num_steps)  # its switch: a fraction of this run
             if isinstance(pool.sampler, pool_lib.StagedSampler) else pool.sampler)
  train_batches = pipeline.TrainBatches(source, sampler, s.data.train_transform,
                                        s.method.train_layout, config.seed)
  eval_batches = pipeline.EvalBatches(
      s.data.eval, s.data.eval_transform, s.method.eval_layout, config.eval.num_examples,
      None if pool.eval_route is None else {"route": pool.eval_route})
  return train_batches, eval_batches


def _train(config, workdir: str, s: Setup, state, train_batches, eval_batches, p: Progress,
           checkpointer, writer):
  """Steps from `p.step` until the run ends (`_end_reason`) or a stop is requested.

  A step's phases run in an order the methods rely on: the step, its metrics checked (a
  diverged worker is excluded before any eval or sync reads it), log, eval of the
  deployable model, target tracking, `after_step` (DiLoCo's outer step, after the eval of
  its step), checkpoint, stop. Closes the checkpointer and the writer; returns the state.
  """
  method, num_steps, step_rng = s.method, s.num_steps, _rngs(config)[1]
  end_step = p.step if _ended_before(config, p) else num_steps
  evaluate = functools.partial(_evaluate, method, eval_batches, p, writer)
  batches = train_batches.iterate(p.step, end_step, config.data.prefetch,
                                  config.data.num_threads)
  next_eval = _next_eval(config, s, p)
  bar = writers.progress_bar(p.step, num_steps, s.is_main)
  watch, own_watch = checkpoint_lib.PreemptionWatch.current()
  # Steps-to-target and ladder runs keep the state at the last eval that left a target
  # unmet, to replay a crossing found too coarsely (`replay.refine`); from the start.
  refine = config.eval.target_resolution > 0 and (config.train.stop_at_target
                                                  or len(p.trackers) > 1)
  snapshot = replay.Snapshot.after_eval(state, p, method) if refine else None
  try:
    # Compiled before the first step, also when none remains: its FLOPs go in the results.
    first = pipeline.to_global(train_batches.local_batch(0), train_batches.layout)
    take_step = functools.partial(_take_step, _compile(config, s, state, first, step_rng, p),
                                  step_rng, method, p)
    for step in range(p.step, end_step):
      batch = next(batches)
      state, step_metrics = take_step(state, batch, step)
      done = step + 1
      bar.update(1)
      if done % config.train.log_every_steps == 0 or done == num_steps:
        _log(config, s, writer, bar, done, step_metrics, p)
      evaluated = done >= next_eval or done == num_steps
      if evaluated:
        evaluate(state, batch, done)
        if snapshot is not None and eval_schedule.too_coarse_at(p.trackers, done, config.eval):
          checkpointer.discard_after(snapshot.step)  # the replay rewrites what followed
          state, batch, done = replay.refine(config, method, snapshot, train_batches, p,
                                             take_step, evaluate, config.train.stop_at_target)
        next_eval = _next_eval(config, s, p)
      end = _end_reason(config, done, num_steps, evaluated, p)
      # DiLoCo's outer step: every H steps and at the last (the model evaluated above).
      state = jax.block_until_ready(method.after_step(state, done, batch,
                                                      last=end is not None))
      p.chrono.lap()
      p.step = done
      if refine:
        snapshot = replay.Snapshot.after_eval(state, p, method) or snapshot
      stop = watch.requested(done)
      with p.chrono.paused("checkpoint"):  # saving is not training
        checkpointer.save(done, state, p.record(method), force=end is not None or stop)
      if stop and end is None:
        raise watch.stop(done, num_steps, workdir)
      if end is not None:
        logging.info("stopping at step %d: %s", done, _END_REASONS[end])
        break
  finally:  # also on preemption or divergence: finish pending saves, restore the signals
    bar.close()
    checkpointer.close()
    writer.close()
    if own_watch:
      watch.close()
  return state


_END_REASONS = {
    "budget": "the step budget is spent",
    "target": "the target (every rung) is reached (train.stop_at_target)",
    "stop_at_step": "the first eval at or past train.stop_at_step",
}


def _end_reason(config, done: int, num_steps: int, evaluated: bool, p: Progress) -> str | None:
  """Why the run ends after step `done` (a key of `_END_REASONS`), or None: steps-to-target
  runs stop at the first eval that reaches the target (every rung); with train.stop_at_step
  any run stops at its first eval at or past that step (its evals the full run's up to
  there, its schedule the budget's)."""
  if config.train.stop_at_target and p.all_reached():
    return "target"
  if done == num_steps:
    return "budget"
  if evaluated and config.train.stop_at_step and done >= config.train.stop_at_step:
    return "stop_at_step"
  return None


def _ended_before(config, p: Progress) -> bool:
  """Whether a restored run had already ended (at its target or its stop_at_step eval)."""
  last_eval = p.history[-1]["step"] if p.history else 0
  at_stop_step = config.train.stop_at_step and last_eval == p.step >= config.train.stop_at_step
  return bool(config.train.stop_at_target and p.all_reached() or at_stop_step)


def _rngs(config) -> tuple[jax.Array, jax.Array]:
  """(init key, step key) of the run, from config.seed alone."""
  return tuple(jax.random.split(jax.random.key(config.seed)))


def _take_step(step_fn, step_rng, method: Method, p: Progress, state, batch, step: int):
  """One step -> (state, metrics on the host). The metrics are checked before anything
  reads the new state (an eval, a sync): a worker that diverged in this very update enters
  neither. The fetch waits for the step, so the lap times it; the noise scale reads it."""
  state, step_metrics = step_fn(*method.step_args(state, batch, step_rng))
  step_metrics = _fetch(step_metrics)
  method.check_step_metrics(step_metrics, step)
  p.durations.append(p.chrono.lap())
  if p.noise is not None:
    p.noise.update(step_metrics)
  return state, step_metrics


def _next_eval(config, s: Setup, p: Progress) -> int:
  """The step of the next eval, from the last one (or the start) and the history."""
  last = p.history[-1]["step"] if p.history else 0
  return eval_schedule.next_eval_step(last, p.history, p.tracker.metric,
                                      eval_schedule.unreached(p.trackers), config.eval,
                                      s.eval_every)


def _compile(config, s: Setup, state, batch, step_rng, p: Progress):
  """The step compiled once (timed apart), XLA's FLOPs read off the same executable."""
  method, k = s.method, config.train.microbatches
  with p.chrono.paused("compile"):
    step_fn = method.train_step.lower(*method.step_args(state, batch, step_rng)).compile()
    # XLA counts the per-device SPMD program; the step costs that on every mesh device.
    p.flops_per_step = costs.flops(step_fn) * s.mesh.devices.size
    if k > 1:  # XLA counts the microbatch loop's body once; it runs k times per model
      lead = len(method.train_layout.leading_shape)
      rows = method.train_layout.leading_shape[-1] // k
      mb = {name: jax.ShapeDtypeStruct((rows,) + x.shape[lead:], x.dtype)
            for name, x in batch.items()}
      teacher = None if s.teacher is None else step_lib.model_variables(s.one_model)
      p.flops_per_step += (k - 1) * method.num_workers * step_lib.microbatch_flops(
          s.one_model, mb, method.step_config, teacher)
  return step_fn


def _log(config, s: Setup, writer, bar, step: int, step_metrics: dict, p: Progress) -> None:
  """The step's metrics (means over workers), the learning rate and the recent speed."""
  since = p.durations[-min(config.train.log_every_steps, len(p.durations)):]
  schedule = optim.create_schedule(config.optim, config.train.batch_size, s.num_steps,
                                   s.steps_per_epoch)  # the optimizer's
  scalars = {f"train/{k}": float(np.mean(v)) for k, v in step_metrics.items()}
  scalars |= {"train/learning_rate": float(schedule(step - 1)),
              "train/steps_per_s": len(since) / max(sum(since), 1e-9)}
  if p.noise is not None:
    scalars["train/b_simple"] = p.noise.ema.estimates()["b_simple"]
  writer.write_scalars(step, scalars)
  bar.set_postfix(loss=f"{scalars['train/loss']:.3f}")


def _evaluate(method: Method, eval_batches, p: Progress, writer, state, batch,
              step: int) -> None:
  """Scores the model at `step` (what a run stopping now deploys); tracks the target and
  reads the noise scale at it."""
  if p.noise is not None:
    p.noise.read(step)
  with p.chrono.paused("eval"):
    p.last_eval = _eval(method, method.deployable(state, step, batch), eval_batches)
  scalars = record.scalars(p.last_eval)
  p.track(p.last_eval, step)
  p.history.append({"step": step, "train_time_s": p.chrono.train_s, **scalars})
  writer.write_scalars(step, {f"eval/{k}": v for k, v in scalars.items()})  # logs it once


def _score_rest(config, s: Setup, pool: pool_lib.Pool, state, step: int) -> dict:
  """The final model's metrics on the eval split's examples past eval.num_examples, which
  no evaluation, stop or tuning choice saw (untimed: no part of the run's cost)."""
  first = config.eval.num_examples
  if not first or first >= len(s.data.eval):
    return {"num_examples": 0}
  route = None if pool.eval_route is None else {"route": pool.eval_route}
  if route is not None and len(pool.eval_route) < len(s.data.eval):
    raise config_lib.ConfigError(
        "eval.score_rest_at_end: the pool routes only the scored eval examples; build it "
        "with eval.score_rest_at_end set (distill.embedding='pca' pools route the rest)")
  rest = pipeline.EvalBatches(s.data.eval, s.data.eval_transform, s.method.eval_layout,
                              per_example=route, first=first)
  metrics = _eval(s.method, s.method.deployable(state, step, None), rest)
  return {"first": first, "num_examples": rest.num_examples, **record.scalars(metrics)}


def evaluate(config: ml_collections.ConfigDict, s: Setup, state, step: int) -> dict:
  """`state` at `step` scored as the loop scores it, outside a run (evaluate.py; no pool)."""
  eval_batches = _streams(config, s, _pool_or_own(config, s, None))[1]
  return _eval(s.method, s.method.deployable(state, step, None), eval_batches)


def _eval(method: Method, state, eval_batches) -> dict:
  sums = None
  for batch in eval_batches:
    sums = metrics_lib.add_sums(sums, method.eval_step(state, batch))
  return method.finalize_eval(sums)


def read_communication(config: ml_collections.ConfigDict, s: Setup,
                       pool: pool_lib.Pool | None) -> costs.Communication:
  """The communication a run of `config` on `pool` reads before training, read without
  training (for a finished run priced by the legacy model, labelled so)."""
  return record.communication_of(config, s, *_streams(config, s, _pool_or_own(config, s, pool)))


def _fetch(tree):
  """`jax.device_get`, but gathers arrays split across processes (the ensemble's per-worker
  metrics), which no process can read alone. Every process must call it: it is a collective."""
  def get(x):
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
      return multihost_utils.process_allgather(x, tiled=True)
    return jax.device_get(x)

  return jax.tree.map(get, tree)


