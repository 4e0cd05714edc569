"""The only coordination of the ensemble: one reduction over the worker axis, at the end.

`combine` turns per-worker logits [N, B, C] into ensemble log-scores [B, C]; workers with
weight 0 (diverged, or routed away) contribute nothing, not even their NaNs.
`mixture_log_probs` is the same mixture at one class only: each worker's log-probability
of the target, [N, B] or [N, B, T], reduced to the mixture's. A language model's perplexity
needs only that, so its evaluations reduce [N, B, T] instead of [N, B, T, V] logits.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ensemble_jax.config_lib import AGGREGATION_MODES as MODES

# `logits` and `probs` reduce logits (`combine`); `routed` is `probs` with per-example
# weights from the distance of each example to the workers' k-means clusters (c-BTM;
# ensemble_jax/distill/clusters.py:routing_weights); `soup` averages weights instead
# (`soup_params`). MODES, all four, is config_lib's list: validation checks against it.


def combine(logits_Nx: jax.Array, weights_N: jax.Array, mode: str) -> jax.Array:
  """Combines per-worker logits [N, ..., C] into ensemble log-scores [..., C].

  `logits` takes the weighted mean of logits. `probs` takes the log of the weighted mean of
  probabilities. That is the mixture's predictive distribution, so its NLL is the
  ensemble's proper perplexity.

  logits_Nx is e.g. [N, B, C] or [N, B, T, V]. weights_N is [N], one per worker, or
  [N, B] for routing, one per worker and example.
  """
  weights_N, valid_N, log_w_N = _normalised(weights_N)
  expand = (slice(None),) * weights_N.ndim + (None,) * (logits_Nx.ndim - weights_N.ndim)
  logits_Nx = jnp.where(valid_N[expand], logits_Nx.astype(jnp.float32), 0.0)
  if mode == "logits":
    return jnp.sum(weights_N[expand] * logits_Nx, axis=0)
  if mode == "probs":
    return jax.nn.logsumexp(jax.nn.log_softmax(logits_Nx) + log_w_N[expand], axis=0)
  raise ValueError(f"combine reduces logits with mode 'logits' or 'probs', not {mode!r} "
                   f"(of {MODES}: 'routed' is 'probs' with routing weights, 'soup' is "
                   "soup_params)")


def _normalised(weights_N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The weights renormalised over the workers, which of them count, and their logs.

  A worker of weight 0 counts for nothing: its log-weight is -inf."""
  weights_N = weights_N.astype(jnp.float32)
  valid_N = weights_N > 0
  weights_N = weights_N / jnp.sum(weights_N, axis=0)
  log_w_N = jnp.where(valid_N, jnp.log(jnp.where(valid_N, weights_N, 1.0)), -jnp.inf)
  return weights_N, valid_N, log_w_N


def target_log_probs(logits_Bx: jax.Array, labels_B: jax.Array) -> jax.Array:
  """One model's log-probability of each target: logits [B, C] or [B, T, V] -> [B] or
  [B, T]."""
  log_probs = jax.nn.log_softmax(logits_Bx.astype(jnp.float32))
  return jnp.take_along_axis(log_probs, labels_B[..., None], axis=-1)[..., 0]


def mixture_log_probs(log_probs_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The `probs` mixture's log-probability of each target, from the workers' own.

  log p(y) = logsumexp_i (log w_i + log p_i(y)): `combine(logits, w, 'probs')` read at the
  target, equal to it up to float rounding. `log_probs_Nx` is [N, B] or [N, B, T]
  (`target_log_probs` of each worker); `weights_N` is [N], or [N, B] / [N, B, T] for
  routing. What crosses workers is one number per worker and target, whatever the
  vocabulary.
  """
  _, valid_N, log_w_N = _normalised(weights_N)
  expand = (slice(None),) * log_w_N.ndim + (None,) * (log_probs_Nx.ndim - log_w_N.ndim)
  log_probs_Nx = jnp.where(valid_N[expand], log_probs_Nx.astype(jnp.float32), 0.0)
  return jax.nn.logsumexp(log_probs_Nx + log_w_N[expand], axis=0)


def soup_params(stacked_tree, weights_N: jax.Array):
  """Weighted average over the leading worker axis (valid only from a shared init)."""
  weights_N = weights_N.astype(jnp.float32) / jnp.sum(weights_N)
  valid_N = weights_N > 0

  def average(x_N):
    x_N = jnp.where(valid_N.reshape((-1,) + (1,) * (x_N.ndim - 1)), x_N, 0)
    return jnp.tensordot(weights_N, x_N.astype(jnp.float32), axes=1).astype(x_N.dtype)

  return jax.tree.map(average, stacked_tree)
