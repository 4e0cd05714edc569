"""Entries' own fields and the model fields a model reads, as a user's plugin meets them.

The plugins are files in a directory outside the package, named in `config.plugins`. Each
test fails on 6d33114e (issue 71): --help listed an entry's name but not the fields it
declares; a model's unread fields were validated as if they applied (GPT-2 refused for
`model.width=0`, a plugin model for a ResNet's `model.width`) and results.json did not say
which applied; a model read any config.model field, declared or not.
"""
import sys
import textwrap

import pytest

from ensemble_jax import config_lib, methods, models, validation
from ensemble_jax.distill.registry import BUILDERS

pytestmark = pytest.mark.unit

# A model, a builder and a method, each with a field of its own (docs/design.md, "Extension
# points"). The model reads `dtype` and its own `fieldy_hidden`, no other model field.
PLUGIN = '''
import flax.linen as nn
import jax.numpy as jnp

from ensemble_jax import methods, models
from ensemble_jax.config_lib import Field
from ensemble_jax.distill.registry import Built, pool_info, register_builder


class Mlp(nn.Module):
  hidden: int
  num_classes: int
  dtype: str

  @nn.compact
  def __call__(self, x, train: bool):
    x = jnp.reshape(x, (x.shape[0], -1)).astype(self.dtype)
    x = nn.Dense(self.hidden)(x)
    self.sow("intermediates", "features", x)
    return nn.Dense(self.num_classes)(nn.relu(x))


@models.MODELS.register("fieldy_mlp", task="classification", fields=("dtype",),
                        features=True, own_fields={
                            "fieldy_hidden": Field(16, lambda n: n >= 1, "must be >= 1.")})
def create(model_config, num_classes, context, in_loop):
  return Mlp(model_config.{read}, num_classes, model_config.dtype)


@register_builder("fieldy_first", fields=("seed",), own_fields={"fieldy_k": 7})
def build_first(inputs):
  k = inputs.config.distill.fieldy_k
  pools = [list(range(k))] * inputs.num_consumers
  return Built(pools, pool_info(inputs, pools, pool_size=k, split="shared", build_flops=0.0))


@methods.METHODS.register("fieldy_ensemble", own_fields={"fieldy_rate": 0.5})
class FieldyEnsemble(methods.METHODS["ensemble"]):
  pass
'''


def _plugin_files(directory, template: str, placeholder: str, entries):
  """A fixture's body: yields write(value), which writes `template` with `placeholder`
  replaced as a new module under `directory`; then unregisters `entries` ((registry, name)
  pairs) and forgets the modules."""
  written = []

  def write(value: str) -> str:
    directory.mkdir(exist_ok=True)
    module = f"{directory.name}_plugin_{len(written)}"
    path = directory / f"{module}.py"
    path.write_text(textwrap.dedent(template).replace(placeholder, value))
    written.append(module)
    return str(path)

  yield write
  for registry, name in entries:
    if name in registry:
      registry.unregister(name)
  for module in written:
    sys.modules.pop(module, None)


@pytest.fixture
def plugin(tmp_path):
  """Writes the plugin (its model's width `model.<read>`, fieldy_hidden unless given) as
  tmp_path/fieldy/<module>.py; unregisters its entries after the test."""
  for write in _plugin_files(tmp_path / "fieldy", PLUGIN, "{read}", (
      (models.MODELS, "fieldy_mlp"), (BUILDERS, "fieldy_first"),
      (methods.METHODS, "fieldy_ensemble"))):
    yield lambda read="fieldy_hidden": write(read)


def _config(path: str, **fields):
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("tiny")
  c.plugins = path
  for name, value in fields.items():
    config_lib.set_dotted(c, name, value)
  return c


