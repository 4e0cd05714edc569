"""The config schema: every hyper-parameter of every method, with its default.

Workload configs in `experiments/configs/` start from `base_config()` and change values.
`validation.validate()` rejects keys the schema does not know and values that cannot work,
before anything is compiled, with a message naming the field, the value and the fix.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
from typing import Callable

import ml_collections

# Field values checked by validation.py. The extension points' names (methods, samplers,
# aggregation modes, pool builders, models) are their registries' (ensemble_jax/registry.py).
DILOCO_MODES = ("global",)  # DiLoCo's one model
LR_SCALINGS = ("linear", "sqrt", "none")  # optim.py: peak lr vs batch size
OPTIMIZERS = ("sgd", "adamw")
AUGMENTS = ("none", "crop_flip", "inception")
TASKS = ("classification", "lm")
TARGET_RANGES = {"accuracy": (0.0, 1.0), "nll": (0.0, math.inf),
                 "perplexity": (1.0, math.inf)}
LOWER_IS_BETTER = ("nll", "perplexity")
# What a sweep's tuning rule minimises (experiments/sweeps/tuning.py `OBJECTIVES`).
TUNE_OBJECTIVES = ("steps_to_target", "final_metric")
ATTENTIONS = ("einsum", "fused")  # models/gpt2.py GPT2.attention
BATCHNORMS = ("synchronised", "per_device")  # method.batchnorm
TARGET_METRICS = {"classification": ("accuracy", "nll"),  # what each task's eval reports
                  "lm": ("perplexity", "nll", "accuracy")}


class ConfigError(ValueError):
  """A config value that cannot work; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Field:
  """A config field a registered entry declares as its own (`Registry.register(own_fields=)`):
  its default, and the check validation runs on it when its entry is chosen."""
  default: object
  ok: Callable | None = None  # value -> bool
  fix: str = "is not a value its entry can use."


# The fields registered entries declare, dotted ('distill.first_k') -> (Field, the config
# field that chooses the entry, the entry's name). `base_config()` holds them with their
# defaults; validation checks those of the entries a config chooses.
DECLARED: dict[str, tuple[Field, str, str]] = {}


def declare(group: str, own_fields: dict, chooser: str, entry: str) -> tuple[str, ...]:
  """Adds `own_fields` ({name: Field or default}) to `group` of the schema for the entry
  `chooser`=`entry`; their dotted names. A name the schema has already is refused."""
  schema = dict(flat(base_config()))
  dotted = {f"{group}.{name}": f if isinstance(f, Field) else Field(f)
            for name, f in own_fields.items()}
  for name in dotted:
    if name in schema:
      owner = DECLARED.get(name)
      by = f"{owner[1]}={owner[2]!r}" if owner else "config_lib.base_config()"
      raise ConfigError(f"{chooser}={entry!r}: config.{name} is declared by {by} already; "
                        "name its field otherwise.")
  for name, f in dotted.items():
    DECLARED[name] = (f, chooser, entry)
  return tuple(dotted)


def undeclare(names) -> None:
  for name in names:
    DECLARED.pop(name, None)


def add_declared(config) -> None:
  """Gives `config` the declared fields it lacks (it was built before their entries were
  registered: a plugin imported after its config file ran), at their defaults."""
  for name, (f, _, _) in DECLARED.items():
    *parents, leaf = name.split(".")
    node = get(config, ".".join(parents)) if parents else config
    if leaf not in node:
      with node.unlocked() if hasattr(node, "unlocked") else contextlib.nullcontext():
        node[leaf] = f.default


class UndeclaredField(ConfigError):
  """A registered entry read a config field it did not declare."""


_VIEW_FIX = "add {path!r} to its fields (its cache key and validation then cover it)."


