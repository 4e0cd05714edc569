"""Model zoo: ResNets for classification, GPT-2 for language modelling.

`MODELS` maps config.model.name to a `Model`: the task it serves and how it is built."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from ensemble_jax import config_lib
from ensemble_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class Model:
  """A registered model: `create(model_config, num_classes, context, in_loop)` for `task`,
  and what it supports, which validation and the methods ask instead of its name
  (validation checks the declarations once on the abstract model, `jax.eval_shape`)."""
  name: str
  task: str  # the config.task it serves: classification | lm
  create: Callable
  # The config.model fields `create` reads besides `name` (model.sparsity is the method's),
  # its own included; it reads them through a `View` that refuses any other. The others do
  # not apply to it: neither validated nor compared on resume nor listed in results.json's
  # `model_fields_read`. None: all of MODEL_FIELDS and its own (no View).
  fields: tuple[str, ...] | None = None
  # It has BatchNorm and takes the module fields `bn_axis_name` (its statistics over a mesh
  # axis) and `bn_groups` (each device's slice alone: method.batchnorm='per_device').
  batchnorm: bool = False
  # It sows its penultimate embedding as `intermediates/features`, which proxies read.
  features: bool = False
  own_fields: tuple[str, ...] = ()  # dotted ('model.hidden'): the fields it declared


def _reads(entry: Model) -> tuple[str, ...]:
  if entry.fields is None:
    return tuple(f"model.{f}" for f in MODEL_FIELDS) + entry.own_fields
  return tuple(f"model.{f}" for f in entry.fields)


def fields_read(model_name: str) -> tuple[str, ...]:
  """The config.model fields (dotted, 'model.width') `model_name`'s model reads besides
  its name (`Model.fields`): those that apply to its runs (results.json
  `model_fields_read`)."""
  return _reads(MODELS[model_name])


def unread_fields(model_name: str) -> tuple[str, ...]:
  """The config.model fields (dotted) that `model_name`'s model does not read, other
  models' own fields included: they do not apply to its runs."""
  read = set(fields_read(model_name))
  declared = tuple(name for name, (_, chooser, _) in config_lib.DECLARED.items()
                   if chooser == MODELS.field)
  return tuple(f for f in (*(f"model.{f}" for f in MODEL_FIELDS), *declared) if f not in read)


def model_view(entry: Model, model_config):
  """`model_config` as `entry.create` reads it: a `config_lib.View` that refuses, in one
  line, a field its entry does not declare (`fields`, its own included), so that what
  validation skips, resume leaves uncompared and results.json lists as unread is unread.
  An entry that declares no fields (None) reads them all: the config as it is."""
  if entry.fields is None:
    return model_config
  return config_lib.View(model_config, ("model.name", *_reads(entry)), f"model {entry.name!r}",
                         prefix="model.", fix="add {name!r} to its fields= (validation, "
                         "resume and results.json's model_fields_read then cover it).")


def with_batchnorm(model, model_config, **fields):
  """`model.clone(**fields)` (bn_axis_name, bn_groups) for a model with BatchNorm
  (`Model.batchnorm`); a model without has nothing to synchronise or group."""
  return model.clone(**fields) if MODELS[model_config.name].batchnorm else model


def _model(name: str, create, *, own_fields=(), **declaration) -> Model:
  """The entry `MODELS.register(name, create, task=..., ...)` registers; its own fields
  (`own_fields`, under `model.`) join the fields it reads."""
  if isinstance(create, Model):  # an entry made by hand: its name must be the one given
    if create.name != name or declaration or own_fields:
      raise ValueError(f"model.name: register {name!r} as MODELS.register({name!r}, create, "
                       "task=..., ...), naming it once")
    return create
  fields = declaration.pop("fields", None)
  if fields is not None:
    fields = tuple(fields) + tuple(f.split(".", 1)[1] for f in own_fields)
  return Model(name, create=create, fields=fields, own_fields=tuple(own_fields), **declaration)


MODELS: Registry[Model] = Registry("model.name", entry=_model)
# The config.model fields a model may read (config_lib._model's, less name and sparsity).
MODEL_FIELDS = ("width", "stage_sizes", "stem", "dtype", "size", "remat", "dropout",
                "attention")


def create_model(model_config, num_classes: int, context: int = 0, in_loop: bool = False):
  """The model `config.model` names; for GPT-2 `num_classes` is the vocabulary size.

  `in_loop` says its step runs in a loop, when config.train.microbatches > 1. On CPU a
  ResNet's convolutions then get canonical gradients (models/conv.py); without them
  XLA:CPU runs them ~6x slower."""
  entry = MODELS[model_config.name]
  return entry.create(model_view(entry, model_config), num_classes, context, in_loop)


def _gpt2(model_config, num_classes: int, context: int, in_loop: bool):
  del in_loop
  from ensemble_jax.models import gpt2

  return gpt2.create_model(model_config.size, vocab_size=num_classes, context=context,
                           dtype=jnp.dtype(model_config.dtype), remat=model_config.remat,
                           dropout=model_config.dropout, attention=model_config.attention)


def _resnet(model_config, num_classes: int, context: int, in_loop: bool):
  del context
  from ensemble_jax.models import resnet

  return resnet.create_model(model_config.name, num_classes=num_classes,
                             width=model_config.width, stem=model_config.stem,
                             dtype=jnp.dtype(model_config.dtype),
                             stage_sizes=tuple(model_config.stage_sizes),
                             canonical_conv_grads=in_loop and jax.default_backend() == "cpu")


MODELS.register("gpt2", _gpt2, task="lm",
                fields=("size", "dtype", "remat", "dropout", "attention"))
for _name in ("resnet18", "resnet34", "resnet50"):  # models/resnet.py's presets
  MODELS.register(_name, _resnet, task="classification",
                  fields=("width", "stage_sizes", "stem", "dtype"), batchnorm=True,
                  features=True)
