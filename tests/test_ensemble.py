"""The stacked engine: no cross-worker collectives, independence, equivalence, aggregation."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax import aggregate, hlo, metrics, optim
from ensemble_jax.config_lib import ConfigError
from ensemble_jax.validation import validate
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.ensemble import Ensemble
from ensemble_jax.models import resnet
from ensemble_jax.sharding import make_mesh

pytestmark = pytest.mark.integration

IMAGE_SHAPE = (12, 12, 1)
INIT_INPUT = jax.ShapeDtypeStruct((1, *IMAGE_SHAPE), jnp.float32)


def _config(num_workers, mesh, strategy="unroll", batch=4):
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.mesh = mesh
  c.method.num_workers = num_workers
  c.method.local_strategy = strategy
  c.train.batch_size = batch
  c.data.image_size = IMAGE_SHAPE[0]
  # No warm-up: the first step must move the parameters, or the equivalence and
  # independence checks below compare untouched inits (the smoke variant warms up 3 of
  # its 4 steps, and these tests build a 10-step schedule: lr 0 at step 0).
  c.optim.warmup_fraction = 0.0
  c.optim.warmup_epochs = 0.0
  return c


def _tiny_model():
  # Two stages of basic blocks, width 4: compile-light, still conv + BatchNorm.
  return resnet.ResNet(stage_sizes=(1, 1), block="basic", num_classes=10, width=4,
                       stem="small")


@functools.lru_cache(maxsize=None)
def _engine(num_workers, mesh, strategy="unroll"):
  config = _config(num_workers, [tuple(a) for a in mesh], strategy)
  tx = optim.create_optimizer(config.optim, config.train.batch_size, 10, 10)
  return Ensemble(config, _tiny_model(), tx, make_mesh(config.mesh), INIT_INPUT), config


def _batch(engine, seed=0):
  n, b = engine.train_layout.leading_shape
  rng = np.random.default_rng(seed)
  local = {"image": rng.integers(0, 255, (n, b, *IMAGE_SHAPE), dtype=np.uint8),
           "label": rng.integers(0, 10, (n, b), dtype=np.int32)}
  return local, {k: jax.device_put(v, engine.train_layout.sharding) for k, v in local.items()}


def _worker_groups(mesh):
  """Mesh position (the SPMD partition id) -> worker-group index."""
  data = mesh.shape.get("data", 1)
  return {p: p // data for p in range(mesh.devices.size)}


CASES = [(8, (("worker", 8), ("data", 1)), "unroll"),
         (16, (("worker", 8), ("data", 1)), "unroll"),
         (16, (("worker", 8), ("data", 1)), "vmap"),
         (4, (("worker", 4), ("data", 2)), "unroll")]


@pytest.mark.parametrize("num_workers,mesh,strategy", CASES)
def test_no_collective_spans_two_workers(num_workers, mesh, strategy):
  engine, _ = _engine(num_workers, mesh, strategy)
  state = engine.init(jax.random.key(0))
  text = engine.train_step.lower(state, _batch(engine)[1], jax.random.key(1)).compile().as_text()
  found = hlo.collectives(text)
  assert not hlo.spanning(found, _worker_groups(engine.mesh), engine.mesh.devices.size), \
      [c.line for c in found]
  if engine.mesh.shape["data"] == 1:
    assert found == [], [c.line for c in found]
  else:  # per-worker data parallelism: all-reduces inside each worker's data pair only
    assert any(c.op == "all-reduce" for c in found)


def test_the_hlo_check_catches_a_planted_worker_psum():
  """The negative control inside the engine's own shard_map: a psum over `worker`."""
  engine, _ = _engine(8, (("worker", 8), ("data", 1)))
  spec = jax.sharding.PartitionSpec("worker")
  leaky = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "worker"), mesh=engine.mesh,
                                in_specs=spec, out_specs=spec, check_vma=False))
  text = leaky.lower(jnp.zeros((8, 3))).compile().as_text()
  assert hlo.spanning(hlo.collectives(text), _worker_groups(engine.mesh), 8)


def test_programs_the_cost_report_reads_talk_across_workers_only_to_evaluate():
  """The step compiles to no collective; the eval (the cross-worker reduction a
  stop-at-target evaluation needs) is the one program whose collectives span workers."""
  engine, config = _engine(8, (("worker", 8), ("data", 1)))
  train = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _batch(engine)[1].items()}
  b = config.eval.batch_size
  eval_batch = {"image": jax.ShapeDtypeStruct((b, *IMAGE_SHAPE), jnp.uint8),
                "label": jax.ShapeDtypeStruct((b,), jnp.int32),
                "mask": jax.ShapeDtypeStruct((b,), jnp.float32)}
  programs = {p.name: p for p in engine.programs(train, eval_batch, eval_batches=2)}
  assert {(p.name, p.per, p.calls) for p in programs.values()} == {
      ("train_step", "step", 1), ("eval", "eval", 2)}
  assert hlo.collectives(programs["train_step"].lowered.compile().as_text()) == []
  evaluate = hlo.collectives(programs["eval"].lowered.compile().as_text())
  assert hlo.spanning(evaluate, _worker_groups(engine.mesh), 8)


