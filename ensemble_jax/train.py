"""`fit(config, workdir, pool=None)`: the one training loop for every method.

A method (the interface: `ensemble_jax/methods/base.py`) supplies the state, the compiled
step, the batch layout and the eval reduction; this loop owns data, timing, evaluation,
target tracking, checkpoints, metric files and `results.json`. It knows nothing about
distillation: `ensemble_jax/run.py` builds a distilled pool first and hands it over.

`fit` runs in phases: `set_up` (everything a config can get wrong, before the workdir is
touched), `_restore` (the latest checkpoint, or a fresh or warm-started state), `_streams`
(train and eval batches), `_train` (the steps), `_results` (results.json). Time is kept
by one `Chrono`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import os
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from clu import parameter_overview
from jax.experimental import multihost_utils

from ensemble_jax import checkpoint as checkpoint_lib
from ensemble_jax import communication, config_lib, costs, distributed, noise_scale, optim
from ensemble_jax import writers
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import data as data_lib
from ensemble_jax import methods as methods_lib
from ensemble_jax.data import pipeline, samplers
from ensemble_jax.methods import Method
from ensemble_jax.methods import step as step_lib
from ensemble_jax.sharding import make_mesh

RESULTS_FILE = "results.json"
CHECKPOINTS = "checkpoints"  # the workdir's orbax directory


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


def fine_interval(step: int, eval_config) -> int:
  """The steps between evals near the target after one at `step`: `target_resolution` x
  `step`, at least 1, so a crossing is known to that fraction of its step."""
  return max(1, int(eval_config.target_resolution * step))


def too_coarse(tracker: TargetTracker, eval_config) -> bool:
  """Whether the crossing just found is known less finely than `target_resolution` asks
  (the metric jumped past the near-target window between two regular evals)."""
  return (eval_config.target_resolution > 0 and tracker.reached
          and tracker.resolution_steps > fine_interval(tracker.reached_step, eval_config))


def near_target(history: list[dict], metric: str, value: float, eval_config,
                every: int) -> bool:
  """Whether some eval so far came within `near_target_margin` (a fraction of the target)
  of the target, or the last two evals' rate reaches it within `near_target_lookahead`
  intervals of `every` steps."""
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


def next_eval_step(step: int, history: list[dict], metric: str, value: float, eval_config,
                   every: int) -> int:
  """The step of the eval after one at `step`: the next multiple of `every`, or, near the
  target (`near_target`), `target_resolution` x `step` steps later (at least 1), so that
  the step the target is first reached at is known to that fraction of itself."""
  coarse = (step // every + 1) * every
  if eval_config.target_resolution <= 0 or not near_target(history, metric, value,
                                                           eval_config, every):
    return coarse
  return min(coarse, step + fine_interval(step, eval_config))


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
  tracker: TargetTracker
  history: list[dict]  # one row of eval scalars per eval
  chrono: Chrono
  config: dict  # this session's config (JSON), kept with every checkpoint
  config_changes: list[dict]  # what each resumed session changed: {"step", "changes"}
  durations: list[float] = dataclasses.field(default_factory=list)  # this session's steps
  flops_per_step: float = float("nan")
  last_eval: dict | None = None
  noise: NoiseScaleTracker | None = None  # config.train.noise_scale

  def record(self, method: Method) -> dict:
    """The checkpoint's JSON record: what a resumed run needs besides the state."""
    record = {"step": self.step, "train_time_s": self.chrono.train_s,
              "eval_time_s": self.chrono.paused_s["eval"], "history": self.history,
              "target": dataclasses.asdict(self.tracker), "method": method.host_state(),
              "config": self.config, "config_changes": self.config_changes}
    if self.noise is not None:
      record["noise_scale"] = self.noise.record()
    return record


