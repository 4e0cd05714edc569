"""The config schema: every hyper-parameter of every method, with its default.

Workload configs in `experiments/configs/` start from `base_config()` and change values;
`validate()` rejects keys the schema does not know and values that cannot work, before
anything is compiled, with a message naming the field, the value and the fix.
"""
from __future__ import annotations

import difflib
import math

import ml_collections

# The choice lists, each written once: the modules that implement them import these (or a
# test checks that their registries agree), and validate() checks configs against them.
METHODS = ("data_parallel", "ensemble", "diloco")  # methods.METHODS implements each
SAMPLERS = ("random", "disjoint")  # data.samplers.SAMPLERS
# aggregate.py: the reductions over workers; the first listed in a config is the headline.
AGGREGATION_MODES = ("logits", "probs", "soup", "routed")  # an ensemble's
DILOCO_MODES = ("global",)  # DiLoCo's one model
LR_SCALINGS = ("linear", "sqrt", "none")  # optim.py: peak lr vs batch size
OPTIMIZERS = ("sgd", "adamw")
AUGMENTS = ("none", "crop_flip", "inception")
TASKS = ("classification", "lm")
TARGET_RANGES = {"accuracy": (0.0, 1.0), "nll": (0.0, math.inf),
                 "perplexity": (1.0, math.inf)}
LOWER_IS_BETTER = ("nll", "perplexity")
RESNETS = ("resnet18", "resnet34", "resnet50")  # models/resnet.py MODELS builds each
GPT2_SIZES = ("micro", "tiny", "mini", "small", "medium", "large", "xl")  # models/gpt2.py SIZES
ATTENTIONS = ("einsum", "fused")  # models/gpt2.py GPT2.attention
TARGET_METRICS = {"classification": ("accuracy", "nll"),  # what each task's eval reports
                  "lm": ("perplexity", "nll", "accuracy")}


