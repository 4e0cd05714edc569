"""Orbax checkpoints of (possibly stacked, sharded) train states plus a JSON record."""
from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


def _abstract(tree):
  """ShapeDtypeStructs that carry each leaf's sharding, so restore lands sharded."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
      if isinstance(x, jax.Array) else x, tree)


class Checkpointer:
  """Saves every `every_steps` (and at the end); restores the latest at start."""

  def __init__(self, directory: str, every_steps: int, max_to_keep: int):
    self.every_steps = every_steps
    self.manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def restore(self, state):
    """-> (state, meta) from the latest checkpoint, or (state, None) if there is none."""
    step = self.manager.latest_step()
    if step is None:
      return state, None
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(state)), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def save(self, step: int, state, meta: dict, force: bool = False) -> None:
    if not force and (self.every_steps <= 0 or step % self.every_steps):
      return
    if self.manager.latest_step() == step:
      return
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
