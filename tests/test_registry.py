"""Registries as a user meets them: plugins written in a directory outside the package.

Each plugin file below is what docs/design.md ("Extension points") tells a user to write.
The tests of issue 71's traps fail on 01e37c00: a builder read fields it did not declare
(its pool's key then stale), could not have a field of its own (`--config.distill.first_k`
was an unknown key), and a mode returning probabilities registered silently (a wrong NLL).
"""
import importlib.util
import logging
import sys
import textwrap

import jax
import numpy as np
import pytest

from ensemble_jax import aggregate, config_lib, plugins, validation
from ensemble_jax.distill import pools
from ensemble_jax.distill.registry import BUILDERS
from tests import pool_keys_lib
from tests.conftest import tiny_ensemble

pytestmark = pytest.mark.integration

PEEK_PLUGIN = '''
from ensemble_jax.distill.registry import Built, pool_info, register_builder


@register_builder("peek", fields=("seed",))
def build_peek(inputs):
  """Declares `seed`, and reads `distill.fraction` too: its key would not hold it."""
  n = int(inputs.config.distill.fraction * 100)
  pools = [list(range(n))] * inputs.num_consumers
  return Built(pools, pool_info(inputs, pools, pool_size=n, split="shared", build_flops=0.0))
'''

FIRST_PLUGIN = '''
from ensemble_jax.config_lib import Field
from ensemble_jax.distill.registry import Built, pool_info, register_builder


@register_builder("first", fields=("seed",),
                  own_fields={"first_k": Field(5, lambda k: k >= 1, "must be >= 1.")})
def build_first(inputs):
  """Every worker draws from the first `distill.first_k` examples."""
  k = inputs.config.distill.first_k
  pools = [list(range(k))] * inputs.num_consumers
  return Built(pools, pool_info(inputs, pools, pool_size=k, split="shared", build_flops=0.0))
'''

FIRST_CONFIG = '''
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import first_plugin  # noqa: E402,F401  (registers the builder `first` and its field)
from experiments.configs import fashion_mnist  # noqa: E402


def get_config(arg="ensemble,tiny"):
  c = fashion_mnist.get_config(arg)
  c.method.num_workers, c.mesh = 4, "worker:4,data:2"
  c.distill.builder = "first"
  return c
'''

# The same builder named only in config.plugins: the config file does not import it.
FIRST_BY_PLUGINS_CONFIG = '''
import os

from experiments.configs import fashion_mnist


def get_config(arg="ensemble,tiny"):
  c = fashion_mnist.get_config(arg)
  c.plugins = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_plugin.py")
  c.method.num_workers, c.mesh = 4, "worker:4,data:2"
  c.distill.builder = "first"
  return c
'''

SOFTMAX_PLUGIN = '''
import jax

from ensemble_jax import aggregate


@aggregate.register_mode("mean_probs")
def mean_probs(logits_Nx, weights_N):
  """Probabilities, where the engine scores log-scores: a wrong NLL if registered."""
  return jax.nn.softmax(aggregate.mean_logits(logits_Nx, weights_N))
'''


def _plugin(tmp_path, name: str, source: str):
  """Imports `source` as module `name` from a file in tmp_path, the way a config does
  (`config.plugins` naming the file: plugins.load)."""
  path = tmp_path / f"{name}.py"
  path.write_text(textwrap.dedent(source))
  plugins.load({"plugins": str(path)})
  return sys.modules[name]


@pytest.fixture
def cleanup():
  """Unregisters what a test's plugins registered and forgets their modules."""
  registered = []
  yield registered
  for registry, name in registered:
    if name in registry:
      registry.unregister(name)
  for module in ("peek_plugin", "first_plugin", "last_plugin", "softmax_plugin"):
    sys.modules.pop(module, None)




