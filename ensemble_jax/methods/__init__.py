"""Training methods: each builds its state, step and batch layout.

`train.py` runs every method through one interface, `base.Method`."""
from ensemble_jax import models, optim
from ensemble_jax.methods.base import Method
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.methods.diloco import DiLoCo
from ensemble_jax.methods.ensemble import Ensemble

METHODS = {m.name: m for m in (DataParallel, Ensemble, DiLoCo)}


def create_method(config, model, tx, mesh, init_input) -> Method:
  """`init_input`: a ShapeDtypeStruct of one model input batch, for abstract init."""
  return METHODS[config.method.name](config, model, tx, mesh, init_input)


def model_and_optimizer(config, num_classes: int, num_steps: int, steps_per_epoch: int):
  """The model and optax transformation of `config`.

  With `config.train.microbatches > 1` the model runs inside the microbatch loop."""
  model = models.create_model(config.model, num_classes, config.data.context,
                              in_loop=config.train.microbatches > 1)
  tx = optim.create_optimizer(config.optim, config.train.batch_size, num_steps,
                              steps_per_epoch)
  return model, tx


def build(config, mesh, *, num_classes: int, init_input, num_steps: int,
          steps_per_epoch: int) -> Method:
  """`config.method` with its model and optimizer, from the facts of the data they need."""
  model, tx = model_and_optimizer(config, num_classes, num_steps, steps_per_epoch)
  return create_method(config, model, tx, mesh, init_input)
