"""`train_and_evaluate(config, workdir)`: one run, composed. What main.py, the sweeps in
experiments/, the LiPT pipeline, the demo and the notebooks call.

A run is the loop (`train.fit`) fed by the distilled pool `config.distill` asks for
(`distill/pools.py`, built or read from its cache first). Composing them here keeps
imports one way: run -> distill -> train -> methods -> data/models -> leaves.
"""
from __future__ import annotations

import ml_collections

from ensemble_jax import checkpoint, config_lib, record, resume, train
from ensemble_jax.data import fetch
from ensemble_jax.distill import pools

RESULTS_FILE = record.RESULTS_FILE  # results.json, in every run's workdir
# What a config, a dataset or a workdir that cannot work raises: one line and status 2 in
# main.py and the studies, never a traceback.
USAGE_ERRORS = (config_lib.ConfigError, fetch.DatasetUnavailableError, fetch.DataError,
                checkpoint.CheckpointError)
finished_results = resume.finished_results  # a finished run's results, read not rewritten


def _set_up_with_pool(config: ml_collections.ConfigDict, workdir: str,
                      pool_config: ml_collections.ConfigDict | None = None):
  """(the run's set-up, its pool built or read from its cache; None without one)."""
  setup = train.set_up(config, workdir)  # a config that cannot work fails before any pool
  pool = pools.create(pool_config or config, setup.data, setup.method.num_workers, workdir)
  return setup, pool


def fit(config: ml_collections.ConfigDict, workdir: str,
        pool_config: ml_collections.ConfigDict | None = None) -> train.Fit:
  """`train_and_evaluate`, also handing back the final state, method and data."""
  setup, pool = _set_up_with_pool(config, workdir, pool_config)
  return train.fit(config, workdir, pool=pool, setup=setup)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       pool_config: ml_collections.ConfigDict | None = None) -> dict:
  """Trains `config.method` on `config.data` (and its distilled pool, if any); writes
  checkpoints, metrics and results.json in `workdir`; returns the results. A finished run
  (the same config run again) is not touched: its results.json is read and returned.

  `pool_config`: the config the pool is built (or read from its cache) for, when it is
  not `config` itself: the sweeps tune the learning rate on one pool per point and seed.
  """
  train.fit_layout(config)  # before the workdir's check: a rerun fits as the run did
  finished = finished_results(config, workdir)
  return finished if finished is not None else fit(config, workdir, pool_config).results


def build_pool(config: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """Builds (or reads from its cache) the distilled pool `config` asks for, training
  nothing; its `info` (build time and FLOPs), or None without one. The sweeps build every
  pool before any point trains, so the build is timed on a host doing nothing else."""
  if config.distill.builder == "none":
    return None
  return _set_up_with_pool(config, workdir)[1].info


def retime_pool(config: ml_collections.ConfigDict, workdir: str, path: str,
                recorded: dict) -> dict:
  """Builds the proxy-free pool cached in `path` (its runs' `distill` block: `recorded`)
  again from `config`, timed, and keeps its new build time (`pools.retime`: the pool must
  come out the same); its new `info`."""
  setup = train.set_up(config, workdir)
  return pools.retime(config, setup.data, setup.method.num_workers, path, recorded)


def read_communication(config: ml_collections.ConfigDict, workdir: str,
                       pool_config: ml_collections.ConfigDict | None = None):
  """`train.read_communication` with the run's pool (from its cache, as the run built it):
  the collectives of a finished run's compiled programs, read without training."""
  setup, pool = _set_up_with_pool(config, workdir, pool_config)
  return train.read_communication(config, setup, pool)

