"""Config validation: every key known, every value one that can work, before any compile.

Each check raises ConfigError naming the field, the value and the fix. `validate` runs
before anything is loaded; `check_batch_fits` once the data's size is known.
"""
from __future__ import annotations

import difflib
import functools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections

from ensemble_jax import aggregate, config_lib, models, plugins, sharding
from ensemble_jax.config_lib import (ATTENTIONS, AUGMENTS, BATCHNORMS,
                                     LOWER_IS_BETTER, LR_SCALINGS, OPTIMIZERS, TARGET_METRICS,
                                     TARGET_RANGES, TASKS, TUNE_OBJECTIVES, ConfigError,
                                     aggregation_modes, base_config, flat, get)
from ensemble_jax.data.samplers import SAMPLERS
from ensemble_jax.distill.registry import BUILDERS
from ensemble_jax.methods import METHODS
from ensemble_jax.models.gpt2 import SIZES as GPT2_SIZES
from ensemble_jax.stored import RENAMED


def _need(ok: bool, field: str, value, fix: str):
  if not ok:
    raise ConfigError(f"config.{field}={value!r}: {fix}")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError on the first key or value that cannot work."""
  plugins.load(config)  # their entries are the registries' before any name is checked
  config_lib.add_declared(config)  # their own fields, if the config was built before them
  _validate_keys_and_types(config)
  _validate_method(config)
  _validate_declared(config)  # before the abstract model, which may read its own
  _validate_model(config)
  _validate_data(config)
  _validate_schedule(config)
  _validate_microbatches(config.train)
  _validate_warm_start_and_sparsity(config)
  _validate_distill(config)
  _validate_tune(config)
  _validate_cost(config)
  _validate_durations_and_target(config)
  _validate_mesh(config)


def _unread_model_fields(config) -> tuple[str, ...]:
  """The config.model fields its model does not read (`models.Model.fields`): no check of
  validation's applies to them. None known while model.name names no model."""
  name = config.model.name
  return models.unread_fields(name) if isinstance(name, str) and name in models.MODELS else ()


def _validate_keys_and_types(config) -> None:
  """Every key known to base_config(), present, and of its default's type (but the model
  fields its model does not read: they do not apply)."""
  known = dict(flat(base_config()))
  unread = _unread_model_fields(config)
  for key, _ in flat(config):
    if key in RENAMED:
      raise ConfigError(f"config.{key} was renamed config.{RENAMED[key]}; set that instead.")
    if key not in known:
      close = difflib.get_close_matches(key, list(known), n=1)
      hint = f" Did you mean config.{close[0]}?" if close else ""
      raise ConfigError(f"config.{key}: unknown key.{hint} Known keys are listed in "
                        "ensemble_jax/config_lib.py:base_config().")
  for key, default in known.items():
    if key in ("mesh", "plugins") or key in unread:  # mesh, plugins: a string or a list
      continue
    try:
      value = get(config, key)
    except (AttributeError, KeyError):
      raise ConfigError(f"config.{key}: missing. Start configs from "
                        "ensemble_jax.config_lib.base_config().") from None
    numeric = (int, float)
    if isinstance(default, bool):
      _need(isinstance(value, bool), key, value, "must be True or False.")
    elif isinstance(default, numeric) and not isinstance(default, bool):
      _need(isinstance(value, numeric) and not isinstance(value, bool), key, value,
            f"must be a number like {default!r}.")
    elif isinstance(default, str):
      _need(isinstance(value, str), key, value, f"must be a string like {default!r}.")


