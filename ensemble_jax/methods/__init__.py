"""Training methods: each builds its state, step and batch layout.

`train.py` runs every method through one interface, `base.Method`. `build` is the one way
to make a method, with its model and optimizer, from a config, without training: the loop,
the cost model (`communication.py`) and the pool builders' proxies all call it."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ensemble_jax import models, optim, plugins, sharding
from ensemble_jax.methods.base import Method
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.methods.diloco import DiLoCo
from ensemble_jax.methods.ensemble import Ensemble
from ensemble_jax.registry import Registry

# config.method.name -> the Method class: __init__(config, model, tx, mesh, init_input).
def _method(name: str, cls: type[Method], *, own_fields=()) -> type[Method]:
  """`@METHODS.register("name")` above a `Method` subclass: `cls.name` is `name` (a
  subclass inherits its parent's capabilities, not its name); `own_fields`, under
  `method.`, its config fields. It reads them from the whole config, not a `View` as a
  builder or a model does: the config it gets is the loop's too, and results.json and
  resume hold and compare it whole, so no record of its fields alone can go stale
  (docs/design.md, "Extension points")."""
  if cls.__dict__.get("name", name) != name:
    raise ValueError(f"method.name: {cls.__name__}.name is {cls.name!r}, registered as "
                     f"{name!r}: name it once, in the registration")
  cls.name, cls.own_fields = name, tuple(own_fields)
  return cls


METHODS: Registry[type[Method]] = Registry("method.name", entry=_method)
for _cls in (DataParallel, Ensemble, DiLoCo):
  METHODS.register(_cls.name, _cls)


@dataclasses.dataclass(frozen=True)
class Built:
  """A method built from a config: it, and the model and optimizer it steps."""
  method: Method
  model: Any  # a flax module
  tx: Any  # an optax GradientTransformation


def build(config, mesh, *, num_classes: int, init_input, num_steps: int,
          steps_per_epoch: int, model=None) -> Built:
  """`config.method` with its model and optimizer, from the facts of the data they need.

  `init_input`: a ShapeDtypeStruct of one model input batch, for abstract init. `model`:
  another model than `config.model`'s (tests). With `config.train.microbatches > 1` the
  model runs inside the microbatch loop."""
  if model is None:
    model = models.create_model(config.model, num_classes, config.data.context,
                                in_loop=config.train.microbatches > 1)
  tx = optim.create_optimizer(config.optim, config.train.batch_size, num_steps,
                              steps_per_epoch)
  return Built(METHODS[config.method.name](config, model, tx, mesh, init_input), model, tx)


def budget_per_worker(method_name: str, steps_per_worker) -> bool:
  """Whether a run's budget is method.steps_per_worker (train.num_steps / num_epochs then
  unread): when it is set and the method's class says it is its budget
  (`Method.per_worker_budget`). Takes a config's values or a saved config's."""
  if method_name is None or (steps_per_worker or 0) <= 0:  # a partial saved config
    return False
  return METHODS[method_name].per_worker_budget


def num_train_steps(config, num_train_examples: int) -> int:
  """Durations are given in steps or epochs; this is the one place they become steps
  (times train.schedule_fraction).

  Epochs count one model's passes over the data: for the ensemble, one worker's.
  """
  if budget_per_worker(config.method.name, config.method.steps_per_worker):
    steps = int(config.method.steps_per_worker)
  elif config.train.num_steps > 0:
    steps = int(config.train.num_steps)
  else:
    steps = int(math.ceil(config.train.num_epochs * num_train_examples
                          / config.train.batch_size))
  return max(1, round(steps * config.train.schedule_fraction))


def fit_workers_to_devices(config, devices: int) -> str | None:
  """A stacked method's default mesh fitted to its workers on `devices`, in place
  (`sharding.fit_worker_mesh`); the line saying what it chose, or None (a method of one
  model, a mesh the user chose, nothing to fit). Every entry point calls it."""
  plugins.load(config)  # before validation: the method may be a plugin's
  if not METHODS[config.method.name].stacked:
    return None
  return sharding.fit_worker_mesh(config, devices)