@pytest.mark.unit
def test_hlo_parser_reads_both_replica_group_formats():
  explicit = "%ar = f32[8]{0} all-reduce(f32[8]{0} %x), replica_groups={{0,1},{2,3}}, to_apply=%s"
  iota = "%ag = f32[8]{0} all-gather-start(f32[2]{0} %x), replica_groups=[2,4]<=[4,2]T(1,0)"
  mesh = ("%ar.1 = (f32[8]{0}, f32[8]{0}) all-reduce(%a, %b), channel_id=2, "
          "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, use_global_device_ids=true")
  a, b, c = hlo.collectives("\n".join([explicit, iota, mesh, "%add = f32[] add(%x, %y)"]))
  assert a.op == "all-reduce" and a.groups == [[0, 1], [2, 3]]
  assert b.op == "all-gather" and b.groups == [[0, 2, 4, 6], [1, 3, 5, 7]]
  assert c.op == "all-reduce" and c.groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
  groups = {p: p // 2 for p in range(8)}
  assert not hlo.spanning([a], groups, 8) and hlo.spanning([b], groups, 8)
  assert not hlo.spanning([c], groups, 8)


# One worker's step, compiled once for every worker of every case: its state's apply_fn is
# one model's (a new model's apply is another static argument: a compile per worker).
_one_step = jax.jit(step_lib.train_step, static_argnums=3)
_ONE_MODEL = _tiny_model()


def _separate_steps(engine, config, state, local_batch, rng):
  """Reference: each worker stepped alone with the key the engine gives it."""
  cfg = step_lib.StepConfig.from_config(config)
  host = jax.device_get(state)
  outs = []
  for i in range(engine.num_workers):
    one = jax.tree.map(lambda x: x[i], host)
    one = one.replace(apply_fn=_ONE_MODEL.apply, tx=state.tx)
    batch = {k: v[i] for k, v in local_batch.items()}
    new, _ = _one_step(one, batch, jax.random.fold_in(rng, i), cfg)
    outs.append(jax.device_get(new.params))
  return outs


@pytest.mark.parametrize("num_workers,mesh,strategy", CASES)
def test_stacked_step_equals_separate_steps(num_workers, mesh, strategy):
  engine, config = _engine(num_workers, mesh, strategy)
  state = engine.init(jax.random.key(0))
  local, batch = _batch(engine, seed=3)
  rng = jax.random.key(7)
  expected = _separate_steps(engine, config, state, local, rng)
  init_params = jax.device_get(state.params)  # the step donates the state
  new_state, metrics_N = engine.train_step(state, batch, rng)
  assert metrics_N["loss"].shape == (num_workers,)
  got = jax.device_get(new_state.params)
  moved = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in
           zip(jax.tree.leaves(got), jax.tree.leaves(init_params))]
  assert max(moved) > 5e-5  # the step trained (by ~lr): what follows compares trained params
  for i in range(num_workers):
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], got)),
                    jax.tree.leaves(expected[i])):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_workers_are_independent():
  engine, _ = _engine(8, (("worker", 8), ("data", 1)))
  state = engine.init(jax.random.key(0))
  kernels = np.asarray(state.params["stem_conv"]["kernel"])
  assert all(not np.allclose(kernels[0], kernels[i]) for i in range(1, 8))  # own inits
  local, batch = _batch(engine, seed=0)
  rng = jax.random.key(1)
  before = jax.device_get(state)
  a, _ = engine.train_step(engine.init(jax.random.key(0)), batch, rng)
  # Worker 3's data changed in a copy: on CPU `batch` may alias `local`'s memory, and the
  # step above may still be reading it (a race that a loaded machine lost).
  local = {k: v.copy() for k, v in local.items()}
  local["image"][3] = 255 - local["image"][3]
  changed = {k: jax.device_put(v, engine.train_layout.sharding) for k, v in local.items()}
  b, _ = engine.train_step(engine.init(jax.random.key(0)), changed, rng)
  for x, y, x0 in zip(jax.tree.leaves(jax.device_get(a.params)),
                      jax.tree.leaves(jax.device_get(b.params)),
                      jax.tree.leaves(before.params)):
    diff = np.abs(x - y).reshape(8, -1).max(axis=1)
    assert np.all(diff[[0, 1, 2, 4, 5, 6, 7]] == 0)
  stem_a = np.asarray(a.params["stem_conv"]["kernel"][3])
  stem_b = np.asarray(b.params["stem_conv"]["kernel"][3])
  assert not np.allclose(stem_a, stem_b)


