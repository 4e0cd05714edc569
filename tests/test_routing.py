"""`routed` aggregation: text routing never sees the tokens it predicts (each position is
routed on its running prefix), and an example whose routed experts were all excluded falls
back to the healthy workers."""
import types

import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax import metrics
from ensemble_jax.distill import clusters, pools
from ensemble_jax.distill.registry import BuildInputs
from ensemble_jax.methods.ensemble import Ensemble

pytestmark = pytest.mark.unit

T = 32  # predictions per window: a window holds T + 1 tokens
TOPIC = 40  # topic k's tokens are [40k, 40k + 40)


class _Windows:
  """A pipeline text source over fixed windows [M, T + 1]."""

  def __init__(self, tokens_MxT1):
    self.tokens_MxT1 = np.asarray(tokens_MxT1, np.int32)

  def __len__(self):
    return len(self.tokens_MxT1)

  def get(self, i):
    return {"tokens": self.tokens_MxT1[i]}


def _topic_windows(topics_M, seed):
  rng = np.random.default_rng(seed)
  return np.stack([rng.integers(TOPIC * k, TOPIC * (k + 1), T + 1) for k in topics_M])


def _route(eval_tokens_MxT1):
  """pools' c-BTM routing of the eval windows (3 topic clusters, top 2 of 3 experts)."""
  config = types.SimpleNamespace(
      seed=0, method=types.SimpleNamespace(aggregation="probs,routed"),
      distill=types.SimpleNamespace(builder="kmeans", tfidf_dim=8, balanced=True,
                                    kmeans_balance="greedy", route_temperature=0.1,
                                    route_top_k=2))
  data = types.SimpleNamespace(train=_Windows(_topic_windows(np.repeat(np.arange(3), 30), 0)),
                               eval=_Windows(eval_tokens_MxT1), num_classes=3 * TOPIC)
  return pools._text_clusters(BuildInputs(config, data, 3, "", start=0.0)).route


