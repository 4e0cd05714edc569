"""What a method communicates, read from its programs compiled for its cluster.

The cost report charges the collectives of every program a run calls (`Method.programs`).
They are compiled on the mesh of the cluster the run stands for (`Method.cluster_mesh`),
of D = config.cost.devices devices. Where that is the run's own mesh, the run's method
lowers them. Where this process has D devices, the method is built again on D of them.
Otherwise a child process with D simulated CPU devices compiles them; for example, a sweep
point standing for 8 devices but trained on a one-device host. The child,
`python -m ensemble_jax.communication`, reads a `Request` on stdin and writes the
collectives on stdout. Programs are compiled, never run, so no array of D devices is ever
materialised.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import jax
import ml_collections
import numpy as np

from ensemble_jax import config_lib, costs, plugins, sharding
from ensemble_jax import methods as methods_lib
from ensemble_jax.sharding import make_mesh

_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=\d+")


@dataclasses.dataclass(frozen=True)
class Request:
  """Everything a method on its cluster needs, as JSON.

  It holds the config with the cluster's mesh, the data facts the model and optimizer are
  built from, and the shapes and dtypes of one global train and eval batch."""
  config: dict
  num_classes: int
  init_input: tuple[tuple[int, ...], str]
  num_steps: int
  steps_per_epoch: int
  train_batch: dict[str, tuple[tuple[int, ...], str]]
  eval_batch: dict[str, tuple[tuple[int, ...], str]]
  eval_batches: int  # eval batches per evaluation

  @property
  def mesh(self) -> dict[str, int]:
    return dict(sharding.mesh_axes(self.config["mesh"]))

  def key(self) -> str:
    """What the collectives depend on: all but the seed and the tuned fields.

    Tuned fields such as the learning rate are scalar constants of the programs. Leaving
    them out lets a sweep point's seeds and tuning runs share one reading."""
    config = json.loads(json.dumps(self.config))
    del config["seed"]
    for field in config["tune"]["fields"]:
      parent, _, leaf = field.rpartition(".")
      del (config_lib.get(config, parent) if parent else config)[leaf]
    return json.dumps(dataclasses.asdict(self) | {"config": config}, sort_keys=True)


def _shapes(batch: dict[str, np.ndarray], leading_shape: tuple[int, ...]) -> dict:
  """The global shape and dtype of each entry of a process's local batch."""
  return {k: (tuple(leading_shape) + v.shape[len(leading_shape):], str(v.dtype))
          for k, v in batch.items()}


