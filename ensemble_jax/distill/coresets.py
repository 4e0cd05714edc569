"""Gradient-matching coresets on closed-form last-layer gradients: CRAIG and GradMatch.

A weighted subset whose gradients sum to the full set's gradient trains (to first order)
like the full set. The last Dense layer's gradient has a closed form from one forward
pass (bias grad r = softmax - onehot, weight grad e outer r), so no backward pass over the
dataset is needed. Pairwise work is done in row chunks of one fixed shape, so memory is
O(chunk * E), never O(E^2).
"""
from __future__ import annotations

import heapq
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ensemble_jax.distill.scores import DEFAULT_CHUNK, _check, _residual

CHUNK = 512


@jax.jit
def _gradients_kernel(embeddings_BxD, logits_BxC, labels_B):
  r_BxC = _residual(logits_BxC, labels_B)
  w_BxDxC = (embeddings_BxD.astype(jnp.float32)[:, :, None] * r_BxC[:, None, :])
  return jnp.concatenate([w_BxDxC.reshape(r_BxC.shape[0], -1), r_BxC], axis=-1)


@jax.jit
def _bias_kernel(logits_BxC, labels_B):
  return _residual(logits_BxC, labels_B)


def last_layer_gradients(embeddings_ExD, logits_ExC, labels_E, include_weight: bool = True,
                         chunk: int = DEFAULT_CHUNK) -> np.ndarray:
  """Per-example gradients of the last Dense layer, [E, D*C + C].

  The weight's come first, then the bias's. With include_weight=False only the bias's,
  [E, C], which takes 1/(D+1) of the memory."""
  logits_ExC, labels_E = _check(logits_ExC, labels_E)
  n = len(labels_E)
  out = []
  for start in range(0, n, chunk):
    stop = min(start + chunk, n)
    if include_weight:
      embeddings = np.asarray(embeddings_ExD)
      if embeddings.ndim != 2 or len(embeddings) != n:
        raise ValueError(f"embeddings must be [E={n}, D], got {embeddings.shape}")
      out.append(np.asarray(_gradients_kernel(embeddings[start:stop], logits_ExC[start:stop],
                                              labels_E[start:stop])))
    else:
      out.append(np.asarray(_bias_kernel(logits_ExC[start:stop], labels_E[start:stop])))
  return np.concatenate(out) if out else np.zeros((0, logits_ExC.shape[1]), np.float32)


@jax.jit
def _distances(a_BxD, g_ExD):
  """Euclidean distances [B, E], through the Gram form (one matmul)."""
  sq = (jnp.sum(a_BxD * a_BxD, -1)[:, None] + jnp.sum(g_ExD * g_ExD, -1)[None, :]
        - 2.0 * a_BxD @ g_ExD.T)
  return jnp.sqrt(jnp.maximum(sq, 0.0))


def _row_chunks(rows_SxD: jax.Array, g_ExD: jax.Array, chunk: int):
  """Yields (start, stop, distances [stop - start, E]) from row chunks to all of g.

  The chunks are padded to one shape, so there is one compile whatever M is."""
  rows_SxD = np.asarray(rows_SxD, np.float32)
  m = rows_SxD.shape[0]
  size = max(1, min(chunk, g_ExD.shape[0]))
  for start in range(0, m, size):
    stop = min(start + size, m)
    rows = np.zeros((size, rows_SxD.shape[1]), np.float32)
    rows[:stop - start] = rows_SxD[start:stop]
    yield start, stop, np.asarray(_distances(rows, g_ExD))[:stop - start]


def _check_k(g_ExD, k: int) -> np.ndarray:
  g_ExD = np.asarray(g_ExD, np.float32)
  if g_ExD.ndim != 2 or len(g_ExD) == 0:
    raise ValueError(f"gradients must be a non-empty [E, D] array, got shape {g_ExD.shape}")
  if not 1 <= k <= len(g_ExD):
    raise ValueError(f"k must lie in [1, E={len(g_ExD)}], got k={k}")
  return g_ExD


