"""Tests for ensemble_jax.models.resnet (compile-light; device-count agnostic)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax.models import resnet

pytestmark = pytest.mark.unit


def _num_params(tree) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree))


def _abstract_init(model, x):
  # eval_shape traces only: no FLOPs, no device memory.
  return jax.eval_shape(functools.partial(model.init, train=False),
                        jax.random.PRNGKey(0), x)


def test_resnet50_param_count_matches_torchvision():
  model = resnet.create_model('resnet50', num_classes=1000)
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  variables = _abstract_init(model, x)
  assert _num_params(variables['params']) == 25_557_032


def test_bf16_compute_keeps_float32_params_and_logits():
  model = resnet.create_model('resnet18', num_classes=10, width=8, stem='small',
                              dtype=jnp.bfloat16)
  x = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)
  variables = _abstract_init(model, x)
  dtypes = {leaf.dtype for leaf in jax.tree_util.tree_leaves(variables)}
  assert dtypes == {jnp.dtype(jnp.float32)}
  logits = jax.eval_shape(functools.partial(model.apply, train=False), variables, x)
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32


@pytest.mark.integration
def test_resnet18_small_stem_fashion_mnist_forward():
  model = resnet.create_model('resnet18', num_classes=10, width=16, stem='small')
  x_Bx28x28x1 = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
  # An 'rbg' key only to keep this test fast: on CPU, XLA compiles each
  # threefry draw (one per param tensor) slowly (~4s here vs ~1.5s with rbg).
  # Variable structure and shapes do not depend on the PRNG implementation.
  init_key = jax.random.key(0, impl='rbg')
  variables = jax.jit(functools.partial(model.init, train=False))(
      init_key, x_Bx28x28x1)
  assert set(variables) == {'params', 'batch_stats'}
  assert _num_params(variables['params']) == 701_178
  # zero_init_residual: each block's last BN scale starts at zero.
  np.testing.assert_array_equal(
      variables['params']['stage1_block1']['bn2']['scale'], 0.0)

  train_apply = jax.jit(functools.partial(model.apply, train=True,
                                          mutable=['batch_stats']))
  logits_BxK, updates = train_apply(variables, x_Bx28x28x1)
  assert logits_BxK.shape == (2, 10)
  assert logits_BxK.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(logits_BxK)))
  # Running stats must move away from their (0 mean, 1 var) init after a train step.
  old = variables['batch_stats']['stem_bn']
  new = updates['batch_stats']['stem_bn']
  assert not np.allclose(old['mean'], new['mean'])
  assert not np.allclose(old['var'], new['var'])
  assert (jax.tree_util.tree_structure(updates['batch_stats'])
          == jax.tree_util.tree_structure(variables['batch_stats']))

  # Un-jitted: for a single small forward this is cheaper than compiling.
  eval_apply = functools.partial(model.apply, train=False)
  new_vars = {'params': variables['params'], 'batch_stats': updates['batch_stats']}
  out1 = eval_apply(new_vars, x_Bx28x28x1)
  out2 = eval_apply(new_vars, x_Bx28x28x1)
  assert out1.shape == (2, 10)
  np.testing.assert_array_equal(np.asarray(out1), np.asarray(out2))


def test_unknown_model_name_raises():
  with pytest.raises(ValueError, match='resnet101') as excinfo:
    resnet.create_model('resnet101', num_classes=10)
  assert 'resnet18' in str(excinfo.value)


def test_invalid_stem_and_block_raise():
  with pytest.raises(ValueError, match='tiny'):
    resnet.create_model('resnet18', num_classes=10, stem='tiny')
  with pytest.raises(ValueError, match='wide'):
    resnet.ResNet(stage_sizes=(1,), block='wide', num_classes=10)


def test_ghost_batch_norm_is_batch_norm_on_each_slice():
  """GhostBatchNorm with G groups: each contiguous slice normalised as nn.BatchNorm alone
  would, the running statistics the slices' mean, the variables nn.BatchNorm's."""
  import flax.linen as nn

  x = jax.random.normal(jax.random.key(0), (12, 3, 3, 5)) * 2.0 + 0.5
  ghost = resnet.GhostBatchNorm(3, False, momentum=0.9)
  variables = ghost.init(jax.random.key(1), x)
  y, updates = ghost.apply(variables, x, mutable=["batch_stats"])
  plain = nn.BatchNorm(use_running_average=False, momentum=0.9)
  assert jax.tree.map(jnp.shape, plain.init(jax.random.key(1), x)) == jax.tree.map(
      jnp.shape, variables)
  slices = [plain.apply(variables, x[4 * i:4 * i + 4], mutable=["batch_stats"])
            for i in range(3)]
  np.testing.assert_allclose(y, jnp.concatenate([s[0] for s in slices]), atol=1e-6)
  for stat in ("mean", "var"):
    np.testing.assert_allclose(updates["batch_stats"][stat],
                               np.mean([s[1]["batch_stats"][stat] for s in slices], 0),
                               rtol=1e-6, atol=1e-7)
  # evaluation reads the running averages, as nn.BatchNorm does
  evaluate = resnet.GhostBatchNorm(3, True)
  np.testing.assert_allclose(evaluate.apply(variables, x),
                             nn.BatchNorm(use_running_average=True).apply(variables, x),
                             atol=1e-6)