class ConfigError(ValueError):
  """A config value that cannot work; the message names the field and the fix."""


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "classification"  # classification (images) | lm (next-token prediction)
  # Mesh axes "name:size,..." (-1: all remaining devices), e.g. "worker:8,data:1"; config
  # files may also give [(name, size)]. Read it through mesh_axes().
  c.mesh = ml_collections.FieldReference("data:-1", field_type=object)

  c.method = ml_collections.ConfigDict()
  c.method.name = "data_parallel"
  c.method.fsdp = False  # shard params and optimizer state over `data` (ZeRO-3 style)
  c.method.fsdp_min_size = 2**14  # leaves smaller than this stay replicated
  # ensemble: N workers, each L steps on its own stream; train.batch_size is per worker.
  c.method.num_workers = 8  # N; a multiple of the mesh's worker axis
  c.method.steps_per_worker = 0  # L; 0: from train.num_steps / train.num_epochs
  c.method.local_strategy = "auto"  # vmap | unroll | auto (unroll on CPU, vmap elsewhere)
  c.method.shared_init = False  # one init for all workers (needed for the weight soup)
  c.method.sampler = "random"  # random | disjoint (see ensemble_jax/data/samplers.py)
  # Modes reported, the first the headline: the ensemble's AGGREGATION_MODES; DiLoCo
  # trains one model, so its only mode is 'global' (the outer params).
  c.method.aggregation = "logits,probs"
  c.method.soup_bn_batches = 4  # train batches to re-estimate BatchNorm stats of the soup
  # diloco: the ensemble's engine plus an outer step every H inner steps (DiLoCo).
  c.method.sync_every = 0  # H; diloco needs H > 0 (H = infinity is the ensemble)
  c.method.outer_learning_rate = 0.7
  c.method.outer_momentum = 0.9  # Nesterov; 0 disables momentum
  c.method.outer_nesterov = True

  c.data = ml_collections.ConfigDict()
  c.data.dataset = "fashion_mnist"  # fashion_mnist | cifar10 | imagenet2012 | any TFDS image set
  # idx (embedded Fashion-MNIST files) | folder (data_dir/{train,<eval.split>}/<class>/<image
  # files>, no TensorFlow) | tfds (array_record data_source)
  c.data.source = "idx"
  # "" -> $ENSEMBLE_JAX_DATA_DIR or ~/.cache/ensemble_jax (idx); the TFDS default (tfds)
  c.data.data_dir = ""
  c.data.image_size = 28
  c.data.train_augment = "crop_flip"  # none | crop_flip | inception
  c.data.crop_padding = 2  # pixels of zero padding before the random crop (crop_flip)
  # resize the shorter side to this, then center-crop (0: resize to image_size)
  c.data.eval_resize = 0
  c.data.mean = (0.286,)  # per-channel, in [0, 1]; applied on device
  c.data.std = (0.353,)
  c.data.train_examples = 0  # > 0: train on the first n examples only (quick runs, tests)
  c.data.prefetch = 4  # batches prepared ahead by grain's threads
  c.data.num_threads = 2
  # text (task='lm')
  c.data.path = ""  # corpus dir/file (source='files'); "" = the embedded pydocs corpus
  c.data.tokenizer = "byte"  # byte (vocab 256) | gpt2 (BPE from local files)
  c.data.tokenizer_dir = ""  # encoder.json + vocab.bpe, or tokenizer.json
  c.data.context = 256  # tokens per training window
  c.data.val_fraction = 0.05  # documents held out, chosen by a hash of their id
  c.data.pile_subsets = ()  # meta.pile_set_name values to keep; () = all
  c.data.text_key = "text"  # the text feature of a TFDS text dataset
  # .jsonl corpora: skip lines that are not a JSON object with the text field (counted in
  # results.json's data.skipped_lines) instead of stopping at the first with its file:line
  c.data.skip_bad_lines = False

  c.model = ml_collections.ConfigDict()
  c.model.name = "resnet18"  # resnet18 | resnet34 | resnet50
  c.model.width = 16  # channels of the first stage (64 for the published ResNets)
  # ResNet blocks per stage; () keeps the named preset's (resnet18: (2, 2, 2, 2)). Fewer
  # stages or blocks make a compile-light model (the tests' smoke variant: (1, 1)).
  c.model.stage_sizes = ()
  c.model.stem = "small"  # small (28x28, 32x32) | imagenet
  c.model.dtype = "float32"  # compute dtype; params are float32
  c.model.size = "tiny"  # gpt2: micro | tiny | mini | small | medium | large | xl
  c.model.sparsity = 0.0  # > 0: SNIP-prune this fraction of kernel weights at init, kept 0
  c.model.remat = False  # gpt2: rematerialise each block in the backward pass
  c.model.dropout = 0.0  # gpt2: embedding, attention and residual dropout
  # gpt2: "einsum" (scores materialised; exact HF numerics) | "fused"
  # (jax.nn.dot_product_attention: cuDNN flash attention on GPU in bf16; no attention dropout)
  c.model.attention = "einsum"

  c.optim = ml_collections.ConfigDict()
  c.optim.name = "adamw"  # sgd | adamw
  # Peak lr = learning_rate * scale(batch_size / base_batch_size), scale from lr_scaling.
  c.optim.learning_rate = 3e-3
  c.optim.base_batch_size = 128
  c.optim.lr_scaling = "linear"  # linear | sqrt (usual for Adam) | none
  # Linear warm-up: > 0, this fraction of the run's own step budget (the sweeps' one rule
  # for every method); else warmup_steps if > 0; else warmup_epochs.
  c.optim.warmup_fraction = 0.0
  c.optim.warmup_epochs = 0.1
  c.optim.warmup_steps = 0  # > 0 overrides warmup_epochs (language models count steps)
  c.optim.schedule = "cosine"  # cosine | constant (both after linear warmup)
  c.optim.weight_decay = 5e-4  # decoupled for adamw; L2 added to grads for sgd
  c.optim.momentum = 0.9  # sgd
  c.optim.nesterov = True  # sgd
  c.optim.b1 = 0.9  # adamw
  c.optim.b2 = 0.999  # adamw
  c.optim.grad_clip_norm = 0.0  # 0 disables
  c.optim.label_smoothing = 0.0

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 128  # global batch (data_parallel)
  # Gradient accumulation: each model's (each worker's) batch is split into k microbatches
  # whose gradients are summed in a lax.scan before one optimizer update: the same update
  # in about 1/k of the activation memory. BatchNorm normalises per microbatch (ghost
  # batch norm, so BatchNorm models train differently from k = 1); its running statistics
  # take one update per step with the microbatches' mean statistics. 1: no split.
  c.train.microbatches = 1
  # Estimate the gradient noise scale B_simple (ensemble_jax/noise_scale.py) from the
  # microbatch and whole-batch gradient norms; needs microbatches >= 2. Results.json gets
  # `noise_scale`; metrics.jsonl `train/b_simple` at log steps.
  c.train.noise_scale = False
  c.train.noise_scale_ema = 0.95  # decay of the moving averages of |G|^2 and tr(Sigma)
  # Duration: exactly one of num_steps / num_epochs is > 0.
  c.train.num_steps = 0
  c.train.num_epochs = 2.0
  c.train.stop_at_target = False  # steps-to-target runs: stop at the first eval reaching it
  # > 0: stop at the first eval at or past this step, though the schedule spans the whole
  # budget: a tuning run that can no longer be chosen (tune.stop_losers). 0: off.
  c.train.stop_at_step = 0
  c.train.init_from = ""  # a finished run's workdir: start from its weights (fresh optimizer)
  c.train.log_every_steps = 50
  c.train.timing_warmup_steps = 2  # steps excluded from the median step time

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 0  # 0: evaluate once per epoch
  c.eval.batch_size = 1000
  c.eval.num_examples = 0  # 0: the whole eval split
  c.eval.split = "test"
  c.eval.target_metric = "accuracy"  # accuracy | nll
  c.eval.target_value = 0.91
  # Near the target, evaluate every max(1, target_resolution x step) steps instead of
  # every_steps, so steps to target is known to that fraction of itself (0: off). Near:
  # some eval within near_target_margin x target of it, or the last two evals' rate
  # reaching it within near_target_lookahead x every_steps.
  c.eval.target_resolution = 0.0
  c.eval.near_target_margin = 0.05
  c.eval.near_target_lookahead = 2.0

  # Multi-host: JAX's own runtime (jax.distributed.initialize), one process per host.
  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = False  # True on multi-host runs (TPU pods auto-detect the rest)
  c.distributed.coordinator_address = ""  # "host:port" of process 0; "" = auto-detect
  c.distributed.num_processes = 0  # 0 = auto-detect
  c.distributed.process_id = -1  # -1 = auto-detect
  c.distributed.local_device_count = 0  # CPU only: fake devices per process (tests)

  # Distilled sequences (ensemble_jax/distill/pools.py): what each worker draws from.
  c.distill = ml_collections.ConfigDict()
  # none (method.sampler) | el2n | grand | loss | kmeans | craig | gradmatch
  c.distill.method = "none"
  c.distill.fraction = 0.3  # pool size / training set (scores, craig, gradmatch)
  c.distill.keep = "hardest"  # scores: hardest | easiest (Sorscher et al.: small fractions)
  c.distill.per_class = True  # select within each class, so classes stay balanced
  c.distill.split = "shared"  # one pool for N workers: shared | disjoint | bagging
  c.distill.gradient = "bias"  # craig/gradmatch: bias (dL/dlogits) | last_layer (+ weights)
  c.distill.gradmatch_lambda = 0.5  # GradMatch's ridge regularisation
  c.distill.balanced = True  # kmeans: equal-size clusters, one per worker
  c.distill.tfidf_dim = 64  # kmeans for task 'lm': tf-idf of windows, SVD to this many dims
  # kmeans for images: what is clustered: "proxy" (a trained proxy's penultimate features)
  # | "pca" (the top `pca_dim` principal components of the standardised pixels; no proxy)
  c.distill.embedding = "proxy"
  c.distill.pca_dim = 32
  # aggregation 'routed' (kmeans): softmax(-d^2 / T) over the top-k nearest clusters,
  # d^2 the squared distance of standardised proxy embeddings divided by their dimension
  # (images), or of the unit-norm tf-idf embeddings (text)
  c.distill.route_temperature = 0.1
  c.distill.route_top_k = 2
  c.distill.proxy_models = 2  # proxies (seeds) whose scores / gradients are combined
  c.distill.proxy_steps = 200  # each proxy's training steps on the full data
  c.distill.proxy_width = 4  # the proxy ResNet's width (a cheap model)
  # standard: independent proxies on the full data; lipt (Ro et al. 2023): one shared init,
  # each member on its own disjoint subset, augmented, SNIP-sparse, merged into one soup
  c.distill.proxy = "standard"
  c.distill.lipt_sparsity = 0.5  # lipt: fraction of kernel weights pruned at init
  c.distill.cache_dir = ""  # "" -> <workdir>/pools; pools are keyed by config + data

  # What the cost report models (ensemble_jax/costs.py): the cluster this run stands for.
  c.cost = ml_collections.ConfigDict()
  c.cost.devices = 0  # D; 0: one device per data-parallel replica / per worker
  c.cost.overlap = 0.0  # fraction of each modelled collective hidden behind compute
  # > 0: one device's step time measured apart (the sweep's calibration run of one model at
  # the per-device batch); 0: the run's own host step / D
  c.cost.device_step_time_s = 0.0

  # The sweeps' tuning rule (experiments/sweeps/tuning.py), one for every curve point: on
  # seed `seed`, each key in turn at `factors` x its configured value, extended by
  # `extend` beyond an edge while the best sits there (at most `max_extensions` per edge).
  c.tune = ml_collections.ConfigDict()
  c.tune.fields = ("optim.learning_rate",)  # numeric config fields, tuned one after another
  c.tune.factors = (0.5, 1.0, 2.0)  # (1.0,): not tuned
  c.tune.extend = 2.0
  c.tune.max_extensions = 2
  c.tune.seed = 0
  # Once a run has reached the target, later runs stop (train.stop_at_step) at their first
  # eval at or past its steps: one that has not reached it by then can no longer be chosen,
  # so the choice is the one full runs would give, for less compute.
  c.tune.stop_losers = False

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 0  # 0: no step-count rule
  # A save every this many minutes of the run, so a kill at any moment loses at most that;
  # 0: none. The end of the run and a stop (SIGTERM, Ctrl-C) always save.
  c.checkpoint.every_minutes = 5.0
  c.checkpoint.max_to_keep = 2
  return c


