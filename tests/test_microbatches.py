"""Gradient accumulation (config.train.microbatches): the same update as the unsplit step."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ensemble_jax import config_lib, hlo, noise_scale, optim, train, validation
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.models import gpt2, resnet
from ensemble_jax.sharding import make_mesh

pytestmark = pytest.mark.integration

VOCAB, CONTEXT = 97, 16  # tests/test_gpt2.py's small model


# One model for every test: a state's apply_fn is a static argument of the jitted step, and
# another model's is another one (a compile of the same step per test).
_GPT2 = gpt2.GPT2(vocab_size=VOCAB, context=CONTEXT, num_layers=2, num_heads=2, embed_dim=32)
_train_step = jax.jit(step_lib.train_step, static_argnums=3)


def _gpt2_state(tx=optax.sgd(1.0)):
  # lr 1: a parameter moves by exactly its gradient, so params compare the gradients.
  return step_lib.create_train_state(_GPT2, tx, jax.random.key(0, impl="rbg"),
                                     jax.ShapeDtypeStruct((1, CONTEXT), jnp.int32))


def _gpt2_batch(rows=8, weighted=False):
  rng = np.random.default_rng(0)
  batch = {"tokens": jnp.asarray(rng.integers(0, VOCAB, (rows, CONTEXT + 1)), jnp.int32)}
  if weighted:  # unequal weights, and unequal totals per microbatch
    batch["weight"] = jnp.asarray(rng.uniform(0.0, 3.0, rows), jnp.float32)
  return batch


def _step(state, batch, k, noise=False):
  cfg = step_lib.StepConfig(task="lm", microbatches=k, noise_scale=noise)
  return _train_step(state, batch, jax.random.key(1), cfg)


@pytest.mark.parametrize("weighted", [False, True])
def test_gpt2_step_of_four_microbatches_equals_the_unsplit_step(weighted):
  state, batch = _gpt2_state(), _gpt2_batch(weighted=weighted)
  whole, m1 = _step(state, batch, 1)
  split, m4 = _step(state, batch, 4)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(whole.params), jax.tree.leaves(state.params))) > 1e-3
  for key in ("loss", "accuracy", "grad_norm"):
    assert float(m4[key]) == pytest.approx(float(m1[key]), rel=1e-5), key
  if weighted:  # the mean of microbatch means' gradients is far from it: the weights matter
    parts = [_step(state, jax.tree.map(lambda x: x[j::4], batch), 1)[0].params for j in range(4)]
    mean_of_means = jax.tree.map(lambda *xs: sum(xs) / 4, *parts)
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree.leaves(mean_of_means), jax.tree.leaves(whole.params))) > 1e-3


def test_noise_metrics_come_from_the_microbatch_and_batch_gradients():
  """The step's |G|^2 and tr(Sigma) estimates are the estimator applied to the norms of
  each microbatch's own mean gradient (an unsplit step on it) and the batch's."""
  state, batch = _gpt2_state(), _gpt2_batch(weighted=True)
  _, m = _step(state, batch, 4, noise=True)
  micro_sq = np.mean([float(_step(state, jax.tree.map(lambda x: x[j::4], batch), 1)[1]
                            ["grad_norm"])**2 for j in range(4)])
  want = noise_scale.step_estimates(micro_sq, float(m["grad_norm"])**2, 2, 8)
  for key, value in want.items():
    assert float(m[key]) == pytest.approx(value, rel=1e-4), key


def _dp_lm(k, batch_size=32):
  from experiments.configs import pydocs_gpt2

  config = pydocs_gpt2.get_config("tiny")
  config.train.batch_size, config.train.microbatches = batch_size, k
  config.data.context = CONTEXT
  model = gpt2.create_model("tiny", vocab_size=VOCAB, context=CONTEXT)
  # lr > 0 at step 0: the first step trains
  config.optim.warmup_fraction = config.optim.warmup_epochs = 0.0
  tx = optim.create_optimizer(config.optim, batch_size, 10, 10)
  return DataParallel(config, model, tx, make_mesh(config.mesh),
                      jax.ShapeDtypeStruct((1, CONTEXT), jnp.int32))


def test_data_parallel_accumulates_per_device_and_all_reduces_once():
  """8 devices, 4 microbatches of 1 row per device: the same step as without them, and no
  collective inside the microbatch loop (one gradient all-reduce per step, not 4)."""
  plain, split = _dp_lm(1), _dp_lm(4)
  assert split.local_accumulation and not plain.local_accumulation
  batch = jax.device_put(_gpt2_batch(32, weighted=True), plain.train_layout.sharding)
  out = {}
  for name, method in (("plain", plain), ("split", split)):
    state = method.init(jax.random.key(0))
    out[name] = method.train_step(state, batch, jax.random.key(1))
  for a, b in zip(jax.tree.leaves(out["plain"][0].params), jax.tree.leaves(out["split"][0].params)):
    np.testing.assert_allclose(b, a, atol=5e-5, rtol=1e-5)  # Adam near g = 0; a step is >= 7e-4
  for key in ("loss", "accuracy", "grad_norm"):
    assert float(out["split"][1][key]) == pytest.approx(float(out["plain"][1][key]), rel=1e-5)

  state = split.init(jax.random.key(0))
  text = split.train_step.lower(state, batch, jax.random.key(1)).compile().as_text()
  bodies = [line.split("body=")[1].split(",")[0].strip("%") for line in text.splitlines()
            if " while(" in line]
  assert bodies, "the microbatches run in a loop"
  computations = {}
  for block in text.split("\n\n"):
    name = block.split("(")[0].replace("ENTRY", "").strip().lstrip("%")
    computations[name] = block
  in_loop = [c for b in bodies for c in hlo.collectives(computations[b])]
  assert in_loop == []
  # outside it: the batch's total weight, then the gradients with the metrics
  assert [c.op for c in hlo.collectives(text)] == ["all-reduce", "all-reduce"]


@pytest.mark.unit
def test_microbatch_sizes_are_checked_before_compiling():
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  config.train.microbatches = 3
  with pytest.raises(config_lib.ConfigError, match=r"^config.train.microbatches=3: must divide "
                     r"config.train.batch_size=32"):
    validation.validate(config)
  config.train.microbatches, config.train.noise_scale = 1, True
  with pytest.raises(config_lib.ConfigError, match=r"^config.train.noise_scale=True: needs"):
    validation.validate(config)
  with pytest.raises(config_lib.ConfigError, match=r"microbatches of 4, not divisible by the "
                     r"mesh's data axis=8; choose k dividing 4"):
    _dp_lm(8)  # 32 rows over 8 devices: 4 each, which 8 microbatches cannot split


def test_batchnorm_is_per_microbatch_with_one_running_update_per_step():
  """Ghost batch norm: each microbatch normalised by its own statistics; the running
  statistics move once per step, by the microbatches' mean statistics."""
  model = resnet.create_model("resnet18", num_classes=10, width=4, stem="small",
                              stage_sizes=(1, 1))
  state = step_lib.create_train_state(model, optax.sgd(0.1), jax.random.key(0, impl="rbg"),
                                      jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
  rng = np.random.default_rng(0)
  batch = {"image": jnp.asarray(rng.integers(0, 255, (16, 28, 28, 1)), jnp.uint8),
           "label": jnp.asarray(rng.integers(0, 10, 16), jnp.int32)}
  cfg1 = step_lib.StepConfig(mean=(0.3,), std=(0.3,))
  cfg2 = step_lib.StepConfig(mean=(0.3,), std=(0.3,), microbatches=2)
  step = jax.jit(step_lib.train_step, static_argnums=3)
  whole, _ = step(state, batch, jax.random.key(1), cfg1)
  split, _ = step(state, batch, jax.random.key(1), cfg2)

  def stats_after(mb):  # one train-mode pass: m * running + (1 - m) * the batch's own
    _, upd = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                            step_lib.model_inputs(mb, cfg1), train=True, mutable=["batch_stats"])
    return upd["batch_stats"]

  halves = [stats_after(jax.tree.map(lambda x: x[j::2], batch)) for j in range(2)]
  want = jax.tree.map(lambda a, b: (a + b) / 2, *halves)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(split.batch_stats)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  # The first BatchNorm sees the input itself: the mean of the halves' means is the mean.
  first = lambda s: s["stem_bn"]["mean"] if "stem_bn" in s else jax.tree.leaves(s)[0]  # noqa
  np.testing.assert_allclose(first(split.batch_stats), first(whole.batch_stats), rtol=1e-5,
                             atol=1e-6)
  assert not np.allclose(jax.tree.leaves(split.params)[-1], jax.tree.leaves(whole.params)[-1])