@dataclasses.dataclass
class NoiseScaleTracker:
  """The gradient noise scale over training: each step's estimates (the step's metrics
  `noise_grad_sq`, `noise_trace`; averaged over workers) into moving averages, and
  B_simple read at every eval step (`history`)."""
  ema: noise_scale.NoiseScaleEMA
  history: list[dict] = dataclasses.field(default_factory=list)

  @classmethod
  def from_record(cls, record: dict | None, decay: float) -> "NoiseScaleTracker":
    if not record:
      return cls(noise_scale.NoiseScaleEMA(decay))
    return cls(noise_scale.NoiseScaleEMA(**record["ema"]), list(record["history"]))

  def record(self) -> dict:
    return {"ema": self.ema.to_dict(), "history": self.history}

  def update(self, step_metrics: dict) -> None:
    self.ema.update(np.mean(step_metrics["noise_grad_sq"]),
                    np.mean(step_metrics["noise_trace"]))

  def read(self, step: int) -> None:
    self.history.append({"step": step, **self.ema.estimates()})

  def results(self, target: TargetTracker) -> dict:
    """results.json `noise_scale`: the final averages, B_simple at the step the target was
    reached (None if it was not), and its history."""
    at = [h for h in self.history if h["step"] == target.reached_step]
    return {**self.ema.estimates(), "ema_decay": self.ema.decay, "steps": self.ema.steps,
            "b_simple_at_target": at[0]["b_simple"] if at else None,
            "history": self.history}


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


def set_up(config: ml_collections.ConfigDict, workdir: str) -> Setup:
  """Validates, loads the data and builds the method; only then creates the workdir, so a
  config that cannot work fails here and leaves no trace."""
  _check_workdir_is_a_path(workdir)
  s = _assemble(config, workdir)
  if config.train.init_from and not os.path.isdir(s.warm_start):
    raise config_lib.ConfigError(f"config.train.init_from={config.train.init_from!r}: no "
                                 f"checkpoints in {s.warm_start}; train that run first.")
  _prepare_workdir(workdir)  # only now: a config that cannot work leaves no trace
  return s


def _assemble(config: ml_collections.ConfigDict, workdir: str | None = None) -> Setup:
  """The run's mesh, data and method, checked against the config (and against the
  checkpoints in `workdir`, if given); nothing written."""
  config_lib.validate(config)
  distributed.maybe_initialize(config.distributed)
  mesh = make_mesh(config.mesh)
  if workdir is not None:  # before any data: another config's checkpoints are an error
    _resume_changes(checkpoint_lib.latest_record(os.path.join(workdir, CHECKPOINTS)), config,
                    workdir)
  data = data_lib.load(config)
  config_lib.check_batch_fits(config, len(data.train))
  num_steps = config_lib.num_train_steps(config, len(data.train))
  steps_per_epoch = config_lib.steps_per_epoch(config, len(data.train))
  model, tx = methods_lib.model_and_optimizer(config, data.num_classes, num_steps,
                                              steps_per_epoch)
  method = methods_lib.create_method(config, model, tx, mesh, data.init_input)
  method.cluster_mesh(config.cost.devices)  # the cluster the cost report models must fit
  one_model = None
  if config.train.microbatches > 1:
    one_model = jax.eval_shape(functools.partial(
        step_lib.create_train_state, model, tx, init_input=data.init_input,
        sparse=config.model.sparsity > 0), jax.random.key(0))
  return Setup(mesh, data, method, num_steps, steps_per_epoch,
               config.eval.every_steps or steps_per_epoch,
               os.path.join(config.train.init_from, "checkpoints"), jax.process_index() == 0,
               one_model)


def compile_step(config: ml_collections.ConfigDict) -> jax.stages.Compiled:
  """`config`'s train step compiled as `fit` compiles it, on an abstract state and the
  first train batch, without training or writing anything (the sweeps fingerprint it)."""
  s = _assemble(config)
  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state = jax.eval_shape(s.method.init, init_rng)
  batches = pipeline.TrainBatches(s.data.train, s.method.sampler(len(s.data.train), config.seed),
                                  s.data.train_transform, s.method.train_layout, config.seed)
  batch = pipeline.to_global(batches.local_batch(0), batches.layout)
  return s.method.train_step.lower(state, batch, step_rng).compile()


def _check_workdir_is_a_path(workdir: str) -> None:
  """results.json and metrics.jsonl are written with plain file I/O: a URL would become a
  local directory named after it (`./gs:/bucket/...`), found out only at the end."""
  if "://" in workdir:
    raise config_lib.ConfigError(
        f"--workdir={workdir!r}: remote workdirs are not supported; use a local path or a "
        "mounted bucket (e.g. gcsfuse's /mnt/bucket/runs).")


def _prepare_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise config_lib.ConfigError(f"--workdir={workdir!r} cannot be created ({e}); choose "
                                 "another.") from None
  if not os.access(workdir, os.W_OK):
    raise config_lib.ConfigError(f"--workdir={workdir!r} is not writable; choose another.")


