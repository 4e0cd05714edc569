"""The engine asks entries, not names: a user's method and model, each in a file of their
own outside the package, imported the way a user's config file imports them.

Both tests fail on 01e37c00 (issue 71): a subclass of `Ensemble` under a new name trained
train.num_steps, not its method.steps_per_worker (`config_lib.budget_per_worker` tested
the name), and a model without BatchNorm on a per-device-BatchNorm mesh died with a raw
TypeError from `DataParallel.__init__` (`model.clone(bn_groups=...)`).
"""
import importlib.util
import os
import textwrap

import pytest

from ensemble_jax import methods, models

pytestmark = pytest.mark.e2e
METHOD_PLUGIN = """
from ensemble_jax import methods
from ensemble_jax.methods.ensemble import Ensemble


class MyEnsemble(Ensemble):
  name = "my_ensemble"


methods.METHODS.register(MyEnsemble.name, MyEnsemble)
"""

MODEL_PLUGIN = """
import flax.linen as nn
import jax.numpy as jnp

from ensemble_jax import models


class MLP(nn.Module):  # no BatchNorm: it takes no bn_axis_name / bn_groups
  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool):
    x = jnp.reshape(x, (x.shape[0], -1)).astype(jnp.float32)
    return nn.Dense(self.num_classes)(nn.relu(nn.Dense(16)(x)))


def create(model_config, num_classes, context, in_loop):
  return MLP(num_classes)


models.MODELS.register("my_mlp", models.Model("my_mlp", "classification", create))
"""


def _import_plugin(tmp_path, name: str, source: str):
  """The plugin file written outside the package and imported from its path."""
  path = tmp_path / f"{name}.py"
  path.write_text(textwrap.dedent(source))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def my_ensemble(tmp_path):
  _import_plugin(tmp_path, "my_method_plugin", METHOD_PLUGIN)
  yield "my_ensemble"
  methods.METHODS.unregister("my_ensemble")


@pytest.fixture
def my_mlp(tmp_path):
  _import_plugin(tmp_path, "my_model_plugin", MODEL_PLUGIN)
  yield "my_mlp"
  models.MODELS.unregister("my_mlp")


def test_a_subclassed_methods_per_worker_budget_is_honoured(my_ensemble, tmp_path):
  from ensemble_jax import run
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.method.name = my_ensemble
  c.method.num_workers, c.mesh = 2, "worker:2,data:1"
  c.method.steps_per_worker, c.train.num_steps = 2, 5  # the budget is the per-worker one
  c.eval.every_steps, c.train.stop_at_target = 2, False
  results = run.train_and_evaluate(c, str(tmp_path / "run"))
  assert results["method"] == "my_ensemble"
  assert results["step_budget"] == 2 and results["steps"] == 2
  assert results["steps_per_worker"] == 2 and results["num_workers"] == 2


def test_a_model_without_batchnorm_on_a_per_device_batchnorm_mesh_is_one_line(
    my_mlp, tmp_path, capsys):
  from ensemble_jax import main
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("tiny")  # data-parallel on a `data` axis of the 8 devices
  c.model.name, c.method.batchnorm, c.cost.devices = my_mlp, "per_device", 8
  workdir = str(tmp_path / "run")
  assert main.run(c, workdir) == 2
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("error: config.method.batchnorm='per_device': ")
  assert "my_mlp" in line and "method.batchnorm='synchronised'" in line
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))  # nothing trained
