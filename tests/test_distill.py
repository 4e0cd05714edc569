"""Pool builders of distilled sequences: scores, coresets, clusters, explicit pools."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax.distill import clusters, coresets, scores
from ensemble_jax.distill import pool as pool_lib

pytestmark = pytest.mark.unit

E, D, C = 400, 8, 4


def _blobs(n, d, c, seed, spread=6.0):
  rng = np.random.default_rng(seed)
  centers_CxD = rng.normal(size=(c, d)) * spread
  labels_E = rng.integers(0, c, n)
  x_ExD = centers_CxD[labels_E] + rng.normal(size=(n, d))
  return x_ExD.astype(np.float32), labels_E.astype(np.int32)


def _linear_proxy(x_ExD, labels_E, steps=50, lr=0.1):
  """A few full-batch gradient-descent steps of softmax regression: a cheap proxy."""
  def loss(params):
    logits = x_ExD @ params["w"] + params["b"]
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), labels_E[:, None], 1))

  params = {"w": jnp.zeros((x_ExD.shape[1], C)), "b": jnp.zeros(C)}
  grad = jax.jit(jax.grad(loss))
  for _ in range(steps):
    params = jax.tree.map(lambda p, g: p - lr * g, params, grad(params))
  return np.asarray(x_ExD @ params["w"] + params["b"])


@pytest.fixture(scope="module")
def noisy():
  x_ExD, clean_E = _blobs(E, D, C, seed=0)
  rng = np.random.default_rng(1)
  flipped_E = np.zeros(E, bool)
  flipped_E[rng.choice(E, E // 10, replace=False)] = True
  labels_E = np.where(flipped_E, (clean_E + rng.integers(1, C, E)) % C, clean_E)
  return x_ExD, labels_E.astype(np.int32), flipped_E, _linear_proxy(x_ExD, labels_E)


def _auroc(scores_E, positive_E):
  ranks = np.argsort(np.argsort(scores_E)) + 1
  pos = positive_E.sum()
  return (ranks[positive_E].sum() - pos * (pos + 1) / 2) / (pos * (len(scores_E) - pos))


@pytest.mark.parametrize("fn", [scores.el2n_scores, scores.loss_scores])
def test_scores_rank_mislabeled_first(noisy, fn):
  x_ExD, labels_E, flipped_E, logits_ExC = noisy
  s_E = fn(logits_ExC, labels_E, chunk=64)  # chunk not dividing E: exercises the padding
  assert s_E.shape == (E,)
  assert _auroc(s_E, flipped_E) > 0.9


def test_grand_closed_form_and_averaging(noisy):
  x_ExD, labels_E, flipped_E, logits_ExC = noisy
  g_ExK = coresets.last_layer_gradients(x_ExD, logits_ExC, labels_E)
  assert g_ExK.shape == (E, D * C + C)
  np.testing.assert_allclose(scores.grand_scores(logits_ExC, labels_E, x_ExD),
                             np.linalg.norm(g_ExK, axis=1), rtol=1e-4)
  np.testing.assert_allclose(scores.grand_scores(logits_ExC, labels_E),
                             scores.el2n_scores(logits_ExC, labels_E), rtol=1e-5)
  avg = scores.average_over_proxies([np.zeros(3), np.ones(3) * 2])
  np.testing.assert_allclose(avg, np.ones(3))
  with pytest.raises(ValueError, match="same examples"):
    scores.average_over_proxies([np.zeros(3), np.zeros(4)])


def test_select_by_score_per_class_balanced():
  labels_E = np.repeat(np.arange(4), [100, 50, 30, 20])
  s_E = np.concatenate([np.full(100, 1e3), np.arange(100.0)])  # class 0 hardest overall
  kept = scores.select_by_score(s_E, 0.5, "hardest", labels_E, per_class=True)
  np.testing.assert_array_equal(np.bincount(labels_E[kept]), [50, 25, 15, 10])
  global_kept = scores.select_by_score(s_E, 0.5, "hardest")
  assert np.bincount(labels_E[global_kept], minlength=4)[0] == 100  # unbalanced without it
  easiest = scores.select_by_score(np.arange(10.0), 0.3, "easiest")
  np.testing.assert_array_equal(easiest, [0, 1, 2])
  with pytest.raises(ValueError, match="fraction"):
    scores.select_by_score(s_E, 1.5)


def test_gradmatch_beats_random_subset(noisy):
  x_ExD, labels_E, _, logits_ExC = noisy
  g_ExK = coresets.last_layer_gradients(x_ExD, logits_ExC, labels_E).astype(np.float64)
  mean_K = g_ExK.mean(0)
  k = 20
  idx, w = coresets.gradmatch(g_ExK, k, lam=1e-3)
  assert 0 < len(idx) <= k and np.all(w > 0)
  ours = np.linalg.norm(w @ g_ExK[idx] / E - mean_K)
  rng = np.random.default_rng(0)
  rand = np.mean([np.linalg.norm(g_ExK[rng.choice(E, k, replace=False)].mean(0) - mean_K)
                  for _ in range(20)])
  assert ours < 0.5 * rand, (ours, rand)


def test_craig_objective_monotone_and_weights(noisy):
  x_ExD, labels_E, _, logits_ExC = noisy
  g_ExK = coresets.last_layer_gradients(x_ExD, logits_ExC, labels_E, include_weight=False)
  idx, w = coresets.craig(g_ExK, 12, chunk=128)
  assert len(set(idx.tolist())) == 12 and w.sum() == E
  max_dist = coresets.max_distance(g_ExK)
  values = [coresets.facility_location(g_ExK, idx[:m], max_dist) for m in range(0, 13)]
  assert np.all(np.diff(values) >= -1e-3 * abs(values[-1])), values
  # Greedy beats a random subset of the same size on its own objective.
  rand = coresets.facility_location(g_ExK, np.random.default_rng(0).choice(E, 12, replace=False),
                                   max_dist)
  assert values[-1] >= rand


def test_per_class_coreset(noisy):
  x_ExD, labels_E, _, logits_ExC = noisy
  g_ExK = coresets.last_layer_gradients(x_ExD, logits_ExC, labels_E, include_weight=False)
  idx, w = coresets.per_class(coresets.craig, g_ExK, labels_E, 16)
  assert set(labels_E[idx].tolist()) == set(range(C)) and len(idx) == len(w)
  assert w.sum() == E  # each class's weights cover that class
  # Gradients given as a function of the rows: asked one class at a time, same picks.
  asked = []
  lazy = lambda rows: asked.append(len(rows)) or g_ExK[rows]  # noqa: E731
  idx2, w2 = coresets.per_class(coresets.craig, lazy, labels_E, 16)
  np.testing.assert_array_equal(idx2, idx)
  np.testing.assert_array_equal(w2, w)
  assert sorted(asked) == sorted(np.bincount(labels_E).tolist())


def test_kmeans_recovers_blobs_and_balanced_sizes():
  x_ExD, labels_E = _blobs(300, 5, 3, seed=3, spread=10.0)
  a_E, c_KxD = clusters.kmeans(x_ExD, 3, seed=0, iters=10)
  assert c_KxD.shape == (3, 5)
  # Each cluster is one blob (up to relabelling).
  for k in range(3):
    assert len(np.unique(labels_E[a_E == k])) == 1
  assert len(np.unique(a_E)) == 3
  a2_E, _ = clusters.kmeans(x_ExD, 3, seed=0, iters=10)
  np.testing.assert_array_equal(a_E, a2_E)

  x_ExD, _ = _blobs(103, 4, 2, seed=4)  # lopsided data, 7 clusters: balance must be forced
  b_E, _ = clusters.kmeans(x_ExD, 7, seed=1, iters=5, balanced=True)
  sizes = np.bincount(b_E, minlength=7)
  assert sizes.sum() == 103 and sizes.max() - sizes.min() <= 1, sizes


def test_routing_weights():
  c_KxD = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]], np.float32)
  x_BxD = c_KxD + 0.5
  w_BxK = np.asarray(clusters.routing_weights(x_BxD, c_KxD, temperature=10.0, top_k=2))
  np.testing.assert_allclose(w_BxK.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(w_BxK.argmax(-1), np.arange(4))
  assert np.all(w_BxK.max(-1) > 0.5) and np.all((w_BxK > 0).sum(-1) == 2)
  full = np.asarray(clusters.routing_weights(x_BxD, c_KxD, temperature=10.0))
  assert np.all(full > 0)


class _Windows:
  """A token-window source: topic t's windows draw tokens from its own 40-token range."""

  def __init__(self, topics_E, seed):
    rng = np.random.default_rng(seed)
    self.tokens_ExT = np.stack([rng.integers(40 * t, 40 * (t + 1), 33) for t in topics_E])

  def __len__(self):
    return len(self.tokens_ExT)

  def get(self, i):
    return {"tokens": self.tokens_ExT[i]}