def fit(config: ml_collections.ConfigDict, workdir: str, *,
        pool: samplers.Pool | None = None, setup: Setup | None = None) -> Fit:
  """Trains `config.method` on `config.data`; writes checkpoints, metrics and results.json.

  `pool`: what the workers read (a distilled pool from `run.py`); None: the method's own
  sampler. `setup`: `set_up(config, workdir)`, when the caller needed it first. Hands back
  the final state too (proxies for distill pools).
  """
  s = setup or set_up(config, workdir)
  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state = s.method.init(init_rng)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, CHECKPOINTS),
                                             config.checkpoint.every_steps,
                                             config.checkpoint.max_to_keep,
                                             config.checkpoint.every_minutes)
  finished = finished_results(config, workdir)
  state, meta = _restore(config, workdir, s, state, checkpointer)
  if finished is None and meta["step"] >= s.num_steps:  # a longer budget field, same steps
    finished = _read_results(workdir, steps=meta["step"])
  if finished is not None:  # its results stand; the state is the final checkpoint's
    checkpointer.close()
    return Fit(finished, state, s.method, s.data)
  pool = _pool_or_own(config, s, pool)
  train_batches, eval_batches = _streams(config, s, pool)
  if config.model.sparsity > 0 and meta["step"] == 0:  # SNIP on the first batch, fixed after
    state = s.method.prune(state, pipeline.to_global(train_batches.local_batch(0),
                                                     train_batches.layout),
                           config.model.sparsity)
  writer = writers.MetricWriter(workdir, enabled=s.is_main, start_step=int(meta["step"]))
  progress = Progress(int(meta["step"]), TargetTracker(**meta["target"]), meta["history"],
                      Chrono(meta["train_time_s"], meta["eval_time_s"]), _as_json(config),
                      meta.get("config_changes", []))
  if config.train.noise_scale:
    progress.noise = NoiseScaleTracker.from_record(meta.get("noise_scale"),
                                                   config.train.noise_scale_ema)
  state = _train(config, workdir, s, state, step_rng, train_batches, eval_batches, progress,
                 checkpointer, writer)
  results = _results(config, s, pool, state, progress, train_batches, eval_batches)
  if s.is_main:  # written whole or not at all: a rerun reads it to know the run finished
    path = os.path.join(workdir, RESULTS_FILE)
    with open(path + ".tmp", "w") as f:
      json.dump(_jsonable(results), f, indent=2)
    os.replace(path + ".tmp", path)
  return Fit(results, state, s.method, s.data)


