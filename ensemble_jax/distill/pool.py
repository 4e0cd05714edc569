"""A built pool as the loop reads it: `Pool` and its samplers (`PoolSampler`,
`StagedSampler`); and `split_pool`, one selection shared among workers.

It stands below the loop, which imports it (`train.py`), beside `data.samplers`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ensemble_jax.data.samplers import Sampler


class PoolSampler(Sampler):
  """Explicit pools, one per consumer (a cluster each, or one shared coreset).

  The pool builders (`scores`, `coresets`, `clusters`) only choose indices; this puts them
  into the same deterministic, resumable stream as the built-in samplers.
  """

  def __init__(self, pools, num_examples: int, seed: int = 0, weights=None):
    pools = [np.asarray(p) for p in pools]
    if not pools:
      raise ValueError("PoolSampler needs one pool per consumer, got an empty list")
    super().__init__(num_examples, len(pools), seed)
    for i, p in enumerate(pools):
      if p.ndim != 1 or p.size == 0:
        raise ValueError(f"pool {i} must be a non-empty 1-D index array, got shape {p.shape}; "
                         f"use fewer consumers or a larger fraction")
      if not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"pool {i} must hold integer indices, got dtype {p.dtype}")
      if p.min() < 0 or p.max() >= num_examples:
        raise ValueError(f"pool {i} has indices in [{p.min()}, {p.max()}], outside "
                         f"[0, {num_examples}): build pools against the same dataset")
    self._pools = [p.astype(np.int64) for p in pools]
    if weights is not None:
      weights = np.asarray(weights, np.float32)
      if weights.shape != (num_examples,) or not np.all(np.isfinite(weights)) or \
          weights.min() < 0:
        raise ValueError(f"weights must be a finite, non-negative [{num_examples}] array, got "
                         f"shape {weights.shape}")
      self.weights = weights

  def pool(self, consumer: int) -> np.ndarray:
    return self._pools[consumer]


def split_pool(indices, num_consumers: int, seed: int, disjoint: bool = True
               ) -> list[np.ndarray]:
  """One selected pool split for `num_consumers` workers, deterministic in seed.

  disjoint: a shuffled partition into near-equal shards. Otherwise each consumer gets its
  own random subset of the same size, ceil(len / num_consumers), overlapping across
  consumers (bagging within the pool).
  """
  indices = np.asarray(indices)
  if num_consumers < 1:
    raise ValueError(f"num_consumers must be >= 1, got {num_consumers}")
  if len(indices) < num_consumers:
    raise ValueError(f"cannot give {num_consumers} consumers a non-empty pool each from "
                     f"{len(indices)} indices; select a larger pool or use fewer consumers")
  if disjoint:
    order = np.random.default_rng([seed, 2**31 - 2]).permutation(len(indices))
    return np.array_split(indices[order], num_consumers)
  size = -(-len(indices) // num_consumers)
  return [indices[np.random.default_rng([seed, 2**31 - 2, i]).choice(
      len(indices), size, replace=False)] for i in range(num_consumers)]


@dataclasses.dataclass
class Pool:
  """A distilled pool: what a run's workers read instead of the method's own sampler.

  `ensemble_jax/distill/pools.py` builds it above the loop and hands it to the loop."""
  sampler: Sampler
  info: dict | None  # results.json `distill`; None without a distilled sequence
  # 'routed' weights: [eval examples, N] (images), [eval windows, T, N] (text, per position)
  eval_route: np.ndarray | None = None
  # what the sampler's indices refer to: None, the training split; else a source of the
  # pool's own (synthetic images, or the training split followed by them)
  source: object | None = None


class StagedSampler(Sampler):
  """`first`'s stream for the first `fraction` of a run's steps, then `then`'s from its
  own step 0 (a distilled warm start: a worker's synthetic set, then its real share).
  `for_run(num_steps)` fixes the switch for a run of that many steps."""

  def __init__(self, first: Sampler, then: Sampler, fraction: float, steps: int | None = None):
    if first.num_consumers != then.num_consumers or first.num_examples != then.num_examples:
      raise ValueError("a staged sampler's stages must have the same consumers and examples")
    super().__init__(first.num_examples, first.num_consumers, first.seed)
    self.first, self.then, self.fraction, self.steps = first, then, fraction, steps

  def for_run(self, num_steps: int) -> "StagedSampler":
    return StagedSampler(self.first, self.then, self.fraction,
                         max(1, round(self.fraction * num_steps)))

  def pool(self, consumer: int) -> np.ndarray:
    return np.union1d(self.first.pool(consumer), self.then.pool(consumer))

  def batch_indices(self, consumer: int, step: int, batch_size: int) -> np.ndarray:
    if self.steps is None:
      raise ValueError("a staged sampler reads batches once for_run(num_steps) fixed its switch")
    if step < self.steps:
      return self.first.batch_indices(consumer, step, batch_size)
    return self.then.batch_indices(consumer, step - self.steps, batch_size)
