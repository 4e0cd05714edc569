"""A pool's build sharded over the processes of a multi-process run, to the same bits.

Each process reads and featurises its contiguous share of a split's chunks. What it computed
is all-gathered whole, as bytes (exact for any dtype, float64 included with JAX's x64 off),
and every process combines the chunks' results in global chunk order, as one process does.
No partial sum crosses a process, so the floating-point arithmetic is the one-process
build's whatever the process count.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


class Processes:
  """Which process this is of how many: (index, count); by default JAX's runtime's."""

  def __init__(self, index: int | None = None, count: int | None = None):
    self.index = jax.process_index() if index is None else int(index)
    self.count = jax.process_count() if count is None else int(count)
    if not 0 <= self.index < self.count:
      raise ValueError(f"process index must lie in [0, {self.count}), got {self.index}")

  @property
  def sharded(self) -> bool:
    return self.count > 1

  def share(self, num_items: int) -> range:
    """This process's contiguous share of range(num_items): shares differ by at most 1."""
    return range(self.index * num_items // self.count,
                 (self.index + 1) * num_items // self.count)


def allgather(x_local: np.ndarray, budget_bytes: int = 1 << 28) -> list[np.ndarray]:
  """Every process's array, in process order: the same dtype on all, any leading length.

  Exchanged as bytes in rounds of at most `budget_bytes` per process (a round holds
  count x that), so the values arrive exactly."""
  x_local = np.ascontiguousarray(x_local)
  head = np.asarray([x_local.ndim, *x_local.shape], np.int64).view(np.int32)
  heads = np.asarray(multihost_utils.process_allgather(head)).view(np.int64)
  if not (heads[:, 0] == x_local.ndim).all() or not (heads[:, 2:] == x_local.shape[1:]).all():
    raise ValueError(f"allgather: the processes' arrays differ beyond the leading axis: "
                     f"{[tuple(h[1:]) for h in heads]}")
  shapes = [tuple(int(s) for s in h[1:]) for h in heads]
  sizes = [int(np.prod(s, dtype=np.int64)) * x_local.itemsize for s in shapes]
  bytes_local = x_local.reshape(-1).view(np.uint8)
  out = [np.empty(size, np.uint8) for size in sizes]
  step = max(1, budget_bytes)
  for begin in range(0, max(sizes), step):
    piece = np.zeros(min(step, max(sizes) - begin), np.uint8)
    mine = bytes_local[begin:begin + len(piece)]
    piece[:len(mine)] = mine
    gathered = np.asarray(multihost_utils.process_allgather(piece))
    for o, g in zip(out, gathered):
      o[begin:begin + len(piece)] = g[:max(0, min(len(piece), len(o) - begin))]
  return [o.view(x_local.dtype).reshape(s) for o, s in zip(out, shapes)]


def gather_rows(x_local: np.ndarray, processes: Processes) -> np.ndarray:
  """The processes' rows concatenated in process order (their shares' order)."""
  if not processes.sharded:
    return x_local
  return np.concatenate(allgather(x_local))