def _mixed_eval_windows():
  """Windows that start on one topic and switch to another halfway: routing moves."""
  first, second = _topic_windows([0, 1, 2, 0], 1), _topic_windows([1, 2, 0, 2], 2)
  return np.concatenate([first[:, :T // 2], second[:, T // 2:]], axis=1)


def test_routing_ignores_the_last_token():
  tokens_MxT1 = _mixed_eval_windows()
  route_MxTxN = _route(tokens_MxT1)
  assert route_MxTxN.shape == (4, T, 3)
  np.testing.assert_allclose(route_MxTxN.sum(-1), 1.0, rtol=1e-5)
  changed = tokens_MxT1.copy()
  changed[:, -1] = (changed[:, -1] + TOPIC) % (3 * TOPIC)  # a target from another topic
  np.testing.assert_array_equal(_route(changed), route_MxTxN)


def test_routing_of_a_position_ignores_later_tokens():
  tokens_MxT1 = _mixed_eval_windows()
  route_MxTxN = _route(tokens_MxT1)
  # Each window's routing follows its context: its first half's topic, then its second's.
  assert not np.allclose(route_MxTxN[:, 0], route_MxTxN[:, -1], atol=1e-3)
  for s in (1, T // 2, T - 1):
    changed = tokens_MxT1.copy()
    changed[:, s:] = (changed[:, s:] + TOPIC) % (3 * TOPIC)  # tokens s.. from another topic
    after_MxTxN = _route(changed)
    np.testing.assert_array_equal(after_MxTxN[:, :s], route_MxTxN[:, :s])
    assert not np.allclose(after_MxTxN[:, s:], route_MxTxN[:, s:], atol=1e-4)


def test_prefix_embeddings_are_transforms_of_truncated_windows():
  rng = np.random.default_rng(3)
  train = _Windows(rng.integers(0, 12, (40, 13)))  # few tokens: many repeats per window
  tfidf = clusters.TfIdf(vocab_size=12, dim=4)
  tfidf.fit(train)
  windows_MxT1 = rng.integers(0, 12, (5, 13))
  # budget 100 floats: 2 windows (12 prefixes x 4 dims each) a chunk, so chunks of 2, 2, 1.
  prefixes_MxTxD = tfidf.transform_prefixes(_Windows(windows_MxT1), budget=100)
  assert prefixes_MxTxD.shape == (5, 12, 4)
  for t in range(12):
    np.testing.assert_allclose(prefixes_MxTxD[:, t],
                               tfidf.transform(_Windows(windows_MxT1[:, :t + 1])),
                               atol=2e-6, err_msg=f"prefix of {t + 1} tokens")
  # The full window's inputs (all but the last token) are the last prefix.
  np.testing.assert_allclose(prefixes_MxTxD[:, -1],
                             tfidf.transform(_Windows(windows_MxT1[:, :-1])), atol=2e-6)


def _fake_engine(task, healthy_N):
  """What `_eval_sums` and `finalize_eval` read of an Ensemble, with the states standing
  in for the workers' logits."""
  return types.SimpleNamespace(
      _worker_logits=lambda states, batch: states, modes=("routed", "probs"),
      step_config=types.SimpleNamespace(task=task), num_workers=len(healthy_N),
      healthy=np.asarray(healthy_N, bool), config=types.SimpleNamespace(task=task))


def _mixture(logits_NxBx, weights_NxBx):
  """log sum_n w_n softmax(logits_n), the weights renormalised, in numpy."""
  p_NxBx = np.exp(logits_NxBx - logits_NxBx.max(-1, keepdims=True))
  p_NxBx /= p_NxBx.sum(-1, keepdims=True)
  w_NxBx = weights_NxBx / weights_NxBx.sum(0)
  return np.log(np.sum(w_NxBx[..., None] * np.nan_to_num(p_NxBx), axis=0))


@pytest.mark.integration
def test_excluded_routed_experts_fall_back_to_the_healthy_workers():
  logits_NxBxC = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
  logits_NxBxC[1] = np.nan  # worker 1 diverged
  healthy_N = np.array([1.0, 0.0, 1.0], np.float32)
  route_BxN = np.array([[0.7, 0.3, 0.0],   # what is left: worker 0 alone
                        [0.0, 1.0, 0.0],   # only worker 1: falls back to 0 and 2
                        [0.5, 0.0, 0.5],
                        [0.0, 1.0, 0.0]],  # would fall back too, but is padding
                       np.float32)
  batch = {"label": jnp.array([0, 1, 2, 3]), "mask": jnp.array([1.0, 1.0, 1.0, 0.0]),
           "route": jnp.asarray(route_BxN)}
  engine = _fake_engine("classification", healthy_N > 0)
  sums = Ensemble._eval_sums(engine, jnp.asarray(logits_NxBxC), batch, jnp.asarray(healthy_N))
  assert float(sums["routed"]["fallback"]) == 1.0
  expected_BxC = _mixture(logits_NxBxC, np.array([[1.0, 1, 0.5, 1], [0, 0, 0, 0],
                                                  [0, 1, 0.5, 1]]))
  want = metrics.prediction_sums(jnp.asarray(expected_BxC), batch["label"], batch["mask"])
  assert np.isfinite(float(sums["routed"]["nll"]))
  for key in ("count", "correct", "nll"):
    np.testing.assert_allclose(sums["routed"][key], want[key], rtol=1e-5, err_msg=key)
  out = Ensemble.finalize_eval(engine, metrics.add_sums(None, sums))
  assert out["routed/fallback"] == 1 and out["fallback"] == 1  # routed is the default mode
  assert np.isfinite(out["routed/nll"])


@pytest.mark.integration
def test_per_position_routing_falls_back_per_position():
  b, t, v = 2, 3, 6
  logits_NxBxTxV = np.random.default_rng(1).normal(size=(3, b, t, v)).astype(np.float32)
  logits_NxBxTxV[2] = np.nan
  healthy_N = np.array([1.0, 1.0, 0.0], np.float32)
  route_BxTxN = np.zeros((b, t, 3), np.float32)
  route_BxTxN[..., 0] = 1.0
  route_BxTxN[0, 1] = [0.0, 0.0, 1.0]  # one position routed only to the diverged worker
  route_BxTxN[1, 2] = [0.0, 0.4, 0.6]  # renormalised onto worker 1
  batch = {"tokens": jnp.zeros((b, t + 1), jnp.int32), "mask": jnp.ones(b),
           "route": jnp.asarray(route_BxTxN)}
  engine = _fake_engine("lm", healthy_N > 0)
  sums = Ensemble._eval_sums(engine, jnp.asarray(logits_NxBxTxV), batch,
                             jnp.asarray(healthy_N))
  assert float(sums["routed"]["fallback"]) == 1.0
  weights_NxBxT = np.moveaxis(route_BxTxN, -1, 0) * healthy_N[:, None, None]
  weights_NxBxT[:, 0, 1] = healthy_N
  want = metrics.prediction_sums(jnp.asarray(_mixture(logits_NxBxTxV, weights_NxBxT)),
                                 batch["tokens"][:, 1:], batch["mask"])
  np.testing.assert_allclose(sums["routed"]["nll"], want["nll"], rtol=1e-5)
  assert float(sums["routed"]["count"]) == b * t