def test_shared_init_gives_identical_workers():
  config = _config(8, [("worker", 8), ("data", 1)])
  config.method.shared_init = True
  tx = optim.create_optimizer(config.optim, 4, 10, 10)
  engine = Ensemble(config, _tiny_model(), tx, make_mesh(config.mesh), INIT_INPUT)
  kernels = np.asarray(engine.init(jax.random.key(0)).params["stem_conv"]["kernel"])
  assert all(np.array_equal(kernels[0], kernels[i]) for i in range(8))


@pytest.mark.unit
def test_logit_mean_matches_numpy_and_excludes_nan_workers():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 5, 3)).astype(np.float32)
  np.testing.assert_allclose(aggregate.combine(logits, jnp.ones(4), "logits"),
                             logits.mean(0), rtol=1e-6)
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(np.exp(aggregate.combine(logits, jnp.ones(4), "probs")),
                             probs.mean(0), rtol=1e-5)
  logits[2] = np.nan
  weights = jnp.asarray([1, 1, 0, 1])
  for mode, ref in (("logits", logits[[0, 1, 3]].mean(0)),
                    ("probs", np.log(probs[[0, 1, 3]].mean(0)))):
    got = np.asarray(aggregate.combine(logits, weights, mode))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_nan_worker_is_excluded_and_reported():
  engine, _ = _engine(8, (("worker", 8), ("data", 1)))
  engine.healthy[:] = True
  engine.excluded.clear()
  loss = np.ones(8)
  loss[5] = np.nan
  engine.check_step_metrics({"loss": loss}, step=11)
  # NaN != NaN, so the record is checked field by field.
  [record] = engine.excluded
  assert (record["worker"], record["step"]) == (5, 11)
  assert math.isnan(record["loss"])
  assert engine.healthy.tolist() == [True] * 5 + [False] + [True] * 2
  with pytest.raises(FloatingPointError, match="all 8 workers diverged"):
    engine.check_step_metrics({"loss": np.full(8, np.inf)}, step=12)
  engine.healthy[:] = True
  engine.excluded.clear()


@pytest.mark.unit
def test_soup_without_shared_init_is_refused():
  config = _config(8, [("worker", 8), ("data", 1)])
  config.method.aggregation = "logits,soup"
  with pytest.raises(ConfigError, match="shared_init=True"):
    validate(config)


@pytest.mark.unit
def test_n_not_a_multiple_of_the_worker_axis_is_refused():
  config = _config(12, [("worker", 8), ("data", 1)])
  tx = optim.create_optimizer(config.optim, 4, 10, 10)
  with pytest.raises(ConfigError, match="num_workers=12 is not a multiple of the mesh's "
                                        "worker axis=8"):
    Ensemble(config, _tiny_model(), tx, make_mesh(config.mesh), INIT_INPUT)


@pytest.mark.unit
def test_ece_of_a_perfectly_calibrated_batch_is_zero():
  logits = jnp.log(jnp.asarray([[0.5, 0.5], [0.5, 0.5]]))
  sums = metrics.prediction_sums(logits, jnp.asarray([0, 1]), jnp.ones(2))
  assert metrics.finalize(sums)["ece"] == pytest.approx(0.0, abs=1e-6)


def test_per_device_batchnorm_in_a_worker_spanning_two_devices():
  """A worker on two `data` devices with method.batchnorm='per_device': each device's rows
  normalised alone, so its step holds the one all-reduce of gradients, running statistics
  and metrics (synchronised: one per layer's statistics too), still inside the worker; a
  cluster whose devices do not tile the worker's here is refused, naming the fix."""
  counts = {}
  for how in ("per_device", "synchronised"):
    config = _config(4, [("worker", 4), ("data", 2)])
    config.method.batchnorm = how
    tx = optim.create_optimizer(config.optim, config.train.batch_size, 10, 10)
    engine = Ensemble(config, _tiny_model(), tx, make_mesh(config.mesh), INIT_INPUT)
    state = engine.init(jax.random.key(0))
    found = hlo.collectives(engine.train_step.lower(state, _batch(engine)[1],
                                                    jax.random.key(1)).compile().as_text())
    assert not hlo.spanning(found, _worker_groups(engine.mesh), engine.mesh.devices.size)
    counts[how] = sum(c.op == "all-reduce" for c in found)
  assert counts["per_device"] == 1 < counts["synchronised"]
  config = _config(4, [("worker", 4), ("data", 2)], batch=6)
  config.method.batchnorm, config.cost.devices = "per_device", 12  # 3 devices a worker
  config.eval.batch_size = 48
  with pytest.raises(ConfigError, match=r"each worker stands for 3 devices .* spans 2 here"):
    Ensemble(config, _tiny_model(), optim.create_optimizer(config.optim, 4, 10, 10),
             make_mesh(config.mesh), INIT_INPUT)
