"""Every configured optimizer builds and takes a step (the SGD path once broke unnoticed)."""
import jax.numpy as jnp
import optax
import pytest

from ensemble_jax import config_lib, optim


@pytest.mark.parametrize("name", config_lib.OPTIMIZERS)
def test_every_optimizer_builds_and_steps(name):
  c = config_lib.base_config().optim
  c.name, c.warmup_steps, c.warmup_epochs = name, 0, 0.0
  tx = optim.create_optimizer(c, batch_size=c.base_batch_size, total_steps=10,
                              steps_per_epoch=10)
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.zeros(2)}
  updates, _ = tx.update({"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}, tx.init(params),
                         params)
  moved = optax.apply_updates(params, updates)
  assert float(jnp.abs(moved["bias"]).sum()) > 0  # the learning rate is live after warm-up