def _validate_method(config) -> None:
  method = METHODS[config.method.name]  # a name not registered raises
  _need(config.method.num_workers > 0, "method.num_workers", config.method.num_workers,
        "must be > 0.")
  _need(config.method.steps_per_worker >= 0, "method.steps_per_worker",
        config.method.steps_per_worker, "must be >= 0 (0: use train.num_steps/num_epochs).")
  method.check_config(config)
  SAMPLERS[config.method.sampler]  # noqa: B018
  _need(config.method.batchnorm in BATCHNORMS, "method.batchnorm", config.method.batchnorm,
        f"choose one of {BATCHNORMS}.")
  _need(config.method.batchnorm != "per_device" or config.train.microbatches == 1,
        "method.batchnorm", config.method.batchnorm,
        f"per-device BatchNorm with gradient accumulation (train.microbatches="
        f"{config.train.microbatches}) is not built: set train.microbatches=1, or "
        "method.batchnorm='synchronised' (each microbatch is then normalised alone).")
  modes = aggregation_modes(config)
  if method.stacked and not method.mixes_workers:  # its own aggregation: check_config's
    return
  _need(bool(modes), "method.aggregation", config.method.aggregation,
        f"a comma-separated list of {', '.join(aggregate.MODES.names())} (e.g. "
        "'logits,probs').")
  entries = [aggregate.MODES[mode] for mode in modes]
  mixtures = [name for name, mode in aggregate.MODES.items() if mode.mixture]
  _need(entries[0].mixture, "method.aggregation", config.method.aggregation,
        "the first mode is evaluated during training: put one that mixes the workers' "
        f"predictions first ({', '.join(mixtures)}).")
  builder = BUILDERS[config.distill.builder]
  for mode in entries:
    fix = mode.requires(config) if mode.requires else None
    _need(fix is None, "method.aggregation", config.method.aggregation, fix)
    _need(not mode.routed or builder.routes, "method.aggregation", config.method.aggregation,
          f"{mode.name!r} weights each worker by the pool's routing of each example: set "
          f"config.distill.builder to one that routes ("
          f"{', '.join(b for b in BUILDERS if BUILDERS[b].routes)}) or drop {mode.name!r}.")


def _validate_model(config) -> None:
  _need(config.task in TASKS, "task", config.task, f"choose one of {TASKS}.")
  served = tuple(name for name in models.MODELS if models.MODELS[name].task == config.task)
  _need(models.MODELS[config.model.name].task == config.task, "model.name",
        config.model.name, f"task {config.task!r} takes one of {served}.")
  entry = models.MODELS[config.model.name]
  reads = set(models.MODEL_FIELDS if entry.fields is None else entry.fields)  # others unchecked
  _need("size" not in reads or config.model.size in GPT2_SIZES, "model.size",
        config.model.size, f"choose a GPT-2 size of {tuple(GPT2_SIZES)}.")
  _need("attention" not in reads or config.model.attention in ATTENTIONS, "model.attention",
        config.model.attention, f"choose one of {ATTENTIONS}.")
  stages = config.model.stage_sizes
  _need("stage_sizes" not in reads or all(isinstance(n, int) and n >= 1 for n in stages),
        "model.stage_sizes", stages,
        "give ResNet blocks per stage as positive ints, e.g. (1, 1), or () for the preset's.")
  _need("attention" not in reads or config.model.attention != "fused"
        or config.model.dropout == 0.0, "model.attention",
        config.model.attention, f"the fused kernel has no attention dropout and "
        f"model.dropout={config.model.dropout}: set model.attention='einsum' or dropout 0.")
  with_bn = tuple(name for name in models.MODELS if models.MODELS[name].batchnorm)
  _need(config.method.batchnorm != "per_device" or entry.batchnorm, "method.batchnorm",
        config.method.batchnorm, f"model {config.model.name} has no BatchNorm to normalise "
        f"per device (its entry: batchnorm=False): set method.batchnorm='synchronised', or "
        f"use a model with BatchNorm ({', '.join(with_bn)}).")
  _check_model_entry(entry, config.model.to_dict(), config.task, config.data.image_size,
                     config.data.context)


