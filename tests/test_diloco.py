"""DiLoCo on the stacked engine: inner steps stay worker-local, the sync is the only talk."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ensemble_jax import hlo
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.methods.diloco import DiLoCo
from ensemble_jax.models import gpt2
from ensemble_jax.sharding import make_mesh

pytestmark = pytest.mark.integration

CONTEXT, VOCAB = 8, 256
INIT_INPUT = jax.ShapeDtypeStruct((1, CONTEXT), jnp.int32)


def _config(method, mesh, batch):
  from experiments.configs import pydocs_gpt2

  c = pydocs_gpt2.get_config("tiny")
  c.method.name, c.mesh = method, mesh
  c.method.aggregation = "global" if method == "diloco" else "logits"
  c.method.num_workers, c.method.sync_every = 4, 1
  c.method.outer_learning_rate, c.method.outer_momentum = 1.0, 0.0
  c.train.batch_size, c.eval.batch_size = batch, 16
  c.data.context = CONTEXT
  return c


def _model():
  return gpt2.GPT2(vocab_size=VOCAB, context=CONTEXT, num_layers=1, num_heads=2, embed_dim=16)


def _tokens(seed, shape):
  return np.random.default_rng(seed).integers(0, VOCAB, shape + (CONTEXT + 1,), dtype=np.int32)


@pytest.fixture(scope="module")
def engines():
  tx = optax.sgd(0.5)  # plain SGD inner step, same lr for both methods
  diloco = DiLoCo(_config("diloco", [("worker", 4), ("data", 1)], 4), _model(), tx,
                  make_mesh([("worker", 4), ("data", 1)]), INIT_INPUT)
  dp = DataParallel(_config("data_parallel", [("data", 4)], 16), _model(), tx,
                    make_mesh([("data", 4)]), INIT_INPUT)
  return diloco, dp


def test_h1_outer_lr1_no_momentum_equals_data_parallel_sgd(engines):
  _assert_h1_equals_data_parallel_sgd(*engines)


def test_h1_equals_data_parallel_sgd_with_all_four_workers_on_one_device(engines):
  """A laptop's layout (`:smoke,diloco` on one device): the 4 workers unrolled on one
  device (worker axis 1) train and sync as on four. The suite's only DiLoCo training with
  several workers to a device: tests/test_readme_commands.py trains the documented DiLoCo
  command on 8 devices and checks its 1-device layout without training."""
  _, dp = engines
  diloco = DiLoCo(_config("diloco", [("worker", 1), ("data", 1)], 4), _model(), optax.sgd(0.5),
                  make_mesh([("worker", 1), ("data", 1)]), INIT_INPUT)
  assert diloco.mesh.devices.size == 1 and diloco.num_workers == 4
  _assert_h1_equals_data_parallel_sgd(diloco, dp)


def _assert_h1_equals_data_parallel_sgd(diloco, dp):
  d_state, p_state = diloco.init(jax.random.key(0)), dp.init(jax.random.key(0))
  rng = jax.random.key(1)
  for step in range(3):
    tokens_NxB = _tokens(step, (4, 4))
    d_batch = {"tokens": jax.device_put(tokens_NxB, diloco.train_layout.sharding)}
    p_batch = {"tokens": jax.device_put(tokens_NxB.reshape(16, -1), dp.train_layout.sharding)}
    d_state, _ = diloco.train_step(d_state, d_batch, rng)
    d_state = diloco.after_step(d_state, step + 1, d_batch)
    p_state, _ = dp.train_step(p_state, p_batch, rng)
  # mean over workers of (theta - lr g_i) = theta - lr mean_i g_i: one SGD step on the union
  for a, b in zip(jax.tree.leaves(jax.device_get(d_state.global_params)),
                  jax.tree.leaves(jax.device_get(p_state.params))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  workers = jax.device_get(d_state.workers.params)
  for leaf in jax.tree.leaves(workers):  # broadcast back: every worker holds the global model
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))


def test_inner_step_is_worker_local_and_the_sync_is_the_collective(engines):
  diloco, _ = engines
  state = diloco.init(jax.random.key(0))
  batch = {"tokens": jax.device_put(_tokens(0, (4, 4)), diloco.train_layout.sharding)}
  groups = {p: p for p in range(4)}  # worker axis 4, data 1: one device per worker
  inner = diloco.train_step.lower(state, batch, jax.random.key(1)).compile().as_text()
  assert hlo.collectives(inner) == []
  sync = diloco.sync.lower(state, jnp.ones(4), batch).compile().as_text()
  assert hlo.spanning(hlo.collectives(sync), groups, 4)


@pytest.mark.unit
def test_diloco_needs_a_sync_period():
  from ensemble_jax.config_lib import ConfigError
  from ensemble_jax.validation import validate

  config = _config("diloco", [("worker", 4), ("data", 1)], 4)
  config.method.sync_every = 0
  with pytest.raises(ConfigError, match="sync_every=0"):
    validate(config)


# ---- BatchNorm models: the global model's statistics are its own ----

IMAGE_SHAPE = (12, 12, 1)


def _resnet_diloco(sync_every, worker_axis=4):
  """Tiny ResNet DiLoCo, 4 workers on `worker_axis` devices (1: all four on one)."""
  from ensemble_jax import optim
  from ensemble_jax.models import resnet

  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("diloco,tiny")
  c.mesh, c.method.num_workers = [("worker", worker_axis), ("data", 1)], 4
  c.method.sync_every = sync_every
  c.train.batch_size, c.data.image_size = 8, IMAGE_SHAPE[0]
  model = resnet.ResNet(stage_sizes=(1, 1), block="basic", num_classes=10, width=4,
                        stem="small")
  c.optim.warmup_fraction = c.optim.warmup_epochs = 0.0  # lr > 0 at step 0: the first step trains
  tx = optim.create_optimizer(c.optim, c.train.batch_size, 10, 10)
  return DiLoCo(c, model, tx, make_mesh(c.mesh),
                jax.ShapeDtypeStruct((1, *IMAGE_SHAPE), jnp.float32)), model


def _images(diloco, seed):
  rng = np.random.default_rng(seed)
  local = {"image": rng.integers(0, 255, (4, 8, *IMAGE_SHAPE), dtype=np.uint8),
           "label": rng.integers(0, 10, (4, 8), dtype=np.int32)}
  return {k: jax.device_put(v, diloco.train_layout.sharding) for k, v in local.items()}


@pytest.mark.parametrize("worker_axis", [4, 1])
def test_sync_reestimates_the_global_models_batchnorm_statistics(worker_axis):
  """Regression: the global model's statistics were the workers' average (failed on
  b8f7b5c: no statistics of the global weights existed). On one device too (a laptop's
  `:smoke,diloco`): the suite's BatchNorm DiLoCo with several workers to a device."""
  from ensemble_jax.methods import step as step_lib

  diloco, model = _resnet_diloco(sync_every=2, worker_axis=worker_axis)
  state, rng = diloco.init(jax.random.key(0)), jax.random.key(1)
  for step in (1, 2):
    batch = _images(diloco, step)
    state, _ = diloco.train_step(state, batch, rng)
    averaged = jax.tree.map(lambda x: np.asarray(x).mean(0),
                            jax.device_get(state.workers.batch_stats))
    state = diloco.after_step(state, step, batch)
  assert diloco.syncs == [2]
  expected = jax.device_get(step_lib.batch_statistics(
      model, state.global_params, state.global_batch_stats, batch, diloco.step_config))
  got = jax.device_get(state.global_batch_stats)
  for e, g, a, w in zip(jax.tree.leaves(expected), jax.tree.leaves(got),
                        jax.tree.leaves(averaged),
                        jax.tree.leaves(jax.device_get(state.workers.batch_stats))):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w, np.broadcast_to(g, w.shape))  # broadcast to workers
  assert not all(np.allclose(g, a, rtol=1e-3) for g, a in zip(jax.tree.leaves(got),
                                                              jax.tree.leaves(averaged)))


def test_the_deployable_model_between_syncs_is_the_outer_step_a_stop_would_take():
  diloco, _ = _resnet_diloco(sync_every=10)
  state, rng = diloco.init(jax.random.key(0)), jax.random.key(1)
  batch = _images(diloco, 0)
  state, _ = diloco.train_step(state, batch, rng)
  before = jax.device_get(state.global_params)
  model = diloco.deployable(state, 1, batch)  # step 1 of H = 10: no sync yet
  assert diloco.syncs == []
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state.global_params))):
    np.testing.assert_array_equal(a, b)  # training is not disturbed
  synced = diloco.after_step(state, 1, batch, last=True)  # a run ending at step 1
  assert diloco.syncs == [1]
  for a, b in zip(jax.tree.leaves(jax.device_get((model.global_params, model.global_batch_stats))),
                  jax.tree.leaves(jax.device_get((synced.global_params,
                                                  synced.global_batch_stats)))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert diloco.deployable(synced, 1, None) is synced  # synced at this step: as it is
