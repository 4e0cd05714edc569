"""The Method interface: every member the training loop (`ensemble_jax/train.py`) reads.

One loop runs every method, so what it may call is written down here, once. The hooks
come in the order the loop uses them:

  set-up           layouts, `init`, `prune`, `sampler`
  each step        `train_step`, `check_step_metrics`, `after_step`; on eval steps
                   `deployable`, `eval_step` and `finalize_eval` before `after_step`
  each checkpoint  `host_state`; `load_host_state` on restore
  the end          `final_results`; `cluster_mesh` and `programs` for the cost report

The defaults suit a method that keeps no host-side state and never syncs: they return the
state unchanged.
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
  """A jitted program a method runs, lowered for its mesh, and how often it runs.

  `costs` prices the collectives of its compiled HLO."""
  name: str  # how results.json names it: train_step, eval, sync, ...
  per: str  # the unit `calls` counts in (costs.UNITS): step, eval, sync (outer step), ...
  calls: int  # calls per unit (an evaluation calls its program once per eval batch)
  lowered: jax.stages.Lowered


def abstract(tree, sharding) -> Any:
  """ShapeDtypeStructs of `tree`'s leaves, placed in `sharding`.

  The leaves may be arrays or ShapeDtypeStructs. `sharding` is one sharding for every
  leaf, or a tree of them matching `tree`."""
  def struct(x, s):  # weak types kept: they are part of what a program is compiled for
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s,
                                weak_type=getattr(x, "weak_type", False))

  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree.map(lambda x: struct(x, sharding), tree)
  return jax.tree.map(struct, tree, sharding)


class Method(abc.ABC):
  """A training method: its state, compiled step, batch layout and eval reduction."""

  name: str  # results.json `method`; the key of config.method.name
  # What the engine asks of a method class, never of its name (a subclass inherits them):
  # it trains `num_workers` models stacked over a mesh 'worker' axis (else one model);
  stacked: bool = False
  # (stacked) config.method.aggregation names modes of aggregate.MODES that mix its workers;
  # False: its aggregation is its own (DiLoCo's `global`), which `check_config` checks;
  mixes_workers: bool = False
  # method.steps_per_worker (when > 0) is its step budget, train.num_steps/num_epochs unread.
  per_worker_budget: bool = False
  # Independent models trained side by side: the sampler's consumers, a distilled pool's
  # splits. 1 for data-parallel training (one model, however many devices).
  num_workers: int
  train_layout: BatchLayout  # the global train batch: [B, ...] or [N, b, ...], sharded
  eval_layout: BatchLayout  # the global eval batch
  step_config: step_lib.StepConfig  # the static inputs of one model's step (pools read it)
  # (state, batch, rng[, teacher]) -> (state, metrics): jitted, so the loop can
  # `.lower().compile()` it once and read XLA's FLOPs off the executable it runs. Its
  # inputs are `step_args`'.
  train_step: jax.stages.Wrapped
  config: Any  # the run's config
  mesh: jax.sharding.Mesh
  # A frozen teacher's variables (config.distill.teacher), replicated on every device: an
  # input of every step, not state (never stacked, updated or checkpointed). The loop loads
  # them (`ensemble_jax/teacher.py`); until then `step_args` has their shapes only.
  teacher: Any = None

  @classmethod
  def check_config(cls, config) -> None:
    """Raises ConfigError on a value of `config` this method cannot use.

    Called by validation before anything is built; the default accepts every config."""
    del config

  @abc.abstractmethod
  def one_model(self) -> Any:
    """One model's abstract train state (a worker's, without the stacked axis)."""

  def abstract_teacher(self) -> Any:
    """The teacher's variables as replicated ShapeDtypeStructs, or None without one.

    The teacher is the student's model: its variables have one model's shapes."""
    if not self.config.distill.teacher:
      return None
    return abstract(step_lib.model_variables(self.one_model()),
                    jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()))

  def step_args(self, state, batch, rng) -> tuple:
    """`train_step`'s inputs: (state, batch, rng), and the teacher's variables when the run
    has one (their shapes, for lowering, until the loop has loaded them)."""
    if not self.config.distill.teacher:
      return state, batch, rng
    return state, batch, rng, (self.abstract_teacher() if self.teacher is None
                               else self.teacher)

  @property
  @abc.abstractmethod
  def examples_per_step(self) -> int:
    """Training examples one step consumes, all workers together (cost reports)."""

  @abc.abstractmethod
  def init(self, rng: jax.Array) -> Any:
    """Called once before restore: the fresh train state, placed in its shardings."""

  @abc.abstractmethod
  def prune(self, state, batch: dict, sparsity: float) -> Any:
    """Returns the state with its SNIP mask decided (`step_lib.snip_prune`).

    Called once at step 0 when config.model.sparsity > 0, with the first global train
    batch."""

  @abc.abstractmethod
  def sampler(self, num_examples: int, seed: int) -> Sampler:
    """Which rows each of the `num_workers` consumers reads.

    Called at set-up when the run has no distilled pool."""

  @abc.abstractmethod
  def check_step_metrics(self, step_metrics: dict, step: int) -> None:
    """Raises on a diverged step, or excludes the diverged worker.

    Called right after every step with its metrics on the host, before an eval or a sync
    reads the new state."""

  def trained_params(self, state) -> Any:
    """The weights `state` trains, which the run's parameter table lists.

    The stacked engine's are stacked over workers."""
    return state.params

  def deployable(self, state, step: int, batch: dict | None) -> Any:
    """The model a run stopping at `step` would deploy.

    Called on eval steps, and at the end with `batch` None when the last step was restored
    rather than trained."""
    del step, batch
    return state

  @abc.abstractmethod
  def eval_step(self, state, batch: dict) -> dict:
    """One eval batch's metric sums on the device, for `deployable`'s state.

    `metrics.add_sums` sums them over batches."""

  @abc.abstractmethod
  def finalize_eval(self, sums: dict) -> dict:
    """Called once per eval with the summed sums: the eval's metrics (`accuracy`, `nll`,
    ... as host scalars, plus whatever per-worker detail the method reports)."""

  def after_step(self, state, step: int, batch: dict, last: bool = False) -> Any:
    """The state to train on next; DiLoCo's outer step goes here.

    Called after every step's eval, if any, and before its checkpoint. `last` says the run
    stops after this step."""
    del step, batch, last
    return state

  def host_state(self) -> dict:
    """Called at every checkpoint: JSON the checkpoint carries besides the train state."""
    return {}

  def load_host_state(self, host_state: dict) -> None:
    """Restores the record `host_state()` returned; {} on a fresh run.

    Called after a restore, and when the loop rewinds to an earlier eval to replay a
    too-coarse crossing of the target."""
    del host_state

  @abc.abstractmethod
  def final_results(self, state, last_eval: dict, num_steps: int, train_batches,
                    eval_batches) -> dict:
    """Called once at the end: the method's own keys of results.json."""

  @abc.abstractmethod
  def cluster_mesh(self, devices: int) -> dict[str, int]:
    """The mesh of the `devices`-device cluster this run stands for.

    The cost report charges the collectives of programs on this mesh. `devices` is
    config.cost.devices; 0 means the method's own default. Raises ConfigError if `devices`
    cannot hold the method. Called at set-up and at the end."""

  @abc.abstractmethod
  def programs(self, train_batch: dict, eval_batch: dict, eval_batches: int) -> list[Program]:
    """Every program the run calls that may communicate, lowered from abstract inputs.

    Called once at the end, on a method built for `cluster_mesh`. Only the shapes and
    dtypes of the state, `train_batch` and `eval_batch` are read; the batches may be global
    arrays or ShapeDtypeStructs. `eval_batches` is the number of batches per evaluation."""