def max_distance(g_ExD, chunk: int = CHUNK) -> float:
  """Largest pairwise distance: the offset that makes CRAIG's similarities non-negative."""
  g_np = np.asarray(g_ExD, np.float32)
  return max(float(d.max()) for _, _, d in _row_chunks(g_np, jnp.asarray(g_np), chunk))


def facility_location(g_ExD, indices, max_dist: float | None = None,
                      chunk: int = CHUNK) -> float:
  """F(S) = sum_i max_{j in S} (max_dist - |g_i - g_j|), the objective CRAIG maximises."""
  g_np = np.asarray(g_ExD, np.float32)
  g = jnp.asarray(g_np)
  indices = np.asarray(indices, np.int64)
  if len(indices) == 0:
    return 0.0
  if max_dist is None:
    max_dist = max_distance(g_np, chunk)
  best = np.full(g.shape[0], np.inf)
  for _, _, d_BxE in _row_chunks(g_np[indices], g, chunk):
    best = np.minimum(best, d_BxE.min(axis=0))
  return float(np.sum(max_dist - best))


def craig(g_ExD, k: int, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
  """CRAIG (Mirzasoleiman et al., 2020): facility location by lazy greedy.

  Similarity is max_dist - |g_i - g_j| (non-negative). Returns (indices [k] in pick order,
  weights [k] = how many examples each pick is the nearest pick of; they sum to E).
  """
  g_np = _check_k(g_ExD, k)
  g = jnp.asarray(g_np)
  n = g_np.shape[0]
  # One chunked pass: the largest distance, and each candidate's sum of distances.
  dist_sum_E = np.zeros(n)
  max_dist = 0.0
  for start, stop, d in _row_chunks(g_np, g, chunk):
    dist_sum_E[start:stop] = d.sum(axis=1)
    max_dist = max(max_dist, float(d.max()))
  # With nothing picked, every point's current similarity is 0 (a phantom pick).
  gains = n * max_dist - dist_sum_E
  heap = [(-gains[j], j) for j in range(n)]
  heapq.heapify(heap)
  current_E = np.zeros(n)
  picks = []
  one_row = lambda j: np.asarray(_distances(g_np[j:j + 1], g))[0]
  while len(picks) < k:
    _, j = heapq.heappop(heap)
    sim_E = max_dist - one_row(j)
    gain = np.maximum(sim_E - current_E, 0.0).sum()
    # Gains only shrink as picks are added (submodularity): a fresh gain that still tops
    # every stale upper bound is the true argmax.
    if not heap or gain >= -heap[0][0]:
      picks.append(j)
      current_E = np.maximum(current_E, sim_E)
    else:
      heapq.heappush(heap, (-gain, j))
  picks = np.asarray(picks, np.int64)
  return picks, _nearest_counts(g_np, g, picks, chunk)


def _nearest_counts(g_np: np.ndarray, g: jax.Array, picks: np.ndarray, chunk: int
                    ) -> np.ndarray:
  best_E = np.full(g.shape[0], np.inf)
  owner_E = np.zeros(g.shape[0], np.int64)
  for start, _, d_BxE in _row_chunks(g_np[picks], g, chunk):
    closer = d_BxE.min(axis=0) < best_E
    owner_E[closer] = start + d_BxE.argmin(axis=0)[closer]
    best_E = np.minimum(best_E, d_BxE.min(axis=0))
  return np.bincount(owner_E, minlength=len(picks)).astype(np.float32)


def _nnls_ridge(g_SxD: np.ndarray, target_D: np.ndarray, lam: float) -> np.ndarray:
  """Ridge-regularised non-negative least squares.

  argmin_{w >= 0} |w G - target|^2 + lam |w|^2, solved as NNLS on [G'; sqrt(lam) I]."""
  import scipy.optimize

  s = len(g_SxD)
  a = np.concatenate([g_SxD.T, np.sqrt(lam) * np.eye(s)], axis=0)
  b = np.concatenate([target_D, np.zeros(s)])
  return scipy.optimize.nnls(a, b, maxiter=50 * max(s, 1))[0]


@jax.jit
def _correlations(g_ExD, r_D):
  return g_ExD @ r_D


def gradmatch(g_ExD, k: int, lam: float = 0.5, picks_per_round: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
  """GradMatch (Killamsetty et al., 2021): a weighted coreset matching the gradient sum.

  Orthogonal matching pursuit towards the full gradient sum, with non-negative,
  L2-regularised (`lam`) least-squares weights. Each round adds the `picks_per_round`
  examples most correlated with the residual; 0 means max(1, k // 64). It then re-solves
  the weights with scipy's NNLS, so there are k / picks_per_round solves instead of k.

  Returns (indices, weights) with sum_j w_j g_j ~ sum_i g_i. The weights match the
  gradient, not the count, so they need not sum to E. There are fewer than k picks when no
  remaining example correlates positively with the residual, or when NNLS zeroes a pick's
  weight.
  """
  g_np = _check_k(g_ExD, k)
  if lam < 0:
    raise ValueError(f"lam must be >= 0, got {lam}; it is the L2 penalty on the weights")
  per_round = picks_per_round or max(1, k // 64)
  g = jnp.asarray(g_np)
  g64 = g_np.astype(np.float64)
  target_D = g64.sum(axis=0)
  scale = max(np.linalg.norm(target_D), 1e-30)
  residual_D = target_D.copy()
  picks = np.zeros(0, np.int64)
  w_S = np.zeros(0)
  taken = np.zeros(len(g_np), bool)
  while len(picks) < k and np.linalg.norm(residual_D) > 1e-7 * scale:
    corr_E = np.array(_correlations(g, jnp.asarray(residual_D, jnp.float32)))
    corr_E[taken] = -np.inf
    best = np.argsort(-corr_E, kind="stable")[:min(per_round, k - len(picks))]
    best = best[corr_E[best] > 0]
    if not len(best):
      break
    picks = np.concatenate([picks, best])
    taken[best] = True
    w_S = _nnls_ridge(g64[picks], target_D, lam)
    residual_D = target_D - w_S @ g64[picks]
  keep = w_S > 0  # an OMP pick whose NNLS weight fell to 0 represents nothing
  return picks[keep], w_S[keep].astype(np.float32)
def per_class(select: Callable, g_ExD, labels_E, k: int, **kwargs
              ) -> tuple[np.ndarray, np.ndarray]:
  """Runs `select(g_class, k_class, **kwargs)` within each label.

  k is split by class size, at least one pick per class. Returns the concatenated (global
  indices, weights).

  g_ExD is the gradients [E, D], or a function of example indices returning their rows.
  The function keeps one class's gradients in memory at a time; ImageNet's 1.28M x D
  never materialises.
  """
  labels_E = np.asarray(labels_E)
  rows = g_ExD if callable(g_ExD) else np.asarray(g_ExD).__getitem__
  if not callable(g_ExD) and labels_E.shape != (len(g_ExD),):
    raise ValueError(f"labels must be [E={len(g_ExD)}], got shape {labels_E.shape}")
  classes = np.unique(labels_E)
  if not len(classes) <= k <= len(labels_E):
    raise ValueError(f"per-class selection needs {len(classes)} <= k <= {len(labels_E)} "
                     f"(one pick per class at least), got k={k}")
  indices, weights = [], []
  for c in classes:
    members = np.flatnonzero(labels_E == c)
    k_c = int(min(len(members), max(1, round(k * len(members) / len(labels_E)))))
    idx, w = select(rows(members), k_c, **kwargs)
    indices.append(members[idx])
    weights.append(w)
  return np.concatenate(indices), np.concatenate(weights)
