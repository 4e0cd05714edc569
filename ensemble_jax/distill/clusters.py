"""k-means clusters of the training set: worker i trains on cluster i (c-BTM style).

The clusters live in a proxy's embedding space. At aggregation each input is routed to the
experts of its nearest centroids. A text window is routed position by position, each on the
tf-idf of its running prefix, the context the model sees (`TfIdf.transform_prefixes`); never
on the tokens it predicts.

The balanced variant caps every cluster near E/k, so no worker gets a tiny shard (and an
ensemble step of stacked workers does not wait on the biggest one).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ensemble_jax import data as data_lib
from ensemble_jax.distill import shards


@jax.jit
def _sq_distances(x_ExD: jax.Array, c_KxD: jax.Array) -> jax.Array:
  sq = (jnp.sum(x_ExD * x_ExD, -1)[:, None] + jnp.sum(c_KxD * c_KxD, -1)[None, :]
        - 2.0 * x_ExD @ c_KxD.T)
  return jnp.maximum(sq, 0.0)


@functools.partial(jax.jit, static_argnums=1)
def _plus_plus(x_ExD: jax.Array, k: int, rng: jax.Array) -> jax.Array:
  """k-means++ seeding: each next centroid drawn with probability ~ d^2 to the nearest."""
  n = x_ExD.shape[0]
  rng, first = jax.random.split(rng)
  c_KxD = jnp.zeros((k, x_ExD.shape[1]), x_ExD.dtype).at[0].set(
      x_ExD[jax.random.randint(first, (), 0, n)])
  d2_E = _sq_distances(x_ExD, c_KxD[:1])[:, 0]

  def body(i, carry):
    c_KxD, d2_E, rng = carry
    rng, key = jax.random.split(rng)
    # All-zero d2 (fewer distinct points than k): fall back to a uniform draw.
    p_E = jnp.where(jnp.sum(d2_E) > 0, d2_E / jnp.maximum(jnp.sum(d2_E), 1e-30), 1.0 / n)
    pick = jax.random.choice(key, n, p=p_E)
    c_KxD = c_KxD.at[i].set(x_ExD[pick])
    d2_E = jnp.minimum(d2_E, _sq_distances(x_ExD, x_ExD[pick][None])[:, 0])
    return c_KxD, d2_E, rng

  c_KxD, _, _ = jax.lax.fori_loop(1, k, body, (c_KxD, d2_E, rng))
  return c_KxD


_NO_KEY = np.uint64(np.iinfo(np.uint64).max)


def _balanced_assign(d2_ExK: np.ndarray) -> np.ndarray:
  """Balanced assignment: every cluster holds floor(E/k) or ceil(E/k) points.

  A greedy pass over (point, cluster) pairs, nearest first (ties: lower point, then lower
  cluster), under capacities that sum to E; at most E mod k clusters hold the ceil.

  Computed exactly, without sorting the E * k pairs. A pair the greedy skips has its point
  placed or its cluster full, and both are final, so its next placement is the smallest of
  the unplaced points' nearest open pairs. Between two cluster closures these placements
  are a sorted run of the points' nearest open clusters. A round keeps the unplaced points
  sorted by their nearest open pair, finds the closing positions (where an open cluster
  reaches its capacity) in a head of that sequence, and places everything up to the
  closures it can take in order: those before the first new pair of a point whose cluster
  closed. Those points move on to their nearest open cluster, merged back into the
  sequence. At most k + 1 closures, so at most k + 1 rounds of O(E k) numpy. Equal to
  `_balanced_assign_pairwise`, the pair-at-a-time greedy (tests/test_balanced_assign.py).
  """
  n, k = d2_ExK.shape
  if n >= 2**32:
    raise ValueError(f"at most 2^32 - 1 points, got {n}")
  greedy = _Greedy(d2_ExK)
  cand, key = greedy.nearest_open(None)
  order = np.argsort(key)
  seq = cand[order], key[order]  # a key's low bits are its point
  while len(seq[0]):
    seq = greedy.round(*seq)
  return greedy.assign


class _Greedy:
  """`_balanced_assign`'s state between rounds: the placements, the clusters' counts and
  which are open."""

  def __init__(self, d2_ExK: np.ndarray):
    n, self.k = d2_ExK.shape
    self.floor, self.extra = n // self.k, n % self.k
    self.d2_ExK = np.ascontiguousarray(d2_ExK, np.float32)  # read, never written
    # Non-negative floats order as their bits, -0.0 as +0.0 once its sign bit is cleared
    # (`nearest_open` clears it: argmin already ties them).
    self.bits_ExK = self.d2_ExK.view(np.uint32)
    # small ints: numpy's stable sort is a radix sort
    self.cdt = np.int16 if self.k < 2**15 else np.int32
    self.assign, self.count = np.full(n, -1, np.int32), np.zeros(self.k, np.int64)
    self.open_k, self.num_extra = np.ones(self.k, bool), 0
    self.span = max(1, 4 * n // self.k)  # the sequence's head a round counts first

  def nearest_open(self, rows):
    """The rows' nearest open clusters and their pair keys (distance bits, row): unique
    per point, and ordered as the greedy's pairs. `rows` None: every row."""
    if rows is None:
      rows = np.arange(len(self.d2_ExK), dtype=np.int64)
      sub = self.d2_ExK if self.open_k.all() else self.d2_ExK.copy()
    else:
      sub = np.take(self.d2_ExK, rows, axis=0)
    if not self.open_k.all():
      sub[:, ~self.open_k] = np.inf
    c = np.argmin(sub, axis=1)  # the first minimum: the lower cluster
    bits = np.take(self.bits_ExK.reshape(-1), rows * self.k + c) & np.uint32(0x7FFFFFFF)
    key = (bits.astype(np.uint64) << np.uint64(32)) | rows.astype(np.uint64)
    return c.astype(self.cdt), key

  def round(self, seq_c, seq_key):
    """Places the sorted sequence (its points' nearest open clusters and pair keys) up to
    the closures it can take in order; returns the sequence of the points still unplaced
    (empty when all are placed)."""
    k, extras_mode, n = self.k, self.num_extra < self.extra, len(seq_key)
    need = (self.floor + 1 if extras_mode else self.floor) - self.count  # until it closes
    # The next closures lie in a head of the sequence: counted there, the head quadrupled
    # until a cluster fills (the rest's pairs come after all of the head's, moved or not).
    w = min(n, 2 * self.span)
    while True:
      sizes = np.bincount(seq_c[:w], minlength=k)
      closing = self.open_k & (sizes >= need)
      if closing.any() or w == n:
        break
      w = min(n, 4 * w)
    if not closing.any():  # no cluster fills: every point takes its nearest open one
      self.assign[_rows(seq_key)] = seq_c
      return seq_c[:0], seq_key[:0]
    by_c = np.argsort(seq_c[:w], kind="stable")  # head positions grouped by cluster
    starts = np.cumsum(sizes) - sizes
    close_pos, last, extras_spent, reuse = self._close(
        seq_key, by_c, starts, sizes, need, np.flatnonzero(closing), extras_mode)
    # Everything up to the last closure is placed but the points of clusters closed before
    # them; after it, the points of closed clusters move on.
    self.span = last + 1
    head_c, head_key = seq_c[:last + 1], seq_key[:last + 1]
    took = np.arange(last + 1) <= close_pos[head_c]
    self.assign[_rows(head_key[took])] = head_c[took]
    self.count += np.bincount(head_c[took], minlength=k)
    if extras_spent:
      self.open_k &= self.count != self.floor
    tail_c, tail_key = seq_c[last + 1:], seq_key[last + 1:]
    keep = self.open_k[tail_c]
    rest_c, rest_key = tail_c[keep], tail_key[keep]
    if reuse is not None:  # the one closed cluster's points after it, as `_close` moved them
      new_c, new_key = reuse
      beyond = tail_key[w - last - 1:][~keep[w - last - 1:]]  # and those past the head
      if len(beyond):
        more_c, more_key = self.nearest_open(_rows(beyond))
        new_c, new_key = np.concatenate([new_c, more_c]), np.concatenate([new_key, more_key])
    else:
      moved = np.concatenate([head_key[~took], tail_key[~keep]])
      if not len(moved):
        return rest_c, rest_key
      new_c, new_key = self.nearest_open(_rows(moved))
    o = np.argsort(new_key)
    new_c, new_key = new_c[o], new_key[o]
    # A merge of two sorted runs (keys are unique): the new pairs' places, the rest around.
    at = np.searchsorted(rest_key, new_key) + np.arange(len(new_key))
    others = np.ones(len(rest_key) + len(new_key), bool)
    others[at] = False
    out_c, out_key = np.empty(len(others), seq_c.dtype), np.empty(len(others), np.uint64)
    out_c[at], out_key[at] = new_c, new_key
    out_c[others], out_key[others] = rest_c, rest_key
    return out_c, out_key

  def _close(self, seq_key, by_c, starts, sizes, need, ev, extras_mode):
    """Closes the clusters that fill, in sequence order, while no moved point's new pair
    comes first: (each cluster's closing position, the last closure's, whether the ceil
    clusters ran out, and when one cluster closed and no other did, the new pairs (clusters,
    keys) of its points in the head after it, else None)."""
    ev_pos = by_c[starts[ev] + need[ev] - 1]
    o = np.argsort(ev_pos)
    close_pos = np.full(self.k, len(seq_key), np.int64)
    first_moved, last, extras_spent, pairs, closed = _NO_KEY, -1, False, None, 0
    for c, p in zip(ev[o].tolist(), ev_pos[o].tolist()):
      if seq_key[p] >= first_moved:  # a moved point may come first: next round
        break
      self.open_k[c], close_pos[c], last, closed = False, p, p, closed + 1
      if extras_mode:
        self.num_extra += 1
        extras_spent = self.num_extra == self.extra
      if extras_spent:  # clusters at floor close too: next round
        break
      moved = by_c[starts[c] + need[c]:starts[c] + sizes[c]]
      pairs = None
      if len(moved) and self.open_k.any():
        pairs = self.nearest_open(_rows(seq_key[moved]))
        first_moved = min(first_moved, pairs[1].min())
    return close_pos, last, extras_spent, pairs if closed == 1 and not extras_spent else None


