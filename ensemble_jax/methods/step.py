"""One model's train state and its pure update step, shared by every method and task.

`data_parallel` jits `train_step` over a sharded global batch; the stacked engine applies
the same function to each worker inside `shard_map`. Nothing here knows about meshes.
Two tasks share the code: `classification` (batch {"image", "label"}, logits [B, C]) and
`lm` (batch {"tokens"} of T + 1 tokens, logits [B, T, V] predicting tokens[:, 1:]).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from ensemble_jax.data.images import normalize


class TrainState(train_state.TrainState):
  batch_stats: Any = None
  # Sparse models: which parameters exist (True) and which SNIP pruned (False), decided
  # once by `snip_prune` and carried (and checkpointed) with the state; never re-derived
  # from values, so zero-initialised biases and BatchNorm scales still train. None: dense.
  prune_mask: Any = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static inputs of the step: hashable, so jit treats them as constants."""
  task: str = "classification"
  mean: tuple[float, ...] = ()
  std: tuple[float, ...] = ()
  label_smoothing: float = 0.0
  # Inside shard_map, the mesh axis one model's batch is split over (per-worker data
  # parallelism): gradients and metrics are averaged over it (BatchNorm syncs its batch
  # statistics itself, through the model's `bn_axis_name`).
  data_axis: str | None = None

  @classmethod
  def from_config(cls, config, data_axis: str | None = None) -> "StepConfig":
    return cls(config.task, tuple(config.data.mean), tuple(config.data.std),
               config.optim.label_smoothing, data_axis)


def model_inputs(batch: dict, cfg: StepConfig) -> jax.Array:
  if cfg.task == "lm":
    return batch["tokens"][:, :-1]
  return normalize(batch["image"], cfg.mean, cfg.std)


def targets(batch: dict, cfg: StepConfig) -> jax.Array:
  """[B] class labels, or [B, T] next tokens."""
  return batch["tokens"][:, 1:] if cfg.task == "lm" else batch["label"]


def create_train_state(model, tx: optax.GradientTransformation, rng: jax.Array,
                       init_input: jax.ShapeDtypeStruct, sparse: bool = False) -> TrainState:
  """`sparse`: the state carries a prune mask (all True until `snip_prune` decides it)."""
  variables = model.init(rng, jnp.zeros(init_input.shape, init_input.dtype), train=False)
  params = variables["params"]
  mask = jax.tree.map(lambda p: jnp.ones(p.shape, bool), params) if sparse else None
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx,
                           batch_stats=variables.get("batch_stats"), prune_mask=mask)


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0
                  ) -> jax.Array:
  """Per-example (or per-token) loss with optional label smoothing; classes on the last axis."""
  num_classes = logits.shape[-1]
  targets_onehot = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets_onehot)


def _variables(state: TrainState, params) -> dict:
  if state.batch_stats is None:
    return {"params": params}
  return {"params": params, "batch_stats": state.batch_stats}


