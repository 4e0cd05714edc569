"""The gradient noise scale estimator on synthetic gradients of known |G|^2 and tr(Sigma)."""
import math

import numpy as np
import pytest

from ensemble_jax import noise_scale

pytestmark = pytest.mark.integration

DIM = 64


def _problem(seed=0):
  """Per-example gradients g_i = G + e_i, e_i ~ N(0, Sigma), Sigma diagonal: B_simple known."""
  rng = np.random.default_rng(seed)
  g = rng.normal(0.0, 0.03, DIM)
  sigma_diag = rng.uniform(0.5, 2.0, DIM)
  return rng, g, sigma_diag, sigma_diag.sum() / (g @ g)


def _step_norms(rng, g, sigma_diag, b_big, k):
  """|G_small|^2 (mean over the k microbatches of b_big / k) and |G_big|^2 of one step."""
  examples = g + rng.normal(size=(b_big, DIM)) * np.sqrt(sigma_diag)
  micro = examples.reshape(k, b_big // k, DIM).mean(1)
  return float(np.mean(np.sum(micro**2, -1))), float(np.sum(examples.mean(0)**2))


def test_step_estimates_are_unbiased():
  rng, g, sigma_diag, _ = _problem()
  b_big, k = 256, 8
  rows = [noise_scale.step_estimates(*_step_norms(rng, g, sigma_diag, b_big, k), b_big // k,
                                     b_big) for _ in range(4000)]
  grad_sq = np.array([r["noise_grad_sq"] for r in rows])
  trace = np.array([r["noise_trace"] for r in rows])
  # within 4 standard errors of the truth; the naive |G_big|^2 is biased by tr(Sigma) / B
  assert abs(grad_sq.mean() - g @ g) < 4 * grad_sq.std() / math.sqrt(len(rows))
  assert abs(trace.mean() - sigma_diag.sum()) < 4 * trace.std() / math.sqrt(len(rows))
  naive = np.mean([_step_norms(rng, g, sigma_diag, b_big, k)[1] for _ in range(400)])
  assert naive > g @ g + 0.5 * sigma_diag.sum() / b_big
  assert (grad_sq < 0).any()  # one step's |G|^2 estimate is noisy: hence the averages


@pytest.mark.parametrize("k", [8, 2])
def test_moving_averages_recover_b_simple(k):
  """Over 4,000 steps at batch 256 (a spread of about 5% across seeds), B_simple ~ 1,800."""
  rng, g, sigma_diag, b_simple = _problem(1)
  b_big = 256
  ema = noise_scale.NoiseScaleEMA(decay=0.997)
  for _ in range(4000):
    est = noise_scale.step_estimates(*_step_norms(rng, g, sigma_diag, b_big, k), b_big // k,
                                     b_big)
    ema.update(est["noise_grad_sq"], est["noise_trace"])
  got = ema.estimates()
  assert 1000 < b_simple < 3000  # far above both batch sizes: the hard case
  assert got["b_simple"] == pytest.approx(b_simple, rel=0.15)
  assert got["trace"] == pytest.approx(sigma_diag.sum(), rel=0.1)


@pytest.mark.unit
def test_moving_average_is_bias_corrected_and_restorable():
  ema = noise_scale.NoiseScaleEMA(decay=0.9)
  assert math.isnan(ema.estimates()["b_simple"])
  ema.update(2.0, 10.0)
  assert ema.estimates() == {"grad_sq": pytest.approx(2.0), "trace": pytest.approx(10.0),
                             "b_simple": pytest.approx(5.0)}
  ema.update(-4.0, 10.0)  # noise dominates: |G|^2 not positive, B_simple not measurable
  assert math.isnan(ema.estimates()["b_simple"])
  again = noise_scale.NoiseScaleEMA(**ema.to_dict())
  assert again.estimates()["trace"] == pytest.approx(10.0)
  with pytest.raises(ValueError, match="b_small < b_big"):
    noise_scale.step_estimates(1.0, 1.0, 8, 8)
