"""The only coordination of the ensemble: one reduction over the worker axis, at the end.

Each aggregation mode is a `Mode` in `MODES`, registered with `register_mode`: how it
combines per-worker logits [N, B, C] into ensemble log-scores [B, C] (`combine`), whether it
can instead reduce each worker's log-probability of the target alone, [N, B] or [N, B, T]
(`targets`: what a language model's perplexity needs, whatever the vocabulary), and whether
its weights come from the batch's routing (`routed`). Workers with weight 0 (diverged, or
routed away) contribute nothing, not even their NaNs.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from ensemble_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class Mode:
  """An aggregation mode: what `methods/ensemble.py` must know to evaluate and report it.

  combine: (logits_Nx, weights_N) -> log-scores [..., C]; None for a mode that averages
    weights rather than predictions (`soup`, reduced by `ensemble.final_results`).
  targets: (target log-probs_Nx, weights_N) -> the mode's log-probability of each target,
    equal to `combine` read at the target; None when the mode needs the full logits (a
    language model then reduces [N, B, T, V] at every evaluation it is the headline of).
  routed: its weights are the batch's `route` (a pool that routes, `distill.registry`).
  requires: config -> None, or the fix a config must make to use the mode.
  """
  name: str
  combine: Callable | None
  targets: Callable | None = None
  routed: bool = False
  requires: Callable | None = None

  @property
  def mixture(self) -> bool:
    """Whether it mixes the workers' predictions (every evaluation can score it)."""
    return self.combine is not None


MODES: Registry[Mode] = Registry("method.aggregation")


def register_mode(name: str, *, targets: Callable | None = None, routed: bool = False,
                  requires: Callable | None = None):
  """Decorator: registers `combine(logits_Nx, weights_N) -> log-scores` as mode `name`."""
  def register(combine):
    MODES.register(name, Mode(name, combine, targets, routed, requires))
    return combine

  return register


def combine(logits_Nx: jax.Array, weights_N: jax.Array, mode: str) -> jax.Array:
  """Combines per-worker logits [N, ..., C] into ensemble log-scores [..., C] by `mode`.

  logits_Nx is e.g. [N, B, C] or [N, B, T, V]. weights_N is [N], one per worker, or
  [N, B] for routing, one per worker and example."""
  reduce = MODES[mode].combine
  if reduce is None:
    raise ValueError(f"mode {mode!r} averages weights, not logits (soup_params)")
  return reduce(logits_Nx, weights_N)


def _expanded(weights_N: jax.Array, values_Nx: jax.Array):
  """(weights, validity, log-weights) renormalised and broadcast to `values_Nx`, whose
  excluded workers' values are zeroed."""
  weights_N, valid_N, log_w_N = _normalised(weights_N)
  expand = (slice(None),) * weights_N.ndim + (None,) * (values_Nx.ndim - weights_N.ndim)
  values_Nx = jnp.where(valid_N[expand], values_Nx.astype(jnp.float32), 0.0)
  return weights_N[expand], values_Nx, log_w_N[expand]


@register_mode("logits")
def mean_logits(logits_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The weighted mean of logits (the default headline)."""
  weights, logits_Nx, _ = _expanded(weights_N, logits_Nx)
  return jnp.sum(weights * logits_Nx, axis=0)


def mixture_log_probs(log_probs_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The `probs` mixture's log-probability of each target, from the workers' own.

  log p(y) = logsumexp_i (log w_i + log p_i(y)): `combine(logits, w, 'probs')` read at the
  target, equal to it up to float rounding. `log_probs_Nx` is [N, B] or [N, B, T]
  (`target_log_probs` of each worker); `weights_N` is [N], or [N, B] / [N, B, T] for
  routing. What crosses workers is one number per worker and target, whatever the
  vocabulary.
  """
  _, log_probs_Nx, log_w = _expanded(weights_N, log_probs_Nx)
  return jax.nn.logsumexp(log_probs_Nx + log_w, axis=0)


@register_mode("probs", targets=mixture_log_probs)
def mixture(logits_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The log of the weighted mean of probabilities: the mixture's predictive distribution,
  so its NLL is the ensemble's proper perplexity."""
  _, logits_Nx, log_w = _expanded(weights_N, logits_Nx)
  return jax.nn.logsumexp(jax.nn.log_softmax(logits_Nx) + log_w, axis=0)


def _soup_requires(config) -> str | None:
  if not config.method.shared_init:
    return ("'soup' averages weights, which is only meaningful from one shared init: set "
            "config.method.shared_init=True or drop 'soup'.")
  return None


# c-BTM: `probs` with per-example weights from the distance of each example to the
# workers' k-means clusters (ensemble_jax/distill/clusters.py:routing_weights).
register_mode("routed", targets=mixture_log_probs, routed=True)(mixture)
# The workers' weights averaged into one model (`soup_params`, `ensemble.soup_state`).
MODES.register("soup", Mode("soup", None, requires=_soup_requires))


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


def soup_params(stacked_tree, weights_N: jax.Array):
  """Weighted average over the leading worker axis (valid only from a shared init)."""
  weights_N = weights_N.astype(jnp.float32) / jnp.sum(weights_N)
  valid_N = weights_N > 0

  def average(x_N):
    x_N = jnp.where(valid_N.reshape((-1,) + (1,) * (x_N.ndim - 1)), x_N, 0)
    return jnp.tensordot(weights_N, x_N.astype(jnp.float32), axes=1).astype(x_N.dtype)

  return jax.tree.map(average, stacked_tree)


def routed(modes) -> bool:
  """Whether any of `modes` weights the workers by the batch's routing (DiLoCo's `global`,
  not a mode of the ensemble, does not)."""
  return any(MODES[mode].routed for mode in modes if mode in MODES)