class View:
  """`config` as an entry that declared `fields` reads it: any other field is refused.

  `fields` are dotted ('distill.fraction', 'seed', or a whole group: 'data'); a whole
  group comes back as the config's own. What the entry declares is what its cache key
  holds, so a field read past it could leave a stale pool: refused, in one line.
  `fix`: what the refusal tells the entry to do, formatted with the field's dotted `path`
  and its `name` (a model declares 'width', not 'model.width')."""

  def __init__(self, config, fields, owner: str, prefix: str = "", fix: str = _VIEW_FIX):
    object.__setattr__(self, "_view", (config, tuple(fields), owner, prefix, fix))

  def _read(self, name: str, default=None, has_default: bool = False):
    config, fields, owner, prefix, fix = self._view
    path = prefix + name
    if name not in config:
      if has_default:
        return default
      raise AttributeError(f"config.{path}: no such field")
    value = config[name]
    if any(path == f or path.startswith(f + ".") for f in fields):
      return value
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      return View(value, fields, owner, path + ".", fix)
    raise UndeclaredField(f"{owner} read config.{path}, which it does not declare: "
                          + fix.format(path=path, name=name))

  def __getattr__(self, name: str):
    if name.startswith("__"):
      raise AttributeError(name)
    return self._read(name)

  def __getitem__(self, name: str):
    return self._read(name)

  def get(self, name: str, default=None):
    return self._read(name, default, has_default=True)

  def __contains__(self, name: str) -> bool:
    return name in self._view[0]

  def __setattr__(self, name, value):
    raise TypeError(f"{self._view[2]} may not change its config (config.{name})")


def full_config(config):
  """The whole config behind a `View` (the package's own helpers that read what their
  caller declared for it, e.g. a proxy's run); a config as it is."""
  return object.__getattribute__(config, "_view")[0] if isinstance(config, View) else config


# The schedule's length, a fraction of the step budget: the one tuned field that is not a
# rate (the sweeps try it at tune.schedule_fractions).
SCHEDULE_FRACTION = "train.schedule_fraction"


