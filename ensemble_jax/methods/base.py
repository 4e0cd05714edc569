"""The Method interface: every member the training loop (`ensemble_jax/train.py`) reads.

One loop runs every method, so what it may call is written down here, once. The hooks
come in the order the loop uses them: set-up (layouts, `init`, `prune`, `sampler`), each
step (`train_step`, `check_step_metrics`, `deployable` + `eval_step` + `finalize_eval`
on eval steps, `after_step`), each checkpoint (`host_state`; `load_host_state` on
restore), and the end (`final_results`; `cluster_mesh` and `programs` for the cost
report). The defaults are what a method that keeps no host-side state and never syncs
needs: the state as it is, unchanged.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax

from ensemble_jax.data.pipeline import BatchLayout
from ensemble_jax.data.samplers import Sampler
from ensemble_jax.methods import step as step_lib


@dataclasses.dataclass(frozen=True)
class Program:
  """A jitted program a method runs, lowered for the method's mesh, and how often it runs:
  `costs` prices the collectives of its compiled HLO."""
  name: str  # how results.json names it: train_step, eval, sync, ...
  per: str  # the unit `calls` counts in (costs.UNITS): step, eval, sync (outer step), ...
  calls: int  # calls per unit (an evaluation calls its program once per eval batch)
  lowered: jax.stages.Lowered


def abstract(tree, sharding) -> Any:
  """ShapeDtypeStructs of `tree`'s leaves (arrays or ShapeDtypeStructs) placed in
  `sharding`: one sharding for every leaf, or a tree of them matching `tree`."""
  def struct(x, s):  # weak types kept: they are part of what a program is compiled for
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s,
                                weak_type=getattr(x, "weak_type", False))

  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree.map(lambda x: struct(x, sharding), tree)
  return jax.tree.map(struct, tree, sharding)


class Method(abc.ABC):
  """A training method: its state, compiled step, batch layout and eval reduction."""

  name: str  # results.json `method`; the key of config.method.name
  # Independent models trained side by side: the sampler's consumers, a distilled pool's
  # splits. 1 for data-parallel training (one model, however many devices).
  num_workers: int
  train_layout: BatchLayout  # the global train batch: [B, ...] or [N, b, ...], sharded
  eval_layout: BatchLayout  # the global eval batch
  step_config: step_lib.StepConfig  # the static inputs of one model's step (pools read it)
  # (state, batch, rng) -> (state, metrics): jitted, so the loop can `.lower().compile()`
  # it once and read XLA's FLOPs off the executable it runs.
  train_step: jax.stages.Wrapped

  @property
  @abc.abstractmethod
  def examples_per_step(self) -> int:
    """Training examples one step consumes, all workers together (cost reports)."""

  @abc.abstractmethod
  def init(self, rng: jax.Array) -> Any:
    """Called once before restore: the fresh train state, placed in its shardings."""

  @abc.abstractmethod
  def prune(self, state, batch: dict, sparsity: float) -> Any:
    """Called once at step 0 when config.model.sparsity > 0, with the first global train
    batch: the state with its SNIP mask decided (`step_lib.snip_prune`)."""

  @abc.abstractmethod
  def sampler(self, num_examples: int, seed: int) -> Sampler:
    """Called at set-up when the run has no distilled pool: which rows each of the
    `num_workers` consumers reads."""

  @abc.abstractmethod
  def check_step_metrics(self, step_metrics: dict, step: int) -> None:
    """Called right after every step, before anything reads the new state (an eval, a
    sync), with the step's metrics on the host: raises, or excludes a diverged worker."""

  def trained_params(self, state) -> Any:
    """The weights `state` trains (stacked over workers for the stacked engine): what the
    run's parameter table lists."""
    return state.params

  def deployable(self, state, step: int, batch: dict | None) -> Any:
    """Called on eval steps, and at the end when the last step was restored rather than
    trained (`batch` None): the model a run stopping at `step` would deploy."""
    del step, batch
    return state

  @abc.abstractmethod
  def eval_step(self, state, batch: dict) -> dict:
    """Called on every eval batch with `deployable`'s state: metric sums on the device
    (summed over batches by `metrics.add_sums`)."""

  @abc.abstractmethod
  def finalize_eval(self, sums: dict) -> dict:
    """Called once per eval with the summed sums: the eval's metrics (`accuracy`, `nll`,
    ... as host scalars, plus whatever per-worker detail the method reports)."""

  def after_step(self, state, step: int, batch: dict, last: bool = False) -> Any:
    """Called after every step's eval (if any) and before its checkpoint; `last`: the run
    stops after this step. The state to train on next (DiLoCo's outer step goes here)."""
    del step, batch, last
    return state

  def host_state(self) -> dict:
    """Called at every checkpoint: JSON the checkpoint carries besides the train state."""
    return {}

  def load_host_state(self, host_state: dict) -> None:
    """Called after restore with `host_state()`'s record ({} on a fresh run), and when the
    loop rewinds to an earlier eval to replay a too-coarse crossing (train._refine)."""
    del host_state

  @abc.abstractmethod
  def final_results(self, state, last_eval: dict, num_steps: int, train_batches,
                    eval_batches) -> dict:
    """Called once at the end: the method's own keys of results.json."""

  @abc.abstractmethod
  def cluster_mesh(self, devices: int) -> dict[str, int]:
    """Called at set-up and at the end: the mesh of the cluster of `devices` devices this
    run stands for (config.cost.devices; 0: the method's own default), whose programs'
    collectives the cost report charges. Raises ConfigError if `devices` cannot hold it."""

  @abc.abstractmethod
  def programs(self, train_batch: dict, eval_batch: dict, eval_batches: int) -> list[Program]:
    """Called once at the end, on a method built for `cluster_mesh`: every program the run
    calls that may communicate, lowered from abstract inputs (its state's shapes;
    `train_batch`, `eval_batch`: global batches or ShapeDtypeStructs, only their shapes and
    dtypes are read; `eval_batches`: batches per evaluation)."""
