"""Training methods: each builds its state, step and batch layout; `train.py` runs them."""
from ensemble_jax.methods.data_parallel import DataParallel

METHODS = {DataParallel.name: DataParallel}


def create_method(config, model, tx, mesh, image_shape):
  return METHODS[config.method.name](config, model, tx, mesh, image_shape)
