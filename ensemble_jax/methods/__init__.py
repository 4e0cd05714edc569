"""Training methods: each builds its state, step and batch layout.

`train.py` runs every method through one interface, `base.Method`. `build` is the one way
to make a method, with its model and optimizer, from a config, without training: the loop,
the cost model (`communication.py`) and the pool builders' proxies all call it."""
from __future__ import annotations

import dataclasses
from typing import Any

from ensemble_jax import models, optim
from ensemble_jax.methods.base import Method
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.methods.diloco import DiLoCo
from ensemble_jax.methods.ensemble import Ensemble
from ensemble_jax.registry import Registry

# config.method.name -> the Method class: __init__(config, model, tx, mesh, init_input).
METHODS: Registry[type[Method]] = Registry("method.name")
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
