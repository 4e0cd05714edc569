"""DiLoCo: the stacked engine plus an outer step every H = `config.method.sync_every` steps.

Inner steps are the ensemble's, with no collective over `worker`. Every H steps, and at
the run's last step whatever H, one jitted sync does four things:

  1. averages the workers' weights into a pseudo-gradient: the global params minus the
     mean of the workers' params;
  2. takes an outer Nesterov SGD step on the global params (the paper: lr 0.7, momentum
     0.9);
  3. re-estimates the global model's BatchNorm statistics on the step's train batch, for
     the global weights rather than as the workers' average;
  4. broadcasts the global model back to the workers.

Inner optimizer states persist across syncs. With H = infinity and a final logit average
instead of a weight average, this is `Ensemble`: the sync is the only difference.

The model at step t, which evaluations score and steps to target count, is what a user
would deploy if the run stopped at t. That is the outer step taken at t, exactly what a run
ending at t does. When t is not a sync step it is computed without disturbing training.
"""
from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from ensemble_jax import aggregate
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import sharding as sharding_lib
from ensemble_jax.config_lib import DILOCO_MODES, ConfigError, aggregation_modes
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.base import Program
from ensemble_jax.methods.ensemble import Ensemble


class DiLoCoState(flax.struct.PyTreeNode):
  workers: step_lib.TrainState  # [N, ...] inner states
  global_params: Any  # the outer model, replicated
  global_batch_stats: Any  # its BatchNorm statistics, re-estimated at every outer step
  outer_opt_state: Any


def _broadcast(tree, n: int):
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), tree)


