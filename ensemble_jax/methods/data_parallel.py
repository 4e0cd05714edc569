"""The pjit baseline: one model, global batch sharded over `data`, an all-reduce per step.

Params are replicated, or FSDP-sharded over `data` (`config.method.fsdp`); XLA's SPMD
partitioner inserts the gradient all-reduce (or all-gather / reduce-scatter for FSDP).
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ensemble_jax import models
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import sharding as sharding_lib
from ensemble_jax.config_lib import ConfigError
from ensemble_jax.data.pipeline import BatchLayout
from ensemble_jax.data.samplers import RandomSampler, Sampler
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.base import Method, Program, abstract


def check_divisible(value: int, field: str, divisor: int, what: str) -> None:
  if value % divisor:
    raise ConfigError(f"config.{field}={value} is not divisible by {what}={divisor}; "
                      f"choose a multiple of {divisor}.")


def check_batch_sizes(config, data_size: int) -> None:
  """Train and eval batches (and each microbatch) split evenly over the mesh's `data` axis."""
  check_divisible(config.train.batch_size, "train.batch_size", data_size,
                  "the mesh's data axis")
  k = config.train.microbatches
  if k > 1 and config.train.batch_size % (k * data_size):
    b = config.train.batch_size
    raise ConfigError(f"config.train.microbatches={k} splits config.train.batch_size={b} into "
                      f"microbatches of {b / k:g}, not divisible by the mesh's data axis="
                      f"{data_size}; choose k dividing {b // data_size}.")
  check_divisible(config.eval.batch_size, "eval.batch_size", data_size,
                  "the mesh's data axis")