def test_help_lists_each_entrys_own_fields_with_their_defaults(plugin, capsys, monkeypatch):
  from ensemble_jax import main

  monkeypatch.setattr(sys.modules["__main__"], "__doc__", None)  # --help writes it
  with pytest.raises(SystemExit) as e:
    main.parse_flags(["main", "--config=experiments/configs/fashion_mnist.py:tiny",
                      f"--config.plugins={plugin()}", "--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for entry, field in (("fieldy_mlp", "--config.model.fieldy_hidden=16"),
                       ("fieldy_first", "--config.distill.fieldy_k=7"),
                       ("fieldy_ensemble", "--config.method.fieldy_rate=0.5")):
    assert f"      {entry}: {field}" in out.splitlines(), out


def test_model_fields_a_model_does_not_read_are_not_validated():
  """GPT-2 reads no model.width: 0 there does not apply to it."""
  from experiments.configs import pydocs_gpt2

  c = pydocs_gpt2.get_config("tiny")
  c.model.width = 0
  validation.validate(c)
  assert {"model.width", "model.stem", "model.stage_sizes"} <= set(
      models.unread_fields("gpt2"))
  assert "model.width" not in models.fields_read("gpt2")


def test_a_plugin_models_unread_fields_are_skipped_and_its_reads_listed(plugin):
  """What results.json records as `model_fields_read` (record.build)."""
  c = _config(plugin(), **{"model.name": "fieldy_mlp", "model.width": 0,
                           "model.stage_sizes": (0,), "model.size": "none"})
  validation.validate(c)
  assert models.fields_read("fieldy_mlp") == ("model.dtype", "model.fieldy_hidden")
  assert {"model.width", "model.stage_sizes", "model.size"} <= set(
      models.unread_fields("fieldy_mlp"))
  assert "model.fieldy_hidden" in models.unread_fields("resnet18")  # not the ResNet's
  c.model.fieldy_hidden = 0  # its own field is checked, as it applies
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.fieldy_hidden=0: must"):
    validation.validate(c)


def test_a_model_reading_a_field_it_does_not_declare_is_refused_at_validation(plugin):
  """Read through a view, as a builder's config: `model_fields_read` cannot lie."""
  c = _config(plugin(read="width"), **{"model.name": "fieldy_mlp"})
  with pytest.raises(config_lib.ConfigError) as e:
    validation.validate(c)
  assert str(e.value) == (
      "config.model.name='fieldy_mlp': model 'fieldy_mlp' read config.model.width, which it "
      "does not declare: add 'width' to its fields= (validation, resume and results.json's "
      "model_fields_read then cover it).")


# A model whose forward pass has a bug of the user's: `{body}` raises at validation's
# abstract check (`jax.eval_shape` of its init), before anything trains.
RAISING_PLUGIN = '''
import flax.linen as nn
import jax.numpy as jnp

from ensemble_jax import models


class Buggy(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool):
    x = jnp.reshape(x, (x.shape[0], -1))
    {body}


@models.MODELS.register("buggy_mlp", task="classification", fields=())
def create(model_config, num_classes, context, in_loop):
  return Buggy(num_classes)
'''

USER_BUGS = {  # the exception: a __call__ that raises it, what its message says
    "KeyError": ('return {"logits": x}["scores"]', "'scores'"),
    "AttributeError": ("return x.logits", "logits"),
    "IndexError": ("return x[:, :x.shape[3]]", "tuple index out of range"),
    "NotImplementedError": ('raise NotImplementedError("the stem is not written yet")',
                            "the stem is not written yet"),
    "ZeroDivisionError": ("return x * (1 // 0)", "division"),
    "TypeError": ("return nn.Dense(self.num_classes)(x) @ jnp.ones((3, 3))", "dot_general"),
}


@pytest.fixture
def buggy_model(tmp_path):
  """Writes a plugin whose model raises; unregisters it and forgets its modules after."""
  yield from _plugin_files(tmp_path / "buggy", RAISING_PLUGIN, "{body}",
                           ((models.MODELS, "buggy_mlp"),))


@pytest.mark.parametrize("raised", sorted(USER_BUGS))
def test_a_plugin_model_raising_at_the_abstract_check_is_one_line(buggy_model, raised):
  """Fails on e158d51a for all but TypeError: only ValueError and TypeError became a
  ConfigError; a KeyError, AttributeError, IndexError, NotImplementedError or any other
  escaped validation as a raw traceback from inside the model."""
  body, said = USER_BUGS[raised]
  c = _config(buggy_model(body), **{"model.name": "buggy_mlp"})
  with pytest.raises(config_lib.ConfigError) as e:
    validation.validate(c)
  message = str(e.value)
  assert "\n" not in message, message
  assert message.startswith("config.model.name='buggy_mlp': "), message
  assert f"raised {raised}: " in message and said in message, message
  assert "fix the model" in message, message


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_an_interrupt_at_the_abstract_check_is_not_a_config_error(buggy_model, stop):
  c = _config(buggy_model(f"raise {stop.__name__}()"), **{"model.name": "buggy_mlp"})
  with pytest.raises(stop):
    validation.validate(c)
