"""Model zoo: ResNets for classification, GPT-2 for language modelling."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def create_model(model_config, num_classes: int, context: int = 0, in_loop: bool = False):
  """The model `config.model` names; for GPT-2 `num_classes` is the vocabulary size.

  `in_loop` says its step runs in a loop, when config.train.microbatches > 1. On CPU a
  ResNet's convolutions then get canonical gradients (models/conv.py); without them
  XLA:CPU runs them ~6x slower."""
  dtype = jnp.dtype(model_config.dtype)
  if model_config.name == "gpt2":
    from ensemble_jax.models import gpt2

    return gpt2.create_model(model_config.size, vocab_size=num_classes, context=context,
                             dtype=dtype, remat=model_config.remat,
                             dropout=model_config.dropout,
                             attention=model_config.attention)
  from ensemble_jax.models import resnet

  return resnet.create_model(model_config.name, num_classes=num_classes,
                             width=model_config.width, stem=model_config.stem, dtype=dtype,
                             stage_sizes=tuple(model_config.stage_sizes),
                             canonical_conv_grads=in_loop and jax.default_backend() == "cpu")