def base_config() -> ml_collections.ConfigDict:
  """Every field with its default; a workload config changes values, never adds keys."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "classification"  # classification (images) | lm (next-token prediction)
  # Mesh axes "name:size,..." (-1: all remaining devices), e.g. "worker:8,data:1"; config
  # files may also give [(name, size)]. Read it through mesh_axes().
  c.mesh = ml_collections.FieldReference("data:-1", field_type=object)
  # Modules or .py files that register entries (a mode, a builder, a model, a method),
  # imported by every process before it reads the config: "a,b" or [a, b]; plugins.py.
  c.plugins = ml_collections.FieldReference("", field_type=object)
  c.method = _method()
  c.data = _data()
  c.model = _model()
  c.optim = _optim()
  c.train = _train()
  c.eval = _eval()
  c.distributed = _distributed()
  c.distill = _distill()
  c.cost = _cost()
  c.tune = _tune()
  c.checkpoint = _checkpoint()
  for name, (f, _, _) in DECLARED.items():  # the registered entries' own fields
    set_dotted(c, name, f.default)
  return c


def _method() -> ml_collections.ConfigDict:
  """How the models train together: the method and its knobs."""
  g = ml_collections.ConfigDict()
  g.name = "data_parallel"
  g.fsdp = False  # shard params and optimizer state over `data` (ZeRO-3 style)
  g.fsdp_min_size = 2**14  # leaves smaller than this stay replicated
  # BATCHNORMS: how BatchNorm takes its batch statistics where one model's batch spans
  # several devices (data-parallel's D, or an ensemble worker's devices). synchronised:
  # over the model's whole batch (an all-reduce per layer, forward and backward);
  # per_device: each device's rows alone (ghost batch norm, as large-batch ImageNet training
  # runs it; Goyal et al. 2017): no collective. A run standing for cost.devices devices
  # normalises each of their rows alone wherever it runs (models/resnet.py, GhostBatchNorm).
  g.batchnorm = "synchronised"
  # ensemble: N workers, each L steps on its own stream; train.batch_size is per worker.
  g.num_workers = 8  # N; a multiple of the mesh's worker axis
  g.steps_per_worker = 0  # L; 0: from train.num_steps / train.num_epochs
  g.local_strategy = "auto"  # vmap | unroll | auto (unroll on CPU, vmap elsewhere)
  g.shared_init = False  # one init for all workers (needed for the weight soup)
  g.sampler = "random"  # random | disjoint (see ensemble_jax/data/samplers.py)
  # Modes reported, the first the headline: aggregate.MODES (an ensemble's); DiLoCo
  # trains one model, so its only mode is 'global' (the outer params).
  g.aggregation = "logits,probs"
  g.soup_bn_batches = 4  # train batches to re-estimate BatchNorm stats of the soup
  # diloco: the ensemble's engine plus an outer step every H inner steps (DiLoCo).
  g.sync_every = 0  # H; diloco needs H > 0 (H = infinity is the ensemble)
  g.outer_learning_rate = 0.7
  g.outer_momentum = 0.9  # Nesterov; 0 disables momentum
  g.outer_nesterov = True
  return g


def _data() -> ml_collections.ConfigDict:
  """Where the examples come from and how they are prepared."""
  g = ml_collections.ConfigDict()
  g.dataset = "fashion_mnist"  # fashion_mnist | cifar10 | imagenet2012 | any TFDS image set
  # idx (embedded Fashion-MNIST files) | folder (data_dir/{train,<eval.split>}/<class>/<image
  # files>, no TensorFlow) | tfds (array_record data_source)
  g.source = "idx"
  # "" -> $ENSEMBLE_JAX_DATA_DIR or ~/.cache/ensemble_jax (idx); the TFDS default (tfds)
  g.data_dir = ""
  g.image_size = 28
  g.train_augment = "crop_flip"  # none | crop_flip | inception
  g.crop_padding = 2  # pixels of zero padding before the random crop (crop_flip)
  # resize the shorter side to this, then center-crop (0: resize to image_size)
  g.eval_resize = 0
  g.mean = (0.286,)  # per-channel, in [0, 1]; applied on device
  g.std = (0.353,)
  g.train_examples = 0  # > 0: train on the first n examples only (quick runs, tests)
  g.prefetch = 4  # batches prepared ahead by grain's threads
  g.num_threads = 2
  # text (task='lm')
  g.path = ""  # corpus dir/file (source='files'); "" = the embedded pydocs corpus
  g.tokenizer = "byte"  # byte (vocab 256) | gpt2 (BPE from local files)
  g.tokenizer_dir = ""  # encoder.json + vocab.bpe, or tokenizer.json
  g.context = 256  # tokens per training window
  g.val_fraction = 0.05  # documents held out, chosen by a hash of their id
  g.pile_subsets = ()  # meta.pile_set_name values to keep; () = all
  g.text_key = "text"  # the text feature of a TFDS text dataset
  # .jsonl corpora: skip lines that are not a JSON object with the text field (counted in
  # results.json's data.skipped_lines) instead of stopping at the first with its file:line
  g.skip_bad_lines = False
  return g


def _model() -> ml_collections.ConfigDict:
  """The network: a ResNet or a GPT-2, and its precision."""
  g = ml_collections.ConfigDict()
  g.name = "resnet18"  # resnet18 | resnet34 | resnet50
  g.width = 16  # channels of the first stage (64 for the published ResNets)
  # ResNet blocks per stage; () keeps the named preset's (resnet18: (2, 2, 2, 2)). Fewer
  # stages or blocks make a compile-light model (the tests' smoke variant: (1, 1)).
  g.stage_sizes = ()
  g.stem = "small"  # small (28x28, 32x32) | imagenet
  g.dtype = "float32"  # compute dtype; params are float32
  g.size = "tiny"  # gpt2: micro | tiny | mini | small | medium | large | xl
  g.sparsity = 0.0  # > 0: SNIP-prune this fraction of kernel weights at init, kept 0
  g.remat = False  # gpt2: rematerialise each block in the backward pass
  g.dropout = 0.0  # gpt2: embedding, attention and residual dropout
  # gpt2: "einsum" (scores materialised; exact HF numerics) | "fused"
  # (jax.nn.dot_product_attention: cuDNN flash attention on GPU in bf16; no attention dropout)
  g.attention = "einsum"
  return g


def _optim() -> ml_collections.ConfigDict:
  """The optimizer and its learning-rate schedule."""
  g = ml_collections.ConfigDict()
  g.name = "adamw"  # sgd | adamw
  # Peak lr = learning_rate * scale(batch_size / base_batch_size), scale from lr_scaling.
  g.learning_rate = 3e-3
  g.base_batch_size = 128
  g.lr_scaling = "linear"  # linear | sqrt (usual for Adam) | none
  # Linear warm-up: > 0, this fraction of the run's own step budget (the sweeps' one rule
  # for every method); else warmup_steps if > 0; else warmup_epochs.
  g.warmup_fraction = 0.0
  g.warmup_epochs = 0.1
  g.warmup_steps = 0  # > 0 overrides warmup_epochs (language models count steps)
  g.schedule = "cosine"  # cosine | constant (both after linear warmup)
  g.weight_decay = 5e-4  # decoupled for adamw; L2 added to grads for sgd
  g.momentum = 0.9  # sgd
  g.nesterov = True  # sgd
  g.b1 = 0.9  # adamw
  g.b2 = 0.999  # adamw
  g.grad_clip_norm = 0.0  # 0 disables
  g.label_smoothing = 0.0
  return g


def _train() -> ml_collections.ConfigDict:
  """How long and in what batches one model trains."""
  g = ml_collections.ConfigDict()
  g.batch_size = 128  # per model: data_parallel's global batch, each ensemble/DiLoCo worker's
  # Gradient accumulation: each model's (each worker's) batch is split into k microbatches
  # whose gradients are summed in a lax.scan before one optimizer update: the same update
  # in about 1/k of the activation memory. BatchNorm normalises per microbatch (ghost
  # batch norm, so BatchNorm models train differently from k = 1); its running statistics
  # take one update per step with the microbatches' mean statistics. 1: no split.
  g.microbatches = 1
  # Estimate the gradient noise scale B_simple (ensemble_jax/noise_scale.py) from the
  # microbatch and whole-batch gradient norms; needs microbatches >= 2. Results.json gets
  # `noise_scale`; metrics.jsonl `train/b_simple` at log steps.
  g.noise_scale = False
  g.noise_scale_ema = 0.95  # decay of the moving averages of |G|^2 and tr(Sigma)
  # Duration: exactly one of num_steps / num_epochs is > 0.
  g.num_steps = 0
  g.num_epochs = 2.0
  # The run's budget and the learning-rate schedule spanning it: this fraction of the
  # duration above (a shorter schedule decays sooner; the sweeps can tune it).
  g.schedule_fraction = 1.0
  g.stop_at_target = False  # steps-to-target runs: stop at the first eval reaching it
  # > 0: stop at the first eval at or past this step, though the schedule spans the whole
  # budget: a tuning run that can no longer be chosen (tune.stop_losers). 0: off.
  g.stop_at_step = 0
  g.init_from = ""  # a finished run's workdir: start from its weights (fresh optimizer)
  g.log_every_steps = 50
  g.timing_warmup_steps = 2  # steps excluded from the median step time
  return g


def _eval() -> ml_collections.ConfigDict:
  """When and on what the model is scored, and the target."""
  g = ml_collections.ConfigDict()
  g.every_steps = 0  # 0: evaluate once per epoch
  g.batch_size = 1000
  g.num_examples = 0  # 0: the whole eval split
  # At the end, also score the split's examples past num_examples, which the evaluations
  # (the target, the stop, the tuning) never saw: results.json `rest`.
  g.score_rest_at_end = False
  g.split = "test"
  g.target_metric = "accuracy"  # accuracy | nll; lm also perplexity (TARGET_METRICS)
  g.target_value = 0.91
  # A ladder of targets (rungs, easiest first; the first is target_value): one run records
  # its steps and time to every rung it reaches, so one set of tuning runs serves each. ():
  # the one target_value. train.stop_at_target stops at the last rung.
  g.target_values = ()
  # Near the target, evaluate every max(1, target_resolution x step) steps instead of
  # every_steps, so steps to target is known to that fraction of itself (0: off). Near:
  # some eval within near_target_margin x target of it, or the last two evals' rate
  # reaching it within near_target_lookahead x every_steps.
  g.target_resolution = 0.0
  g.near_target_margin = 0.05
  g.near_target_lookahead = 2.0
  return g


def _distributed() -> ml_collections.ConfigDict:
  """Multi-host: JAX's own runtime (jax.distributed.initialize), one process per host."""
  g = ml_collections.ConfigDict()
  g.initialize = False  # True on multi-host runs (TPU pods auto-detect the rest)
  g.coordinator_address = ""  # "host:port" of process 0; "" = auto-detect
  g.num_processes = 0  # 0 = auto-detect
  g.process_id = -1  # -1 = auto-detect
  g.local_device_count = 0  # CPU only: fake devices per process (tests)
  return g


