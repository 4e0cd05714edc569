"""Bad configs fail before compilation with one message naming field, value and fix."""
import os
import subprocess
import sys

import ml_collections
import pytest

from ensemble_jax import config_lib, train
from tests.conftest import REPO


def _set(config, dotted, value):
  """A copy of `config` with one field changed, type-safety off (as a hand-built dict)."""
  config = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  *parents, leaf = dotted.split(".")
  node = config
  for p in parents:
    node = node[p]
  node[leaf] = value
  return config


@pytest.mark.parametrize("field,value,message", [
    ("train.batch_size", 0, r"config.train.batch_size=0: must be > 0"),
    ("train.batch_size", "128", r"config.train.batch_size='128': must be a number"),
    ("method.name", "allreduce", r"config.method.name='allreduce': choose one of"),
    ("optim.name", "lamb", r"config.optim.name='lamb'"),
    ("eval.target_value", 1.5, r"config.eval.target_value=1.5: accuracy lies in \[0.0, 1.0\]"),
    ("eval.target_metric", "top5", r"config.eval.target_metric='top5'"),
    ("train.num_epochs", 3.0, r"set exactly one of train.num_steps and train.num_epochs"),
    ("mesh", [("data", -1), ("worker", -1)], r"at most one axis may be -1"),
    ("mesh", [("model", 2)], r"axis names must be 'data' or 'worker'"),
    ("method.fsdp", "yes", r"config.method.fsdp='yes': must be True or False"),
    ("data.train_augment", "mixup", r"config.data.train_augment='mixup'"),
])
def test_bad_values_are_named(smoke_config, field, value, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(_set(smoke_config, field, value))


def test_unknown_key_suggests_the_known_one(smoke_config):
  with smoke_config.unlocked():
    smoke_config.train.batchsize = 64
  with pytest.raises(config_lib.ConfigError, match=r"config.train.batchsize: unknown key. "
                     r"Did you mean config.train.batch_size\?"):
    config_lib.validate(smoke_config)


@pytest.mark.parametrize("field,value,message", [
    ("train.batch_size", 36, r"config.train.batch_size=36 is not divisible by the mesh's "
                             r"data axis=8"),
    ("mesh", [("data", 16)], r"needs 16 devices but only 8 are present"),
    ("mesh", [("data", 3), ("worker", -1)], r"does not divide the 8 devices"),
])
def test_shape_errors_before_compilation(smoke_config, tmp_path, field, value, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    train.train_and_evaluate(_set(smoke_config, field, value), str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists() or not os.listdir(tmp_path / "wd")


def test_main_rejects_unknown_override(tmp_path):
  cmd = [sys.executable, "-m", "ensemble_jax.main",
         "--config=experiments/configs/fashion_mnist.py:smoke", f"--workdir={tmp_path}",
         "--config.train.batchsize=3"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "batchsize" in proc.stderr
  assert not os.listdir(tmp_path)