@pytest.mark.e2e
def test_resnet_trains_with_microbatches_through_the_loop(tmp_path):
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  config.train.microbatches, config.train.noise_scale = 2, True
  fit = train.fit(config, str(tmp_path))
  r = fit.results
  assert r["steps"] == 4 and np.isfinite(r["final"]["nll"])
  assert [h["step"] for h in r["noise_scale"]["history"]] == [2, 4]
  assert r["noise_scale"]["steps"] == 4 and np.isfinite(r["noise_scale"]["trace"])
  with open(tmp_path / "metrics.jsonl") as f:
    logged = [json.loads(line) for line in f]
  assert any("train/b_simple" in row and "train/noise_trace" in row for row in logged)


@pytest.mark.e2e
def test_gpt2_through_the_loop_equals_the_unsplit_run(tmp_path):
  """Four steps of DP on 8 devices with 4 microbatches each: the unsplit run's weights,
  losses and FLOPs (XLA counts the microbatch loop's body once; the loop adds the rest)."""
  from experiments.configs import pydocs_gpt2

  fits = {}
  for k in (1, 4):
    config = pydocs_gpt2.get_config("tiny")
    config.train.batch_size, config.train.microbatches = 32, k
    fits[k] = train.fit(config, str(tmp_path / f"k{k}"))
  for a, b in zip(jax.tree.leaves(fits[1].state.params), jax.tree.leaves(fits[4].state.params)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)
  r1, r4 = fits[1].results, fits[4].results
  assert r4["final"]["nll"] == pytest.approx(r1["final"]["nll"], rel=1e-5)
  assert r4["flops_per_step"] == pytest.approx(r1["flops_per_step"], rel=0.02)


