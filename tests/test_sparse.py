"""Sparse (SNIP-pruned) training: the mask is decided once, by construction, never by value.

Regression test for the defect where the sparse optimizer froze every parameter that was
zero at any step (`p == 0`): zero-initialised biases, BatchNorm biases and the residual
BatchNorm scales (`scale_init=zeros`) never trained, so every residual branch of a pruned
ResNet stayed switched off. Failed on b8f7b5c (the BatchNorm biases and scales stayed 0).
"""
import jax
import numpy as np
import pytest

from ensemble_jax import run

pytestmark = pytest.mark.e2e


def test_pruned_entries_stay_zero_and_zero_initialised_parameters_train(tiny_config,
                                                                         tmp_path):
  config = tiny_config
  config.model.sparsity = 0.5
  config.optim.warmup_fraction = config.optim.warmup_epochs = 0.0  # every step moves weights
  config.checkpoint.every_steps = 0
  fit = run.fit(config, str(tmp_path))
  params = jax.device_get(fit.state.params)
  mask = jax.device_get(fit.state.prune_mask)  # decided by SNIP at step 0, carried since
  kernels = [(p, m) for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(mask))
             if p.ndim > 1]
  pruned = sum(int((~m).sum()) for _, m in kernels)
  assert pruned / sum(p.size for p, _ in kernels) == pytest.approx(0.5, abs=0.01)
  for p, m in kernels:
    assert np.all(p[~m] == 0)  # every pruned entry is still exactly zero
    assert np.count_nonzero(p[m]) > 0.99 * m.sum()  # and only those: kept weights live
  for path, p in jax.tree_util.tree_leaves_with_path(params):
    if p.ndim == 1:  # biases and BatchNorm scales: never pruned, zero-initialised or not
      assert np.any(p != 0), f"{jax.tree_util.keystr(path)} never moved from 0"
  scales = {jax.tree_util.keystr(k): m for k, m in jax.tree_util.tree_leaves_with_path(mask)
            if m.ndim == 1}
  assert scales and all(m.all() for m in scales.values())  # the mask covers kernels only

