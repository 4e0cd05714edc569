"""Per-example scores from a cheap proxy, and the pools they select.

EL2N, GraNd and loss scores (Paul et al., 2021) rank examples by how hard a proxy a few
epochs in finds them; averaging over proxy seeds removes most of one proxy's noise.
Scores are computed chunk by chunk with one fixed chunk shape, so memory stays bounded by
the chunk and the jitted kernel compiles once whatever the dataset size.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_CHUNK = 4096


def _residual(logits_BxC: jax.Array, labels_B: jax.Array) -> jax.Array:
  """r = softmax(logits) - onehot(label) = dLoss/dlogits of the cross-entropy."""
  logits_BxC = logits_BxC.astype(jnp.float32)
  return jax.nn.softmax(logits_BxC) - jax.nn.one_hot(labels_B, logits_BxC.shape[-1])


@jax.jit
def _loss_kernel(logits_BxC, labels_B):
  logp_BxC = jax.nn.log_softmax(logits_BxC.astype(jnp.float32))
  return -jnp.take_along_axis(logp_BxC, labels_B[:, None], axis=-1)[:, 0]


@jax.jit
def _el2n_kernel(logits_BxC, labels_B):
  return jnp.linalg.norm(_residual(logits_BxC, labels_B), axis=-1)


@jax.jit
def _grand_kernel(logits_BxC, labels_B, embeddings_BxD):
  # Last Dense layer gradient is (e outer r, r): |e outer r|^2 = |e|^2 |r|^2.
  r2_B = jnp.sum(jnp.square(_residual(logits_BxC, labels_B)), axis=-1)
  e2_B = jnp.sum(jnp.square(embeddings_BxD.astype(jnp.float32)), axis=-1)
  return jnp.sqrt(e2_B * r2_B + r2_B)


def _check(logits_NxC, labels_N) -> tuple[np.ndarray, np.ndarray]:
  logits_NxC, labels_N = np.asarray(logits_NxC), np.asarray(labels_N)
  if logits_NxC.ndim != 2 or labels_N.shape != logits_NxC.shape[:1]:
    raise ValueError(f"expected logits [N, C] and labels [N], got {logits_NxC.shape} and "
                     f"{labels_N.shape}; flatten sequence tasks to one row per example first")
  if labels_N.size and (labels_N.min() < 0 or labels_N.max() >= logits_NxC.shape[1]):
    raise ValueError(f"labels must lie in [0, {logits_NxC.shape[1]}), got range "
                     f"[{labels_N.min()}, {labels_N.max()}]")
  return logits_NxC, labels_N.astype(np.int32)


def chunked(kernel: Callable, *arrays_N: np.ndarray, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """Applies a per-row `kernel` over row chunks of one fixed shape (the last one padded)."""
  if chunk <= 0:
    raise ValueError(f"chunk must be positive, got {chunk}")
  n = len(arrays_N[0])
  if n == 0:
    return np.zeros((0,), np.float32)
  size = min(chunk, n)
  out = []
  for start in range(0, n, size):
    parts = [a[start:start + size] for a in arrays_N]
    valid = len(parts[0])
    if valid < size:  # pad with row 0 so the kernel sees the same shape (no recompile)
      parts = [np.concatenate([p, np.repeat(p[:1], size - valid, axis=0)]) for p in parts]
    out.append(np.asarray(kernel(*parts))[:valid])
  return np.concatenate(out)


def loss_scores(logits_NxC, labels_N, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """Cross-entropy of each example: [N] float32."""
  logits_NxC, labels_N = _check(logits_NxC, labels_N)
  return chunked(_loss_kernel, logits_NxC, labels_N, chunk=chunk)


def el2n_scores(logits_NxC, labels_N, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """EL2N: |softmax - onehot|_2 of each example: [N] float32."""
  logits_NxC, labels_N = _check(logits_NxC, labels_N)
  return chunked(_el2n_kernel, logits_NxC, labels_N, chunk=chunk)


def grand_scores(logits_NxC, labels_N, embeddings_NxD=None,
                 chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """GraNd on the last layer: norm of its closed-form gradient, sqrt(|e|^2|r|^2 + |r|^2).

  Without embeddings only the bias part is scored (which then equals EL2N).
  """
  logits_NxC, labels_N = _check(logits_NxC, labels_N)
  if embeddings_NxD is None:
    embeddings_NxD = np.zeros((len(labels_N), 1), np.float32)
  embeddings_NxD = np.asarray(embeddings_NxD)
  if embeddings_NxD.ndim != 2 or len(embeddings_NxD) != len(labels_N):
    raise ValueError(f"embeddings must be [N={len(labels_N)}, D], got {embeddings_NxD.shape}")
  return chunked(_grand_kernel, logits_NxC, labels_N, embeddings_NxD, chunk=chunk)


def average_over_proxies(scores: Sequence[np.ndarray]) -> np.ndarray:
  """Mean score over proxies (seeds): one proxy's ranking is noisy, the mean much less."""
  if len(scores) == 0:
    raise ValueError("average_over_proxies needs at least one score array, got none")
  shapes = {np.shape(s) for s in scores}
  if len(shapes) != 1:
    raise ValueError(f"all proxies must score the same examples, got shapes {sorted(shapes)}")
  return np.mean(np.stack([np.asarray(s, np.float32) for s in scores]), axis=0)


def _top(scores_N: np.ndarray, count: int, keep: str) -> np.ndarray:
  # Stable sort so ties break by index: the selection is deterministic.
  order = np.argsort(-scores_N if keep == "hardest" else scores_N, kind="stable")
  return order[:count]


def select_by_score(scores_N, fraction: float, keep: str = "hardest", labels_N=None,
                    per_class: bool = False) -> np.ndarray:
  """Indices (sorted) of the `fraction` highest (hardest) or lowest (easiest) scores.

  per_class keeps the fraction within each class, so pruning does not unbalance classes.
  At least one example is kept (per class, with per_class).
  """
  scores_N = np.asarray(scores_N)
  if scores_N.ndim != 1 or scores_N.size == 0:
    raise ValueError(f"scores must be a non-empty [N] array, got shape {scores_N.shape}")
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
  if keep not in ("hardest", "easiest"):
    raise ValueError(f"keep={keep!r} unknown; choose 'hardest' or 'easiest'")
  if not per_class:
    return np.sort(_top(scores_N, max(1, int(round(fraction * len(scores_N)))), keep))
  if labels_N is None:
    raise ValueError("per_class=True needs labels; pass labels_N")
  labels_N = np.asarray(labels_N)
  if labels_N.shape != scores_N.shape:
    raise ValueError(f"labels shape {labels_N.shape} must match scores shape {scores_N.shape}")
  picked = []
  for c in np.unique(labels_N):
    members = np.flatnonzero(labels_N == c)
    count = max(1, int(round(fraction * len(members))))
    picked.append(members[_top(scores_N[members], count, keep)])
  return np.sort(np.concatenate(picked))
