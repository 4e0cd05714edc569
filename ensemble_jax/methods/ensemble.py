"""The stacked engine: N independent train states on a leading axis, stepping in lockstep.

Every leaf of the state has shape [N, ...] and is sharded over the mesh's `worker` axis.
The step is `shard_map` over the mesh; inside, each device updates its k = N / W local
workers (by `vmap` or a Python-unrolled loop, `config.method.local_strategy`). The only
collectives allowed inside name `data` (one worker spread over several devices), never
`worker`: workers do not talk until the final reduction in `ensemble_jax/aggregate.py`.
DiLoCo is this engine plus an outer step every H steps; the ensemble is H = infinity.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from ensemble_jax import aggregate, models
from ensemble_jax import metrics as metrics_lib
from ensemble_jax import sharding as sharding_lib
from ensemble_jax.config_lib import ConfigError, aggregation_modes
from ensemble_jax.sharding import (LOCAL_STRATEGIES, map_local_workers, mesh_string,
                                   resolve_local_strategy)
from ensemble_jax.data.pipeline import BatchLayout, to_global
from ensemble_jax.data.samplers import Sampler, create_sampler
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.base import Method, Program, abstract
from ensemble_jax.methods.data_parallel import check_batch_sizes, check_divisible



def eval_plan(task: str, modes: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
  """What every evaluation reduces across workers, and which modes are left for the end.

  Returns ({mode: 'full' or 'targets'}, end modes). `full` reduces the workers' logits,
  [N, B, C] to [B, C], for every metric; `targets` reduces only each worker's
  log-probability of the target, [N, B, T], to the mixture's (`aggregate.mixture_log_probs`).

  Classification reduces every mixture mode (`aggregate.Mode.mixture`) in full at every
  evaluation: its targets are accuracies, which need the mixture's argmax, and C is the
  class count. A language model reduces only what stopping at its target needs: the
  headline mode's perplexity, from the targets' log-probabilities when the mode can
  (`Mode.targets`), else from the full logits. The other modes, and the headline mixture's
  accuracy and ECE, are computed once at the end (`final_results`) from the full logits.
  """
  mixtures = tuple(mode for mode in modes if aggregate.MODES[mode].mixture)
  if task != "lm":
    return {mode: "full" for mode in mixtures}, ()
  headline = modes[0] if modes else None
  plan = {}
  if headline in mixtures:
    plan[headline] = "targets" if aggregate.MODES[headline].targets else "full"
  return plan, tuple(mode for mode in mixtures if plan.get(mode) != "full")


class Ensemble(Method):
  name = "ensemble"
  stacked = True
  per_worker_budget = True
  # Whether config.method.aggregation names modes of aggregate.MODES. DiLoCo's one mode,
  # `global`, is its outer model, which its own `_eval_sums` scores.
  mixes_workers = True

  def __init__(self, config, model, tx, mesh, init_input: jax.ShapeDtypeStruct):
    self.config, self.mesh = config, mesh
    m = config.method
    if "worker" not in mesh.shape:
      raise ConfigError(f"config.mesh={mesh_string(config.mesh)!r}: the ensemble "
                        "needs a 'worker' axis, e.g. 'worker:-1,data:1'.")
    num_shards, data_size = mesh.shape["worker"], mesh.shape.get("data", 1)
    self.num_workers = m.num_workers
    if m.num_workers % num_shards:
      devices = mesh.devices.size
      fits = sharding_lib.fitted_mesh(m.num_workers, jax.device_count(),
                                      sharding_lib.batch_sizes(config))
      raise ConfigError(f"config.method.num_workers={m.num_workers} is not a multiple of the "
                        f"mesh's worker axis={num_shards} (config.mesh="
                        f"{mesh_string(config.mesh)!r} on {devices} devices); use "
                        f"--config.mesh={fits} (the default {sharding_lib.WORKER_MESH} fits "
                        f"N workers to the devices), or N = k * {num_shards}.")
    self.workers_per_shard = m.num_workers // num_shards
    check_batch_sizes(config, data_size)
    self.model = self._normalised(model, data_size)
    self.strategy = resolve_local_strategy(m.local_strategy, jax.default_backend())
    self.modes = aggregation_modes(config)
    self.step_config = step_lib.StepConfig.from_config(
        config, data_axis="data" if data_size > 1 else None)
    self.train_layout = BatchLayout((m.num_workers, config.train.batch_size),
                                    NamedSharding(mesh, P("worker", "data")))
    self.eval_layout = BatchLayout((config.eval.batch_size,), NamedSharding(mesh, P("data")))
    self.healthy = np.ones(m.num_workers, bool)
    self.excluded: list[dict] = []

    self._init_one = functools.partial(step_lib.create_train_state, self.model, tx,
                                       init_input=init_input,
                                       sparse=config.model.sparsity > 0)
    self.state_sharding = self._shardings(jax.eval_shape(self._init_state, jax.random.key(0)))
    rep = sharding_lib.replicated(mesh)
    per_worker = NamedSharding(mesh, P("worker"))
    # A teacher is one set of variables replicated on every device (not stacked): each
    # worker reads its own copy, so its step still needs no collective.
    teacher = (P(),) if config.distill.teacher else ()
    self._stacked_step = jax.shard_map(
        self._local_step, mesh=mesh,
        in_specs=(P("worker"), P("worker", "data"), P()) + teacher,
        out_specs=(P("worker"), P("worker")),
        # Replication over `data` holds by construction: the step pmeans grads and
        # metrics over `data` when it is > 1 (BatchNorm syncs over it itself).
        check_vma=False)
    self.train_step = jax.jit(self._step,
                              in_shardings=(self.state_sharding, self.train_layout.sharding, rep)
                              + (rep,) * len(teacher),
                              out_shardings=(self.state_sharding, per_worker), donate_argnums=0)
    self._worker_logits = jax.shard_map(self._local_logits, mesh=mesh,
                                        in_specs=(P("worker"), P("data")),
                                        out_specs=P("worker", "data"), check_vma=False)
    self._eval_fn = jax.jit(self._eval_sums, out_shardings=rep)
    self.end_modes = eval_plan(config.task, self.modes)[1] if self.mixes_workers else ()
    self._final_fn = jax.jit(self._final_sums, out_shardings=rep)

  # ---- init ----
  def _init_state(self, rng):
    if self.config.method.shared_init:
      keys = jnp.broadcast_to(rng, (self.num_workers,))
    else:
      keys = jax.random.split(rng, self.num_workers)
    return jax.vmap(self._init_one)(keys)

  def _shardings(self, abstract_state):
    return sharding_lib.state_shardings(abstract_state, self.mesh, fsdp=False, min_size=0,
                                        leading=("worker",))

  def init(self, rng: jax.Array):
    return jax.jit(self._init_state, out_shardings=self.state_sharding)(rng)

  def one_model(self):
    return jax.eval_shape(self._init_one, jax.random.key(0))

  def prune(self, states, batch, sparsity: float):
    """SNIP at init, each worker on its own first batch (a one-off: plain vmap)."""
    cfg = dataclasses.replace(self.step_config, data_axis=None)
    prune_one = functools.partial(step_lib.snip_prune, cfg=cfg, sparsity=sparsity)
    return jax.jit(jax.vmap(prune_one), out_shardings=self.state_sharding)(states, batch)

  # `after_step` and `deployable` keep Method's defaults: workers never talk while they
  # train and an eval scores them as they are. DiLoCo overrides both (its outer step).

  def sampler(self, num_examples: int, seed: int) -> Sampler:
    return create_sampler(self.config.method.sampler, num_examples, self.num_workers, seed)

  @property
  def examples_per_step(self) -> int:
    return self.num_workers * self.config.train.batch_size

  # ---- the step: no collective over `worker` ----
  def _step(self, states, batch, rng, *teacher):
    return self._stacked_step(states, batch, rng, *teacher)

  def _local_step(self, states, batch, rng, *teacher):
    first = jax.lax.axis_index("worker") * self.workers_per_shard

    def one(j, state, batch_j):
      return step_lib.train_step(state, batch_j, jax.random.fold_in(rng, first + j),
                                 self.step_config, *teacher)

    return map_local_workers(one, self.strategy, states, batch)

  # ---- evaluation: per-worker logits, then the one reduction over workers ----
  def _local_logits(self, states, batch):
    return map_local_workers(lambda j, s: step_lib.predict(s, batch, self.step_config),
                             self.strategy, states)

  def _eval_sums(self, states, batch, weights_N):
    """Each worker's own metric sums, and the mixtures an evaluation reduces (`eval_plan`)."""
    plan = eval_plan(self.step_config.task, self.modes)[0]
    return mixture_sums(self._worker_logits(states, batch), batch, weights_N, plan,
                        self.step_config, per_worker=True)

  def _final_sums(self, states, batch, weights_N):
    """The end's mixtures in full: the modes, and metrics, evaluations leave out."""
    plan = {mode: "full" for mode in eval_plan(self.step_config.task, self.modes)[1]}
    return mixture_sums(self._worker_logits(states, batch), batch, weights_N, plan,
                        self.step_config, per_worker=False)

  def eval_step(self, states, batch):
    return self._eval_fn(states, batch, jnp.asarray(self.healthy, jnp.float32))

  def finalize_eval(self, sums) -> dict:
    out = {}
    for mode in self.modes:
      if mode in sums:
        for k, v in metrics_lib.finalize(sums[mode], self.config.task).items():
          out[f"{mode}/{k}"] = v
        if "fallback" in sums[mode]:  # examples (tokens) routed only to excluded workers
          out[f"{mode}/fallback"] = int(sums[mode]["fallback"])
    per_worker = [metrics_lib.finalize(jax.tree.map(lambda x: x[i], sums["per_worker"]),
                                       self.config.task) for i in range(self.num_workers)]
    healthy_acc = [w["accuracy"] for w, ok in zip(per_worker, self.healthy) if ok]
    out.update({"worker/accuracy_mean": float(np.mean(healthy_acc)),
                "worker/accuracy_min": float(np.min(healthy_acc)),
                "worker/accuracy_max": float(np.max(healthy_acc)),
                "worker/nll_mean": float(np.mean([w["nll"] for w, ok in
                                                  zip(per_worker, self.healthy) if ok])),
                "per_worker": per_worker})
    default = self.modes[0]
    for key in list(out):
      if key.startswith(default + "/"):
        out[key.split("/", 1)[1]] = out[key]
    return out

  # ---- divergence: a worker whose loss is not finite is excluded, and reported ----
  def host_state(self) -> dict:
    """Which workers diverged: the checkpoint carries it so a resumed run agrees."""
    return {"healthy": self.healthy.tolist(), "excluded": list(self.excluded)}

  def load_host_state(self, host_state: dict) -> None:
    if host_state:
      self.healthy = np.asarray(host_state["healthy"], bool)
      self.excluded = list(host_state["excluded"])

  def check_step_metrics(self, step_metrics: dict, step: int) -> None:
    loss_N = np.asarray(step_metrics["loss"])
    for i in np.flatnonzero(~np.isfinite(loss_N) & self.healthy):
      self.healthy[i] = False
      self.excluded.append({"worker": int(i), "step": int(step), "loss": float(loss_N[i])})
      logging.warning("worker %d diverged at step %d (loss %s): excluded from the ensemble",
                      i, step, loss_N[i])
    if not self.healthy.any():
      raise FloatingPointError(f"all {self.num_workers} workers diverged by step {step}; lower "
                               "config.optim.learning_rate or set config.optim.grad_clip_norm.")

  # ---- soup: average the weights, then re-estimate BatchNorm statistics ----
  def _soup_sums(self, states, weights_N, bn_batches, batch):
    soup = soup_state(self.model, self.step_config, states, weights_N, bn_batches)
    logits = step_lib.predict(soup, batch, self.step_config)
    return metrics_lib.prediction_sums(logits, step_lib.targets(batch, self.step_config),
                                       batch["mask"])

  def final_results(self, state, last_eval: dict, num_steps: int, train_batches,
                    eval_batches) -> dict:
    ensemble = {mode: {k.split("/", 1)[1]: v for k, v in last_eval.items()
                       if k.startswith(mode + "/")} for mode in self.modes
                if not self.mixes_workers or aggregate.MODES[mode].mixture}
    if self.end_modes:  # in full, once: what the evaluations left out (`eval_plan`)
      weights = jnp.asarray(self.healthy, jnp.float32)
      sums = None
      for batch in eval_batches:
        sums = metrics_lib.add_sums(sums, self._final_fn(state, batch, weights))
      for mode in self.end_modes:
        full = metrics_lib.finalize(sums[mode], self.config.task)
        if "fallback" in sums[mode]:
          full["fallback"] = int(sums[mode]["fallback"])
        # What the last evaluation reported stays: it is the model's score at its step.
        ensemble[mode] = {**full, **ensemble[mode]}
    if "soup" in self.modes:
      # Global arrays: a process's local batch holds only its own workers' rows.
      bn_batches = stacked_train_batches(train_batches, self.config.method.soup_bn_batches)
      weights = jnp.asarray(self.healthy, jnp.float32)
      soup_sums = jax.jit(self._soup_sums)
      sums = None
      for batch in eval_batches:
        sums = metrics_lib.add_sums(sums, soup_sums(state, weights, bn_batches, batch))
      ensemble["soup"] = metrics_lib.finalize(sums, self.config.task)
    return {"num_workers": self.num_workers,
            "steps_per_worker": num_steps,
            "local_strategy": self.strategy,
            "workers_per_device": self.workers_per_shard,
            "per_worker": last_eval["per_worker"],
            "ensemble": ensemble,
            "excluded_workers": list(self.excluded),
            # Counted off shapes: the params span processes, so no one process can fetch them.
            "num_params_per_worker": step_lib.num_params(state.params) // self.num_workers}

  # ---- what the cost report charges ----
  def _normalised(self, model, data_size: int):
    """`model` with its BatchNorm (`config.method.batchnorm`) over a worker's batch on its
    `data_size` devices here: synchronised over them, or per device of the cluster the run
    stands for (`cluster_mesh`): each device's rows alone, or, where one device here holds
    several of the cluster's, each of those slices alone (GhostBatchNorm)."""
    spans = self.cluster_mesh(self.config.cost.devices)["data"]
    if self.config.method.batchnorm == "synchronised" or spans == 1:
      return (models.with_batchnorm(model, self.config.model, bn_axis_name="data")
              if data_size > 1 else model)
    if spans % data_size:
      raise ConfigError(
          f"config.method.batchnorm='per_device': each worker stands for {spans} devices "
          f"(config.cost.devices={self.config.cost.devices}) but spans {data_size} here, "
          "so its devices' rows cannot each be normalised alone; set config.cost.devices to "
          f"a multiple of num_workers x {data_size}, or method.batchnorm='synchronised'.")
    return models.with_batchnorm(model, self.config.model, bn_groups=spans // data_size)

  def cluster_mesh(self, devices: int) -> dict[str, int]:
    """The workers' mesh, by default one device per worker times `data` here.

    With D devices each worker spans D / N of them when D is a multiple of N; otherwise
    N / D workers share a device."""
    n, data = self.num_workers, self.mesh.shape.get("data", 1)
    if not devices:
      return {"worker": n, "data": data}
    if devices % n == 0:
      worker, data = n, devices // n
    elif n % devices == 0:
      worker, data = devices, 1
    else:
      raise ConfigError(f"config.cost.devices={devices}: {n} workers cannot share it evenly; "
                        f"choose a multiple or a divisor of method.num_workers={n}.")
    spans = "the devices each worker spans, config.cost.devices / num_workers"
    check_divisible(self.config.train.batch_size, "train.batch_size", data, spans)
    check_divisible(self.config.eval.batch_size, "eval.batch_size", data, spans)
    return {"worker": worker, "data": data}

  def programs(self, train_batch, eval_batch, eval_batches: int) -> list[Program]:
    """The step, the eval step, the end's full mixtures and the soup's average, if any.

    The step's collectives run over `data` only, none when a worker has one device. The
    eval step reduces across workers what a stop-at-target evaluation needs (`eval_plan`):
    a language model's per-worker target log-probabilities, never its logits, unless
    `logits` is the headline. What evaluations leave out is reduced once, at the end
    (`final_eval`)."""
    a = self._abstract_inputs(train_batch, eval_batch)
    out = [Program("train_step", "step", 1,
                   self.train_step.lower(*self.step_args(a.state, a.train, a.rng))),
           Program("eval", "eval", eval_batches,
                   self._eval_fn.lower(a.state, a.eval, a.weights_N))]
    if self.end_modes:  # once, at the end: final_results
      out.append(Program("final_eval", "run", eval_batches,
                         self._final_fn.lower(a.state, a.eval, a.weights_N)))
    if "soup" in self.modes:  # once, at the end: final_results
      count = self.config.method.soup_bn_batches
      bn_batches = abstract(
          jax.tree.map(lambda x: jax.ShapeDtypeStruct((count, *x.shape), x.dtype), a.train),
          NamedSharding(self.mesh, P(None, "worker", "data")))
      out.append(Program("soup", "run", eval_batches, jax.jit(self._soup_sums).lower(
          a.state, a.weights_N, bn_batches, a.eval)))
    return out

  def _abstract_inputs(self, train_batch, eval_batch) -> AbstractInputs:
    return AbstractInputs(
        state=abstract(jax.eval_shape(self._init_state, jax.random.key(0)), self.state_sharding),
        train=abstract(train_batch, self.train_layout.sharding),
        eval=abstract(eval_batch, self.eval_layout.sharding),
        # Uncommitted arrays, as the loop passes them: programs it ran are not compiled again.
        weights_N=jnp.asarray(self.healthy, jnp.float32), rng=jax.random.key(0))


def mixture_sums(logits_NxBx, batch: dict, weights_N, plan: dict[str, str], step_config,
                 per_worker: bool) -> dict:
  """Metric sums of the mixtures `plan` names ({mode: 'full' or 'targets'}, `eval_plan`).

  `logits_NxBx` is [N, B, C] or [N, B, T, V], sharded over workers: each worker's own sums
  (`per_worker`) and its target log-probabilities are computed where its logits are; only
  the mixtures cross workers. `weights_N` is 1 for a healthy worker, 0 for an excluded one.
  """
  labels, mask = step_lib.targets(batch, step_config), batch["mask"]
  sums = {}
  if per_worker:
    sums["per_worker"] = jax.vmap(metrics_lib.prediction_sums, (0, None, None))(
        logits_NxBx, labels, mask)
  if "targets" in plan.values():  # [N, B, T]: one number per worker and target
    log_probs_NxBx = jax.vmap(aggregate.target_log_probs, (0, None))(logits_NxBx, labels)
  for mode, form in plan.items():
    entry = aggregate.MODES[mode]
    weights, fallback_Bx = weights_N, None
    if entry.routed:  # the pool's routing of each example [B, N] or position [B, T, N]
      route_NxBx = jnp.moveaxis(batch["route"].astype(jnp.float32), -1, 0)
      healthy_NxBx = jnp.broadcast_to(
          weights_N.reshape((-1,) + (1,) * (route_NxBx.ndim - 1)), route_NxBx.shape)
      weights = healthy_NxBx * route_NxBx  # renormalised over what is left
      # All of its routed experts excluded: the healthy workers' uniform mixture, counted.
      fallback_Bx = jnp.sum(weights, axis=0) <= 0
      weights = jnp.where(fallback_Bx[None], healthy_NxBx, weights)
    if form == "targets":
      sums[mode] = metrics_lib.nll_sums(entry.targets(log_probs_NxBx, weights), mask)
    else:
      sums[mode] = metrics_lib.prediction_sums(entry.combine(logits_NxBx, weights), labels,
                                               mask)
    if fallback_Bx is not None:
      mask_Bx = mask.reshape(mask.shape + (1,) * (fallback_Bx.ndim - 1))
      sums[mode]["fallback"] = jnp.sum(fallback_Bx * mask_Bx)
  return sums


@dataclasses.dataclass(frozen=True)
class AbstractInputs:
  """The stacked engine's program inputs, as `Method.programs` lowers them.

  The state and batches are ShapeDtypeStructs in their shardings; the small rest are
  arrays."""
  state: Any
  train: dict
  eval: dict
  weights_N: jax.Array
  rng: jax.Array


def soup_state(model, step_config, states, weights_N, bn_batches):
  """The workers' weighted weight average as one model, without the worker axis.

  Valid only from a shared init. Its BatchNorm statistics are re-estimated for its own
  weights on `bn_batches`, [S, N, b, ...] train batches averaged over S. The workers'
  averaged statistics would not match the averaged weights."""
  params = aggregate.soup_params(states.params, weights_N)
  stats = states.batch_stats
  if stats is not None:
    model = model.clone(bn_axis_name=None)  # runs outside shard_map
    like = jax.tree.map(lambda x: x[0], stats)
    stats = jax.tree.map(lambda x: x.mean(0), jax.lax.map(
        lambda b: step_lib.batch_statistics(model, params, like, b, step_config), bn_batches))
  return states.replace(params=params, batch_stats=stats)


def stacked_train_batches(train_batches, count: int) -> dict:
  """The first `count` [N, b] batches of a run's train stream, as [count, N, b, ...].

  They are global arrays: a process's local batch holds only its own workers' rows."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *[
      to_global(train_batches.local_batch(k), train_batches.layout) for k in range(count)])