def test_tfidf_clusters_separate_topics_and_route_unseen_windows():
  topics_E = np.repeat(np.arange(3), 50)
  tfidf = clusters.TfIdf(vocab_size=160, dim=8, chunk=64)  # chunks: 64, 64, 22 windows
  x_ExD = tfidf.fit(_Windows(topics_E, seed=0))
  np.testing.assert_allclose(np.linalg.norm(x_ExD, axis=1), 1.0, rtol=1e-5)
  a_E, c_KxD = clusters.kmeans(x_ExD, 3, seed=0, balanced=True)
  for k in range(3):  # each cluster is one topic, 50 windows each
    assert len(np.unique(topics_E[a_E == k])) == 1 and (a_E == k).sum() == 50
  unseen_topics = np.array([0, 1, 2, 2])
  route_BxK = np.asarray(clusters.routing_weights(
      tfidf.transform(_Windows(unseen_topics, seed=1)), c_KxD, temperature=0.1, top_k=2))
  cluster_of_topic = [np.bincount(a_E[topics_E == t]).argmax() for t in range(3)]
  np.testing.assert_array_equal(route_BxK.argmax(-1), np.take(cluster_of_topic, unseen_topics))
  assert np.all(route_BxK.max(-1) > 0.9)
  with pytest.raises(ValueError, match=r"token ids must lie in \[0, 100\)"):
    clusters.TfIdf(vocab_size=100).fit(_Windows(topics_E, seed=0))


