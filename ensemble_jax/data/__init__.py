"""Datasets for both tasks behind one call: `load(config)` -> `Data`."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from absl import logging


@dataclasses.dataclass
class Data:
  train: Any  # a source: __len__ and get(index) -> example dict
  eval: Any
  num_classes: int  # classes, or the vocabulary size for language models
  init_input: jax.ShapeDtypeStruct  # one model-input batch, for abstract init
  train_transform: Callable
  eval_transform: Callable
  info: dict  # what the run should record about its data (sizes, tokens, ...)


class Head:
  """The first `n` examples of a source (config.data.train_examples: quick runs, tests)."""

  def __init__(self, source, n: int):
    self.source, self.n = source, min(n, len(source))

  def __len__(self) -> int:
    return self.n

  def get(self, index: int) -> dict:
    if not 0 <= index < self.n:
      raise IndexError(f"example {index} outside [0, {self.n})")
    return self.source.get(index)

  def get_range(self, begin: int, end: int) -> dict | None:
    if not 0 <= begin <= end <= self.n:
      raise IndexError(f"range [{begin}, {end}) outside [0, {self.n})")
    return get_range(self.source, begin, end)


def get_range(source, begin: int, end: int) -> dict | None:
  """Examples [begin, end) of a source stacked per field, from its `get_range` if it has one
  (array-backed sources: a slice); None where it reads examples one by one."""
  get_range_fn = getattr(source, "get_range", None)
  return None if get_range_fn is None else get_range_fn(begin, end)


def load(config) -> Data:
  """Images or token windows; the training set cut to config.data.train_examples if > 0."""
  start = time.perf_counter()
  data = _load(config)
  if config.data.train_examples > 0:
    data.train = Head(data.train, config.data.train_examples)
    data.info = {**data.info, "train_examples_used": len(data.train)}
  kind = "windows" if config.task == "lm" else "examples"
  logging.info("data: %s, %d train / %d eval %s, loaded in %.1f s", config.data.dataset,
               len(data.train), len(data.eval), kind, time.perf_counter() - start)
  return data


def _load(config) -> Data:
  if config.task == "lm":
    from ensemble_jax.data import text

    data = text.load(config.data)
    identity = lambda example, u: example  # noqa: E731
    return Data(data.train, data.eval, data.vocab_size,
                jax.ShapeDtypeStruct((1, config.data.context), jnp.int32), identity, identity,
                {"tokenizer": config.data.tokenizer, "eos_id": data.eos_id, **data.stats})
  from ensemble_jax.data import images

  data = images.load(config.data, config.eval.split)
  return Data(data.train, data.eval, data.num_classes,
              jax.ShapeDtypeStruct((1, *data.image_shape), jnp.float32),
              images.make_transform(config.data, train=True),
              images.make_transform(config.data, train=False),
              {"train_examples": len(data.train), "eval_examples": len(data.eval)})