def _rows(keys: np.ndarray) -> np.ndarray:
  """The points of pair keys (their low 32 bits)."""
  return (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _balanced_assign_pairwise(d2_ExK: np.ndarray) -> np.ndarray:
  """The reference of `_balanced_assign`: the same greedy, one sorted pair at a time.

  A greedy pass over (point, cluster) pairs, nearest first, under capacities that sum to E;
  at most E mod k clusters hold the ceil.

  A Python pass over all E * k pairs sorted by distance: ~10x slower than
  `_balanced_assign` at E = 60,000, k = 64. Kept for the tests and the pool benchmark.
  """
  n, k = d2_ExK.shape
  floor, extra = n // k, n % k
  order = np.argsort(d2_ExK.reshape(-1), kind="stable").tolist()
  assign, count, num_extra, placed = [-1] * n, [0] * k, 0, 0
  for pair in order:
    i, c = divmod(pair, k)
    if assign[i] >= 0:
      continue
    if count[c] < floor or (count[c] == floor and num_extra < extra):
      num_extra += count[c] == floor
      assign[i], count[c], placed = c, count[c] + 1, placed + 1
      if placed == n:
        break
  return np.asarray(assign, np.int32)


@functools.partial(jax.jit, static_argnames=("k",))
def _update(x_ExD, a_E, c_KxD, k: int):
  onehot_ExK = jax.nn.one_hot(a_E, k, dtype=x_ExD.dtype)
  count_K = onehot_ExK.sum(0)
  mean_KxD = onehot_ExK.T @ x_ExD / jnp.maximum(count_K, 1.0)[:, None]
  # An emptied cluster keeps its centroid rather than collapsing to the origin.
  return jnp.where(count_K[:, None] > 0, mean_KxD, c_KxD)


@functools.partial(jax.jit, static_argnames=("k", "iters"))
def _lloyd(x_ExD, c_KxD, k: int, iters: int):
  """`iters` unconstrained Lloyd steps in one device program."""
  def body(_, c_KxD):
    return _update(x_ExD, jnp.argmin(_sq_distances(x_ExD, c_KxD), axis=-1), c_KxD, k)

  return jax.lax.fori_loop(0, iters, body, c_KxD)


def _kmeans(x_ExD, rng, k: int, iters: int, balanced: bool, balanced_iters: int | None):
  def assign(c_KxD):
    d2_ExK = _sq_distances(x_ExD, c_KxD)
    return (jnp.asarray(_balanced_assign(np.asarray(d2_ExK))) if balanced
            else jnp.argmin(d2_ExK, axis=-1))

  c_KxD = _plus_plus(x_ExD, k, rng)
  host_iters = iters if balanced_iters is None or not balanced else min(balanced_iters, iters)
  if host_iters < iters:  # the unconstrained steps first, on the device
    c_KxD = _lloyd(x_ExD, c_KxD, k, iters - host_iters)
  for _ in range(host_iters):  # Lloyd's steps, driven from the host (the balanced greedy is)
    c_KxD = _update(x_ExD, assign(c_KxD), c_KxD, k)
  return assign(c_KxD), c_KxD


# The entropic temperature, over the mean squared distance to the nearest centroid: annealed
# geometrically from the first to the last Lloyd step, and the final prices at the last. Hot,
# the prices converge in a few steps; cold, a point's soft assignment is near its hard one,
# so the hard counts near the soft (on tf-idf a fixed 0.1 left ~5 clusters per point).
SINKHORN_EPSILON = (0.3, 0.03)
SINKHORN_STEPS = 20  # at most, price steps per Lloyd step
SINKHORN_TOL = 0.01  # a Lloyd step's price steps stop once every soft count is within 1%
# Over-relaxed Sinkhorn: each price step moves 1.8x Sinkhorn-Knopp's (which converges slowly
# when cold; the docs at N = 64: x0.997 the greedy's objective at 1.0, x0.982 at 1.8).
SINKHORN_OVERRELAX = 1.8
SINKHORN_FINAL = 40  # price steps on the last centroids before the final assignment


def _first_argmin(z_ExK: jax.Array) -> jax.Array:
  """argmin over the last axis, ties to the lower index, as two plain reductions (XLA:CPU's
  variadic argmin reduction is ~5x slower than a min)."""
  m_Ex1 = jnp.min(z_ExK, -1, keepdims=True)
  iota = jax.lax.broadcasted_iota(jnp.int32, z_ExK.shape, 1)
  return jnp.min(jnp.where(z_ExK <= m_Ex1, iota, z_ExK.shape[1]), -1)


def _sinkhorn_prices(d2_ExK, p_K, eps, steps: int, tol: float = 0.0):
  """Sinkhorn-Knopp steps on the clusters' prices (log column scalings) toward equal soft
  counts E / k at temperature `eps`: `steps` of them, fewer once every soft count is within
  `tol` of E / k."""
  n, k = d2_ExK.shape
  log_cap = jnp.log(n / k)

  def soft_counts(p_K):
    z_ExK = -(d2_ExK + p_K) / eps
    w_ExK = jnp.exp(z_ExK - jnp.max(z_ExK, -1, keepdims=True))
    return jnp.sum(w_ExK / jnp.sum(w_ExK, -1, keepdims=True), 0)

  def cond(carry):
    i, _, soft_K = carry
    return (i < steps) & (jnp.max(jnp.abs(soft_K * (k / n) - 1.0)) > tol)

  def step(carry):
    i, p_K, soft_K = carry
    p_K = p_K + SINKHORN_OVERRELAX * eps * (jnp.log(jnp.maximum(soft_K, 1e-30)) - log_cap)
    return i + 1, p_K, soft_counts(p_K)

  return jax.lax.while_loop(cond, step, (0, p_K, soft_counts(p_K)))[1]


@functools.partial(jax.jit, static_argnames=("k", "iters"))
def _sinkhorn_lloyd(x_ExD, c_KxD, k: int, iters: int):
  """Balanced Lloyd in one device program: each step assigns every point to its cheapest
  cluster at prices (d^2 + price) that warm-started Sinkhorn steps move toward equal counts,
  and moves the centroids to their points' means. Returns the centroids and the priced
  distances [E, K] of the final assignment."""
  n = x_ExD.shape[0]
  first, last = SINKHORN_EPSILON

  def temperature(d2_ExK, t):  # t in [0, 1]: the first to the last temperature
    scale = jnp.maximum(jnp.mean(jnp.min(d2_ExK, -1)), 1e-30)  # > 0 on coincident points
    return first * (last / first) ** t * scale

  def body(i, carry):
    c_KxD, p_K = carry
    d2_ExK = _sq_distances(x_ExD, c_KxD)
    eps = temperature(d2_ExK, i / max(iters - 1, 1))
    p_K = _sinkhorn_prices(d2_ExK, p_K, eps, SINKHORN_STEPS, SINKHORN_TOL)
    a_E = _first_argmin(d2_ExK + p_K)
    sum_KxD = jax.ops.segment_sum(x_ExD, a_E, k)
    count_K = jax.ops.segment_sum(jnp.ones(n, x_ExD.dtype), a_E, k)
    mean_KxD = sum_KxD / jnp.maximum(count_K, 1.0)[:, None]
    return jnp.where(count_K[:, None] > 0, mean_KxD, c_KxD), p_K

  c_KxD, p_K = jax.lax.fori_loop(0, iters, body, (c_KxD, jnp.zeros(k, x_ExD.dtype)))
  d2_ExK = _sq_distances(x_ExD, c_KxD)
  p_K = _sinkhorn_prices(d2_ExK, p_K, temperature(d2_ExK, 1.0), SINKHORN_FINAL)
  # Shifted to non-negative prices: the same order of pairs, and the greedy's keys are the
  # bits of non-negative floats.
  return c_KxD, jnp.maximum(d2_ExK + (p_K - jnp.min(p_K)), 0.0)


BALANCES = ("greedy", "sinkhorn")


def kmeans(x_ExD, k: int, seed: int = 0, iters: int = 20, balanced: bool = False,
           balanced_iters: int | None = None, balance: str = "greedy"
           ) -> tuple[np.ndarray, np.ndarray]:
  """Lloyd's k-means from k-means++ seeds: (assignments [E] int, centroids [K, D]).

  Deterministic in seed. balanced=True assigns greedily under capacity ceil(E/k), with
  sizes within 1 of each other (`_balanced_assign`: a host pass of at most k + 1 numpy
  rounds per iteration). `balanced_iters` (None: all): only the last that many Lloyd
  steps assign under the capacities, the others unconstrained in one device program; the
  final assignment is balanced either way (experiments/bench/kmeans_schedules.py measures
  what it costs the objective).

  balance="sinkhorn" (with balanced=True): all Lloyd steps in one device program, each
  point to its cheapest cluster at Sinkhorn-Knopp prices that hold the counts near E/k
  (`_sinkhorn_lloyd`), then one host pass: `_balanced_assign` on the priced distances, so
  sizes are within 1 as above. No host pass per step; other clusters than the greedy's.

  The prices follow the centroids: up to SINKHORN_STEPS over-relaxed price steps per Lloyd
  step, at a temperature annealed from 0.3 to 0.03 x the mean squared distance to the
  nearest centroid. One step per Lloyd step at a fixed 0.1 lagged on the docs' tf-idf at
  N = 64: soft counts 643-1743 around E/k = 1299 at the end, each point's soft assignment
  spread over ~5 clusters (exp of its entropy; 1.6 on Fashion-MNIST's PCA), so the final
  greedy moved 14% of the points and the objective was x1.127 the greedy's. Now the final
  greedy moves 0.9% and the objective is x0.98 (x0.96-0.98 over seeds 0-3; Fashion-MNIST
  N = 64 x0.95, both N = 8 x0.98-0.99). On separated blobs of unequal sizes (few points
  near two clusters) the prices still cannot keep up at the lower temperatures: x0.55-2.1
  the greedy's there (before x0.5-5.3).
  """
  x_ExD = np.asarray(x_ExD, np.float32)
  if x_ExD.ndim != 2:
    raise ValueError(f"kmeans expects [E, D] points, got shape {x_ExD.shape}")
  if not 1 <= k <= len(x_ExD):
    raise ValueError(f"k must lie in [1, E={len(x_ExD)}], got k={k}")
  if iters < 0:
    raise ValueError(f"iters must be >= 0, got {iters}")
  if balanced_iters is not None and balanced_iters < 0:
    raise ValueError(f"balanced_iters must be >= 0 or None, got {balanced_iters}")
  if balance not in BALANCES:
    raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
  if balanced and balance == "sinkhorn":
    if balanced_iters is not None:
      raise ValueError("balanced_iters is a schedule of the greedy balance only")
    x = jnp.asarray(x_ExD)
    c_KxD, priced_ExK = _sinkhorn_lloyd(x, _plus_plus(x, k, jax.random.key(seed)), k, iters)
    return _balanced_assign(np.asarray(priced_ExK)), np.asarray(c_KxD)
  a_E, c_KxD = _kmeans(jnp.asarray(x_ExD), jax.random.key(seed), k, iters, balanced,
                       balanced_iters)
  return np.asarray(a_E), np.asarray(c_KxD)


@functools.partial(jax.jit, static_argnames=("top_k",))
def _routing(x_BxD, c_KxD, temperature, top_k: int):
  logits_BxK = -_sq_distances(x_BxD.astype(jnp.float32), c_KxD.astype(jnp.float32)) / temperature
  # Exactly top_k kept, ties broken by lower centroid index (top_k's order).
  _, keep_BxT = jax.lax.top_k(logits_BxK, top_k)
  kept_BxK = jnp.zeros(logits_BxK.shape, bool).at[
      jnp.arange(logits_BxK.shape[0])[:, None], keep_BxT].set(True)
  logits_BxK = jnp.where(kept_BxK, logits_BxK, -jnp.inf)
  return jax.nn.softmax(logits_BxK, axis=-1)


def routing_weights(x_BxD, centroids_KxD, temperature: float = 1.0, top_k: int | None = None
                    ) -> jax.Array:
  """c-BTM routing weights [B, K]: softmax(-d^2 / T) over the top_k centroids.

  The top_k are renormalised, so rows sum to 1. A row is `aggregate.combine`'s `weights_N`;
  zeros are routed away.
  """
  k = np.shape(centroids_KxD)[0]
  top_k = k if top_k is None else top_k
  if not 1 <= top_k <= k:
    raise ValueError(f"top_k must lie in [1, K={k}], got {top_k}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  return _routing(jnp.asarray(x_BxD), jnp.asarray(centroids_KxD), temperature, top_k)


# ---- text: tf-idf features of token windows (c-BTM clusters documents the same way) ----


class PixelPCA:
  """The top `dim` principal components of standardised pixels: a proxy-free embedding.

  Images are read through `transform`, the eval transform at the model's input size. They
  are cast to float, standardised per channel with `mean` / `std` as the model sees them,
  and flattened to P = H * W * I values. `fit` centres them, eigendecomposes the P x P
  covariance and returns the projections [E, dim]. The covariance is accumulated over
  chunks, so memory is O(P^2) whatever E (plus the standardised training pixels, kept for
  the projections while they take at most `cache_bytes`). `transform` projects any split
  the same way.

  `covariance` is the precision of the chunks' products: "float64" (each chunk cast to
  float64, the full eigendecomposition) or "float32" (float32 products of the chunks
  shifted by the first chunk's mean, summed over chunks in float64; only the top `dim`
  eigenvectors computed): ~2x less arithmetic, other components in the last bits.

  In a multi-process run (`processes`, by default JAX's runtime's) each process reads and
  projects only its contiguous share of the chunks; the chunks' sums and products and the
  projections are all-gathered and the sums added in chunk order (`shards`), so the
  components and projections are the one-process build's bits whatever the process count.
  """

  COVARIANCES = ("float64", "float32")

  def __init__(self, dim: int, mean, std, transform, chunk: int = 4096,
               covariance: str = "float64", cache_bytes: int = 1 << 28,
               processes: shards.Processes | None = None):
    if dim < 1:
      raise ValueError(f"dim must be >= 1, got {dim}")
    if covariance not in self.COVARIANCES:
      raise ValueError(f"covariance must be one of {self.COVARIANCES}, got {covariance!r}")
    self.dim, self.chunk, self.transform_fn = int(dim), int(chunk), transform
    self.covariance, self.cache_bytes = covariance, int(cache_bytes)
    self.processes = shards.Processes() if processes is None else processes
    self.mean_I, self.std_I = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    self.center_P = self.components_PxD = None
    self.flops = 0.0  # multiply-adds x 2 of the covariance and the projections

  def _images(self, source, chunks: range | None = None):
    """The eval-transformed images [B, H, W, I] of the source's chunks (all, or the given)."""
    zeros = np.zeros(8, np.float32)  # the eval transform ignores its uniforms
    batch_fn = getattr(self.transform_fn, "batch", None)
    for c in range(-(-len(source) // self.chunk)) if chunks is None else chunks:
      begin = c * self.chunk
      end = min(begin + self.chunk, len(source))
      # A slice of an array-backed source through the batched transform (the same images
      # as one by one, without a Python call per image); else one by one.
      examples = None if batch_fn is None else data_lib.get_range(source, begin, end)
      if examples is not None:
        yield batch_fn(examples, np.zeros((end - begin, 8), np.float32))["image"]
      else:
        yield np.stack([self.transform_fn(source.get(i), zeros)["image"]
                        for i in range(begin, end)])

  def _standardise(self, images, dtype=np.float32) -> np.ndarray:
    """Images [B, ...] -> standardised pixels [B, P] of `dtype`: (x / 255 - mean) / std in
    float32, then cast. uint8 images through a table of the 256 values per channel, the
    same float32 arithmetic once per value instead of once per pixel."""
    if images.dtype != np.uint8:
      x = (images.astype(np.float32) / 255.0 - self.mean_I) / self.std_I
      return x.reshape(len(x), -1).astype(dtype, copy=False)
    i = images.shape[-1]
    lut_256xI = (np.arange(256, dtype=np.float32)[:, None] / 255.0 - self.mean_I) / self.std_I
    lut = np.broadcast_to(lut_256xI, (256, i)).astype(dtype).reshape(-1)
    index = images if i == 1 else images.astype(np.intp) * i + np.arange(i)
    return np.take(lut, index.reshape(len(images), -1))

  def _chunks(self, source, chunks: range | None = None):
    """The standardised pixels [B, P] of the source's chunks (all, or the given ones)."""
    for images in self._images(source, chunks):
      yield self._standardise(images)

  def _mine(self, source) -> range:
    """This process's chunks of `source`: a contiguous share, or all in one process."""
    return self.processes.share(-(-len(source) // self.chunk))

  def _chunk_stats(self, images, shift):
    """A chunk's (sum [P], products [P, P]), both float64, as the covariance adds them."""
    if self.covariance == "float64":
      x64 = self._standardise(images, np.float64)
      return x64.sum(0), x64.T @ x64
    s_BxP = self._standardise(images) - shift  # shifted near the mean: small float32 error
    return s_BxP.sum(0, dtype=np.float64), (s_BxP.T @ s_BxP).astype(np.float64)

  def _accumulate(self, stats):
    """The chunks' stats summed in chunk order: (total [P], cross [P, P] or rows of it)."""
    total = cross = None
    for s_P, g_PxP in stats:
      if self.covariance == "float64":
        total = s_P if total is None else total + s_P
        cross = g_PxP if cross is None else cross + g_PxP
      else:
        total = s_P + (0.0 if total is None else total)
        cross = g_PxP + (0.0 if cross is None else cross)
    return total, cross

  def _gathered_sums(self, stats, p: int, budget_bytes: int = 1 << 28):
    """`_accumulate` of every process's chunk stats, all-gathered: each entry summed over
    the chunks in global chunk order, as one process sums it. The [P, P] products are
    exchanged a block of rows at a time: a round holds every chunk's rows of that block."""
    sums_MxP = np.stack([s for s, _ in stats]) if stats else np.zeros((0, p))
    cross_MxPxP = np.stack([g for _, g in stats]) if stats else np.zeros((0, p, p))
    sums_CxP = np.concatenate(shards.allgather(sums_MxP))
    rows = max(1, budget_bytes // max(1, 8 * p * len(sums_CxP)))
    total, blocks = None, []
    for r in range(0, p, rows):
      cross_CxRxP = np.concatenate(shards.allgather(cross_MxPxP[:, r:r + rows]))
      total, block = self._accumulate(zip(sums_CxP, cross_CxRxP))
      blocks.append(block)
    return total, np.concatenate(blocks)

  def fit(self, source) -> np.ndarray:
    """Fits the components on `source`'s images; returns their projections [E, dim].

    In a multi-process run each process reads only its share of the chunks (and the first,
    for the float32 covariance's shift); the result is the same bits as one process's."""
    n, mine = len(source), self._mine(source)
    if n == 0:
      raise ValueError("PixelPCA.fit needs at least one image")
    shift = None  # float32: the first chunk's mean (a process without it reads it)
    if self.covariance == "float32" and (not mine or mine[0] != 0):
      shift = next(self._chunks(source, range(1))).mean(0)
    cached, cached_bytes = [], 0  # this process's images, projected once components are known

    def stats():
      nonlocal cached, cached_bytes, shift
      for images in self._images(source, mine):
        if shift is None and self.covariance == "float32":
          shift = self._standardise(images).mean(0)
        cached_bytes += images.nbytes
        if cached is not None:
          cached = cached + [images] if cached_bytes <= self.cache_bytes else None
        yield self._chunk_stats(images, shift)

    if self.processes.sharded:
      local = list(stats())  # a process with no chunk reads one for the pixel count
      p = (local[0][0].shape[0] if local else len(shift) if shift is not None else
           next(self._chunks(source, range(1))).shape[1])
      total, cross = self._gathered_sums(local, p)
    else:
      total, cross = self._accumulate(stats())
    p = cross.shape[0]
    if not 1 <= self.dim <= p:
      raise ValueError(f"dim must lie in [1, P={p} pixels], got {self.dim}")
    center = total / n
    cov = cross / n - np.outer(center, center)
    if self.covariance == "float64":
      _, vectors_PxP = np.linalg.eigh(cov)  # ascending eigenvalues
      vectors_PxD = vectors_PxP[:, ::-1][:, :self.dim]
    else:
      import scipy.linalg

      center = center + shift
      _, vectors_PxD = scipy.linalg.eigh(cov, subset_by_index=[p - self.dim, p - 1],
                                         driver="evr")
      vectors_PxD = vectors_PxD[:, ::-1]
    self.center_P = center.astype(np.float32)
    self.components_PxD = vectors_PxD.astype(np.float32)
    self.flops += 2.0 * n * p * p
    chunks = (map(self._standardise, cached) if cached is not None
              else self._chunks(source, mine))
    return self._project(chunks)

  def transform(self, source) -> np.ndarray:
    """The projections [E, dim] of `source`'s images (each process projecting its share)."""
    if self.components_PxD is None:
      raise ValueError("PixelPCA.transform before fit")
    return self._project(self._chunks(source, self._mine(source)))

  def _project(self, chunks) -> np.ndarray:
    """This process's chunks projected, then every process's in chunk order."""
    out = [(x - self.center_P) @ self.components_PxD for x in chunks]
    mine_ExD = np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)
    all_ExD = shards.gather_rows(mine_ExD, self.processes)
    self.flops += 2.0 * len(all_ExD) * self.components_PxD.size
    return all_ExD


class TfIdf:
  """tf-idf of token windows, reduced to `dim` directions by a truncated SVD and L2-normed.

  `fit` fits it on the training windows. `transform` embeds any windows;
  `transform_prefixes` embeds every running prefix of their model inputs, for routing
  without the targets.
  Counts are built in chunks of sparse rows, so a corpus of many windows never materialises
  a dense [E, vocab] matrix.

  In a multi-process run (`processes`) each process reads and counts its contiguous share
  of the chunks, and embeds its share of the prefixes; the counts' sparse rows and the
  prefix embeddings are all-gathered in row order (`shards`). The truncated SVD then runs in
  every process on the whole matrix: its products sum over all windows, and summing them
  across processes would round apart from one process. So the result is the one-process
  build's bits whatever the process count.
  """

  def __init__(self, vocab_size: int, dim: int = 64, chunk: int = 4096,
               processes: shards.Processes | None = None):
    if dim < 1:
      raise ValueError(f"dim must be >= 1, got {dim}")
    self.vocab_size, self.dim, self.chunk = int(vocab_size), int(dim), int(chunk)
    self.processes = shards.Processes() if processes is None else processes
    self.idf_V = self.components_DxV = None

  def counts(self, source) -> "scipy.sparse.csr_matrix":  # noqa: F821
    """Token counts [E, vocab] of every window of a pipeline source ({'tokens': [T]})."""
    from scipy import sparse

    parts = []
    for begin in (c * self.chunk for c in self.processes.share(-(-len(source) // self.chunk))):
      rows_BxT = _tokens(source, begin, min(begin + self.chunk, len(source)))
      if rows_BxT.max() >= self.vocab_size or rows_BxT.min() < 0:
        raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got "
                         f"[{rows_BxT.min()}, {rows_BxT.max()}]")
      parts.append(_count_rows(rows_BxT, self.vocab_size))
    if not self.processes.sharded:
      return sparse.vstack(parts).tocsr()  # duplicates summed: counts
    local = (sparse.vstack(parts).tocsr() if parts else
             sparse.csr_matrix((0, self.vocab_size), dtype=np.float32))
    # vstack concatenates its parts' rows: the processes' stacks concatenated are the same.
    data = np.concatenate(shards.allgather(local.data))
    indices = np.concatenate(shards.allgather(local.indices.astype(np.int64)))
    row_nnz = np.concatenate(shards.allgather(np.diff(local.indptr).astype(np.int64)))
    index_dtype = np.int32 if len(indices) < 2**31 else np.int64
    indptr = np.concatenate([[0], np.cumsum(row_nnz)]).astype(index_dtype)
    return sparse.csr_matrix((data, indices.astype(index_dtype), indptr),
                             shape=(len(row_nnz), self.vocab_size))

  def _normalised_tfidf(self, counts_ExV):
    from scipy import sparse

    x = counts_ExV.multiply(self.idf_V[None, :]).tocsr()
    norms = np.sqrt(np.asarray(x.multiply(x).sum(1))).ravel()
    return sparse.diags(1.0 / np.maximum(norms, 1e-12)) @ x

  def fit(self, source, seed: int = 0) -> np.ndarray:
    """Fits idf and the SVD on `source`; returns its embeddings [E, dim]."""
    from scipy.sparse import linalg

    counts = self.counts(source)
    n = counts.shape[0]
    df_V = np.bincount(counts.indices, minlength=self.vocab_size)
    self.idf_V = (np.log((1.0 + n) / (1.0 + df_V)) + 1.0).astype(np.float32)  # smoothed
    x = self._normalised_tfidf(counts)
    k = min(self.dim, min(x.shape) - 1)
    v0 = np.random.default_rng(seed).standard_normal(min(x.shape))
    _, _, vt = linalg.svds(x.astype(np.float64), k=k, v0=v0)
    self.components_DxV = vt.astype(np.float32)
    return self._project(x)

  def transform(self, source) -> np.ndarray:
    if self.idf_V is None:
      raise ValueError("TfIdf.transform before fit")
    return self._project(self._normalised_tfidf(self.counts(source)))

  def transform_prefixes(self, source, budget: int = 1 << 22) -> np.ndarray:
    """Embeddings [E, T, dim] of each window's running prefixes, never its targets.

    Row t embeds window[:t + 1] of the window's inputs, window[:-1]. That is `transform` of
    the window truncated to the context of prediction t.

    Both the projection and the tf-idf norm are sums over tokens, so they are running sums
    over positions of per-token terms. Memory is O(T * dim) per window, whatever the vocab,
    over chunks of windows holding about `budget` floats.
    """
    if self.idf_V is None:
      raise ValueError("TfIdf.transform_prefixes before fit")
    idf_V = self.idf_V.astype(np.float64)
    # Token v adds idf[v] * components[:, v] to the unnormalised projection.
    proj_VxD = idf_V[:, None] * self.components_DxV.T.astype(np.float64)
    n = len(source)
    t = _tokens(source, 0, 1).shape[1] - 1 if n else 0
    # Each window's rows are its own running sums: a share of the windows, then gathered.
    share = self.processes.share(n)
    out_ExTxD = np.zeros((len(share), t, proj_VxD.shape[1]), np.float32)
    rows = max(1, min(self.chunk, budget // max(1, t * proj_VxD.shape[1])))
    for begin in range(share.start, share.stop, rows):
      end = min(begin + rows, share.stop)
      inputs_BxT = np.ascontiguousarray(_tokens(source, begin, end)[:, :-1])
      if inputs_BxT.max() >= self.vocab_size or inputs_BxT.min() < 0:
        raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got "
                         f"[{inputs_BxT.min()}, {inputs_BxT.max()}]")
      # The squared tf-idf norm grows by ((c + 1)^2 - c^2) idf^2 = (2c + 1) idf^2 when a
      # token seen c times before joins the prefix.
      seen_BxT = _earlier_occurrences(inputs_BxT)
      sq_norm_BxT = np.cumsum((2.0 * seen_BxT + 1.0) * idf_V[inputs_BxT] ** 2, axis=1)
      z_BxTxD = np.cumsum(proj_VxD[inputs_BxT], axis=1)
      z_BxTxD /= np.maximum(np.sqrt(sq_norm_BxT), 1e-12)[..., None]
      z_BxTxD /= np.maximum(np.linalg.norm(z_BxTxD, axis=-1, keepdims=True), 1e-12)
      out_ExTxD[begin - share.start:end - share.start] = z_BxTxD
    return shards.gather_rows(out_ExTxD, self.processes)

  def _project(self, x_ExV) -> np.ndarray:
    z = np.asarray(x_ExV @ self.components_DxV.T, np.float32)
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)


def _count_rows(rows_BxT: np.ndarray, vocab_size: int, dense_limit: int = 1 << 24):
  """The windows' token counts [B, vocab] as a canonical CSR matrix (sorted indices,
  duplicates summed). Through a dense [B, vocab] bincount while that has at most
  `dense_limit` entries (byte-level vocabularies), else from (row, token) pairs: the same
  matrix, bit for bit (counts are small integers, exact in float32)."""
  from scipy import sparse

  b, t = rows_BxT.shape
  if b * vocab_size <= dense_limit:
    flat = (np.arange(b, dtype=np.int64)[:, None] * vocab_size + rows_BxT).ravel()
    dense_BxV = np.bincount(flat, minlength=b * vocab_size).reshape(b, vocab_size)
    return sparse.csr_matrix(dense_BxV.astype(np.float32))
  r = np.repeat(np.arange(b), t)
  return sparse.csr_matrix((np.ones(r.size, np.float32), (r, rows_BxT.ravel())),
                           shape=(b, vocab_size))


def _tokens(source, begin: int, end: int) -> np.ndarray:
  """Windows [begin, end) of a text source [B, T]: one slice where the source has ranges."""
  examples = data_lib.get_range(source, begin, end)
  if examples is not None:
    return examples["tokens"]
  return np.stack([source.get(i)["tokens"] for i in range(begin, end)])


def _earlier_occurrences(tokens_BxT: np.ndarray) -> np.ndarray:
  """[C, T]: how often tokens[c, t] occurs in tokens[c, :t]."""
  c, t = tokens_BxT.shape
  order_BxT = np.argsort(tokens_BxT, axis=1, kind="stable")  # equal tokens keep their order
  sorted_BxT = np.take_along_axis(tokens_BxT, order_BxT, axis=1)
  pos_T = np.arange(t)
  starts_BxT = np.ones((c, t), bool)
  starts_BxT[:, 1:] = sorted_BxT[:, 1:] != sorted_BxT[:, :-1]
  rank_BxT = pos_T - np.maximum.accumulate(np.where(starts_BxT, pos_T, 0), axis=1)
  seen_BxT = np.empty_like(rank_BxT)
  np.put_along_axis(seen_BxT, order_BxT, rank_BxT, axis=1)
  return seen_BxT