@functools.lru_cache(maxsize=64)
def _checked_entry(entry, model_json: str, task: str, image_size: int, context: int) -> str:
  """What the abstract model (`jax.eval_shape`, no FLOPs) contradicts of its entry's
  declarations, or '': BatchNorm statistics without `batchnorm`, or `batchnorm` without
  the module fields the methods set; `features` not sown."""
  model_config = ml_collections.ConfigDict(json.loads(model_json))
  inputs = (jax.ShapeDtypeStruct((2, context), jnp.int32) if task == "lm" else
            jax.ShapeDtypeStruct((2, image_size, image_size, 3), jnp.float32))
  try:
    model = entry.create(models.model_view(entry, model_config), 10 if task != "lm" else 256,
                         context, False)
    # the key made inside the trace: a concrete one would start the backend before a
    # multi-process run's jax.distributed.initialize
    variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False),
                               inputs)
    has_bn = "batch_stats" in variables
    if has_bn and not entry.batchnorm:
      return ("its variables hold BatchNorm statistics but its entry says batchnorm=False: "
              "declare batchnorm=True (the module then takes bn_axis_name and bn_groups)")
    if entry.batchnorm and not all(hasattr(model, f) for f in ("bn_axis_name", "bn_groups")):
      return ("its entry says batchnorm=True but the module has no bn_axis_name / bn_groups "
              "fields: add them, or declare batchnorm=False")
    if entry.features:
      _, sown = jax.eval_shape(functools.partial(model.apply, train=False,
                                                 mutable=["intermediates"]), variables, inputs)
      if "features" not in sown.get("intermediates", {}):
        return ("its entry says features=True but it sows no intermediates/features: "
                "self.sow('intermediates', 'features', x_BxD), or declare features=False")
  except config_lib.UndeclaredField as e:  # it read a field it does not declare
    return str(e)
  except Exception as e:  # noqa: BLE001  (the entry's own code; an interrupt or SystemExit
    return _model_raised(e)  # is no Exception: it goes on)
  return ""


def _model_raised(e: Exception) -> str:
  """What the entry's own code raised at the abstract check, as one line with the fix."""
  said = next((line.strip() for line in str(e).splitlines() if line.strip()), "no message")
  return (f"its abstract model (jax.eval_shape on a batch of 2) raised {type(e).__name__}: "
          f"{said.rstrip('.')}; fix the model for this config.model (its create or "
          "__call__), or choose another model.name.")


def _check_model_entry(entry, model_dict: dict, task: str, image_size: int,
                       context: int) -> None:
  """Checks a model's declarations against its abstract model, once per model config."""
  model_json = json.dumps(model_dict, sort_keys=True, default=list)
  problem = _checked_entry(entry, model_json, task, image_size, context)
  _need(not problem, "model.name", entry.name, problem)


def _validate_data(config) -> None:
  _need(config.data.train_augment in AUGMENTS, "data.train_augment",
        config.data.train_augment, f"choose one of {AUGMENTS}.")
  _need(config.data.source != "idx" or config.data.dataset == "fashion_mnist",
        "data.dataset", config.data.dataset, "the built-in idx reader (data.source='idx') "
        "serves only 'fashion_mnist'; for other datasets set data.source='tfds'.")
  sources = ("files", "tfds") if config.task == "lm" else ("idx", "folder", "tfds")
  _need(config.data.source in sources, "data.source", config.data.source,
        f"for task {config.task!r} choose one of {sources}.")
  _need(config.data.source != "folder" or bool(config.data.data_dir), "data.data_dir",
        config.data.data_dir, "data.source='folder' reads data_dir/train/<class>/<images>: "
        "set data.data_dir to that tree's root.")
  _need(config.data.tokenizer in ("byte", "gpt2"), "data.tokenizer", config.data.tokenizer,
        "choose 'byte' or 'gpt2'.")
  _need(0.0 < config.data.val_fraction < 1.0, "data.val_fraction", config.data.val_fraction,
        "must lie in (0, 1).")
  _need(config.data.context > 0, "data.context", config.data.context, "must be > 0.")


def _validate_schedule(config) -> None:
  """The optimizer and its schedule, the eval cadence, the positive sizes and durations."""
  _need(config.optim.name in OPTIMIZERS, "optim.name", config.optim.name,
        f"choose one of {OPTIMIZERS}.")
  _need(config.optim.lr_scaling in LR_SCALINGS, "optim.lr_scaling",
        config.optim.lr_scaling, "choose 'linear', 'sqrt' or 'none'.")
  _need(0.0 <= config.optim.warmup_fraction < 1.0, "optim.warmup_fraction",
        config.optim.warmup_fraction, "is a fraction of the step budget, in [0, 1).")
  for field in ("eval.target_resolution", "eval.near_target_margin",
                "eval.near_target_lookahead"):
    value = get(config, field)
    _need(value >= 0, field, value, "must be >= 0.")
  _need(config.optim.schedule in ("cosine", "constant"), "optim.schedule",
        config.optim.schedule, "choose 'cosine' or 'constant'.")
  unread = _unread_model_fields(config)  # they do not apply: GPT-2's model.width
  for field in ("train.batch_size", "eval.batch_size", "data.image_size", "model.width",
                "optim.base_batch_size", "train.log_every_steps"):
    if field in unread:
      continue
    value = get(config, field)
    _need(value > 0, field, value, "must be > 0.")
  for field in ("train.num_steps", "train.num_epochs", "train.stop_at_step",
                "eval.every_steps", "eval.num_examples", "checkpoint.every_steps",
                "checkpoint.every_minutes", "optim.learning_rate", "optim.weight_decay",
                "optim.warmup_epochs",
                "optim.warmup_steps", "data.train_examples", "data.crop_padding"):
    value = get(config, field)
    _need(value >= 0, field, value, "must be >= 0.")


