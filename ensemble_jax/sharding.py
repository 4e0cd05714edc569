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


# The stacked methods' default mesh: one worker per device (several per device when N is a
# multiple of the devices). `fit_worker_mesh` fits it to N workers on other counts.
WORKER_MESH = "worker:-1,data:1"


def fitted_mesh(num_workers: int, devices: int, batch_sizes: tuple[int, ...] = ()) -> str:
  """The default layout of N workers on D devices, as a mesh string.

  N a multiple of D: `WORKER_MESH`, N / D workers per device. Otherwise the workers form
  g = gcd(N, D) groups, each on D / g devices that split its workers' batches on `data`
  (N = 4 on 8 devices: 'worker:4,data:2', each worker on two devices): the same updates
  as one worker per device (BatchNorm over the worker's whole batch). Where `batch_sizes`
  do not split D / g ways, `data` is the largest divisor of D / g that splits them all, and
  the other devices idle."""
  if num_workers % devices == 0:
    return WORKER_MESH
  groups = math.gcd(num_workers, devices)
  span = devices // groups
  data = max(d for d in range(1, span + 1)
             if span % d == 0 and all(b % d == 0 for b in batch_sizes))
  return f"worker:{groups},data:{data}"


def batch_sizes(config) -> tuple[int, ...]:
  """What each worker's `data` devices split: its train batch (each microbatch) and the
  eval batch."""
  return (config.train.batch_size // max(config.train.microbatches, 1),
          config.train.batch_size, config.eval.batch_size)


def fit_worker_mesh(config, devices: int) -> str | None:
  """Fits a stacked method's default mesh (`WORKER_MESH`) to its N workers on the
  `devices` present (`fitted_mesh`), in place; `methods.fit_workers_to_devices`, which
  every entry point (main, the run API, the sweeps) calls, calls it for a stacked method.
  Returns a line saying what it chose, None when the config stays as it is (a mesh the
  user chose, N a multiple of D).

  A layout field: it changes what runs where, not what is trained, nor the cluster the run
  stands for and is priced on: N devices, one worker each (`cost.devices`, unless the config
  sets it)."""
  if mesh_string(config.mesh) != WORKER_MESH:
    return None
  n = config.method.num_workers
  mesh = fitted_mesh(n, devices, batch_sizes(config))
  if mesh == WORKER_MESH:
    return None
  config.mesh = mesh
  config.cost.devices = config.cost.devices or n
  used = math.prod(size for _, size in mesh_axes(mesh))
  idle = (f"; {devices - used} device(s) idle: the batches do not split further"
          if used < devices else "")
  return (f"layout: {n} workers on {devices} devices, mesh {mesh} (the default "
          f"{WORKER_MESH} fitted: one worker per device cannot hold {n} workers on "
          f"{devices}){idle}; priced as {config.cost.devices} devices (cost.devices). "
          "--config.mesh=... chooses another.")


def describe_layout(stacked: bool, num_workers: int, mesh: dict, devices: int) -> str:
  """What runs where, in words (results.json `layout`): `stacked` workers
  (`Method.stacked`) or one model."""
  used = math.prod(mesh.values())
  data = mesh.get("data", 1)
  if not stacked:
    return f"one model on {used} of {devices} device(s), its batch split {data} ways"
  groups = mesh.get("worker", 1)
  per = num_workers // groups
  spans = f", each worker's batches split over {data} devices" if data > 1 else ""
  return (f"{num_workers} workers on {used} of {devices} device(s): {groups} group(s) of "
          f"{per} worker(s){spans}")


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
