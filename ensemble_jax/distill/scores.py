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


def _check(logits_ExC, labels_E) -> tuple[np.ndarray, np.ndarray]:
  logits_ExC, labels_E = np.asarray(logits_ExC), np.asarray(labels_E)
  if logits_ExC.ndim != 2 or labels_E.shape != logits_ExC.shape[:1]:
    raise ValueError(f"expected logits [E, C] and labels [E], got {logits_ExC.shape} and "
                     f"{labels_E.shape}; flatten sequence tasks to one row per example first")
  if labels_E.size and (labels_E.min() < 0 or labels_E.max() >= logits_ExC.shape[1]):
    raise ValueError(f"labels must lie in [0, {logits_ExC.shape[1]}), got range "
                     f"[{labels_E.min()}, {labels_E.max()}]")
  return logits_ExC, labels_E.astype(np.int32)


def chunked(kernel: Callable, *arrays_E: np.ndarray, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """Applies a per-row `kernel` over row chunks of one fixed shape (the last one padded)."""
  if chunk <= 0:
    raise ValueError(f"chunk must be positive, got {chunk}")
  n = len(arrays_E[0])
  if n == 0:
    return np.zeros((0,), np.float32)
  size = min(chunk, n)
  out = []
  for start in range(0, n, size):
    parts = [a[start:start + size] for a in arrays_E]
    valid = len(parts[0])
    if valid < size:  # pad with row 0 so the kernel sees the same shape (no recompile)
      parts = [np.concatenate([p, np.repeat(p[:1], size - valid, axis=0)]) for p in parts]
    out.append(np.asarray(kernel(*parts))[:valid])
  return np.concatenate(out)


def loss_scores(logits_ExC, labels_E, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """Cross-entropy of each example: [E] float32."""
  logits_ExC, labels_E = _check(logits_ExC, labels_E)
  return chunked(_loss_kernel, logits_ExC, labels_E, chunk=chunk)


def el2n_scores(logits_ExC, labels_E, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """EL2N: |softmax - onehot|_2 of each example: [E] float32."""
  logits_ExC, labels_E = _check(logits_ExC, labels_E)
  return chunked(_el2n_kernel, logits_ExC, labels_E, chunk=chunk)


def grand_scores(logits_ExC, labels_E, embeddings_ExD=None,
                 chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """GraNd on the last layer: norm of its closed-form gradient, sqrt(|e|^2|r|^2 + |r|^2).

  Without embeddings only the bias part is scored (which then equals EL2N).
  """
  logits_ExC, labels_E = _check(logits_ExC, labels_E)
  if embeddings_ExD is None:
    embeddings_ExD = np.zeros((len(labels_E), 1), np.float32)
  embeddings_ExD = np.asarray(embeddings_ExD)
  if embeddings_ExD.ndim != 2 or len(embeddings_ExD) != len(labels_E):
    raise ValueError(f"embeddings must be [E={len(labels_E)}, D], got {embeddings_ExD.shape}")
  return chunked(_grand_kernel, logits_ExC, labels_E, embeddings_ExD, chunk=chunk)


def average_over_proxies(scores: Sequence[np.ndarray]) -> np.ndarray:
  """Mean score over proxies (seeds): one proxy's ranking is noisy, the mean much less."""
  if len(scores) == 0:
    raise ValueError("average_over_proxies needs at least one score array, got none")
  shapes = {np.shape(s) for s in scores}
  if len(shapes) != 1:
    raise ValueError(f"all proxies must score the same examples, got shapes {sorted(shapes)}")
  return np.mean(np.stack([np.asarray(s, np.float32) for s in scores]), axis=0)


def _top(scores_E: np.ndarray, count: int, keep: str) -> np.ndarray:
  # Stable sort so ties break by index: the selection is deterministic.
  order = np.argsort(-scores_E if keep == "hardest" else scores_E, kind="stable")
  return order[:count]


def select_by_score(scores_E, fraction: float, keep: str = "hardest", labels_E=None,
                    per_class: bool = False) -> np.ndarray:
  """Indices (sorted) of the `fraction` highest (hardest) or lowest (easiest) scores.

  per_class keeps the fraction within each class, so pruning does not unbalance classes.
  At least one example is kept (per class, with per_class).
  """
  scores_E = np.asarray(scores_E)
  if scores_E.ndim != 1 or scores_E.size == 0:
    raise ValueError(f"scores must be a non-empty [E] array, got shape {scores_E.shape}")
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
  if keep not in ("hardest", "easiest"):
    raise ValueError(f"keep={keep!r} unknown; choose 'hardest' or 'easiest'")
  if not per_class:
    return np.sort(_top(scores_E, max(1, int(round(fraction * len(scores_E)))), keep))
  if labels_E is None:
    raise ValueError("per_class=True needs labels; pass labels_E")
  labels_E = np.asarray(labels_E)
  if labels_E.shape != scores_E.shape:
    raise ValueError(f"labels shape {labels_E.shape} must match scores shape {scores_E.shape}")
  picked = []
  for c in np.unique(labels_E):
    members = np.flatnonzero(labels_E == c)
    count = max(1, int(round(fraction * len(members))))
    picked.append(members[_top(scores_E[members], count, keep)])
  return np.sort(np.concatenate(picked))