def _validate_warm_start_and_sparsity(config) -> None:
  _need(0.0 <= config.model.sparsity < 1.0, "model.sparsity", config.model.sparsity,
        "is the pruned fraction of kernel weights, in [0, 1).")


def _validate_cost(config) -> None:
  _need(config.cost.devices >= 0, "cost.devices", config.cost.devices,
        "must be >= 0 (0: one device per replica or worker).")
  _need(config.cost.device_step_time_s >= 0, "cost.device_step_time_s",
        config.cost.device_step_time_s, "must be >= 0 (0: the run's host step / devices).")
  _need(config.cost.calibration_steps >= 3, "cost.calibration_steps",
        config.cost.calibration_steps, "must be >= 3 (a third warm-up, the rest timed).")
  _need(0.0 <= config.cost.overlap <= 1.0, "cost.overlap", config.cost.overlap,
        "is a fraction in [0, 1].")


def _validate_durations_and_target(config) -> None:
  steps, epochs = config.train.num_steps, config.train.num_epochs
  fraction = config.train.schedule_fraction
  _need(0.0 < fraction <= 1.0, "train.schedule_fraction", fraction,
        "is the fraction of the duration the run and its schedule span, in (0, 1].")
  _need(steps > 0 or epochs > 0, "train.num_steps", (steps, epochs),
        "set one of train.num_steps and train.num_epochs to a value > 0, e.g. "
        "--config.train.num_steps=1000.")
  _need(not (steps > 0 and epochs > 0), "train.num_steps", (steps, epochs),
        f"set exactly one of train.num_steps and train.num_epochs: add "
        f"--config.train.num_epochs=0 to train {steps} steps (or --config.train.num_steps=0 "
        f"for {epochs} epochs).")
  _need(len(config.data.mean) == len(config.data.std), "data.mean", config.data.mean,
        f"must have as many channels as data.std={config.data.std!r}.")
  metric = config.eval.target_metric
  _need(metric in TARGET_METRICS.get(config.task, ()), "eval.target_metric", metric,
        f"task {config.task!r} reports {TARGET_METRICS.get(config.task, ())}: choose one.")
  lo, hi = TARGET_RANGES[metric]
  _need(lo <= config.eval.target_value <= hi, "eval.target_value", config.eval.target_value,
        f"{metric} lies in [{lo}, {hi}].")
  rungs = tuple(config.eval.target_values)
  if not rungs:
    return
  _need(all(isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
            for v in rungs), "eval.target_values", rungs,
        f"each rung is a {metric} in [{lo}, {hi}].")
  lower = metric in LOWER_IS_BETTER
  _need(all((b < a) if lower else (b > a) for a, b in zip(rungs, rungs[1:])),
        "eval.target_values", rungs,
        f"the rungs go from the easiest to the hardest ({'falling' if lower else 'rising'} "
        f"{metric}), each once: e.g. {tuple(sorted(rungs, reverse=lower))}.")
  _need(rungs[0] == config.eval.target_value, "eval.target_value",
        config.eval.target_value,
        f"the first rung of eval.target_values={rungs} is the target: set "
        f"--config.eval.target_value={rungs[0]}.")


def _validate_microbatches(train) -> None:
  k = train.microbatches
  _need(isinstance(k, int) and k >= 1, "train.microbatches", k, "must be an integer >= 1.")
  _need(train.batch_size % k == 0, "train.microbatches", k,
        f"must divide config.train.batch_size={train.batch_size} (the per-model batch); "
        f"choose a divisor of {train.batch_size}.")
  _need(not train.noise_scale or k >= 2, "train.noise_scale", train.noise_scale,
        "needs two batch sizes: set config.train.microbatches >= 2 (small = a microbatch).")
  _need(0.0 <= train.noise_scale_ema < 1.0, "train.noise_scale_ema", train.noise_scale_ema,
        "is a moving-average decay, in [0, 1).")