def _distill() -> ml_collections.ConfigDict:
  """Distilled pools: what each worker draws from (ensemble_jax/distill/pools.py)."""
  g = ml_collections.ConfigDict()
  # How each worker's pool is built (distill.registry.BUILDERS): none (the method's own
  # sampler, method.sampler) | el2n | grand | loss | kmeans | craig | gradmatch |
  # distribution_matching | gradient_matching (synthetic sets, not indices)
  g.builder = "none"
  g.fraction = 0.3  # pool size / training set (scores, craig, gradmatch)
  g.keep = "hardest"  # scores: hardest | easiest (Sorscher et al.: small fractions)
  g.per_class = True  # select within each class, so classes stay balanced
  g.split = "shared"  # one pool for N workers: shared | disjoint | bagging
  g.gradient = "bias"  # craig/gradmatch: bias (dL/dlogits) | last_layer (+ weights)
  g.gradmatch_lambda = 0.5  # GradMatch's ridge regularisation
  g.balanced = True  # kmeans: equal-size clusters, one per worker
  # kmeans, balanced: "greedy" (the host greedy under capacities at every Lloyd step) |
  # "sinkhorn" (every step on the device at Sinkhorn-Knopp prices, one final host greedy;
  # sizes within 1 either way; other clusters, 1-5% tighter on the benchmarked pools)
  g.kmeans_balance = "greedy"
  g.tfidf_dim = 64  # kmeans for task 'lm': tf-idf of windows, SVD to this many dims
  # kmeans for images: what is clustered: "proxy" (a trained proxy's penultimate features)
  # | "pca" (the top `pca_dim` principal components of the standardised pixels; no proxy)
  g.embedding = "proxy"
  g.pca_dim = 32
  # "pca": the covariance's precision: "float64" (each chunk of pixels in float64, the full
  # eigendecomposition) | "float32" (float32 products of mean-shifted chunks, only the top
  # `pca_dim` eigenvectors: ~2x less arithmetic; other components in the last bits)
  g.pca_covariance = "float64"
  # "pca": the side of the square images the components are of: 0 is the model's input
  # size; a smaller one downsamples first (ImageNet at 224: 150,528 pixels a covariance
  # cannot hold; at 16, 768 pixels, the size of a Fashion-MNIST image)
  g.pca_image_size = 0
  # aggregation 'routed' (kmeans): softmax(-d^2 / T) over the top-k nearest clusters,
  # d^2 the squared distance of standardised proxy embeddings divided by their dimension
  # (images), or of the unit-norm tf-idf embeddings (text)
  g.route_temperature = 0.1
  g.route_top_k = 2
  g.proxy_models = 2  # proxies (seeds) whose scores / gradients are combined
  g.proxy_steps = 200  # each proxy's training steps on the full data
  g.proxy_width = 4  # the proxy ResNet's width (a cheap model)
  # standard: independent proxies on the full data; lipt (Ro et al. 2023): one shared init,
  # each member on its own disjoint subset, augmented, SNIP-sparse, merged into one soup
  g.proxy = "standard"
  g.lipt_sparsity = 0.5  # lipt: fraction of kernel weights pruned at init
  g.cache_dir = ""  # "" -> <workdir>/pools; pools are keyed by config + data
  # distribution_matching (Zhao & Bilen 2023) | gradient_matching (with siamese augmentation,
  # Zhao & Bilen 2021): each worker's own synthetic set, distilled from its own
  # class-stratified 1/N share of the training data from its own seed
  g.images_per_class = 10  # gradient_matching: 1, 10, 20, 30, 40 or 50 (its loops' table)
  # distillation iterations (the papers' protocols: 20,000 distribution matching; 1,000
  # gradient matching, each a fresh network, outer x inner loops by images_per_class)
  g.iterations = 2000
  g.real_per_class = 64  # real images per class and iteration (the papers': 256)
  g.image_lr = 1.0  # distribution_matching: SGD on the images, momentum 0.5
  g.embed_width = 128  # the random ConvNet's width (embedding, or the matched gradients)
  g.gm_image_lr = 0.1  # gradient_matching: SGD on the images, momentum 0.5 (the paper's)
  g.gm_net_lr = 0.01  # gradient_matching: SGD on the network in its inner loop
  # a distilled warm start: the first `synthetic_fraction` of a run's steps on the
  # synthetic set, then the worker's real share; 0: every step on the synthetic set
  g.synthetic_fraction = 0.0
  # How a worker's synthetic examples are augmented in training: dsa, as their distiller
  # matched them (the literature trains on its sets so), or none. Real examples get
  # data.train_augment whatever this says.
  g.synthetic_augment = "dsa"
  # Knowledge distillation (any method, any pool): a finished data-parallel run's workdir
  # whose final weights are a frozen teacher of the same model; every worker's loss takes
  # its soft targets: (1 - kd_weight) CE(labels) + kd_weight T^2 KL(teacher || student) at
  # temperature T = kd_temperature. The teacher's training is charged to the run.
  g.teacher = ""
  g.kd_weight = 0.0  # in [0, 1]; > 0 needs a teacher, and a teacher needs it > 0
  g.kd_temperature = 1.0
  return g