@pytest.mark.parametrize("strategy", ["unroll", "vmap"])
def test_ensemble_workers_accumulate_like_their_unsplit_steps(strategy):
  """4 workers, each over 2 `data` devices (its microbatches per device, gradients pmeaned
  once): the same workers as without microbatches."""
  from ensemble_jax import methods
  from experiments.configs import pydocs_gpt2

  out = {}
  for k in (1, 2):
    config = pydocs_gpt2.get_config("ensemble,tiny")
    config.mesh, config.method.num_workers = [("worker", 4), ("data", 2)], 4
    config.method.local_strategy, config.train.microbatches = strategy, k
    config.data.context = CONTEXT
    model = gpt2.create_model("tiny", vocab_size=VOCAB, context=CONTEXT)
    # lr > 0 at step 0: the first step trains
    config.optim.warmup_fraction = config.optim.warmup_epochs = 0.0
    engine = methods.build(config, make_mesh(config.mesh), num_classes=VOCAB,
                           init_input=jax.ShapeDtypeStruct((1, CONTEXT), jnp.int32),
                           num_steps=10, steps_per_epoch=10, model=model).method
    tokens = _gpt2_batch(4 * 8)["tokens"].reshape(4, 8, CONTEXT + 1)
    batch = jax.device_put({"tokens": tokens}, engine.train_layout.sharding)
    out[k] = engine.train_step(engine.init(jax.random.key(0)), batch, jax.random.key(1))
  for a, b in zip(jax.tree.leaves(out[1][0].params), jax.tree.leaves(out[2][0].params)):
    np.testing.assert_allclose(b, a, atol=5e-5, rtol=1e-5)  # Adam near g = 0; a step is >= 7e-4
  np.testing.assert_allclose(out[2][1]["loss"], out[1][1]["loss"], rtol=1e-5)
  assert out[2][1]["loss"].shape == (4,)


@pytest.mark.parametrize("kernel,strides,padding", [(3, 1, ((1, 1), (1, 1))),
                                                    (3, 2, ((1, 1), (1, 1))),
                                                    (1, 2, "VALID"), (7, 2, ((3, 3), (3, 3))),
                                                    (3, 2, "SAME")])
def test_canonical_conv_gradients_are_the_convolutions_gradients(kernel, strides, padding):
  from jax import lax

  from ensemble_jax.models.conv import NHWC, canonical_conv

  x = jax.random.normal(jax.random.key(0), (3, 15, 15, 4))
  w = jax.random.normal(jax.random.key(1), (kernel, kernel, 4, 5))

  def loss(conv, x, w):
    return jnp.sum(jnp.sin(conv(x, w, (strides, strides), padding, dimension_numbers=NHWC)))

  want = jax.grad(functools.partial(loss, lax.conv_general_dilated), (0, 1))(x, w)
  got = jax.grad(functools.partial(loss, canonical_conv), (0, 1))(x, w)
  for a, b in zip(want, got):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_resnet_convolutions_in_the_microbatch_loop_are_canonical_on_cpu():
  """XLA:CPU's fast convolutions need NHWC / HWIO; inside a loop it does not rewrite the
  gradients' convolutions into that form (ResNet-18 at 4 microbatches: 12.5 s a step
  against 2.2 s unsplit), so the model writes them so (models/conv.py)."""
  def conv_labels(canonical):
    model = resnet.create_model("resnet18", num_classes=10, width=4, stem="small",
                                canonical_conv_grads=canonical, stage_sizes=(1, 1))
    state = step_lib.create_train_state(model, optax.sgd(0.1), jax.random.key(0, impl="rbg"),
                                        jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    batch = {"image": jax.ShapeDtypeStruct((8, 28, 28, 1), jnp.uint8),
             "label": jax.ShapeDtypeStruct((8,), jnp.int32)}
    cfg = step_lib.StepConfig(mean=(0.3,), std=(0.3,), microbatches=2)
    text = jax.jit(step_lib.train_step, static_argnums=3).lower(
        state, batch, jax.random.key(1), cfg).compile().as_text()
    return {line.split("dim_labels=")[1].split(",")[0] for line in text.splitlines()
            if " convolution(" in line}

  assert conv_labels(True) == {"b01f_01io->b01f"}
  assert conv_labels(False) != {"b01f_01io->b01f"}  # what XLA:CPU leaves in the loop