def _in(*choices):
  return lambda v: v in choices, f"choose one of {choices}."


# The checks of the distill fields a pool builder may read: validation checks those its
# builder reads (`distill.registry.Builder.reads`), and no others.
DISTILL_CHECKS = {
    "fraction": (lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]."),
    "keep": _in("hardest", "easiest"),
    "split": _in("shared", "disjoint", "bagging"),
    "gradient": _in("bias", "last_layer"),
    "gradmatch_lambda": (lambda v: v >= 0, "must be >= 0."),
    "tfidf_dim": (lambda v: v >= 1, "must be >= 1."),
    "embedding": _in("proxy", "pca"),
    "pca_dim": (lambda v: v >= 1, "must be >= 1."),
    "pca_covariance": _in("float64", "float32"),
    "kmeans_balance": _in("greedy", "sinkhorn"),
    "pca_image_size": (lambda v: v >= 0, "must be >= 0 (0: the model's input size)."),
    "proxy_models": (lambda v: v > 0, "must be > 0."),
    "proxy_steps": (lambda v: v > 0, "must be > 0."),
    "proxy_width": (lambda v: v > 0, "must be > 0."),
    "proxy": _in("standard", "lipt"),
    "lipt_sparsity": (lambda v: 0.0 <= v < 1.0, "is a pruned fraction, in [0, 1)."),
    "route_temperature": (lambda v: v > 0, "must be > 0."),
    "route_top_k": (lambda v: v >= 1, "must be >= 1."),
    "images_per_class": (lambda v: v >= 1, "must be >= 1."),
    "iterations": (lambda v: v >= 0, "must be >= 0 (0: the real images it starts from)."),
    "real_per_class": (lambda v: v >= 1, "must be >= 1."),
    "image_lr": (lambda v: v > 0, "must be > 0."),
    "embed_width": (lambda v: v >= 1, "must be >= 1."),
    "gm_image_lr": (lambda v: v > 0, "must be > 0."),
    "gm_net_lr": (lambda v: v > 0, "must be > 0."),
    "synthetic_fraction": (lambda v: 0.0 <= v < 1.0,
                           "lies in [0, 1): 0 trains every step on the synthetic set."),
}


SYNTHETIC_AUGMENTS = ("dsa", "none")


def _validate_teacher(config) -> None:
  """Knowledge distillation's fields; whether the teacher's run exists is checked at
  set-up (`ensemble_jax/teacher.py`), before anything compiles."""
  d = config.distill
  _need(0.0 <= d.kd_weight <= 1.0, "distill.kd_weight", d.kd_weight,
        "is the soft targets' share of the loss, in [0, 1] (0: no teacher).")
  _need(d.kd_temperature > 0, "distill.kd_temperature", d.kd_temperature,
        "must be > 0 (1: the teacher's own probabilities).")
  _need(bool(d.teacher) == (d.kd_weight > 0), "distill.kd_weight", d.kd_weight,
        f"set it in (0, 1] with a teacher, 0 without one (distill.teacher={d.teacher!r}).")
  _need(not d.teacher or not config.optim.label_smoothing, "optim.label_smoothing",
        config.optim.label_smoothing, "must be 0 with a teacher: its soft targets replace "
        "smoothed labels.")


def _validate_distill(config) -> None:
  _validate_teacher(config)
  d = config.distill
  _need(d.synthetic_augment in SYNTHETIC_AUGMENTS, "distill.synthetic_augment",
        d.synthetic_augment, f"use one of {SYNTHETIC_AUGMENTS}.")
  builder = BUILDERS[d.builder]
  if builder.build is None:
    return
  served = tuple(m for m in METHODS if builder.methods is None or builder.methods(METHODS[m]))
  _need(config.method.name in served, "distill.builder", d.builder,
        f"it gives each worker its own pool: use one of {served}, not "
        f"{config.method.name!r}.")
  serves = tuple(b for b in BUILDERS if BUILDERS[b].tasks is None
                 or config.task in BUILDERS[b].tasks)
  _need(builder.tasks is None or config.task in builder.tasks, "distill.builder", d.builder,
        f"use {' or '.join(map(repr, serves))} for task {config.task!r}.")
  for name in builder.reads(config):
    group, _, field = name.partition(".")
    if group == "distill" and field in DISTILL_CHECKS:
      ok, fix = DISTILL_CHECKS[field]
      _need(ok(d[field]), name, d[field], fix)
  entry = models.MODELS[config.model.name]
  sows = tuple(name for name in models.MODELS if models.MODELS[name].features)
  _need(not builder.uses_proxy(config) or entry.features, "distill.builder", d.builder,
        f"its proxy's features are what model {config.model.name} sows, and it sows none "
        f"(its entry: features=False): use a model that does ({', '.join(sows)}) or a "
        "builder without a proxy.")
  if builder.check is not None:
    builder.check(config)