def train_step(state: TrainState, batch: dict, rng: jax.Array, cfg: StepConfig
               ) -> tuple[TrainState, dict]:
  """(state, batch, rng) -> (state, metrics); the rng is folded with the step inside."""
  rng = jax.random.fold_in(rng, state.step)
  inputs, labels = model_inputs(batch, cfg), targets(batch, cfg)
  mutable = ["batch_stats"] if state.batch_stats is not None else False

  def loss_fn(params):
    out = state.apply_fn(_variables(state, params), inputs, train=True, mutable=mutable,
                         rngs={"dropout": rng})
    logits, updates = out if mutable else (out, {})
    loss = cross_entropy(logits, labels, cfg.label_smoothing)
    if "weight" in batch:  # a weighted coreset: sum_i w_i l_i / sum_i w_i
      per_example = loss.reshape(loss.shape[0], -1).mean(-1)
      loss = jnp.sum(batch["weight"] * per_example) / jnp.maximum(jnp.sum(batch["weight"]), 1e-12)
    else:
      loss = loss.mean()
    return loss, (logits, updates.get("batch_stats"))

  (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
  if cfg.data_axis is not None:
    grads, loss, accuracy = jax.lax.pmean((grads, loss, accuracy), cfg.data_axis)
  if state.prune_mask is not None:  # pruned entries get no gradient and stay exactly 0
    grads = _masked(grads, state.prune_mask)
  state = state.apply_gradients(grads=grads, batch_stats=batch_stats)
  if state.prune_mask is not None:
    state = state.replace(params=_masked(state.params, state.prune_mask))
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
  return state, metrics


def snip_prune(state: TrainState, batch: dict, cfg: StepConfig, sparsity: float) -> TrainState:
  """SNIP (Lee et al., 2019): zero the `sparsity` fraction of kernel weights (ndim > 1)
  with the smallest saliency |dL/dw * w| on one batch, a data-driven mask fixed at init.

  The forward uses running BatchNorm statistics (no batch-stat collectives), so it runs
  unchanged under vmap over stacked workers. The mask goes into `state.prune_mask` (every
  non-kernel parameter kept), which `train_step` applies to every later update.
  """
  inputs, labels = model_inputs(batch, cfg), targets(batch, cfg)

  def loss_fn(params):
    logits = state.apply_fn(_variables(state, params), inputs, train=False)
    return cross_entropy(logits, labels).mean()

  grads = jax.grad(loss_fn)(state.params)
  leaves, treedef = jax.tree.flatten(state.params)
  kernel_ids = [i for i, p in enumerate(leaves) if p.ndim > 1]
  weights = jnp.concatenate([leaves[i].ravel() for i in kernel_ids])
  saliency = jnp.abs(jnp.concatenate([jax.tree.leaves(grads)[i].ravel() for i in kernel_ids])
                     * weights)
  # Exactly `sparsity` of the kernel weights pruned, lowest saliency first; ties (e.g. the
  # zero-saliency branches behind zero-initialised residual BatchNorm scales) by |w|.
  order = jnp.lexsort((jnp.abs(weights), saliency))
  keep = jnp.ones(weights.shape, bool).at[order[:int(sparsity * weights.size)]].set(False)
  offsets = np.cumsum([0] + [leaves[i].size for i in kernel_ids])
  masks = [jnp.ones(p.shape, bool) for p in leaves]
  for j, i in enumerate(kernel_ids):
    masks[i] = keep[offsets[j]:offsets[j + 1]].reshape(leaves[i].shape)
  mask = jax.tree.unflatten(treedef, masks)
  return state.replace(params=_masked(state.params, mask), prune_mask=mask)


def _masked(tree, mask):
  return jax.tree.map(lambda x, m: jnp.where(m, x, jnp.zeros_like(x)), tree, mask)


def batch_statistics(model, params, batch_stats, stacked_batch: dict, cfg: StepConfig):
  """BatchNorm running statistics of `params` re-estimated on a stacked [N, b, ...] batch
  (seen as one batch of N * b): what these weights see, not an average of other models'.

  From zero running statistics one train-mode pass leaves (1 - momentum) x the batch's
  statistics; dividing by it gives them exactly. `model` must not name a mesh axis.
  """
  flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), stacked_batch)
  zeros = jax.tree.map(jnp.zeros_like, batch_stats)
  _, updates = model.apply({"params": params, "batch_stats": zeros}, model_inputs(flat, cfg),
                           train=True, mutable=["batch_stats"])
  keep = 1.0 - model.bn_momentum
  return jax.tree.map(lambda x: x / keep, updates["batch_stats"])


def predict(state: TrainState, batch: dict, cfg: StepConfig) -> jax.Array:
  """Eval-mode logits [B, C] or [B, T, V] (running BatchNorm statistics)."""
  return state.apply_fn(_variables(state, state.params), model_inputs(batch, cfg), train=False)


def predict_with_features(state: TrainState, batch: dict, cfg: StepConfig
                          ) -> tuple[jax.Array, jax.Array]:
  """Eval-mode logits [B, C] and penultimate embeddings [B, D]: what pools score and cluster.

  A model offers its embedding by sowing it as `intermediates/features` (ResNet does); this
  is the one place that reads it.
  """
  logits, inter = state.apply_fn(_variables(state, state.params), model_inputs(batch, cfg),
                                 train=False, mutable=["intermediates"])
  return logits, inter["intermediates"]["features"][0]


def num_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
