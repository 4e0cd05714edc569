"""Language modelling through the one loop: DP and the ensemble on the embedded corpus."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax import aggregate, metrics, run
from tests.conftest import assert_documented


def _config(arg):
  from experiments.configs import pydocs_gpt2

  return pydocs_gpt2.get_config(arg)


def test_data_parallel_lm_few_steps(tmp_path):
  config = _config("tiny")
  r = run.train_and_evaluate(config, str(tmp_path))
  with open(tmp_path / "results.json") as f:
    on_disk = json.load(f)
  final = on_disk["final"]
  assert on_disk["method"] == "data_parallel" and on_disk["steps"] == 4
  # 32 windows of 32 next-token predictions were scored
  assert final["num_tokens"] == config.eval.num_examples * config.data.context
  assert final["perplexity"] == pytest.approx(np.exp(final["nll"]))
  assert final["perplexity"] < 256  # better than uniform over bytes after 4 steps
  assert on_disk["data"]["tokenizer"] == "byte"
  assert on_disk["tokens_per_step"] == 8 * 32 and on_disk["tokens_per_s"] > 0
  assert_documented(on_disk)
  assert r["target"]["metric"] == "perplexity" and r["target"]["reached"]


def test_ensemble_lm_reports_both_aggregations(tmp_path):
  config = _config("ensemble,tiny")
  config.method.num_workers = 8
  r = run.train_and_evaluate(config, str(tmp_path))
  assert r["num_workers"] == 8 and r["steps_per_worker"] == 4
  assert set(r["ensemble"]) == {"probs", "logits"}
  probs, logits = r["ensemble"]["probs"], r["ensemble"]["logits"]
  assert probs["perplexity"] == pytest.approx(r["final"]["perplexity"])  # 'probs' is headline
  # The mixture's NLL is at most the mean NLL of its members (Jensen).
  assert probs["nll"] <= np.mean([w["nll"] for w in r["per_worker"]]) + 1e-6
  assert np.isfinite(logits["perplexity"])


def test_lm_sums_count_every_token_and_mask_padding():
  logits = jax.random.normal(jax.random.key(0), (3, 5, 7))
  labels = jax.random.randint(jax.random.key(1), (3, 5), 0, 7)
  mask = jnp.asarray([1.0, 1.0, 0.0])
  out = metrics.finalize(metrics.prediction_sums(logits, labels, mask), task="lm")
  logp = jax.nn.log_softmax(logits[:2])
  ref = -np.take_along_axis(np.asarray(logp), np.asarray(labels[:2])[..., None], -1).mean()
  assert out["num_tokens"] == 10
  assert out["nll"] == pytest.approx(float(ref), rel=1e-5)
  assert out["bits_per_token"] == pytest.approx(float(ref) / np.log(2), rel=1e-5)


def test_probs_aggregation_of_token_logits_is_the_mixture():
  logits = jax.random.normal(jax.random.key(0), (4, 2, 3, 5))
  mixed = aggregate.combine(logits, jnp.ones(4), "probs")
  ref = jax.nn.softmax(logits).mean(0)
  np.testing.assert_allclose(np.exp(mixed), ref, rtol=1e-5)
