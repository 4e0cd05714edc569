"""Samplers: what each consumer (a worker, or the one data-parallel model) sees: the
`Sampler` interface and the method's own streams (`SAMPLERS`: random, disjoint). A
distilled pool's sampler is in `distill/pool.py`.

A sampler maps (consumer, step) to the example indices of that consumer's batch, as a
pure function of (seed, consumer, step). Random access by step is what makes the data
stream resumable from a checkpoint with nothing but the step number.
"""
from __future__ import annotations

import abc
import functools

import numpy as np

from ensemble_jax.registry import Registry


class Sampler(abc.ABC):
  """An index stream per consumer: `batch_indices(consumer, step, batch_size)`."""

  # Per-example loss weights over the whole dataset ([num_examples]), or None: coresets
  # (CRAIG, GradMatch) stand for the full set only with their weights.
  weights: np.ndarray | None = None

  def __init__(self, num_examples: int, num_consumers: int = 1, seed: int = 0):
    if num_examples <= 0:
      raise ValueError(f"a sampler needs a non-empty dataset, got num_examples={num_examples}")
    self.num_examples = num_examples
    self.num_consumers = num_consumers
    self.seed = seed

  @abc.abstractmethod
  def pool(self, consumer: int) -> np.ndarray:
    """The example indices `consumer` draws from."""

  @functools.lru_cache(maxsize=64)
  def _epoch_order(self, consumer: int, epoch: int) -> np.ndarray:
    pool = self.pool(consumer)
    rng = np.random.default_rng([self.seed, consumer, epoch])
    return pool[rng.permutation(len(pool))]

  def batch_indices(self, consumer: int, step: int, batch_size: int) -> np.ndarray:
    """Epoch-shuffled, without replacement inside an epoch of the consumer's pool."""
    if not 0 <= consumer < self.num_consumers:
      raise ValueError(f"consumer={consumer} outside [0, {self.num_consumers})")
    pool_size = len(self.pool(consumer))
    flat = step * batch_size + np.arange(batch_size)
    epochs, positions = np.divmod(flat, pool_size)
    out = np.empty(batch_size, dtype=np.int64)
    for epoch in np.unique(epochs):
      sel = epochs == epoch
      out[sel] = self._epoch_order(consumer, int(epoch))[positions[sel]]
    return out


class RandomSampler(Sampler):
  """Every consumer draws from the whole dataset, in its own order (seeded by consumer)."""

  @functools.lru_cache(maxsize=1)
  def _all(self) -> np.ndarray:
    return np.arange(self.num_examples)

  def pool(self, consumer: int) -> np.ndarray:
    return self._all()


class DisjointSampler(Sampler):
  """The dataset partitioned into `num_consumers` shards of near-equal size."""

  @functools.lru_cache(maxsize=1)
  def _shards(self):
    order = np.random.default_rng([self.seed, 2**31 - 1]).permutation(self.num_examples)
    return np.array_split(order, self.num_consumers)

  def pool(self, consumer: int) -> np.ndarray:
    return self._shards()[consumer]


# What a worker's stream draws from without a distilled pool: name -> Sampler class.
SAMPLERS: Registry[type[Sampler]] = Registry("method.sampler")
SAMPLERS.register("random", RandomSampler)
SAMPLERS.register("disjoint", DisjointSampler)


def create_sampler(name: str, num_examples: int, num_consumers: int, seed: int) -> Sampler:
  if name == "disjoint" and num_examples < num_consumers:
    raise ValueError(f"sampler 'disjoint' needs at least one example per consumer: "
                     f"{num_examples} examples for {num_consumers} consumers")
  return SAMPLERS[name](num_examples, num_consumers, seed)