def _validate_declared(config) -> None:
  """The fields registered entries declared as their own (`own_fields`): those of the
  entries the config chooses, and any its builder reads."""
  reads = set(BUILDERS[config.distill.builder].reads(config))
  for name, (field, chooser, entry) in config_lib.DECLARED.items():
    if field.ok is not None and (get(config, chooser) == entry or name in reads):
      value = get(config, name)
      _need(field.ok(value), name, value, field.fix)


def _validate_tune(config) -> None:
  t = config.tune

  def value(key):
    try:
      return get(config, key)
    except (AttributeError, KeyError):
      return None

  for key in t.fields:
    _need(isinstance(value(key), float), "tune.fields", t.fields,
          f"{key!r} is not a float field of the config (e.g. 'optim.learning_rate').")
  for key in t.inherited:
    _need(isinstance(value(key), (int, float)), "tune.inherited", t.inherited,
          f"{key!r} is not a numeric field of the config (e.g. 'train.schedule_fraction').")
  _need(len(t.factors) > 0 and all(f > 0 for f in t.factors), "tune.factors", t.factors,
        "a non-empty list of positive multipliers, e.g. (0.5, 1.0, 2.0).")
  _need(t.extend > 1.0, "tune.extend", t.extend, "must be > 1 (e.g. 2.0).")
  _need(len(t.schedule_fractions) > 0 and all(0 < f <= 1 for f in t.schedule_fractions),
        "tune.schedule_fractions", t.schedule_fractions, "must be values in (0, 1].")
  _need(t.max_extensions >= 0, "tune.max_extensions", t.max_extensions, "must be >= 0.")
  _need(0 < t.schedule_margin <= 1, "tune.schedule_margin", t.schedule_margin,
        "must be in (0, 1]: the fraction of its schedule by which a length must reach the "
        "target on every tuning seed.")
  _need(t.objective in TUNE_OBJECTIVES, "tune.objective", t.objective,
        f"choose one of {TUNE_OBJECTIVES}.")
  _need(t.objective == "steps_to_target" or not t.stop_losers, "tune.stop_losers",
        t.stop_losers, f"stops runs by steps to target; with tune.objective={t.objective!r} "
        "every run must train to its end: set tune.stop_losers=False.")


def _validate_mesh(config) -> None:
  mesh = config.mesh
  axes = sharding.mesh_axes(mesh)
  names = [n for n, _ in axes]
  _need(len(set(names)) == len(names), "mesh", mesh, "axis names must be unique.")
  _need(sum(s == -1 for _, s in axes) <= 1, "mesh", mesh, "at most one axis may be -1.")
  _need(all(s == -1 or s > 0 for _, s in axes), "mesh", mesh,
        "sizes must be positive or -1 (all remaining devices).")
  _need(all(n in sharding.MESH_AXES for n in names), "mesh", mesh,
        "axis names must be 'data' or 'worker'.")
  _need(not METHODS[config.method.name].stacked or "worker" in names, "mesh", mesh,
        f"{config.method.name} steps its workers over a 'worker' axis: e.g. "
        "'worker:-1,data:1'.")


def check_batch_fits(config, num_train_examples: int) -> None:
  """One model's batch must fit in the training set; say what to choose if it does not."""
  b = config.train.batch_size
  if b > num_train_examples:
    fits = 2 ** int(math.log2(max(1, num_train_examples // 4)))
    raise ConfigError(
        f"config.train.batch_size={b} is larger than the training set ({num_train_examples} "
        f"examples): choose at most {num_train_examples}, e.g. "
        f"--config.train.batch_size={fits} --config.optim.base_batch_size={fits}.")
