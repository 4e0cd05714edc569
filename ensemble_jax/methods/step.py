"""One model's train state and its pure update step, shared by every method.

`data_parallel` jits `train_step` over a sharded global batch; the stacked engine applies
the same function to each worker inside `shard_map`. Nothing here knows about meshes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from ensemble_jax.data.images import normalize


class TrainState(train_state.TrainState):
  batch_stats: Any = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static inputs of the step: hashable, so jit treats them as constants."""
  mean: tuple[float, ...]
  std: tuple[float, ...]
  label_smoothing: float = 0.0
  # Inside shard_map, the mesh axis one model's batch is split over (per-worker data
  # parallelism): gradients and metrics are averaged over it (BatchNorm syncs its batch
  # statistics itself, through the model's `bn_axis_name`).
  data_axis: str | None = None


def create_train_state(model, tx: optax.GradientTransformation, rng: jax.Array,
                       image_shape: tuple[int, ...]) -> TrainState:
  variables = model.init(rng, jnp.zeros((1, *image_shape), jnp.float32), train=False)
  return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                           batch_stats=variables.get("batch_stats"))


def cross_entropy(logits_BxC: jax.Array, labels_B: jax.Array,
                  label_smoothing: float = 0.0) -> jax.Array:
  """Per-example loss with optional label smoothing."""
  num_classes = logits_BxC.shape[-1]
  targets_BxC = optax.smooth_labels(jax.nn.one_hot(labels_B, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits_BxC.astype(jnp.float32), targets_BxC)


def train_step(state: TrainState, batch: dict, rng: jax.Array, cfg: StepConfig
               ) -> tuple[TrainState, dict]:
  """(state, batch, rng) -> (state, metrics); the rng is folded with the step inside."""
  rng = jax.random.fold_in(rng, state.step)
  inputs = normalize(batch["image"], cfg.mean, cfg.std)

  def loss_fn(params):
    logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                     inputs, train=True, mutable=["batch_stats"],
                                     rngs={"dropout": rng})
    loss = cross_entropy(logits, batch["label"], cfg.label_smoothing).mean()
    return loss, (logits, updates["batch_stats"])

  (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
  if cfg.data_axis is not None:
    grads, loss, accuracy = jax.lax.pmean((grads, loss, accuracy), cfg.data_axis)
  state = state.apply_gradients(grads=grads, batch_stats=batch_stats)
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
  return state, metrics


def predict(state: TrainState, images: jax.Array, cfg: StepConfig) -> jax.Array:
  """Eval-mode logits [B, C] (running BatchNorm statistics)."""
  return state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                        normalize(images, cfg.mean, cfg.std), train=False)


def num_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
