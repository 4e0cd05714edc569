"""Training methods: each builds its state, step and batch layout; `train.py` runs them."""
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.methods.ensemble import Ensemble

METHODS = {DataParallel.name: DataParallel, Ensemble.name: Ensemble}


def create_method(config, model, tx, mesh, init_input):
  """`init_input`: a ShapeDtypeStruct of one model input batch, for abstract init."""
  return METHODS[config.method.name](config, model, tx, mesh, init_input)
