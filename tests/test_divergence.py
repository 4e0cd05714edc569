"""A worker that diverges is excluded before anything reads its state: an eval or a sync.

Regression test: the non-finite-loss check ran one step late, after the eval that
followed, so a worker that diverged in the last update entered the final evaluation
(failed on b8f7b5c: the final ensemble NLL was NaN while `excluded_workers` listed it).
"""
import math

import jax
import jax.numpy as jnp
import pytest

from ensemble_jax import run
from ensemble_jax.methods import step as step_lib

pytestmark = pytest.mark.e2e

BAD_WORKER = 5


def test_a_worker_diverging_in_the_last_step_is_excluded_from_the_final_eval(tmp_path,
                                                                             monkeypatch):
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("ensemble,tiny")  # 8 workers, one per device, L = 4
  config.checkpoint.every_steps = 0
  last = config.method.steps_per_worker
  clean_step = step_lib.train_step

  def diverging_step(state, batch, rng, cfg):
    """Worker BAD_WORKER's last update turns its weights and loss to NaN."""
    new, metrics = clean_step(state, batch, rng, cfg)
    bad = (jax.lax.axis_index("worker") == BAD_WORKER) & (state.step == last - 1)
    poison = lambda x: jnp.where(bad, jnp.nan, x)  # noqa: E731
    return (new.replace(params=jax.tree.map(poison, new.params)),
            {**metrics, "loss": poison(metrics["loss"])})

  monkeypatch.setattr(step_lib, "train_step", diverging_step)
  r = run.train_and_evaluate(config, str(tmp_path))
  assert [(w["worker"], w["step"]) for w in r["excluded_workers"]] == [(BAD_WORKER, last - 1)]
  assert r["history"][-1]["step"] == last
  for mode in ("logits", "probs"):  # the final eval never saw the NaN worker
    assert math.isfinite(r["ensemble"][mode]["nll"]), mode
  assert math.isfinite(r["final"]["worker/nll_mean"])
