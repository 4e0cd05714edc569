"""Knowledge distillation: one loss with a teacher's soft targets, a frozen teacher read
from a finished run, charged to the run that learns from it."""
import copy
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax import config_lib, costs, hlo, optim, run, train
from ensemble_jax.config_lib import ConfigError
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.ensemble import Ensemble
from ensemble_jax.models import resnet
from ensemble_jax.sharding import make_mesh
from ensemble_jax.validation import validate
from tests.conftest import assert_documented

pytestmark = pytest.mark.integration


def _logits(seed, shape=(3, 5, 7)):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.normal(0, 2, shape), jnp.float32)


def _labels(shape=(3, 5), classes=7):
  return jnp.asarray(np.random.default_rng(9).integers(0, classes, shape), jnp.int32)


def _reference_kd_loss(logits, labels, teacher_logits, w, t):
  """(1 - w) CE + w T^2 KL(softmax(teacher / T) || softmax(student / T)), directly in jnp."""
  log_probs = jax.nn.log_softmax(logits)
  ce = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  teacher_log_probs = jax.nn.log_softmax(teacher_logits / t)
  kl = jnp.sum(jnp.exp(teacher_log_probs)
               * (teacher_log_probs - jax.nn.log_softmax(logits / t)), axis=-1)
  return (1 - w) * ce + w * t * t * kl


@pytest.mark.unit
def test_weight_zero_is_the_plain_loss_bit_for_bit():
  """w = 0 takes the plain path whatever the teacher says: the same loss, prediction and
  gradient, bitwise."""
  logits, labels, teacher = _logits(0), _labels(), _logits(1)

  def total(fn):
    return jax.value_and_grad(lambda s: fn(s)[0].sum())(logits)

  plain = total(lambda s: step_lib.loss_and_predictions(s, labels))
  with_teacher = total(lambda s: step_lib.loss_and_predictions(
      s, labels, teacher_logits=teacher, kd_weight=0.0, kd_temperature=2.0))
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(with_teacher)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.unit
@pytest.mark.parametrize("weight,temperature", [(0.5, 1.0), (0.3, 2.0), (1.0, 4.0)])
def test_kd_loss_and_gradient_match_a_direct_reference(weight, temperature):
  logits, labels, teacher = _logits(0), _labels(), _logits(1)
  cotangent = _logits(2, (3, 5))  # a per-token weighting, as a mean or a coreset applies

  def ours(s):
    loss, _ = step_lib.loss_and_predictions(s, labels, teacher_logits=teacher,
                                            kd_weight=weight, kd_temperature=temperature)
    return jnp.sum(cotangent * loss)

  def reference(s):
    return jnp.sum(cotangent * _reference_kd_loss(s, labels, teacher, weight, temperature))

  value, grad = jax.value_and_grad(ours)(logits)
  ref_value, ref_grad = jax.value_and_grad(reference)(logits)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
  # The teacher is frozen: no gradient reaches it through the loss.
  teacher_grad = jax.grad(lambda t: jnp.sum(step_lib.loss_and_predictions(
      logits, labels, teacher_logits=t, kd_weight=weight,
      kd_temperature=temperature)[0]))(teacher)
  assert not np.any(np.asarray(teacher_grad))
  # A teacher that agrees with the student leaves only the hard part.
  same, _ = step_lib.loss_and_predictions(logits, labels, teacher_logits=logits,
                                          kd_weight=weight, kd_temperature=temperature)
  plain, _ = step_lib.loss_and_predictions(logits, labels)
  np.testing.assert_allclose(same, (1 - weight) * plain, rtol=1e-5, atol=1e-6)


# ---- the ensemble's compiled step with a teacher: still no collective across workers ----

IMAGE_SHAPE = (12, 12, 1)


def _ensemble(mesh, teacher=True):
  """A tiny ResNet ensemble; with a teacher (its run's path is never read: lowering needs
  only the teacher's shapes)."""
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.mesh = mesh
  c.method.num_workers, c.method.local_strategy = 8, "unroll"
  c.train.batch_size, c.data.image_size = 4, IMAGE_SHAPE[0]
  if teacher:
    c.distill.teacher, c.distill.kd_weight, c.distill.kd_temperature = "run", 0.5, 2.0
  tx = optim.create_optimizer(c.optim, c.train.batch_size, 10, 10)
  model = resnet.ResNet(stage_sizes=(1, 1), block="basic", num_classes=10, width=4,
                        stem="small")
  return Ensemble(c, model, tx, make_mesh(c.mesh),
                  jax.ShapeDtypeStruct((1, *IMAGE_SHAPE), jnp.float32))


