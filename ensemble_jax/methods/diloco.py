"""DiLoCo: the stacked engine plus an outer step every H = `config.method.sync_every` steps.

Inner steps are the ensemble's (no collective over `worker`); every H steps one jitted
sync averages the workers' weights into a pseudo-gradient (global params minus the mean
of worker params), takes an outer Nesterov SGD step on the global params (lr 0.7,
momentum 0.9 in the paper) and broadcasts them back. Inner optimizer states persist
across syncs. With H = infinity and a final logit average instead of a weight average,
this is `Ensemble`: the one sync knob is the only difference.
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
from ensemble_jax.config_lib import ConfigError
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.ensemble import Ensemble


class DiLoCoState(flax.struct.PyTreeNode):
  workers: step_lib.TrainState  # [N, ...] inner states
  global_params: Any  # the outer model, replicated
  outer_opt_state: Any

  @property
  def params(self):
    """The workers' stacked params, as for the ensemble (the outer model: global_params)."""
    return self.workers.params


def _broadcast(tree, n: int):
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), tree)


class DiLoCo(Ensemble):
  name = "diloco"

  def __init__(self, config, model, tx, mesh, init_input):
    m = config.method
    if m.sync_every <= 0:
      raise ConfigError(f"config.method.sync_every={m.sync_every}: DiLoCo syncs every H > 0 "
                        "steps; H = infinity is method.name='ensemble'.")
    momentum = m.outer_momentum if m.outer_momentum > 0 else None
    self.outer_tx = optax.sgd(m.outer_learning_rate, momentum=momentum,
                              nesterov=m.outer_nesterov and momentum is not None)
    super().__init__(config, model, tx, mesh, init_input)
    self.modes = ("global",)  # what DiLoCo trains is one model: the global params
    self.sync = jax.jit(self._sync, out_shardings=self.state_sharding, donate_argnums=0)

  def _init_state(self, rng):
    """Every worker starts from the global params (one init, whatever shared_init says)."""
    workers = jax.vmap(self._init_one)(jnp.broadcast_to(rng, (self.num_workers,)))
    global_params = jax.tree.map(lambda x: x[0], workers.params)
    return DiLoCoState(workers, global_params, self.outer_tx.init(global_params))

  def _shardings(self, abstract_state):
    rep = sharding_lib.replicated(self.mesh)
    return DiLoCoState(
        workers=super()._shardings(abstract_state.workers),
        global_params=jax.tree.map(lambda _: rep, abstract_state.global_params),
        outer_opt_state=jax.tree.map(lambda _: rep, abstract_state.outer_opt_state))

  def _step(self, state, batch, rng):
    workers, metrics = self._stacked_step(state.workers, batch, rng)
    return state.replace(workers=workers), metrics

  def _sync(self, state, weights_N):
    """The only cross-worker communication: one weighted mean of the workers' weights."""
    mean_params = aggregate.soup_params(state.workers.params, weights_N)
    pseudo_grad = jax.tree.map(jnp.subtract, state.global_params, mean_params)
    updates, outer_opt_state = self.outer_tx.update(pseudo_grad, state.outer_opt_state,
                                                    state.global_params)
    global_params = optax.apply_updates(state.global_params, updates)
    workers = state.workers.replace(params=_broadcast(global_params, self.num_workers))
    if workers.batch_stats is not None:
      stats = aggregate.soup_params(workers.batch_stats, weights_N)
      workers = workers.replace(batch_stats=_broadcast(stats, self.num_workers))
    return DiLoCoState(workers, global_params, outer_opt_state)

  def after_step(self, state, step: int):
    if step % self.config.method.sync_every:
      return state
    return self.sync(state, jnp.asarray(self.healthy, jnp.float32))

  def _eval_sums(self, state, batch, weights_N):
    """The global model (BatchNorm statistics: the workers' mean), and each worker."""
    sums = {"per_worker": jax.vmap(metrics_lib.prediction_sums, (0, None, None))(
        self._worker_logits(state.workers, batch), step_lib.targets(batch, self.step_config),
        batch["mask"])}
    stats = state.workers.batch_stats
    if stats is not None:
      stats = aggregate.soup_params(stats, weights_N)
    one = jax.tree.map(lambda x: x[0], state.workers).replace(params=state.global_params,
                                                              batch_stats=stats)
    logits = step_lib.predict(one, batch, self.step_config)
    sums["global"] = metrics_lib.prediction_sums(
        logits, step_lib.targets(batch, self.step_config), batch["mask"])
    return sums

  def final_results(self, state, last_eval, num_steps, train_batches, eval_batches) -> dict:
    out = super().final_results(state.workers, last_eval, num_steps, train_batches,
                                eval_batches)
    out["sync_every"] = self.config.method.sync_every
    out["num_syncs"] = num_steps // self.config.method.sync_every
    return out
