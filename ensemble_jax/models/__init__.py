"""Model zoo: ResNets for classification, GPT-2 for language modelling.

`MODELS` maps config.model.name to a `Model`: the task it serves and how it is built."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from ensemble_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class Model:
  """A registered model: `create(model_config, num_classes, context, in_loop)` for `task`,
  and what it supports, which validation and the methods ask instead of its name
  (validation checks the declarations once on the abstract model, `jax.eval_shape`)."""
  name: str
  task: str  # the config.task it serves: classification | lm
  create: Callable
  # The config.model fields `create` reads besides `name` (model.sparsity is the method's);
  # the others do not apply to it: neither validated nor compared on resume. None: all.
  fields: tuple[str, ...] | None = None
  # It has BatchNorm and takes the module fields `bn_axis_name` (its statistics over a mesh
  # axis) and `bn_groups` (each device's slice alone: method.batchnorm='per_device').
  batchnorm: bool = False
  # It sows its penultimate embedding as `intermediates/features`, which proxies read.
  features: bool = False


def unread_fields(model_name: str) -> tuple[str, ...]:
  """The config.model fields (dotted, 'model.width') that `model_name`'s model does not
  read (`Model.fields`): they do not apply to its runs."""
  fields = MODELS[model_name].fields
  if fields is None:
    return ()
  return tuple(f"model.{f}" for f in MODEL_FIELDS if f not in fields)


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
  return Model(name, create=create, fields=fields, **declaration)


MODELS: Registry[Model] = Registry("model.name", entry=_model)
# The config.model fields a model may read (config_lib._model's, less name and sparsity).
MODEL_FIELDS = ("width", "stage_sizes", "stem", "dtype", "size", "remat", "dropout",
                "attention")


def create_model(model_config, num_classes: int, context: int = 0, in_loop: bool = False):
  """The model `config.model` names; for GPT-2 `num_classes` is the vocabulary size.

  `in_loop` says its step runs in a loop, when config.train.microbatches > 1. On CPU a
  ResNet's convolutions then get canonical gradients (models/conv.py); without them
  XLA:CPU runs them ~6x slower."""
  return MODELS[model_config.name].create(model_config, num_classes, context, in_loop)


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