def finished_results(config: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """The workdir's results.json if `config` would train that run no further (the same
  command run again), else None. Never rewrites it; reads no data, so it is quick.

  Raises ConfigError if the results are of a run `config` cannot continue (see
  `_resume_changes`). A longer duration, or stop_at_target turned off before the budget
  was spent, continues the run from its checkpoints instead.
  """
  _check_workdir_is_a_path(workdir)
  config_lib.validate(config)
  results = _read_results(workdir)
  if results is None:
    return None
  changes = _resume_changes({"step": results.get("steps"), "config": results.get("config")},
                            config, workdir)
  if any(field in config_lib.EXTENSIBLE for field in changes):
    return None  # extended: train on
  steps = results.get("steps", 0)
  limit = results.get("step_budget", steps)
  if config.train.stop_at_step:  # stopped early on purpose: as far as this config goes
    limit = min(limit, config.train.stop_at_step)
  spent = steps >= limit
  if not (spent or config.train.stop_at_target and results.get("target", {}).get("reached")):
    return None  # stopped at its target, and this config does not stop there: train on
  if changes:
    logging.info("%s is finished; changes that alter nothing trained are ignored: %s",
                 workdir, _listed(changes))
  return results


def _read_results(workdir: str, steps: int | None = None) -> dict | None:
  """The workdir's results.json (only if it covers `steps` steps, when given), else None."""
  path = os.path.join(workdir, RESULTS_FILE)
  try:
    with open(path) as f:
      results = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:  # unreadable: the checkpoints decide what happens
    logging.warning("%s cannot be read (%s); resuming from the checkpoints", path, e)
    return None
  return results if steps is None or results.get("steps") == steps else None


def _resume_changes(record: dict | None, config, workdir: str) -> dict[str, tuple]:
  """{field: (before, now)}: what `config` changes in the run `record` (a checkpoint's record
  or results.json) describes; each a change `config_lib.may_change_on_resume` allows.

  Raises ConfigError listing the others: continuing would make one run of two configs, and
  results.json would claim the new one for all of it.
  """
  if not record or not isinstance(record.get("config"), dict):
    return {}  # a fresh workdir, or checkpoints from before configs were kept with them
  changes = config_lib.config_changes(record["config"], config)
  blocked = {k: v for k, v in changes.items() if not config_lib.may_change_on_resume(k, *v)}
  if blocked:
    raise config_lib.ConfigError(
        f"--workdir={workdir!r} holds a run trained {record['step']} steps with other values: "
        f"{_listed(blocked)}. Continue it with its own values, or give the new config a new "
        "--workdir. (A rerun may change logging, eval frequency and batch size, "
        "stop_at_target, checkpointing, cost.*, the mesh, sharding and data location, and may "
        "lengthen train.num_steps, train.num_epochs or method.steps_per_worker to extend the "
        "run.)")
  return changes


def _listed(changes: dict[str, tuple]) -> str:
  return ", ".join(f"{field} {before!r} -> {now!r}" for field, (before, now) in changes.items())


PARAMETERS_FILE = "parameters.txt"  # the parameter table, in every run's workdir


def _write_parameter_table(workdir: str, params) -> None:
  """The per-parameter table goes to the workdir; the log gets the one line with its total."""
  path = os.path.join(workdir, PARAMETERS_FILE)
  table = parameter_overview.get_parameter_overview(params, include_stats=False)
  if not os.path.exists(path):  # a finished run's workdir stays as it was
    with open(path, "w") as f:
      f.write(table + "\n")
  logging.info("parameters: %s (per-parameter table: %s)",
               f"{sum(math.prod(x.shape) for x in jax.tree.leaves(params)):,}", path)


def _restore(config, workdir: str, s: Setup, state, checkpointer) -> tuple[Any, dict]:
  """The state to train from and the run's record: the workdir's latest checkpoint, else
  `state` (with config.train.init_from's weights if set) and a fresh record."""
  state, meta = checkpointer.restore(state)
  meta = meta or {"step": 0, "train_time_s": 0.0, "eval_time_s": 0.0, "history": [],
                  "target": dataclasses.asdict(TargetTracker(config.eval.target_metric,
                                                             config.eval.target_value))}
  changes = _resume_changes(meta, config, workdir)
  if changes:  # allowed ones, kept in the record and results.json
    logging.info("Resuming at step %d with changed fields: %s", meta["step"], _listed(changes))
    meta["config_changes"] = meta.get("config_changes", []) + [
        {"step": meta["step"], "changes": {k: list(v) for k, v in changes.items()}}]
  s.method.load_host_state(meta.get("method", {}))
  if s.is_main:
    _write_parameter_table(workdir, jax.eval_shape(s.method.trained_params, state))
  if meta["step"]:
    logging.info("Resumed from step %d in %s", meta["step"], workdir)
  else:
    logging.info("no checkpoint in %s: starting from step 0", workdir)
  if not meta["step"] and config.train.init_from:  # weights (and BatchNorm statistics) only; a fresh optimizer
    source = checkpoint_lib.Checkpointer(s.warm_start, 0, 1)
    warm, _ = source.restore(state)
    source.close()
    state = state.replace(params=warm.params, batch_stats=warm.batch_stats)
    logging.info("Initialised from the weights in %s", s.warm_start)
  return state, meta


def _pool_or_own(config, s: Setup, pool: samplers.Pool | None) -> samplers.Pool:
  """`pool`, or without a distilled sequence the method's own sampler."""
  if pool is None:
    return samplers.Pool(s.method.sampler(len(s.data.train), config.seed), None)
  return pool


def _streams(config, s: Setup, pool: samplers.Pool):
  """(train batches, eval batches): what each worker reads, in the method's layouts."""
  train_batches = pipeline.TrainBatches(s.data.train, pool.sampler, s.data.train_transform,
                                        s.method.train_layout, config.seed)
  eval_batches = pipeline.EvalBatches(
      s.data.eval, s.data.eval_transform, s.method.eval_layout, config.eval.num_examples,
      None if pool.eval_route is None else {"route": pool.eval_route})
  return train_batches, eval_batches


def _train(config, workdir: str, s: Setup, state, step_rng, train_batches, eval_batches,
           p: Progress, checkpointer, writer):
  """Steps from `p.step` to the budget, the target (train.stop_at_target), train.stop_at_step
  or a preemption notice; closes the checkpointer and the writer. Returns the final state.

  A step's phases run in an order the methods rely on: the step, its metrics checked (a
  diverged worker is excluded before any eval or sync reads it), log, eval of the
  deployable model, target tracking, `after_step` (DiLoCo's outer step, after the eval of
  its step), checkpoint, preemption, stop at the target.
  """
  method, num_steps = s.method, s.num_steps
  batches = train_batches.iterate(p.step, num_steps, config.data.prefetch,
                                  config.data.num_threads)
  stop_at_target = config.train.stop_at_target
  # Steps-to-target runs stop at the first eval that reaches the target (or the budget);
  # train.stop_at_step: any run at its first eval at or past that step (its evals are the
  # full run's up to there; the schedule stays the budget's).
  stop_at_step = config.train.stop_at_step or num_steps + 1
  last_eval = p.history[-1]["step"] if p.history else 0
  ended = stop_at_target and p.tracker.reached or last_eval == p.step >= stop_at_step
  end_step = p.step if ended else num_steps
  next_eval = _next_eval(config, s, p)
  bar = _progress_bar(p.step, num_steps, s.is_main)
  schedule = optim.create_schedule(config.optim, config.train.batch_size, num_steps,
                                   s.steps_per_epoch)  # the optimizer's, to log
  writer.write_hparams(config.to_dict(), [f"eval/{config.eval.target_metric}", "train/loss"])
  # main.py installs a watch before set-up (a Ctrl-C while data loads or the step compiles
  # stops after step 1); without one, this loop watches for its own length.
  own_watch = PreemptionWatch.active is None
  preemption = PreemptionWatch() if own_watch else PreemptionWatch.active
  step_fn = None
  # Steps-to-target runs keep the state at the last eval that missed the target, to
  # replay a crossing found too coarsely (`_refine`); from the start, if it is an eval's.
  refine = stop_at_target and config.eval.target_resolution > 0
  snapshot = _Snapshot.after_eval(state, p, method) if refine else None
  try:
    for step in range(p.step, end_step):
      batch = next(batches)
      if step_fn is None:
        step_fn = _compile(config, s, state, batch, step_rng, p)
      state, step_metrics = _take_step(step_fn, state, batch, step_rng, step, method, p)
      done = step + 1
      bar.update(1)
      if done % config.train.log_every_steps == 0 or done == num_steps:
        since = p.durations[-min(config.train.log_every_steps, len(p.durations)):]
        _log(writer, bar, done, step_metrics, p.noise,
             {"train/learning_rate": float(schedule(step)),
              "train/steps_per_s": len(since) / max(sum(since), 1e-9)})
      evaluated = done >= next_eval or done == num_steps
      if evaluated:
        _evaluate(method, state, batch, done, eval_batches, p, writer)
        if snapshot is not None and too_coarse(p.tracker, config.eval):
          checkpointer.discard_after(snapshot.step)
          state, batch, done = _refine(config, method, snapshot, step_fn, step_rng,
                                       train_batches, eval_batches, p, writer)
        next_eval = _next_eval(config, s, p)
      reached = stop_at_target and p.tracker.reached
      early = evaluated and done >= stop_at_step and not reached  # an early end, here
      # DiLoCo's outer step: every H steps and at the last (the model evaluated above).
      state = jax.block_until_ready(method.after_step(state, done, batch,
                                                      last=done == num_steps or reached
                                                      or early))
      p.chrono.lap()
      p.step = done
      if refine:
        snapshot = _Snapshot.after_eval(state, p, method) or snapshot
      record = p.record(method)
      stop = preemption.requested(done)
      with p.chrono.paused("checkpoint"):  # saving is not training
        checkpointer.save(done, state, record,
                          force=done == num_steps or stop or reached or early)
      if stop and done < num_steps:
        preempted = preemption.stop(done, num_steps, workdir)
        logging.warning(preempted.message)
        raise preempted
      if reached:
        logging.info("target %s %s reached at step %d: stopping (train.stop_at_target)",
                     p.tracker.metric, p.tracker.value, done)
        break
      if early:
        logging.info("stopping at step %d, the first eval at or past train.stop_at_step=%d",
                     done, stop_at_step)
        break
  finally:  # also on preemption or divergence: finish pending saves, restore the signals
    bar.close()
    checkpointer.close()
    writer.close()
    if own_watch:
      preemption.close()
  return state


def _take_step(step_fn, state, batch, step_rng, step: int, method: Method, p: Progress):
  """One step -> (state, metrics on the host). The metrics are checked before anything
  reads the new state (an eval, a sync): a worker that diverged in this very update enters
  neither. The fetch waits for the step, so the lap times it; the noise scale reads it."""
  state, step_metrics = step_fn(state, batch, step_rng)
  step_metrics = _fetch(step_metrics)
  method.check_step_metrics(step_metrics, step)
  p.durations.append(p.chrono.lap())
  if p.noise is not None:
    p.noise.update(step_metrics)
  return state, step_metrics


@dataclasses.dataclass
class _Snapshot:
  """The loop right after an eval that missed the target (its outer step done): what
  replaying the steps after it needs."""
  step: int
  state: Any  # a copy: the step donates its input's buffers
  history_len: int
  train_s: float
  host_state: dict
  noise: dict | None

  @classmethod
  def after_eval(cls, state, p: Progress, method: Method) -> "_Snapshot | None":
    """The loop now, if it stands at an eval that missed the target (or at the start)."""
    if (p.history[-1]["step"] if p.history else 0) != p.step or p.tracker.reached:
      return None
    return cls(p.step, jax.tree.map(jnp.copy, state), len(p.history), p.chrono.train_s,
               copy.deepcopy(method.host_state()),
               None if p.noise is None else copy.deepcopy(p.noise.record()))


def _refine(config, method: Method, snap: _Snapshot, step_fn, step_rng, train_batches,
            eval_batches, p: Progress, writer):
  """The target was first met `resolution_steps` after the previous eval, more coarsely
  than `eval.target_resolution` allows: the metric jumped past the near-target window
  between two regular evals. Rewinds to that eval (`snap`) and replays the same steps (the
  same batches and keys: the same updates) with an eval every target_resolution x step
  steps, up to the first that meets the target. The coarse eval leaves the history; the
  thrown-away steps' training time leaves the training clock (recorded in
  `target.refined_from`). Returns (state, batch, step) at the refined crossing, before
  its `after_step`.
  """
  coarse = p.tracker
  logging.info("target met at step %d, %d steps after the previous eval: replaying them "
               "from step %d with evals every %g x step", coarse.reached_step,
               coarse.resolution_steps, snap.step, config.eval.target_resolution)
  p.tracker = TargetTracker(coarse.metric, coarse.value, refined_from={
      "step": coarse.reached_step, "resolution_steps": coarse.resolution_steps,
      "discarded_train_s": p.chrono.train_s - snap.train_s})
  del p.history[snap.history_len:]
  p.chrono.train_s = snap.train_s
  method.load_host_state(copy.deepcopy(snap.host_state))
  if p.noise is not None:
    p.noise = NoiseScaleTracker.from_record(snap.noise, config.train.noise_scale_ema)
  state, end = snap.state, coarse.reached_step
  batches = train_batches.iterate(snap.step, end, config.data.prefetch,
                                  config.data.num_threads)
  next_eval = snap.step + fine_interval(snap.step, config.eval)
  for step in range(snap.step, end):
    batch = next(batches)
    state, _ = _take_step(step_fn, state, batch, step_rng, step, method, p)
    done = step + 1
    if done >= next_eval or done == end:
      _evaluate(method, state, batch, done, eval_batches, p, writer)
      if p.tracker.reached:
        return state, batch, done
      next_eval = done + fine_interval(done, config.eval)
    state = jax.block_until_ready(method.after_step(state, done, batch))
    p.chrono.lap()
  raise RuntimeError(f"replaying steps {snap.step}..{end} did not meet the target that step "
                     f"{end} met: the steps are not deterministic on this backend")


def _next_eval(config, s: Setup, p: Progress) -> int:
  """The step of the next eval, from the last one (or the start) and the history."""
  last = p.history[-1]["step"] if p.history else 0
  return next_eval_step(last, p.history, p.tracker.metric, p.tracker.value, config.eval,
                        s.eval_every)


def _compile(config, s: Setup, state, batch, step_rng, p: Progress):
  """The step compiled once (timed apart), XLA's FLOPs read off the same executable."""
  method, k = s.method, config.train.microbatches
  with p.chrono.paused("compile"):
    step_fn = method.train_step.lower(state, batch, step_rng).compile()
    # XLA counts the per-device SPMD program; the step costs that on every mesh device.
    p.flops_per_step = costs.flops(step_fn) * s.mesh.devices.size
    if k > 1:  # XLA counts the microbatch loop's body once; it runs k times per model
      lead = len(method.train_layout.leading_shape)
      rows = method.train_layout.leading_shape[-1] // k
      mb = {name: jax.ShapeDtypeStruct((rows,) + x.shape[lead:], x.dtype)
            for name, x in batch.items()}
      p.flops_per_step += (k - 1) * method.num_workers * step_lib.microbatch_flops(
          s.one_model, mb, method.step_config)
  return step_fn


def _log(writer, bar, step: int, step_metrics: dict,
         noise: NoiseScaleTracker | None = None, extra: dict | None = None) -> None:
  scalars = {f"train/{k}": float(np.mean(v)) for k, v in step_metrics.items()} | (extra or {})
  if noise is not None:
    scalars["train/b_simple"] = noise.ema.estimates()["b_simple"]
  writer.write_scalars(step, scalars)
  bar.set_postfix(loss=f"{scalars['train/loss']:.3f}")


def _evaluate(method: Method, state, batch, step: int, eval_batches, p: Progress,
              writer) -> None:
  """Scores the model at `step` (what a run stopping now deploys); tracks the target and
  reads the noise scale at it."""
  if p.noise is not None:
    p.noise.read(step)
  with p.chrono.paused("eval"):
    p.last_eval = _eval(method, method.deployable(state, step, batch), eval_batches)
  scalars = _scalars(p.last_eval)
  p.tracker.update(p.last_eval, step, p.chrono.train_s, p.chrono.wall_s(),
                   p.history[-1]["step"] if p.history else 0)
  p.history.append({"step": step, "train_time_s": p.chrono.train_s, **scalars})
  writer.write_scalars(step, {f"eval/{k}": v for k, v in scalars.items()})  # logs it once


def _eval(method: Method, state, eval_batches) -> dict:
  sums = None
  for batch in eval_batches:
    sums = metrics_lib.add_sums(sums, method.eval_step(state, batch))
  return method.finalize_eval(sums)


def _results(config, s: Setup, pool: samplers.Pool, state, p: Progress, train_batches,
             eval_batches) -> dict:
  """results.json: what was trained, how long it took and cost, how good it is."""
  method = s.method
  if p.last_eval is None:  # resumed after the last step: evaluate the restored state
    p.last_eval = _eval(method, method.deployable(state, p.step, None), eval_batches)
  target = p.tracker
  results = {
      "method": method.name,
      "config": config.to_dict(),
      "num_devices": jax.device_count(),
      "host": host_info(),
      "mesh": dict(s.mesh.shape),
      "data": s.data.info,
      "steps": p.step,  # trained; fewer than step_budget when stopped at the target
      "step_budget": s.num_steps,
      "examples_per_step": method.examples_per_step,
      "wall_time_s": p.chrono.wall_s(),
      "train_time_s": p.chrono.train_s,
      "eval_time_s": p.chrono.paused_s["eval"],
      "compile_time_s": p.chrono.paused_s["compile"],
      # This session's blocking part of checkpoint saves.
      "checkpoint_time_s": p.chrono.paused_s["checkpoint"],
      "flops_per_step": p.flops_per_step,
      "step_time_s": costs.median_step_time(p.durations, config.train.timing_warmup_steps),
      "final": _scalars(p.last_eval),
      "target": {"metric": target.metric, "value": target.value, "reached": target.reached,
                 "reached_step": target.reached_step, "reached_time_s": target.reached_time_s,
                 "reached_wall_time_s": target.reached_wall_time_s,
                 # the crossing is in (reached_step - resolution_steps, reached_step]
                 "resolution_steps": target.resolution_steps,
                 "resolution": (target.resolution_steps / target.reached_step
                                if target.reached else None),
                 # a too-coarse crossing replayed finely (`_refine`): what it replaced
                 "refined_from": target.refined_from},
      "history": p.history,
      # Fields a resumed session changed ({"step", "changes": {field: [before, after]}});
      # `config` is the last session's.
      "config_changes": p.config_changes,
      **method.final_results(state, p.last_eval, p.step, train_batches, eval_batches),
  }
  if pool.info is not None:
    results["distill"] = pool.info
  if p.noise is not None:
    results["noise_scale"] = p.noise.results(target)
  devices = math.prod(method.cluster_mesh(config.cost.devices).values())
  try:
    comm = _communication(config, s, train_batches, eval_batches)
  except Exception as e:  # noqa: BLE001 -- results.json is still written, labelled
    logging.warning("communication not read from HLO; the legacy model stands in: %s", e)
    comm = costs.legacy_communication(results, devices, f"compiling failed: {e}")
  results["cost"] = costs.summary(results, comm, devices, config.cost.overlap,
                                  simulated=jax.devices()[0].platform == "cpu",
                                  device_step_time_s=config.cost.device_step_time_s)
  if config.task == "lm":
    results["tokens_per_step"] = method.examples_per_step * config.data.context
    results["tokens_per_s"] = results["tokens_per_step"] / results["step_time_s"]
  return results


# XLA:CPU compiles for the host's instruction set, so the same run on another CPU (or
# another jaxlib) can round differently, and a chaotic run can then take other steps to
# its target. Runs on one host and jaxlib are bit-identical.
_CPU_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def host_info() -> dict:
  """What a result's floating point depends on besides the config: jaxlib, the device kind
  and, on CPU, the instruction-set features XLA compiles for."""
  info = {"jax": jax.__version__, "jaxlib": jax.lib.__version__,
          "device_kind": jax.devices()[0].device_kind}
  if jax.devices()[0].platform == "cpu" and os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines()
                    if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    info["cpu"] = fields.get("model name")
    info["cpu_features"] = [f for f in _CPU_FEATURES if f in flags]
  return info


def read_communication(config: ml_collections.ConfigDict, s: Setup,
                       pool: samplers.Pool | None) -> costs.Communication:
  """The communication a run of `config` on `pool` reads at its end, read again without
  training: for a finished run whose own reading failed (its results.json then carries
  the legacy model, labelled so)."""
  return _communication(config, s, *_streams(config, s, _pool_or_own(config, s, pool)))


def _communication(config, s: Setup, train_batches, eval_batches) -> costs.Communication:
  """The collectives of the method's programs on the cluster the run stands for."""
  req = communication.request(config, s.method, num_classes=s.data.num_classes,
                              init_input=s.data.init_input, num_steps=s.num_steps,
                              steps_per_epoch=s.steps_per_epoch, train_batches=train_batches,
                              eval_batches=eval_batches)
  return communication.for_cluster(s.method, req)


class Preempted(SystemExit):
  """Raised after the checkpoint that a stop request asked for (exit 143 or 130)."""

  def __init__(self, message: str, code: int = 143):
    super().__init__(code)
    self.message = message

  def __str__(self) -> str:
    return self.message


class PreemptionWatch:
  """SIGTERM (a preemption notice) or Ctrl-C: checkpoint at the end of the step, then stop.

  A second Ctrl-C aborts at once. With several processes, JAX's preemption sync point makes
  them agree on the step (SIGTERM only; Ctrl-C keeps its default there).
  """
  SIGNALS = {signal.SIGTERM: ("a preemption notice (SIGTERM)", 143),
             signal.SIGINT: ("Ctrl-C", 130)}

  active: "PreemptionWatch | None" = None  # the installed one: signals are per process

  def __init__(self):
    self.received = None  # the first stop signal's number
    self._previous = {}
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        self._previous[signum] = signal.signal(signum, self._notify)
      PreemptionWatch.active = self

  def _notify(self, signum, frame):
    del frame
    if signum == signal.SIGINT:  # the next Ctrl-C raises KeyboardInterrupt: abort now
      signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.warning("%s: checkpointing at the end of this step, then stopping%s",
                    self.SIGNALS[signum][0],
                    " (Ctrl-C again aborts at once)" if signum == signal.SIGINT else "")
    self.received = self.received or signum

  def requested(self, step: int) -> bool:
    if jax.process_count() > 1:
      if multihost_utils.reached_preemption_sync_point(step):
        self.received = signal.SIGTERM
    return self.received is not None

  def stop(self, step: int, num_steps: int, workdir: str) -> Preempted:
    """The exception that ends the run after its checkpoint, with its one-line message."""
    what, code = self.SIGNALS[self.received]
    return Preempted(f"stopped at step {step} of {num_steps} on {what}; checkpoint saved in "
                     f"{workdir}/checkpoints. Rerun the same command to resume.", code)

  def close(self) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
    if PreemptionWatch.active is self:
      PreemptionWatch.active = None


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


def _as_json(config) -> dict:
  """The config as results.json and the checkpoint record hold it (tuples as lists)."""
  return json.loads(json.dumps(config.to_dict()))


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


def _progress_bar(start: int, total: int, enabled: bool):
  if not enabled:
    return _NoProgress()
  from tqdm.auto import tqdm

  return tqdm(total=total, initial=start, desc="train", dynamic_ncols=True, mininterval=2.0)