class DiLoCo(Ensemble):
  name = "diloco"
  mixes_workers = False  # its one model, `global`, is the outer params

  @classmethod
  def check_config(cls, config) -> None:
    """H > 0, its one mode `global`; no warm start and no pruning at init (not built)."""
    m = config.method
    for ok, field, value, fix in (
        (m.sync_every > 0, "method.sync_every", m.sync_every, "diloco syncs every H > 0 "
         "steps (H = infinity is method.name='ensemble')."),
        (aggregation_modes(config) == DILOCO_MODES, "method.aggregation", m.aggregation,
         "DiLoCo trains one model, the global (outer) params, and reports only it: set "
         "method.aggregation='global'."),
        (not config.train.init_from, "train.init_from", config.train.init_from,
         "warm starts are not built for diloco: use data_parallel or ensemble."),
        (config.model.sparsity == 0, "model.sparsity", config.model.sparsity,
         "pruning at init is not built for diloco: use data_parallel or ensemble.")):
      if not ok:
        raise ConfigError(f"config.{field}={value!r}: {fix}")

  def __init__(self, config, model, tx, mesh, init_input):
    m = config.method
    if m.sync_every <= 0:
      raise ConfigError(f"config.method.sync_every={m.sync_every}: DiLoCo syncs every H > 0 "
                        "steps; H = infinity is method.name='ensemble'.")
    momentum = m.outer_momentum if m.outer_momentum > 0 else None
    self.outer_tx = optax.sgd(m.outer_learning_rate, momentum=momentum,
                              nesterov=m.outer_nesterov and momentum is not None)
    super().__init__(config, model, tx, mesh, init_input)
    self.syncs: list[int] = []  # the steps at which outer steps happened
    self.sync = jax.jit(self._sync, out_shardings=self.state_sharding, donate_argnums=0)
    rep = sharding_lib.replicated(mesh)
    self._deployable = jax.jit(
        lambda state, weights_N, batch: self._global_model(self._outer_step(
            state, weights_N, batch)), out_shardings=(rep, rep))

  def _init_state(self, rng):
    """Every worker starts from the global params (one init, whatever shared_init says)."""
    workers = jax.vmap(self._init_one)(jnp.broadcast_to(rng, (self.num_workers,)))
    first = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
    global_params = first(workers.params)
    return DiLoCoState(workers, global_params, first(workers.batch_stats),
                       self.outer_tx.init(global_params))

  def trained_params(self, state):
    """The workers' stacked params, as the ensemble's (the outer model: global_params)."""
    return state.workers.params

  def _shardings(self, abstract_state):
    rep = sharding_lib.replicated(self.mesh)
    replicated = lambda tree: jax.tree.map(lambda _: rep, tree)  # noqa: E731
    return DiLoCoState(
        workers=super()._shardings(abstract_state.workers),
        global_params=replicated(abstract_state.global_params),
        global_batch_stats=replicated(abstract_state.global_batch_stats),
        outer_opt_state=replicated(abstract_state.outer_opt_state))

  def _step(self, state, batch, rng, *teacher):
    workers, metrics = self._stacked_step(state.workers, batch, rng, *teacher)
    return state.replace(workers=workers), metrics

  def _outer_step(self, state, weights_N, batch):
    """The outer step on the healthy workers' mean; the workers are untouched.

    The new global model's BatchNorm statistics are re-estimated on `batch`, the step's
    [N, b] train batch."""
    mean_params = aggregate.soup_params(state.workers.params, weights_N)
    pseudo_grad = jax.tree.map(jnp.subtract, state.global_params, mean_params)
    updates, outer_opt_state = self.outer_tx.update(pseudo_grad, state.outer_opt_state,
                                                    state.global_params)
    global_params = optax.apply_updates(state.global_params, updates)
    stats = state.global_batch_stats
    if stats is not None:
      stats = step_lib.batch_statistics(self.model.clone(bn_axis_name=None), global_params,
                                        stats, batch, self.step_config)
    return state.replace(global_params=global_params, global_batch_stats=stats,
                         outer_opt_state=outer_opt_state)

  def _sync(self, state, weights_N, batch):
    """The only cross-worker communication: the outer step, broadcast to every worker."""
    state = self._outer_step(state, weights_N, batch)
    workers = state.workers.replace(params=_broadcast(state.global_params, self.num_workers))
    if state.global_batch_stats is not None:
      workers = workers.replace(
          batch_stats=_broadcast(state.global_batch_stats, self.num_workers))
    return state.replace(workers=workers)

  def after_step(self, state, step: int, batch, last: bool = False):
    """An outer step every H steps, and at the run's last step (whatever H)."""
    if step % self.config.method.sync_every and not last:
      return state
    if self.syncs and self.syncs[-1] == step:  # resumed after this sync: done already
      return state
    self.syncs.append(step)
    return self.sync(state, jnp.asarray(self.healthy, jnp.float32), batch)

  def deployable(self, state, step: int, batch):
    """The model at `step`: the outer step a run stopping now would take (a copy)."""
    if self.syncs and self.syncs[-1] == step:
      return state
    params, stats = self._deployable(state, jnp.asarray(self.healthy, jnp.float32), batch)
    return state.replace(global_params=params, global_batch_stats=stats)

  @staticmethod
  def _global_model(state):
    return state.global_params, state.global_batch_stats

  def host_state(self) -> dict:
    return {**super().host_state(), "syncs": list(self.syncs)}

  def load_host_state(self, host_state: dict) -> None:
    super().load_host_state(host_state)
    if host_state:
      self.syncs = list(host_state["syncs"])

  def _eval_sums(self, state, batch, weights_N):
    """The global model with its own BatchNorm statistics, and each worker as it is."""
    sums = {"per_worker": jax.vmap(metrics_lib.prediction_sums, (0, None, None))(
        self._worker_logits(state.workers, batch), step_lib.targets(batch, self.step_config),
        batch["mask"])}
    one = jax.tree.map(lambda x: x[0], state.workers).replace(
        params=state.global_params, batch_stats=state.global_batch_stats)
    logits = step_lib.predict(one, batch, self.step_config)
    sums["global"] = metrics_lib.prediction_sums(
        logits, step_lib.targets(batch, self.step_config), batch["mask"])
    return sums

  def programs(self, train_batch, eval_batch, eval_batches: int) -> list[Program]:
    """The ensemble's step and eval, plus the outer step.

    The outer step runs at every sync, broadcast back to the workers. It also runs at every
    eval no sync preceded at its step, to make the deployable model: the workers' weight
    all-reduce and the global model's BatchNorm statistics. At a sync step the sync's outer
    step is the deployable model, so its all-reduce is charged once. This host computes it
    for the eval too, and the eval time holds that."""
    a = self._abstract_inputs(train_batch, eval_batch)
    return [*super().programs(train_batch, eval_batch, eval_batches),
            Program("deployable", "unsynced_eval", 1,
                    self._deployable.lower(a.state, a.weights_N, a.train)),
            Program("sync", "sync", 1, self.sync.lower(a.state, a.weights_N, a.train))]

  def final_results(self, state, last_eval, num_steps, train_batches, eval_batches) -> dict:
    out = super().final_results(state.workers, last_eval, num_steps, train_batches,
                                eval_batches)
    out["sync_every"] = self.config.method.sync_every
    out["syncs"] = list(self.syncs)
    return out
