"""Training methods: each builds its state, step and batch layout; `train.py` runs them
through the interface `base.Method` writes down."""
from ensemble_jax.methods.base import Method
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.methods.diloco import DiLoCo
from ensemble_jax.methods.ensemble import Ensemble

METHODS = {m.name: m for m in (DataParallel, Ensemble, DiLoCo)}


def create_method(config, model, tx, mesh, init_input) -> Method:
  """`init_input`: a ShapeDtypeStruct of one model input batch, for abstract init."""
  return METHODS[config.method.name](config, model, tx, mesh, init_input)
