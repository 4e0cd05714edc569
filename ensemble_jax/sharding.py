"""The mesh from `config.mesh`, and sharding rules for parameters."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ensemble_jax.config_lib import ConfigError


MESH_AXES = ("data", "worker")
_MESH_FORMS = ("write it as 'axis:size,...' like 'data:-1' or 'worker:8,data:1' (a config "
               "file may also give [('data', -1)]).")


def mesh_axes(mesh) -> list[tuple[str, int]]:
  """config.mesh as [(axis, size)], where size -1 means the rest of the devices.

  It reads the string form the command line sets, 'worker:8,data:1', and the list form of
  config files, [('worker', 8), ('data', 1)]. The one parser of the field; raises
  ConfigError on a value that is neither.
  """
  try:
    if isinstance(mesh, str):
      pairs = [part.split(":") for part in mesh.split(",")]
      axes = [(name.strip(), int(size)) for name, size in pairs]
    else:
      axes = [(str(name), int(size)) for name, size in mesh]
  except (TypeError, ValueError):
    raise ConfigError(f"config.mesh={mesh!r}: {_MESH_FORMS}") from None
  if not axes or not all(name for name, _ in axes):
    raise ConfigError(f"config.mesh={mesh!r}: {_MESH_FORMS}")
  return axes


def mesh_string(mesh) -> str:
  """config.mesh in its string form: 'worker:8,data:1'."""
  return ",".join(f"{name}:{size}" for name, size in mesh_axes(mesh))


def mesh_shape(mesh_config, num_devices: int) -> list[tuple[str, int]]:
  """Resolves the one -1 axis; checks the mesh fits the devices."""
  axes = mesh_axes(mesh_config)
  shown = mesh_string(mesh_config)
  fixed = math.prod(size for _, size in axes if size != -1)
  if any(size == -1 for _, size in axes):
    if num_devices % fixed:
      raise ConfigError(f"config.mesh={shown!r}: the fixed axes use {fixed} devices, "
                        f"which does not divide the {num_devices} devices present; choose "
                        f"sizes whose product divides {num_devices}.")
    axes = [(name, num_devices // fixed if size == -1 else size) for name, size in axes]
  total = math.prod(size for _, size in axes)
  if total > num_devices:
    raise ConfigError(f"config.mesh={shown!r} needs {total} devices but only "
                      f"{num_devices} are present; shrink the mesh or use -1 for one axis.")
  return axes


def make_mesh(mesh_config, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  axes = mesh_shape(mesh_config, len(devices))
  total = math.prod(size for _, size in axes)
  grid = np.asarray(devices[:total]).reshape([size for _, size in axes])
  return Mesh(grid, tuple(name for name, _ in axes))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def fsdp_spec(shape: tuple[int, ...], axis: str, axis_size: int, min_size: int,
              leading: tuple = ()) -> P:
  """Shard the largest dimension divisible by the axis size; small leaves replicate.

  `leading` names the mesh axes of leading (stacked) dims, which are never FSDP-split.
  """
  inner = shape[len(leading):]
  spec = [None] * len(inner)
  if math.prod(inner) >= min_size and axis_size > 1:
    for d in sorted(range(len(inner)), key=lambda d: -inner[d]):
      if inner[d] % axis_size == 0:
        spec[d] = axis
        break
  return P(*leading, *spec)


def state_shardings(abstract_state, mesh: Mesh, *, fsdp: bool, min_size: int,
                    leading: tuple = ()):
  """NamedShardings for every leaf of a (possibly stacked) train state."""
  data_size = mesh.shape.get("data", 1)

  def rule(leaf):
    shape = getattr(leaf, "shape", ())
    if len(shape) < len(leading):
      return NamedSharding(mesh, P())
    if fsdp:
      return NamedSharding(mesh, fsdp_spec(shape, "data", data_size, min_size, leading))
    return NamedSharding(mesh, P(*leading))

  return jax.tree.map(rule, abstract_state)


# How a device runs its several local workers inside shard_map.
LOCAL_STRATEGIES = ("vmap", "unroll", "auto")


def resolve_local_strategy(strategy: str, backend: str) -> str:
  """Resolves `auto` to `unroll` on CPU and `vmap` on accelerators.

  On CPU vmapped convolutions become slow grouped convolutions: 2 workers per device cost
  ~3x two single steps vmapped, ~1x unrolled (experiments/bench/engine.py). On accelerators
  batching the workers' matmuls fills the device."""
  if strategy not in LOCAL_STRATEGIES:
    raise ConfigError(f"config.method.local_strategy={strategy!r}: choose one of "
                      f"{LOCAL_STRATEGIES}.")
  if strategy != "auto":
    return strategy
  return "unroll" if backend == "cpu" else "vmap"


def map_local_workers(fn, strategy: str, *stacked):
  """Applies `fn(j, *tree_j)` to each of the k local workers; results stacked on axis 0."""
  k = jax.tree.leaves(stacked)[0].shape[0]
  if strategy == "vmap":
    return jax.vmap(fn)(jnp.arange(k), *stacked)
  outs = [fn(j, *jax.tree.map(lambda x: x[j], stacked)) for j in range(k)]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