@pytest.mark.parametrize("mesh", ["worker:8,data:1", "worker:4,data:2"])
def test_an_ensemble_step_with_a_teacher_has_no_collective_across_workers(mesh):
  """The teacher's variables are one replicated input: each worker reads its own copy.
  (Stacked, or left to the partitioner, they would be all-gathered into every step.)"""
  engine = _ensemble(mesh)
  n, b = engine.train_layout.leading_shape
  batch = {"image": jax.ShapeDtypeStruct((n, b, *IMAGE_SHAPE), jnp.uint8,
                                         sharding=engine.train_layout.sharding),
           "label": jax.ShapeDtypeStruct((n, b), jnp.int32,
                                         sharding=engine.train_layout.sharding)}
  state = jax.eval_shape(engine.init, jax.random.key(0))
  args = engine.step_args(state, batch, jax.random.key(1))
  assert len(args) == 4 and "batch_stats" in args[3]  # a BatchNorm teacher's statistics
  text = engine.train_step.lower(*args).compile().as_text()
  found = hlo.collectives(text)
  data = engine.mesh.shape["data"]
  worker_of = {p: p // data for p in range(engine.mesh.devices.size)}
  assert not hlo.spanning(found, worker_of, engine.mesh.devices.size), [c.line for c in found]
  if data == 1:
    assert found == [], [c.line for c in found]
  # The teacher's forward is in the step: XLA counts more FLOPs than the plain step's.
  plain = _ensemble(mesh, teacher=False)
  plain_args = plain.step_args(jax.eval_shape(plain.init, jax.random.key(0)), batch,
                               jax.random.key(1))
  assert len(plain_args) == 3
  plain_step = plain.train_step.lower(*plain_args).compile()
  assert costs.flops(engine.train_step.lower(*args).compile()) > costs.flops(plain_step)


# ---- bad inputs: one line each, before anything compiles ----

def _lm_config(arg="tiny"):
  from experiments.configs import pydocs_gpt2

  return pydocs_gpt2.get_config(arg)


@pytest.mark.unit
@pytest.mark.parametrize("field,value,says", [
    ("kd_weight", 1.5, "config.distill.kd_weight=1.5: is the soft targets' share"),
    ("kd_weight", -0.1, "config.distill.kd_weight=-0.1"),
    ("kd_temperature", 0.0, "config.distill.kd_temperature=0.0: must be > 0"),
    ("kd_temperature", -1.0, "config.distill.kd_temperature=-1.0"),
])
def test_bad_kd_fields_are_one_line_errors(field, value, says):
  config = _lm_config()
  config.distill.teacher, config.distill.kd_weight = "/some/run", 0.5
  config.distill[field] = value
  with pytest.raises(ConfigError) as e:
    validate(config)
  assert str(e.value).startswith(says) and "\n" not in str(e.value)


@pytest.mark.unit
def test_a_teacher_and_its_weight_come_together():
  config = _lm_config()
  config.distill.kd_weight = 0.5  # no teacher
  with pytest.raises(ConfigError, match=r"^config.distill.kd_weight=0.5: set it in \(0, 1\] "
                                        r"with a teacher, 0 without one"):
    validate(config)
  config.distill.teacher, config.distill.kd_weight = "/some/run", 0.0
  with pytest.raises(ConfigError, match="config.distill.kd_weight=0.0"):
    validate(config)
  config.distill.kd_weight, config.optim.label_smoothing = 0.5, 0.1
  with pytest.raises(ConfigError, match="config.optim.label_smoothing=0.1: must be 0 with a "
                                        "teacher"):
    validate(config)


def test_a_missing_or_unfinished_teacher_is_refused_before_compiling(tmp_path):
  config = _lm_config()
  missing = str(tmp_path / "no_such_run")
  config.distill.teacher, config.distill.kd_weight = missing, 0.5
  with pytest.raises(ConfigError) as e:
    train.check(config)
  message = str(e.value)
  assert message.startswith(f"config.distill.teacher={missing!r}: no finished run there")
  assert "train the teacher first: python -m ensemble_jax.main" in message
  assert "\n" not in message
  unfinished = tmp_path / "unfinished"
  os.makedirs(unfinished / "checkpoints")  # checkpoints, but no results.json yet
  config.distill.teacher = str(unfinished)
  with pytest.raises(ConfigError, match="no finished run there"):
    train.check(config)


# ---- end to end: a tiny teacher, then students of every method learning from it ----

@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
  """A finished tiny data-parallel GPT-2 run: the teacher."""
  workdir = str(tmp_path_factory.mktemp("teacher"))
  results = run.train_and_evaluate(_lm_config("tiny"), workdir)
  return workdir, results


def _student(arg, teacher_dir):
  config = _lm_config(arg)
  config.distill.teacher, config.distill.kd_weight = teacher_dir, 0.5
  config.distill.kd_temperature = 2.0
  return config


@pytest.mark.e2e
@pytest.mark.parametrize("arg,microbatches", [("ensemble,tiny", 1), ("tiny", 2)])
def test_students_learn_from_a_finished_teacher_and_are_charged_for_it(
    teacher_run, tmp_path, arg, microbatches):
  teacher_dir, teacher_results = teacher_run
  config = _student(arg, teacher_dir)
  if microbatches > 1:  # each of 4 devices splits its 2 rows in two
    config.mesh, config.train.microbatches = "data:4", microbatches
  r = run.train_and_evaluate(config, str(tmp_path))
  with open(tmp_path / "results.json") as f:
    on_disk = json.load(f)
  assert_documented(on_disk)
  taught = on_disk["teacher"]
  assert taught["workdir"] == teacher_dir and taught["method"] == "data_parallel"
  assert taught["steps"] == teacher_results["steps"] == 4
  assert (taught["kd_weight"], taught["kd_temperature"]) == (0.5, 2.0)
  assert on_disk["config"]["distill"]["teacher"] == teacher_dir
  assert np.isfinite(r["final"]["perplexity"]) and r["final"]["perplexity"] < 256
  # The teacher's training is charged: all of its steps' FLOPs, its time on the critical
  # path of every preset (it trains before the students).
  assert taught["flops"] == pytest.approx(teacher_results["flops_per_step"] * 4)
  measured, modelled = on_disk["cost"]["measured"], on_disk["cost"]["modelled"]
  steps = measured["steps_to_target"]
  assert measured["flops_to_target"] == pytest.approx(
      on_disk["flops_per_step"] * steps + taught["flops"])
  for preset, seconds in taught["critical_path_s"].items():
    assert seconds > 0 and modelled["teacher_s"][preset] == seconds
    assert modelled["critical_path_s"][preset] >= seconds + steps * modelled[
        "device_step_time_s"] - 1e-9
  # Its forward runs inside every step: the step's XLA FLOPs exceed the plain step's.
  plain = copy.deepcopy(config)
  plain.distill.teacher, plain.distill.kd_weight = "", 0.0
  assert costs.flops(train.compile_step(config)) > costs.flops(train.compile_step(plain))


@pytest.mark.e2e
def test_a_teacher_of_another_model_is_refused(teacher_run):
  config = _student("tiny", teacher_run[0])
  config.model.size = "micro"
  with pytest.raises(ConfigError, match=r"was trained with model.size='tiny', this run has "
                                        r"'micro'"):
    train.check(config)


@pytest.mark.e2e
def test_a_teacher_recorded_before_a_model_field_existed_is_this_model(teacher_run, tmp_path):
  # A committed teacher's config may predate a field (model.stage_sizes): as on resume,
  # a field its record lacks is not compared.
  shutil.copytree(teacher_run[0], tmp_path / "teacher")
  path = tmp_path / "teacher" / "results.json"
  results = json.loads(path.read_text())
  del results["config"]["model"]["stage_sizes"]
  path.write_text(json.dumps(results))
  train.check(_student("tiny", str(tmp_path / "teacher")))


@pytest.mark.unit
def test_config_lib_lists_the_kd_fields_with_no_teacher_by_default():
  d = config_lib.base_config().distill
  assert (d.teacher, d.kd_weight, d.kd_temperature) == ("", 0.0, 1.0)


@pytest.mark.unit
def test_the_kd_grid_is_the_ensemble_curve_taught_by_a_full_grid_run(tmp_path):
  """`ensemble_kd`'s points are the ensemble curve's, plus the teacher and its loss
  fields; the teacher is a data-parallel seed run of the full grid, of the same model."""
  from experiments import sweeps
  from experiments.sweeps import cost_vs_time

  module = sweeps.load_config_module(os.path.join("experiments", "configs", "pydocs_gpt2.py"))
  full, kd = module.sweep_grid("full"), module.sweep_grid("kd")
  assert "ensemble_kd" not in full and set(kd) == {"ensemble_kd"}
  assert set(kd["ensemble_kd"]) == set(full["ensemble"])
  *_, results, workload, curve, point, seed = module.KD_TEACHER.split("/")
  assert (results, workload, curve, seed) == ("results", "pydocs_gpt2", "data_parallel",
                                              "seed1")
  teacher = cost_vs_time._point_config(module, *full[curve][point], 1, str(tmp_path))
  for name, spec in kd["ensemble_kd"].items():
    taught = cost_vs_time._point_config(module, *spec, 0, str(tmp_path))
    validate(taught)
    assert (taught.distill.teacher, taught.distill.kd_weight, taught.distill.kd_temperature
            ) == (module.KD_TEACHER, module.KD_WEIGHT, module.KD_TEMPERATURE)
    plain = cost_vs_time._point_config(module, *full["ensemble"][name], 0, str(tmp_path))
    changed = {k for k, v in config_lib.flat(taught.to_dict())
               if v != config_lib.get(plain, k)}
    assert changed == {"distill.teacher", "distill.kd_weight", "distill.kd_temperature",
                       "cost.price_like"}
    assert taught.cost.price_like == f"../pydocs_gpt2/ensemble/{name}"  # priced as its twin
    assert taught.model.to_dict() == teacher.model.to_dict()
    assert taught.data.context == teacher.data.context