def flat(config, prefix=""):
  """(dotted field, value) of every leaf of a config or its dict."""
  for k, v in config.items():
    if isinstance(v, (ml_collections.ConfigDict, dict)):
      yield from flat(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def get(config, dotted: str):
  """config.get('a.b') for a dotted path."""
  for part in dotted.split("."):
    config = config[part]
  return config


def set_dotted(config, dotted: str, value) -> None:
  """config['a']['b'] = value for a dotted path 'a.b' (the twin of `get`)."""
  *parents, leaf = dotted.split(".")
  node = get(config, ".".join(parents)) if parents else config
  node[leaf] = value


def aggregation_modes(config) -> tuple[str, ...]:
  """config.method.aggregation as a tuple of modes, headline first.

  The field stays a comma string so that `--config.method.aggregation=logits,soup` works
  on the command line; read it through this, never by splitting it again. `config` may
  also be a run's saved config (a plain dict).
  """
  method = config["method"] if isinstance(config, dict) else config.method
  aggregation = method["aggregation"] if isinstance(method, dict) else method.aggregation
  return tuple(mode for mode in aggregation.split(",") if mode)


def parse_variants(arg: str, known, config_name: str) -> set[str]:
  """The variants of a workload config's argument ('tiny,ensemble'), each one known."""
  variants = set(filter(None, arg.split(",")))
  if variants - set(known):
    raise ValueError(f"unknown variant(s) {sorted(variants - set(known))} of {config_name}; "
                     f"choose from {sorted(known)}")
  return variants


def _need(ok: bool, field: str, value, fix: str):
  if not ok:
    raise ConfigError(f"config.{field}={value!r}: {fix}")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError on the first key or value that cannot work."""
  _validate_keys_and_types(config)
  _validate_method(config)
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


def _validate_keys_and_types(config) -> None:
  """Every key known to base_config(), present, and of its default's type."""
  known = dict(flat(base_config()))
  for key, _ in flat(config):
    if key not in known:
      close = difflib.get_close_matches(key, list(known), n=1)
      hint = f" Did you mean config.{close[0]}?" if close else ""
      raise ConfigError(f"config.{key}: unknown key.{hint} Known keys are listed in "
                        "ensemble_jax/config_lib.py:base_config().")
  for key, default in known.items():
    if key == "mesh":  # a string or a list of pairs: _validate_mesh reads both
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
  _need(config.method.name in METHODS, "method.name", config.method.name,
        f"choose one of {METHODS}.")
  _need(config.method.num_workers > 0, "method.num_workers", config.method.num_workers,
        "must be > 0.")
  _need(config.method.steps_per_worker >= 0, "method.steps_per_worker",
        config.method.steps_per_worker, "must be >= 0 (0: use train.num_steps/num_epochs).")
  _need(config.method.name != "diloco" or config.method.sync_every > 0, "method.sync_every",
        config.method.sync_every, "diloco syncs every H > 0 steps (H = infinity is "
        "method.name='ensemble').")
  _need(config.method.sampler in SAMPLERS, "method.sampler", config.method.sampler,
        f"choose one of {SAMPLERS}.")
  modes = aggregation_modes(config)
  if config.method.name == "diloco":
    _need(modes == DILOCO_MODES, "method.aggregation", config.method.aggregation,
          "DiLoCo trains one model, the global (outer) params, and reports only it: set "
          "method.aggregation='global'.")
    return
  _need(bool(modes) and all(m in AGGREGATION_MODES for m in modes),
        "method.aggregation", config.method.aggregation,
        f"a comma-separated list of {', '.join(AGGREGATION_MODES)} (e.g. 'logits,probs').")
  _need(modes[0] != "soup", "method.aggregation", config.method.aggregation,
        "the first mode is evaluated during training; put 'logits' or 'probs' first.")
  _need("routed" not in modes or config.distill.method == "kmeans", "method.aggregation",
        config.method.aggregation, "'routed' weights each worker by the example's distance "
        "to its k-means cluster: set config.distill.method='kmeans' or drop 'routed'.")
  _need("soup" not in modes or config.method.shared_init, "method.aggregation",
        config.method.aggregation, "'soup' averages weights, which is only meaningful from "
        "one shared init: set config.method.shared_init=True or drop 'soup'.")


def _validate_model(config) -> None:
  _need(config.task in TASKS, "task", config.task, f"choose one of {TASKS}.")
  models = ("gpt2",) if config.task == "lm" else RESNETS
  _need(config.model.name in models, "model.name", config.model.name,
        f"task {config.task!r} takes one of {models}.")
  _need(config.task != "lm" or config.model.size in GPT2_SIZES, "model.size",
        config.model.size, f"choose a GPT-2 size of {GPT2_SIZES}.")
  _need(config.model.attention in ATTENTIONS, "model.attention", config.model.attention,
        f"choose one of {ATTENTIONS}.")
  stages = config.model.stage_sizes
  _need(all(isinstance(n, int) and n >= 1 for n in stages), "model.stage_sizes", stages,
        "give ResNet blocks per stage as positive ints, e.g. (1, 1), or () for the preset's.")
  _need(config.model.attention != "fused" or config.model.dropout == 0.0, "model.attention",
        config.model.attention, f"the fused kernel has no attention dropout and "
        f"model.dropout={config.model.dropout}: set model.attention='einsum' or dropout 0.")


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
  for field in ("train.batch_size", "eval.batch_size", "data.image_size", "model.width",
                "optim.base_batch_size", "train.log_every_steps"):
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
  _need(not config.train.init_from or config.method.name != "diloco", "train.init_from",
        config.train.init_from, "warm starts are supported for data_parallel and ensemble.")
  _need(0.0 <= config.model.sparsity < 1.0, "model.sparsity", config.model.sparsity,
        "is the pruned fraction of kernel weights, in [0, 1).")
  _need(config.model.sparsity == 0 or config.method.name != "diloco", "model.sparsity",
        config.model.sparsity, "pruning at init is supported for data_parallel and ensemble.")


def _validate_cost(config) -> None:
  _need(config.cost.devices >= 0, "cost.devices", config.cost.devices,
        "must be >= 0 (0: one device per replica or worker).")
  _need(config.cost.device_step_time_s >= 0, "cost.device_step_time_s",
        config.cost.device_step_time_s, "must be >= 0 (0: the run's host step / devices).")
  _need(0.0 <= config.cost.overlap <= 1.0, "cost.overlap", config.cost.overlap,
        "is a fraction in [0, 1].")


def _validate_durations_and_target(config) -> None:
  steps, epochs = config.train.num_steps, config.train.num_epochs
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


DISTILL_METHODS = ("none", "el2n", "grand", "loss", "kmeans", "craig", "gradmatch")


def _validate_distill(config) -> None:
  d = config.distill
  _need(d.method in DISTILL_METHODS, "distill.method", d.method,
        f"choose one of {DISTILL_METHODS}.")
  if d.method == "none":
    return
  _need(config.method.name != "data_parallel" or d.method != "kmeans", "distill.method",
        d.method, "k-means gives each worker its own cluster: use an ensemble or diloco.")
  _need(config.task == "classification" or d.method == "kmeans", "distill.method", d.method,
        "language-model pools are tf-idf clusters only: use 'kmeans' or 'none' for task "
        "'lm'.")
  _need(d.tfidf_dim >= 1, "distill.tfidf_dim", d.tfidf_dim, "must be >= 1.")
  _need(d.embedding in ("proxy", "pca"), "distill.embedding", d.embedding,
        "choose 'proxy' or 'pca'.")
  _need(d.pca_dim >= 1, "distill.pca_dim", d.pca_dim, "must be >= 1.")
  _need(0.0 < d.fraction <= 1.0, "distill.fraction", d.fraction, "must lie in (0, 1].")
  _need(d.keep in ("hardest", "easiest"), "distill.keep", d.keep,
        "choose 'hardest' or 'easiest'.")
  _need(d.split in ("shared", "disjoint", "bagging"), "distill.split", d.split,
        "choose 'shared', 'disjoint' or 'bagging'.")
  _need(d.gradient in ("bias", "last_layer"), "distill.gradient", d.gradient,
        "choose 'bias' or 'last_layer'.")
  for field in ("proxy_models", "proxy_steps", "proxy_width"):
    _need(d[field] > 0, f"distill.{field}", d[field], "must be > 0.")
  _need(d.proxy in ("standard", "lipt"), "distill.proxy", d.proxy,
        "choose 'standard' or 'lipt'.")
  _need(0.0 <= d.lipt_sparsity < 1.0, "distill.lipt_sparsity", d.lipt_sparsity,
        "is a pruned fraction, in [0, 1).")
  _need(d.route_temperature > 0, "distill.route_temperature", d.route_temperature,
        "must be > 0.")
  _need(1 <= d.route_top_k, "distill.route_top_k", d.route_top_k, "must be >= 1.")
  _need(d.gradmatch_lambda >= 0, "distill.gradmatch_lambda", d.gradmatch_lambda,
        "must be >= 0.")


def _validate_tune(config) -> None:
  t = config.tune
  for key in t.fields:
    try:
      value = get(config, key)
    except (AttributeError, KeyError):
      value = None
    _need(isinstance(value, float), "tune.fields", t.fields,
          f"{key!r} is not a float field of the config (e.g. 'optim.learning_rate').")
  _need(len(t.factors) > 0 and all(f > 0 for f in t.factors), "tune.factors", t.factors,
        "a non-empty list of positive multipliers, e.g. (0.5, 1.0, 2.0).")
  _need(t.extend > 1.0, "tune.extend", t.extend, "must be > 1 (e.g. 2.0).")
  _need(t.max_extensions >= 0, "tune.max_extensions", t.max_extensions, "must be >= 0.")


MESH_AXES = ("data", "worker")
_MESH_FORMS = ("write it as 'axis:size,...' like 'data:-1' or 'worker:8,data:1' (a config "
               "file may also give [('data', -1)]).")


def mesh_axes(mesh) -> list[tuple[str, int]]:
  """config.mesh as [(axis, size)], from its string form 'worker:8,data:1' (what the command
  line sets) or its list form [('worker', 8), ('data', 1)] (config files); -1 = the rest.

  The one parser of the field; raises ConfigError on a value that is neither.
  """
  try:
    if isinstance(mesh, str):
      pairs = [part.split(":") for part in mesh.split(",")]
      axes = [(name.strip(), int(size)) for name, size in pairs]
    else:
      axes = [(str(name), int(size)) for name, size in mesh]
  except (TypeError, ValueError):
    raise ConfigError(f"config.mesh={mesh!r}: {_MESH_FORMS}") from None
  _need(bool(axes) and all(name for name, _ in axes), "mesh", mesh, _MESH_FORMS)
  return axes


def mesh_string(mesh) -> str:
  """config.mesh in its string form: 'worker:8,data:1'."""
  return ",".join(f"{name}:{size}" for name, size in mesh_axes(mesh))


def _validate_mesh(config) -> None:
  mesh = config.mesh
  axes = mesh_axes(mesh)
  names = [n for n, _ in axes]
  _need(len(set(names)) == len(names), "mesh", mesh, "axis names must be unique.")
  _need(sum(s == -1 for _, s in axes) <= 1, "mesh", mesh, "at most one axis may be -1.")
  _need(all(s == -1 or s > 0 for _, s in axes), "mesh", mesh,
        "sizes must be positive or -1 (all remaining devices).")
  _need(all(n in MESH_AXES for n in names), "mesh", mesh,
        "axis names must be 'data' or 'worker'.")
  _need(config.method.name == "data_parallel" or "worker" in names, "mesh", mesh,
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


def num_train_steps(config, num_train_examples: int) -> int:
  """Durations are given in steps or epochs; this is the one place they become steps.

  Epochs count one model's passes over the data: for the ensemble, one worker's.
  """
  if config.method.name in ("ensemble", "diloco") and config.method.steps_per_worker > 0:
    return int(config.method.steps_per_worker)
  if config.train.num_steps > 0:
    return int(config.train.num_steps)
  return max(1, int(math.ceil(config.train.num_epochs * num_train_examples
                              / config.train.batch_size)))


def steps_per_epoch(config, num_train_examples: int) -> int:
  return max(1, num_train_examples // config.train.batch_size)