def _cost() -> ml_collections.ConfigDict:
  """The cluster the cost report models (ensemble_jax/costs.py)."""
  g = ml_collections.ConfigDict()
  g.devices = 0  # D; 0: one device per data-parallel replica / per worker
  g.overlap = 0.0  # fraction of each modelled collective hidden behind compute
  # > 0: one device's step time measured apart (the sweep's calibration run of one model at
  # the per-device batch; a grid may give one: then the sweep does not calibrate that
  # point); 0: the run's own host step / D
  g.device_step_time_s = 0.0
  # A sweep point whose seed runs' device step this point takes, once they have run (else
  # it is calibrated): its directory relative to the sweep's workdir, "curve/point" of the
  # same study or "../<study>/curve/point" of another. A curve added to a committed study
  # is priced at that study's calibration of the same step (a taught step scaled by its
  # FLOPs over the untaught one's: experiments/sweeps/cost_vs_time.py, teacher_factor).
  g.price_like = ""
  # The sweeps' calibration run on CPU hosts (experiments/sweeps/cost_vs_time.py): its
  # steps, the first third untimed, the median of the rest its device step.
  g.calibration_steps = 60
  return g


def _tune() -> ml_collections.ConfigDict:
  """The sweeps' tuning rule (experiments/sweeps/tuning.py), one for every curve point.

  On seed `seed`, each field in turn at `factors` x its configured value, extended by
  `extend` beyond an edge while the best sits there, until it is interior (a diverged next
  value bounds it) or `max_extensions` per edge, the cap, is reached (the record says so).
  Only the sweeps read it, yet it lives in the schema: a workload's tuning ranges are
  hyper-parameters of its study, declared beside the values they scale, and a run's
  results.json records the rule it was tuned by.
  """
  g = ml_collections.ConfigDict()
  g.fields = ("optim.learning_rate",)  # numeric config fields, tuned one after another
  # What the choice minimises: steps_to_target (the first rung of eval.target_values; each
  # rung's own choice is recorded beside it), or final_metric (a ceiling: the best end).
  g.objective = "steps_to_target"
  # The rungs of eval.target_values whose own choice (when it differs from the point's) gets
  # the reported seeds too, in <point>/per_target/<run>/seed<k> (): every rung).
  g.report_targets = ()
  g.factors = (0.5, 1.0, 2.0)  # (1.0,): not tuned
  g.extend = 2.0
  # The cap on extensions per edge: the rule never stops at an edge below it (issue 58: the
  # routed small-model experts' rate stopped at 2 extensions, still at the edge). Records
  # tuned before say 2.
  g.max_extensions = 6
  g.seed = 0
  # train.schedule_fraction, when among `fields`: these values, not factors x its value,
  # never extended (above 1 the schedule would outgrow the point's budget).
  g.schedule_fractions = (1.0, 0.5, 0.25)
  # ... each run on `seed`, then on each of these (never reported): a length counts its
  # worst seed, since a short schedule often reaches the target only at its last evals.
  g.schedule_seeds = (1000,)
  # ... and chosen only with a margin: a run reaching the target after this fraction of its
  # schedule's steps counts as a miss (a knife-edge reach the reported seeds then miss).
  g.schedule_margin = 0.8
  # Once a run has reached the target, later runs stop (train.stop_at_step) at their first
  # eval at or past its steps: one that has not reached it by then can no longer be chosen,
  # so the choice is the one full runs would give, for less compute.
  g.stop_losers = False
  # Fields set from another grid's tuning choice (the many-worker, one-device and demo grids
  # train at the full grid's): a run trained at other values of them was trained at a former
  # choice, so it moves to the point's superseded/ and trains again, as a run at other values
  # of the point's own tuned `fields` does, rather than making the workdir another study's.
  g.inherited = ()
  return g


