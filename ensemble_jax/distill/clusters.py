"""k-means in a proxy's embedding space: worker i trains on cluster i (c-BTM style), and
at aggregation each input is routed to the experts of its nearest centroids.

The balanced variant caps every cluster near N/k, so no worker gets a tiny shard (and an
ensemble step of stacked workers does not wait on the biggest one).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _sq_distances(x_NxD: jax.Array, c_KxD: jax.Array) -> jax.Array:
  sq = (jnp.sum(x_NxD * x_NxD, -1)[:, None] + jnp.sum(c_KxD * c_KxD, -1)[None, :]
        - 2.0 * x_NxD @ c_KxD.T)
  return jnp.maximum(sq, 0.0)


def _plus_plus(x_NxD: jax.Array, k: int, rng: jax.Array) -> jax.Array:
  """k-means++ seeding: each next centroid drawn with probability ~ d^2 to the nearest."""
  n = x_NxD.shape[0]
  rng, first = jax.random.split(rng)
  c_KxD = jnp.zeros((k, x_NxD.shape[1]), x_NxD.dtype).at[0].set(
      x_NxD[jax.random.randint(first, (), 0, n)])
  d2_N = _sq_distances(x_NxD, c_KxD[:1])[:, 0]

  def body(i, carry):
    c_KxD, d2_N, rng = carry
    rng, key = jax.random.split(rng)
    # All-zero d2 (fewer distinct points than k): fall back to a uniform draw.
    p_N = jnp.where(jnp.sum(d2_N) > 0, d2_N / jnp.maximum(jnp.sum(d2_N), 1e-30), 1.0 / n)
    pick = jax.random.choice(key, n, p=p_N)
    c_KxD = c_KxD.at[i].set(x_NxD[pick])
    d2_N = jnp.minimum(d2_N, _sq_distances(x_NxD, x_NxD[pick][None])[:, 0])
    return c_KxD, d2_N, rng

  c_KxD, _, _ = jax.lax.fori_loop(1, k, body, (c_KxD, d2_N, rng))
  return c_KxD


def _balanced_assign(d2_NxK: jax.Array) -> jax.Array:
  """Greedy over (point, cluster) pairs, nearest first, under capacities that sum to N:
  every cluster holds floor(N/k) or ceil(N/k) points (at most N mod k hold the ceil)."""
  n, k = d2_NxK.shape
  floor, extra = n // k, n % k
  order = jnp.argsort(d2_NxK.reshape(-1), stable=True)
  points, clusters = order // k, order % k

  def step(carry, pair):
    assign_N, count_K, num_extra = carry
    i, c = pair
    room = (count_K[c] < floor) | ((count_K[c] == floor) & (num_extra < extra))
    ok = (assign_N[i] < 0) & room
    num_extra = num_extra + (ok & (count_K[c] == floor)).astype(jnp.int32)
    assign_N = assign_N.at[i].set(jnp.where(ok, c, assign_N[i]))
    count_K = count_K.at[c].add(ok.astype(jnp.int32))
    return (assign_N, count_K, num_extra), None

  init = (jnp.full((n,), -1, jnp.int32), jnp.zeros((k,), jnp.int32), jnp.int32(0))
  (assign_N, _, _), _ = jax.lax.scan(step, init, (points, clusters))
  return assign_N


@functools.partial(jax.jit, static_argnames=("k", "iters", "balanced"))
def _kmeans(x_NxD, rng, k: int, iters: int, balanced: bool):
  def assign(c_KxD):
    d2_NxK = _sq_distances(x_NxD, c_KxD)
    return _balanced_assign(d2_NxK) if balanced else jnp.argmin(d2_NxK, axis=-1)

  def update(c_KxD, _):
    a_N = assign(c_KxD)
    onehot_NxK = jax.nn.one_hot(a_N, k, dtype=x_NxD.dtype)
    count_K = onehot_NxK.sum(0)
    mean_KxD = onehot_NxK.T @ x_NxD / jnp.maximum(count_K, 1.0)[:, None]
    # An emptied cluster keeps its centroid rather than collapsing to the origin.
    return jnp.where(count_K[:, None] > 0, mean_KxD, c_KxD), None

  c_KxD, _ = jax.lax.scan(update, _plus_plus(x_NxD, k, rng), None, length=iters)
  return assign(c_KxD), c_KxD


def kmeans(x_NxD, k: int, seed: int = 0, iters: int = 20, balanced: bool = False
           ) -> tuple[np.ndarray, np.ndarray]:
  """Lloyd's k-means from k-means++ seeds: (assignments [N] int, centroids [K, D]).

  Deterministic in seed. balanced=True assigns greedily under capacity ceil(N/k), with
  sizes within 1 of each other (costs a sequential pass over the N*k pairs per iteration).
  """
  x_NxD = np.asarray(x_NxD, np.float32)
  if x_NxD.ndim != 2:
    raise ValueError(f"kmeans expects [N, D] points, got shape {x_NxD.shape}")
  if not 1 <= k <= len(x_NxD):
    raise ValueError(f"k must lie in [1, N={len(x_NxD)}], got k={k}")
  if iters < 0:
    raise ValueError(f"iters must be >= 0, got {iters}")
  a_N, c_KxD = _kmeans(jnp.asarray(x_NxD), jax.random.key(seed), k, iters, balanced)
  return np.asarray(a_N), np.asarray(c_KxD)


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
  """c-BTM routing: softmax(-d^2 / T) over centroids, only the top_k kept and renormalised.

  [B, K], rows sum to 1; feed a row as `weights_N` of `aggregate.combine` (zeros are
  routed away).
  """
  k = np.shape(centroids_KxD)[0]
  top_k = k if top_k is None else top_k
  if not 1 <= top_k <= k:
    raise ValueError(f"top_k must lie in [1, K={k}], got {top_k}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  return _routing(jnp.asarray(x_BxD), jnp.asarray(centroids_KxD), temperature, top_k)