@pytest.mark.unit
def test_a_builder_reading_a_field_it_did_not_declare_is_refused(tmp_path, cleanup):
  """Fails on 01e37c00: the build read distill.fraction, and its pool was cached under a
  key without it (a changed fraction reused the old pool)."""
  cleanup.append((BUILDERS, "peek"))
  _plugin(tmp_path, "peek_plugin", PEEK_PLUGIN)
  config = tiny_ensemble(**{"distill.builder": "peek"})
  validation.validate(config)
  data = pool_keys_lib.StubData({"dataset": "fashion_mnist"})
  with pytest.raises(config_lib.ConfigError, match=r"^pool builder 'peek' read config\.distill"
                     r"\.fraction, which it does not declare: add 'distill.fraction'"):
    pools.build(config, data, 4, str(tmp_path / "proxy"))


def _parse(argv):
  """`python -m ensemble_jax.main`'s flag parsing of `argv`; the config it gives."""
  from absl import flags

  from ensemble_jax import main

  levels = {name: logging.getLogger(name).level for name in ("", "absl")}
  saved, sys.argv = sys.argv, ["main"] + argv + ["--workdir=/nonexistent"]
  try:  # config_flags reads its overrides from sys.argv
    main.parse_flags(sys.argv)
    return main._CONFIG.value
  finally:
    sys.argv = saved
    flags.FLAGS.unparse_flags()
    for name, level in levels.items():
      logging.getLogger(name).setLevel(level)


@pytest.mark.unit
def test_a_builders_own_field_is_set_from_the_command_line_and_keys_its_pool(tmp_path,
                                                                            cleanup):
  """Fails on 01e37c00: a builder could not declare a field (`own_fields`); the user's
  `c.distill.first_k` was an unknown key."""
  cleanup.append((BUILDERS, "first"))
  config_file = tmp_path / "first_config.py"
  (tmp_path / "first_plugin.py").write_text(textwrap.dedent(FIRST_PLUGIN))
  config_file.write_text(textwrap.dedent(FIRST_CONFIG))
  default = _parse([f"--config={config_file}"])
  assert default.distill.first_k == 5
  config = _parse([f"--config={config_file}", "--config.distill.first_k=10"])
  assert config.distill.first_k == 10
  validation.validate(config)
  data = pool_keys_lib.StubData({"dataset": "fashion_mnist"})
  assert pools.cache_key(config, data, 4) != pools.cache_key(default, data, 4)
  built = pools.build(config, data, 4, str(tmp_path / "proxy"))
  assert [len(p) for p in built.pools] == [10] * 4
  # Its check runs at validation, before any build.
  config.distill.first_k = 0
  with pytest.raises(config_lib.ConfigError, match=r"config\.distill\.first_k=0: must be >= 1"):
    validation.validate(config)


def test_a_field_of_a_plugin_named_only_in_config_plugins_is_set_from_the_command_line(
    tmp_path, cleanup):
  """The override is parsed after config.plugins is imported (config_flags applies
  overrides while it reads the file, before any validation loads plugins)."""
  cleanup.append((BUILDERS, "last"))  # its own names: absl defines a flag once a process
  (tmp_path / "last_plugin.py").write_text(
      textwrap.dedent(FIRST_PLUGIN).replace("first", "last"))
  config_file = tmp_path / "by_plugins_config.py"
  config_file.write_text(textwrap.dedent(FIRST_BY_PLUGINS_CONFIG).replace("first", "last"))
  config = _parse([f"--config={config_file}", "--config.distill.last_k=10"])
  assert config.distill.last_k == 10 and config.distill.builder == "last"


@pytest.mark.unit
def test_a_mode_returning_probabilities_is_refused_at_registration(tmp_path, cleanup):
  """Fails on 01e37c00: the mode registered, and its probabilities were scored as
  log-scores (a wrong NLL, exit status 0)."""
  cleanup.append((aggregate.MODES, "mean_probs"))
  jax.numpy.zeros(1)  # JAX runs in this process: values are checked at registration
  with pytest.raises(config_lib.ConfigError, match=r"^aggregation mode 'mean_probs': returns "
                     r"probabilities \(each row sums to 1\) but declares returns='logits'"):
    _plugin(tmp_path, "softmax_plugin", SOFTMAX_PLUGIN)
  assert "mean_probs" not in aggregate.MODES
  # Declared as what it returns, it is scored by its log: equal to the `probs` mixture.
  _plugin(tmp_path, "softmax_plugin", SOFTMAX_PLUGIN.replace(
      '"mean_probs")', '"mean_probs", returns="probs")'))
  logits = np.random.default_rng(1).normal(size=(3, 4, 5)).astype(np.float32)
  scores = aggregate.combine(logits, np.ones(3, np.float32), "mean_probs")
  np.testing.assert_allclose(np.exp(scores).sum(-1), 1.0, rtol=1e-5)