def _checkpoint() -> ml_collections.ConfigDict:
  """When the run saves, so a kill loses little."""
  g = ml_collections.ConfigDict()
  g.every_steps = 0  # 0: no step-count rule
  # A save every this many minutes of the run, so a kill at any moment loses at most that;
  # 0: none. The end of the run and a stop (SIGTERM, Ctrl-C) always save.
  g.every_minutes = 5.0
  g.max_to_keep = 2
  return g


def target_ladder(eval_config) -> tuple[float, ...]:
  """The run's targets, easiest first: eval.target_values, or the one eval.target_value."""
  return tuple(float(v) for v in eval_config.target_values) or (float(eval_config.target_value),)


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
  on the command line (spaces around the commas allowed); read it through this, never by
  splitting it again. `config` may
  also be a run's saved config (a plain dict).
  """
  method = config["method"] if isinstance(config, dict) else config.method
  aggregation = method["aggregation"] if isinstance(method, dict) else method.aggregation
  return tuple(mode.strip() for mode in aggregation.split(",") if mode.strip())


def parse_variants(arg: str, known, config_name: str) -> set[str]:
  """The variants of a workload config's argument ('tiny,ensemble'), each one known."""
  variants = set(filter(None, arg.split(",")))
  if variants - set(known):
    said = ", ".join(repr(v) + "".join(f" (did you mean {close!r}?)" for close in
                                       difflib.get_close_matches(v, known, n=1))
                     for v in sorted(variants - set(known)))
    raise ConfigError(f"unknown variant(s) {said} of {config_name}; choose from "
                      f"{sorted(known)}")
  return variants


def steps_per_epoch(config, num_train_examples: int) -> int:
  return max(1, num_train_examples // config.train.batch_size)
