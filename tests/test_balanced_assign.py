"""The balanced k-means assignment: the fast rounds equal the pair-at-a-time greedy."""
import numpy as np
import pytest

from ensemble_jax.distill import clusters

pytestmark = pytest.mark.unit


def _distances(rng, n, k, kind):
  if kind == "uniform":
    return rng.random((n, k), dtype=np.float32)
  if kind == "ties":  # a few distinct values: most pairs tie
    return rng.integers(0, 4, (n, k)).astype(np.float32)
  if kind == "zeros":
    return np.zeros((n, k), np.float32)
  x, c = rng.normal(size=(n, 3)), rng.normal(size=(k, 3))
  d2 = ((x[:, None] - c[None]) ** 2).sum(-1).astype(np.float32)
  d2[rng.random((n, k)) < 0.1] = -0.0  # a clamped distance may be negative zero
  return d2


@pytest.mark.parametrize("kind", ["uniform", "ties", "zeros", "points"])
def test_rounds_equal_the_pairwise_greedy_on_random_distances(kind):
  rng = np.random.default_rng(["uniform", "ties", "zeros", "points"].index(kind))
  for _ in range(60):
    n = int(rng.integers(1, 300))
    k = int(rng.integers(1, min(n, 24) + 1))
    d2 = _distances(rng, n, k, kind)
    fast = clusters._balanced_assign(d2)
    np.testing.assert_array_equal(fast, clusters._balanced_assign_pairwise(d2))
    sizes = np.bincount(fast, minlength=k)
    assert sizes.min() >= n // k and sizes.max() <= -(-n // k)


@pytest.mark.parametrize("n,k", [(5000, 64), (4999, 8), (3000, 1)])
def test_rounds_equal_the_pairwise_greedy_on_k_means_points(n, k):
  rng = np.random.default_rng(n + k)
  x = rng.normal(size=(n, 16)).astype(np.float32)
  c = x[rng.choice(n, k, replace=False)]
  d2 = np.asarray(clusters._sq_distances(x, c))
  np.testing.assert_array_equal(clusters._balanced_assign(d2),
                                clusters._balanced_assign_pairwise(d2))


def test_device_lloyd_steps_keep_the_sizes_and_all_balanced_is_todays_schedule():
  """kmeans(balanced_iters=b): the first 20 - b Lloyd steps unconstrained on the device;
  the final assignment is balanced whatever b, deterministic; b = 20 is the default."""
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.normal(size=(300, 4)) + 4 * rng.normal(size=4) for _ in range(5)])
  x = x.astype(np.float32)
  today = clusters.kmeans(x, 7, seed=1, balanced=True)
  np.testing.assert_array_equal(clusters.kmeans(x, 7, seed=1, balanced=True,
                                                balanced_iters=20)[0], today[0])
  for b in (0, 3):
    a, _ = clusters.kmeans(x, 7, seed=1, balanced=True, balanced_iters=b)
    sizes = np.bincount(a, minlength=7)
    assert sizes.max() - sizes.min() <= 1
    np.testing.assert_array_equal(
        a, clusters.kmeans(x, 7, seed=1, balanced=True, balanced_iters=b)[0])
  with pytest.raises(ValueError, match="balanced_iters"):
    clusters.kmeans(x, 7, balanced=True, balanced_iters=-1)


def test_balanced_kmeans_is_the_pairwise_greedys_bit_for_bit(monkeypatch):
  """Every Lloyd step's assignment through the rounds, as through the pair-at-a-time greedy:
  the same clusters and centroids, bit for bit (a faster greedy must not change a pool)."""
  rng = np.random.default_rng(7)
  x = np.concatenate([rng.normal(size=(400, 6)) + 3 * rng.normal(size=6) for _ in range(6)])
  x = x.astype(np.float32)
  fast = clusters.kmeans(x, 16, seed=3, balanced=True)
  monkeypatch.setattr(clusters, "_balanced_assign", clusters._balanced_assign_pairwise)
  reference = clusters.kmeans(x, 16, seed=3, balanced=True)
  np.testing.assert_array_equal(fast[0], reference[0])
  np.testing.assert_array_equal(fast[1], reference[1])
