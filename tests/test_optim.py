"""Every configured optimizer builds and takes a step (the SGD path once broke unnoticed)."""
import jax.numpy as jnp
import optax
import pytest

from ensemble_jax import config_lib, methods, optim

pytestmark = pytest.mark.unit


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


@pytest.mark.parametrize("workload", ["fashion_mnist", "pydocs_gpt2"])
def test_every_sweep_method_warms_up_the_same_fraction_of_its_own_budget(workload):
  """One warm-up rule (issue 13): DP warmed up 0.1 epoch and the ensemble 0.02 before."""
  import importlib

  module = importlib.import_module(f"experiments.configs.{workload}")
  fractions = set()
  for variant in ("sweep", "ensemble,sweep", "diloco,sweep"):
    c = module.get_config(variant)
    budget = methods.num_train_steps(c, 60_000)
    warmup = optim.warmup_steps(c.optim, budget, config_lib.steps_per_epoch(c, 60_000))
    fractions.add(round(warmup / budget, 2))
  assert fractions == {0.05}


def test_warmup_fraction_takes_precedence_over_steps_and_epochs():
  c = config_lib.base_config().optim
  c.warmup_steps, c.warmup_epochs = 7, 3.0
  assert optim.warmup_steps(c, total_steps=200, steps_per_epoch=10) == 7
  c.warmup_fraction = 0.1
  assert optim.warmup_steps(c, total_steps=200, steps_per_epoch=10) == 20
  assert optim.warmup_steps(c, total_steps=1, steps_per_epoch=10) == 0  # never the whole run