@pytest.mark.unit
def test_a_mode_that_does_not_reduce_over_workers_or_mislabels_log_scores_is_refused():
  def each_worker(logits_Nx, weights_N):
    return logits_Nx

  with pytest.raises(config_lib.ConfigError, match=r"^aggregation mode 'each_worker': returns "
                     r"shape \(3, 4, 5\) for logits \(3, 4, 5\).*reduce over the workers"):
    aggregate.register_mode("each_worker")(each_worker)
  jax.numpy.zeros(1)
  with pytest.raises(config_lib.ConfigError, match=r"^aggregation mode 'raw': declares "
                     r"log-scores \(returns='log_probs'\) but its rows' logsumexp"):
    aggregate.register_mode("raw", returns="log_probs")(aggregate.mean_logits)
  with pytest.raises(config_lib.ConfigError, match=r"^aggregation mode 'nan': returns "
                     r"non-finite scores when an excluded worker"):
    aggregate.register_mode("nan")(lambda logits_Nx, weights_N: logits_Nx.mean(0))
  assert not {"each_worker", "raw", "nan"} & set(aggregate.MODES)


@pytest.mark.unit
def test_the_built_in_modes_pass_their_own_check():
  """Their values are checked here, not in every process (`aggregate._TESTED`)."""
  for name, mode in aggregate.MODES.items():
    if mode.combine is not None:
      aggregate.check_values(mode)


@pytest.mark.unit
def test_every_registry_registers_for_the_length_of_a_with_block():
  from ensemble_jax import methods, models
  from ensemble_jax.data import samplers

  class Mine(methods.METHODS["ensemble"]):
    pass

  def create(model_config, num_classes, context, in_loop):
    raise NotImplementedError

  with aggregate.MODES.registered("worker0", lambda l, w: l[0], returns="logits") as mode:
    assert aggregate.MODES["worker0"] is mode and mode.returns == "logits"
  with methods.METHODS.registered("mine", Mine):
    assert methods.METHODS["mine"].name == "mine"
  with models.MODELS.registered("mine", create, task="classification"):
    assert models.MODELS["mine"].task == "classification"
  with samplers.SAMPLERS.registered("mine", samplers.SAMPLERS["random"]):
    assert "mine" in samplers.SAMPLERS
  with BUILDERS.registered("mine", lambda inputs: None, own_fields={"mine_k": 3}):
    assert config_lib.base_config().distill.mine_k == 3
    assert "distill.mine_k" in BUILDERS["mine"].fields
  for registry in (aggregate.MODES, methods.METHODS, models.MODELS, samplers.SAMPLERS,
                   BUILDERS):
    assert "mine" not in registry and "worker0" not in registry
  assert "mine_k" not in config_lib.base_config().distill


@pytest.mark.unit
def test_aggregation_modes_take_spaces_around_commas():
  """Fails on 01e37c00: `"logits, probs"` was refused for the space."""
  config = tiny_ensemble(**{"method.aggregation": "logits, probs"})
  assert config_lib.aggregation_modes(config) == ("logits", "probs")
  validation.validate(config)


@pytest.mark.unit
def test_the_one_registry_named_models():
  """`models.MODELS` is the registry; resnet's presets are `resnet.PRESETS`."""
  from ensemble_jax import models
  from ensemble_jax.models import resnet

  assert not hasattr(resnet, "MODELS") and set(resnet.PRESETS) <= set(models.MODELS)
