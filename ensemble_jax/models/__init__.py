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
  """A registered model: `create(model_config, num_classes, context, in_loop)` for `task`."""
  name: str
  task: str  # the config.task it serves: classification | lm
  create: Callable


MODELS: Registry[Model] = Registry("model.name")


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


MODELS.register("gpt2", Model("gpt2", "lm", _gpt2))
for _name in ("resnet18", "resnet34", "resnet50"):  # models/resnet.py's presets
  MODELS.register(_name, Model(_name, "classification", _resnet))