def test_pool_sampler_and_split_pool():
  pools = pool_lib.split_pool(np.arange(10, 70), 4, seed=0)
  flat = np.concatenate(pools)
  assert len(flat) == 60 and len(np.unique(flat)) == 60  # disjoint, and covering
  a = pool_lib.PoolSampler(pools, num_examples=100, seed=5)
  b = pool_lib.PoolSampler(pools, num_examples=100, seed=5)
  for i in range(4):
    np.testing.assert_array_equal(a.batch_indices(i, 3, 8), b.batch_indices(i, 3, 8))
    assert np.isin(a.batch_indices(i, 7, 8), pools[i]).all()
  assert not np.array_equal(a.batch_indices(0, 0, 15),
                            pool_lib.PoolSampler(pools, 100, seed=6).batch_indices(0, 0, 15))
  shared = pool_lib.split_pool(np.arange(20), 3, seed=0, disjoint=False)
  assert all(len(p) == 7 and len(np.unique(p)) == 7 for p in shared)
  with pytest.raises(ValueError, match="outside"):
    pool_lib.PoolSampler([np.array([0, 100])], num_examples=100)
  with pytest.raises(ValueError, match="non-empty"):
    pool_lib.PoolSampler([np.array([1]), np.array([], np.int64)], num_examples=100)