def cluster_config(config, run_mesh: dict[str, int], cluster_mesh: dict[str, int]):
  """`config` on the cluster mesh.

  A data-parallel run standing for more `data` devices than it has keeps its microbatch
  size there. Each cluster device splits its own rows into k x run devices / cluster
  devices microbatches, at least 1. With one, the noise-scale estimator, which needs two,
  is off. So the critical-batch sweep's D microbatches stand for D devices."""
  cluster = config.copy_and_resolve_references()
  # in the form the config holds (a string from the command line, a list in config files)
  mesh = list(cluster_mesh.items())
  cluster.mesh = sharding.mesh_string(mesh) if isinstance(config.mesh, str) else mesh
  run_data, data = run_mesh.get("data", 1), cluster_mesh.get("data", 1)
  k = config.train.microbatches
  if k > 1 and data > run_data:
    cluster.train.microbatches = max(1, k * run_data // data)
    cluster.train.noise_scale = cluster.train.noise_scale and cluster.train.microbatches > 1
  return cluster


def request(config, method, *, num_classes: int, init_input: jax.ShapeDtypeStruct,
            num_steps: int, steps_per_epoch: int, train_batches, eval_batches) -> Request:
  """The request for `method`'s programs on its cluster (config.cost.devices)."""
  cluster = cluster_config(config, dict(method.mesh.shape),
                           method.cluster_mesh(config.cost.devices))
  return Request(
      config=json.loads(json.dumps(cluster.to_dict())),
      num_classes=num_classes,
      init_input=(tuple(init_input.shape), str(init_input.dtype)),
      num_steps=num_steps, steps_per_epoch=steps_per_epoch,
      train_batch=_shapes(train_batches.local_batch(0), train_batches.layout.leading_shape),
      eval_batch=_shapes(eval_batches.local_batch(0), eval_batches.layout.leading_shape),
      eval_batches=eval_batches.num_batches)


def read(method: methods_lib.Method, req: Request) -> list[costs.ProgramCollective]:
  """The collectives of `method`'s programs, compiled on its mesh.

  An evaluation is priced per example it scores, whatever `eval.batch_size`: its programs
  are compiled for one batch of all its examples (`eval_batches` x the batch), called
  once. A collective whose bytes grow with the examples (the ensemble's mixture) is charged
  for all of them, one that does not (metric sums) once per evaluation, as a program that
  sums on the devices and reduces at the end of the evaluation would. Compiled, never run:
  no batch that large is ever held in memory."""
  def structs(shapes, rows=1):
    return {k: jax.ShapeDtypeStruct((shape[0] * rows, *shape[1:]), np.dtype(dtype))
            for k, (shape, dtype) in shapes.items()}

  found = []
  for program in method.programs(structs(req.train_batch),
                                 structs(req.eval_batch, req.eval_batches), 1):
    text = program.lowered.compile().as_text()
    found += costs.program_collectives(program.name, program.per, program.calls, text,
                                       method.mesh.devices.size)
  return found


def build(req: Request, devices) -> methods_lib.Method:
  """The request's method on the first of `devices` its cluster mesh needs."""
  config = ml_collections.ConfigDict(req.config)
  plugins.load(config)  # a child process has imported none of them
  shape, dtype = req.init_input
  return methods_lib.build(config, make_mesh(config.mesh, devices),
                           num_classes=req.num_classes,
                           init_input=jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype)),
                           num_steps=req.num_steps, steps_per_epoch=req.steps_per_epoch).method


_READ: dict[str, list[costs.ProgramCollective]] = {}  # a point's seeds and rates share one


def for_cluster(method: methods_lib.Method, req: Request) -> costs.Communication:
  """The communication of `method`'s programs on the request's cluster mesh."""
  cluster = req.mesh
  devices = math.prod(cluster.values())
  if devices == 1:
    return costs.Communication((), "one device: no collectives")
  key = req.key()
  if cluster == dict(method.mesh.shape):
    where = f"this run's mesh {cluster}"
    reading = lambda: read(method, req)  # the run's method lowers them
  elif jax.process_count() == 1 and jax.device_count() >= devices:
    where = f"a {cluster} mesh of this host's devices"
    reading = lambda: read(build(req, jax.devices()[:devices]), req)
  else:
    where = f"a {cluster} mesh of {devices} simulated CPU devices in a child process"
    reading = lambda: _read_in_child(req, devices)
  if key not in _READ:
    _READ[key] = reading()
  found = _READ[key]
  return costs.Communication(tuple(costs.merged(found)),
                             f"compiled HLO of the method's programs on {where}")


def _read_in_child(req: Request, devices: int) -> list[costs.ProgramCollective]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags = _DEVICE_COUNT.sub("", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  # the plugins' modules where this process finds them (a directory put on sys.path here)
  env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
  child = subprocess.run([sys.executable, "-m", "ensemble_jax.communication"],
                         input=json.dumps(dataclasses.asdict(req)), env=env,
                         capture_output=True, text=True, check=False)
  if child.returncode:  # before training: the run stops with the child's last line
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    raise config_lib.ConfigError(
        f"cost model: compiling the {devices}-device programs in a child process (python -m "
        f"ensemble_jax.communication) failed: {lines[-1] if lines else child.returncode}")
  return [costs.ProgramCollective(**r) for r in json.loads(child.stdout.splitlines()[-1])]


def main() -> int:
  """The child: a Request on stdin; its method's collectives, one JSON line, on stdout."""
  req = Request(**json.load(sys.stdin))
  devices = math.prod(req.mesh.values())
  if jax.device_count() < devices:
    raise SystemExit(f"error: {jax.device_count()} devices, the cluster needs {devices}")
  try:
    found = read(build(req, jax.devices()[:devices]), req)
  except config_lib.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps([dataclasses.asdict(c) for c in found]))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