class DataParallel(Method):
  name = "data_parallel"
  num_workers = 1  # one model, however many devices share its batch

  def __init__(self, config, model, tx, mesh, init_input: jax.ShapeDtypeStruct):
    self.config, self.model, self.tx, self.mesh = config, model, tx, mesh
    data_size = mesh.shape.get("data", 1)
    check_batch_sizes(config, data_size)
    check_divisible(config.train.batch_size, "train.batch_size", jax.process_count(),
                    "the process count")
    batch_sharding = NamedSharding(mesh, P("data"))
    self.train_layout = BatchLayout((config.train.batch_size,), batch_sharding)
    self.eval_layout = BatchLayout((config.eval.batch_size,), batch_sharding)
    # Gradient accumulation with replicated params runs per device under shard_map: each
    # device sums its own microbatches' gradients and the step all-reduces them once. (Under
    # plain jit the partitioner all-reduces every microbatch's gradient inside the loop.)
    self.local_accumulation = config.train.microbatches > 1 and not config.method.fsdp
    if self.local_accumulation:  # BatchNorm statistics of each microbatch over all devices
      model = models.with_batchnorm(model, config.model, bn_axis_name="data")
    if config.method.batchnorm == "per_device":
      # The step sees the global batch: one slice per device the run stands for, each
      # normalised alone, so the cluster's step reduces no statistic (validation refuses
      # microbatches).
      devices = self.cluster_mesh(config.cost.devices)["data"]
      model = (models.with_batchnorm(model, config.model, bn_groups=devices) if devices > 1
               else model)
    self.model = model
    self.step_config = step_lib.StepConfig.from_config(
        config, data_axis="data" if self.local_accumulation else None)
    self._init_fn = functools.partial(step_lib.create_train_state, model, tx,
                                      init_input=init_input,
                                      sparse=config.model.sparsity > 0)
    self.state_sharding = sharding_lib.state_shardings(
        jax.eval_shape(self._init_fn, jax.random.key(0)), mesh,
        fsdp=config.method.fsdp, min_size=config.method.fsdp_min_size)
    rep = sharding_lib.replicated(mesh)
    teacher = (P(),) if config.distill.teacher else ()  # replicated, as its sharding below
    step = functools.partial(step_lib.train_step, cfg=self.step_config)
    if teacher:  # the teacher's variables: the step's fourth input
      step = self._step_with_teacher
    if self.local_accumulation:
      step = jax.shard_map(self._local_step, mesh=mesh,
                           in_specs=(P(), P("data"), P()) + teacher, out_specs=(P(), P()),
                           # Replicated by construction: grads and metrics are pmeaned
                           # over `data`, BatchNorm statistics synced over it.
                           check_vma=False)
    self.train_step = jax.jit(step, in_shardings=(self.state_sharding, batch_sharding, rep)
                              + (rep,) * len(teacher),
                              out_shardings=(self.state_sharding, rep), donate_argnums=0)
    self._eval_fn = jax.jit(self._eval_sums, out_shardings=rep)

  def _step_with_teacher(self, state, batch, rng, teacher):
    return step_lib.train_step(state, batch, rng, self.step_config, teacher)

  def _local_step(self, state, batch, rng, *teacher):
    """One device's part of a microbatched step (its own dropout stream)."""
    rng = jax.random.fold_in(rng, jax.lax.axis_index("data"))
    return step_lib.train_step(state, batch, rng, self.step_config, *teacher)

  def one_model(self):
    return jax.eval_shape(self._init_fn, jax.random.key(0))

  @property
  def examples_per_step(self) -> int:
    return self.config.train.batch_size

  def init(self, rng: jax.Array) -> step_lib.TrainState:
    """Abstract init gave the shardings; materialise directly into them."""
    return jax.jit(self._init_fn, out_shardings=self.state_sharding)(rng)

  def prune(self, state, batch, sparsity: float):
    """SNIP at init on the first global batch."""
    prune = functools.partial(step_lib.snip_prune, cfg=self.step_config, sparsity=sparsity)
    return jax.jit(prune, out_shardings=self.state_sharding)(state, batch)

  def sampler(self, num_examples: int, seed: int) -> Sampler:
    return RandomSampler(num_examples, 1, seed)

  def _eval_sums(self, state, batch):
    logits = step_lib.predict(state, batch, self.step_config)
    return metrics_lib.prediction_sums(logits, step_lib.targets(batch, self.step_config),
                                       batch["mask"])

  def eval_step(self, state, batch):
    return self._eval_fn(state, batch)

  def finalize_eval(self, sums) -> dict:
    return metrics_lib.finalize(sums, self.config.task)

  def check_step_metrics(self, step_metrics: dict, step: int) -> None:
    loss = np.asarray(step_metrics["loss"])
    if not np.isfinite(loss):
      raise FloatingPointError(f"training loss is {loss} at step {step}; lower "
                               "config.optim.learning_rate or set config.optim.grad_clip_norm.")

  def final_results(self, state, last_eval: dict, num_steps: int, train_batches,
                    eval_batches) -> dict:
    # Counted off shapes: FSDP params span processes, so no one process can fetch them.
    return {"num_params": step_lib.num_params(state.params)}

  def cluster_mesh(self, devices: int) -> dict[str, int]:
    """One device per data-parallel replica: D devices on `data`.

    D = 0 means this mesh's `data`."""
    devices = devices or self.mesh.shape.get("data", 1)
    check_divisible(self.config.train.batch_size, "train.batch_size", devices,
                    "the cluster's devices, config.cost.devices")
    check_divisible(self.config.eval.batch_size, "eval.batch_size", devices,
                    "the cluster's devices, config.cost.devices")
    return {"data": devices}

  def programs(self, train_batch, eval_batch, eval_batches: int) -> list[Program]:
    """The step (its gradient and BatchNorm-statistic all-reduces) and the eval step (its
    metric sums)."""
    state = abstract(jax.eval_shape(self._init_fn, jax.random.key(0)), self.state_sharding)
    rng = jax.random.key(0)  # uncommitted, as the loop's: the step is not compiled again
    step = self.train_step.lower(*self.step_args(
        state, abstract(train_batch, self.train_layout.sharding), rng))
    evaluate = self._eval_fn.lower(state, abstract(eval_batch, self.eval_layout.sharding))
    return [Program("train_step", "step", 1, step),
            Program("eval", "eval", eval_batches, evaluate)]
