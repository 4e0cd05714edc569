"""Per-process batches assembled into global, sharded jax.Arrays.

A training batch is either `[B, ...]`, one consumer (data-parallel), or `[N, b, ...]`,
N consumers (the stacked engine). Each process reads only the block of the global batch
its devices hold, as the sharding says, so multi-host runs load 1/P of the data. grain
runs the loading in background threads. Every batch is a pure function of (seed, step),
so resuming at step k needs nothing but k.

A source is anything with `__len__` and `get(index) -> dict[str, np.ndarray]`, one
example. A transform maps `(example, uniforms) -> example`; the uniforms are NUM_UNIFORMS
floats in [0, 1) per example, for augmentation. Examples are stacked key by key.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import grain
import jax
import numpy as np

from ensemble_jax.data.samplers import Sampler

NUM_UNIFORMS = 24  # per example: enough for any transform


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """The global batch's leading shape and sharding: (B,) or (N, b)."""
  leading_shape: tuple[int, ...]
  sharding: jax.sharding.NamedSharding

  @property
  def stacked(self) -> bool:
    return len(self.leading_shape) == 2

  def local_block(self) -> tuple[slice, ...]:
    """The leading-dims block this process's devices hold."""
    shape = self.leading_shape
    index_map = self.sharding.addressable_devices_indices_map(shape)
    block = []
    for d, n in enumerate(shape):
      starts = [idx[d].start or 0 for idx in index_map.values()]
      stops = [n if idx[d].stop is None else idx[d].stop for idx in index_map.values()]
      block.append(slice(min(starts), max(stops)))
    return tuple(block)


def _load_block(source, indices: np.ndarray, uniforms: np.ndarray, transform
                ) -> dict[str, np.ndarray]:
  examples = [transform(source.get(int(index)), u) for index, u in zip(indices, uniforms)]
  return {key: np.stack([e[key] for e in examples]) for key in examples[0]}


class TrainBatches:
  """Random access `[step] -> local numpy batch`; iterate for global jax.Arrays."""

  def __init__(self, source, sampler: Sampler, transform, layout: BatchLayout, seed: int):
    self.source, self.sampler, self.transform = source, sampler, transform
    self.layout, self.seed = layout, seed
    self.block = layout.local_block()
    if layout.stacked and sampler.num_consumers != layout.leading_shape[0]:
      raise ValueError(f"sampler has {sampler.num_consumers} consumers but the batch "
                       f"stacks {layout.leading_shape[0]} workers")

  def local_batch(self, step: int) -> dict[str, np.ndarray]:
    if self.layout.stacked:
      consumers, rows = range(*self.block[0].indices(self.layout.leading_shape[0])), self.block[1]
      per_consumer = self.layout.leading_shape[1]
    else:
      consumers, rows = [0], self.block[0]
      per_consumer = self.layout.leading_shape[0]
    blocks = []
    for consumer in consumers:
      indices = self.sampler.batch_indices(consumer, step, per_consumer)
      # Drawn for the consumer's whole batch, then sliced: independent of process layout.
      uniforms = np.random.default_rng([self.seed, consumer, step]).random(
          (per_consumer, NUM_UNIFORMS))
      block = _load_block(self.source, indices[rows], uniforms[rows], self.transform)
      if self.sampler.weights is not None:  # a weighted coreset: weights go into the loss
        block["weight"] = self.sampler.weights[indices[rows]]
      blocks.append(block)
    if self.layout.stacked:
      return {key: np.stack([b[key] for b in blocks]) for key in blocks[0]}
    return blocks[0]

  def iterate(self, start_step: int, num_steps: int, prefetch: int = 4,
              num_threads: int = 2) -> Iterator[dict[str, jax.Array]]:
    ds = grain.MapDataset.range(start_step, num_steps).map(self.local_batch)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads,
                                              prefetch_buffer_size=prefetch))
    for local in ds:
      yield to_global(local, self.layout)


def to_global(local: dict[str, np.ndarray], layout: BatchLayout) -> dict[str, jax.Array]:
  out = {}
  for key, value in local.items():
    global_shape = layout.leading_shape + value.shape[len(layout.leading_shape):]
    out[key] = jax.make_array_from_process_local_data(layout.sharding, value, global_shape)
  return out


class EvalBatches:
  """The eval split in fixed batches, padded to full size with `mask` = 0 rows."""

  def __init__(self, source, transform, layout: BatchLayout, num_examples: int = 0,
               per_example: dict[str, np.ndarray] | None = None, first: int = 0):
    """`per_example` holds extra arrays [len(source), ...] whose rows ride along.

    Routing weights precomputed for every eval example travel this way. The batches hold
    examples `first`, `first` + 1, ...: `num_examples` of them (0: to the end)."""
    if layout.stacked:
      raise ValueError("eval batches are shared by all workers: use a (B,) layout")
    self.source, self.transform, self.layout = source, transform, layout
    self.first = first
    self.num_examples = min(num_examples or len(source) - first, len(source) - first)
    self.batch_size = layout.leading_shape[0]
    self.num_batches = -(-self.num_examples // self.batch_size)
    self.rows = layout.local_block()[0]
    self.per_example = per_example or {}

  def local_batch(self, i: int) -> dict[str, np.ndarray]:
    flat = i * self.batch_size + np.arange(self.batch_size)
    mask = (flat < self.num_examples).astype(np.float32)
    indices = np.where(mask > 0, self.first + flat, 0)[self.rows]
    batch = _load_block(self.source, indices, np.zeros((len(indices), NUM_UNIFORMS)),
                        self.transform)
    extra = {k: np.asarray(v[indices], np.float32) for k, v in self.per_example.items()}
    return {**batch, **extra, "mask": mask[self.rows]}

  def __iter__(self) -> Iterator[dict[str, jax.Array]]:
    ds = grain.MapDataset.range(self.num_batches).map(self.local_batch)
    for local in ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=2)):
      yield to_global(local, self.layout)
