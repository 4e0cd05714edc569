"""The only coordination of the ensemble: one reduction over the worker axis, at the end.

`combine` turns per-worker logits [N, B, C] into ensemble log-scores [B, C]; workers with
weight 0 (diverged, or routed away) contribute nothing, not even their NaNs.
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
  weights_N = weights_N.astype(jnp.float32)
  valid_N = weights_N > 0
  weights_N = weights_N / jnp.sum(weights_N, axis=0)
  expand = (slice(None),) * weights_N.ndim + (None,) * (logits_Nx.ndim - weights_N.ndim)
  logits_Nx = jnp.where(valid_N[expand], logits_Nx.astype(jnp.float32), 0.0)
  if mode == "logits":
    return jnp.sum(weights_N[expand] * logits_Nx, axis=0)
  if mode == "probs":
    log_w_N = jnp.where(valid_N, jnp.log(jnp.where(valid_N, weights_N, 1.0)), -jnp.inf)
    return jax.nn.logsumexp(jax.nn.log_softmax(logits_Nx) + log_w_N[expand], axis=0)
  raise ValueError(f"combine reduces logits with mode 'logits' or 'probs', not {mode!r} "
                   f"(of {MODES}: 'routed' is 'probs' with routing weights, 'soup' is "
                   "soup_params)")


def soup_params(stacked_tree, weights_N: jax.Array):
  """Weighted average over the leading worker axis (valid only from a shared init)."""
  weights_N = weights_N.astype(jnp.float32) / jnp.sum(weights_N)
  valid_N = weights_N > 0

  def average(x_N):
    x_N = jnp.where(valid_N.reshape((-1,) + (1,) * (x_N.ndim - 1)), x_N, 0)
    return jnp.tensordot(weights_N, x_N.astype(jnp.float32), axes=1).astype(x_N.dtype)

  return jax.tree.map(average, stacked_tree)
