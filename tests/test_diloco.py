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

CONTEXT, VOCAB = 8, 256
INIT_INPUT = jax.ShapeDtypeStruct((1, CONTEXT), jnp.int32)


def _config(method, mesh, batch):
  from experiments.configs import pydocs_gpt2

  c = pydocs_gpt2.get_config("smoke")
  c.method.name, c.mesh = method, mesh
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
  diloco, dp = engines
  d_state, p_state = diloco.init(jax.random.key(0)), dp.init(jax.random.key(0))
  rng = jax.random.key(1)
  for step in range(3):
    tokens_NxB = _tokens(step, (4, 4))
    d_batch = {"tokens": jax.device_put(tokens_NxB, diloco.train_layout.sharding)}
    p_batch = {"tokens": jax.device_put(tokens_NxB.reshape(16, -1), dp.train_layout.sharding)}
    d_state, _ = diloco.train_step(d_state, d_batch, rng)
    d_state = diloco.after_step(d_state, step + 1)
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
  sync = diloco.sync.lower(state, jnp.ones(4)).compile().as_text()
  assert hlo.spanning(hlo.collectives(sync), groups, 4)


def test_diloco_needs_a_sync_period():
  from ensemble_jax.config_lib import ConfigError, validate

  config = _config("diloco", [("worker", 4), ("data", 1)], 4)
  config.method.sync_every = 0
  with pytest.raises(ConfigError, match="sync_every=0"):
    validate(config)
