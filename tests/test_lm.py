"""Language modelling through the one loop: DP and the ensemble on the embedded corpus."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax import aggregate, config_lib, metrics, run
from tests.conftest import assert_documented

pytestmark = pytest.mark.integration


def _config(arg):
  from experiments.configs import pydocs_gpt2

  return pydocs_gpt2.get_config(arg)


@pytest.mark.e2e
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
  # GPT-2 reads no model.width / stem / stage_sizes: they did not apply (issue 71)
  assert on_disk["model_fields_read"] == ["model.size", "model.dtype", "model.remat",
                                          "model.dropout", "model.attention"]
  assert_documented(on_disk)
  assert r["target"]["metric"] == "perplexity" and r["target"]["reached"]


@pytest.mark.e2e
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
  # Evaluations reduce the headline mixture's likelihood only; its accuracy and ECE, and
  # the 'logits' mode, come from one reduction of the full logits at the end.
  last = r["history"][-1]
  assert last["probs/perplexity"] == probs["perplexity"] and "probs/accuracy" not in last
  assert not any(k.startswith("logits/") for k in last)
  assert {"accuracy", "ece"} <= set(probs) and {"accuracy", "ece"} <= set(logits)
  programs = {(c["program"], c["per"]) for c in r["cost"]["modelled"]["collectives"]}
  assert {("eval", "eval"), ("final_eval", "run")} <= programs


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


def test_target_log_probs_give_the_mixtures_nll_and_exclude_nan_workers():
  """The mixture read at the target, from each worker's log-probability of it, is the full
  mixture's (`combine`) at the target: what an LM evaluation reduces instead of logits."""
  logits_NxBxTxV = np.asarray(jax.random.normal(jax.random.key(0), (4, 2, 3, 7))) * 3
  logits_NxBxTxV[2] = np.nan  # worker 2 diverged
  labels_BxT = jax.random.randint(jax.random.key(1), (2, 3), 0, 7)
  route_NxBxT = jax.random.uniform(jax.random.key(2), (4, 2, 3))
  logp_NxBxT = jax.vmap(aggregate.target_log_probs, (0, None))(jnp.asarray(logits_NxBxTxV),
                                                                labels_BxT)
  for weights in (jnp.asarray([1.0, 1.0, 0.0, 1.0]),
                  route_NxBxT * jnp.asarray([1.0, 1.0, 0.0, 1.0])[:, None, None]):
    mixed = aggregate.mixture_log_probs(logp_NxBxT, weights)
    full = aggregate.combine(jnp.asarray(logits_NxBxTxV), weights, "probs")
    want = jnp.take_along_axis(jax.nn.log_softmax(full), labels_BxT[..., None], -1)[..., 0]
    assert np.all(np.isfinite(mixed))
    np.testing.assert_allclose(mixed, want, rtol=1e-6, atol=1e-6)
  sums = metrics.nll_sums(mixed, jnp.asarray([1.0, 0.0]))
  assert float(sums["count"]) == 3 and float(sums["nll"]) == pytest.approx(
      -float(mixed[0].sum()), rel=1e-6)
  assert set(metrics.finalize(metrics.add_sums(None, sums), "lm")) == {
      "nll", "perplexity", "bits_per_token", "num_tokens"}


def _lm_eval_collectives(aggregation: str, vocab: int, n=4, b=16, t=32):
  """The collectives of an LM ensemble's eval program, compiled on n devices."""
  from ensemble_jax import hlo, methods
  from ensemble_jax.sharding import make_mesh

  config = _config("ensemble,tiny")
  config.method.num_workers, config.mesh = n, [("worker", n), ("data", 1)]
  config.method.aggregation, config.eval.batch_size = aggregation, b
  method = methods.build(config, make_mesh(config.mesh, jax.devices()[:n]), num_classes=vocab,
                         init_input=jax.ShapeDtypeStruct((1, t), jnp.int32), num_steps=4,
                         steps_per_epoch=10).method
  train = {"tokens": jax.ShapeDtypeStruct((n, 8, t + 1), jnp.int32)}
  batch = {"tokens": jax.ShapeDtypeStruct((b, t + 1), jnp.int32),
           "mask": jax.ShapeDtypeStruct((b,), jnp.float32)}
  if aggregate.routed(config_lib.aggregation_modes(config)):
    batch["route"] = jax.ShapeDtypeStruct((b, t, n), jnp.float32)
  [program] = [p for p in method.programs(train, batch, 1) if p.name == "eval"]
  return sorted((c.op, c.operand_bytes) for c in hlo.collectives(
      program.lowered.compile().as_text()))


def vocabulary_cases() -> list[str]:
  """The aggregations the vocabulary check compiles: one per registered mode that mixes
  predictions (`aggregate.MODES`), read when called. A mode with a target-only form leads
  (its evaluations reduce only that); any other follows `probs` (reduced in full only at
  the end, where its accuracy needs the whole distribution)."""
  return [name if mode.targets else f"probs,{name}"
          for name, mode in aggregate.MODES.items() if mode.mixture]


@pytest.mark.parametrize("aggregation", vocabulary_cases())
def test_lm_ensemble_evaluations_send_no_collective_that_grows_with_the_vocabulary(
    aggregation):
  """The mixture's perplexity needs one log-probability per worker and target: no
  collective of the eval program is as large as one worker's share of [B, T, V] logits,
  and doubling the vocabulary changes none of them."""
  n, b, t, vocab = 4, 16, 32, 256
  found = _lm_eval_collectives(aggregation, vocab, n, b, t)
  assert found and max(size for _, size in found) < b * t * vocab * 4 // n, found
  assert _lm_eval_collectives(aggregation, 2 * vocab, n, b, t) == found
