"""ResNet-50 on ImageNet (TFDS imagenet2012 as array_record in config.data.data_dir).

  make imagenet DATA_DIR=/data/tensorflow_datasets WORKDIR=/ckpt   # the cost-vs-time study
  make imagenet-run DATA_DIR=/data/tensorflow_datasets WORKDIR=/ckpt   # one run, this recipe
  # = python -m ensemble_jax.main --config=experiments/configs/imagenet_resnet50.py \
  #     --workdir=/ckpt/rn50 --config.data.data_dir=/data/tensorflow_datasets
  # variants (comma-separated): ensemble, diloco, sweep, tiny; e.g. imagenet_resnet50.py:sweep,ensemble

Prepare the data once: `tfds build imagenet2012 --manual_dir=DIR_WITH_TARS
--data_dir=DATA_DIR --file_format=array_record`. The classic recipe: batch 1024,
SGD + Nesterov momentum 0.9, peak lr 0.1 * batch/256 (= 0.4), 5 warmup epochs, cosine
over 90 epochs, weight decay 1e-4 (not on BN/bias), label smoothing 0.1, Inception crop
at 224. Target: 75% top-1 on the validation split. One step at batch 8 takes ~2 s on a
CPU core, so this config is for accelerators (a v3-8 runs it in about a day).
`ensemble`: N = 8 workers of 128 images a step, each L = 112,603 steps (the 90 epochs'
examples shared among them: equal compute). `diloco`: the same workers with an outer
Nesterov step every H = 100 steps. `sweep`: the cost-vs-time workload (`sweep_grid`): 128
images per device or worker, the budget rule SWEEP_EXAMPLES, warm-up 5/90 of each run's
budget. `tiny`: compile-light, for tests on `tfds.testing.mock_data` (32 px, ResNet-18 at
width 4, a few steps).
"""
from ensemble_jax import config_lib
from ensemble_jax.config_lib import base_config

IMAGENET_TRAIN_EXAMPLES = 1_281_167
PER_DEVICE = 128  # images per device (data-parallel) or per worker (ensemble, DiLoCo)
# The budget rule, one for every point of every curve: the recipe's 90 epochs of examples,
# all models together (128 D per data-parallel step, 128 N per ensemble or DiLoCo step).
SWEEP_EXAMPLES = 90 * IMAGENET_TRAIN_EXAMPLES
EVALS_PER_BUDGET = 50  # an evaluation every 2% of a run's budget (5% near the target)


def budget_steps(examples_per_step: int, examples: int = SWEEP_EXAMPLES) -> int:
  """The steps a point may take: `examples` at `examples_per_step`, rounded up."""
  return -(-examples // examples_per_step)


def get_config(arg: str = ""):
  c = base_config()
  c.data.dataset = "imagenet2012"
  c.data.source = "tfds"
  c.data.image_size = 224
  c.data.train_augment = "inception"
  c.data.eval_resize = 256
  c.data.mean, c.data.std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  c.data.num_threads = 16
  c.data.prefetch = 4
  c.model.name, c.model.width, c.model.stem = "resnet50", 64, "imagenet"
  c.model.dtype = "bfloat16"
  c.optim.name = "sgd"
  c.optim.learning_rate, c.optim.base_batch_size = 0.1, 256  # linear scaling rule
  c.optim.momentum, c.optim.nesterov = 0.9, True
  c.optim.weight_decay = 1e-4
  c.optim.warmup_epochs = 5.0
  c.optim.label_smoothing = 0.1
  c.train.batch_size = 1024
  c.train.num_epochs = 90.0
  c.train.log_every_steps = 100
  c.eval.split = "validation"
  c.eval.batch_size = 1024
  c.eval.target_metric, c.eval.target_value = "accuracy", 0.75
  c.checkpoint.every_steps = 2000
  variants = config_lib.parse_variants(arg, ("ensemble", "diloco", "sweep", "tiny"),
                                       "imagenet_resnet50.py")
  if variants & {"ensemble", "diloco"}:
    c.method.name = "ensemble"
    c.mesh = "worker:-1,data:1"
    c.method.num_workers = 8
    c.train.batch_size = PER_DEVICE  # per worker; lr 0.1 x 128/256 by the linear rule
    c.method.steps_per_worker = budget_steps(8 * PER_DEVICE)  # 8 x 128 x L = 90 epochs
    c.method.sampler = "random"
    c.method.aggregation = "logits,probs"
  if "diloco" in variants:  # the same engine, with an outer Nesterov step every H steps
    c.method.name, c.method.aggregation = "diloco", "global"  # one model: the outer params
    c.method.sync_every = 100
    c.tune.fields = ("optim.learning_rate", "method.outer_learning_rate")
  if "sweep" in variants:
    c.train.batch_size = PER_DEVICE  # per device (data-parallel) or per worker
    c.optim.warmup_fraction = 5 / 90  # the recipe's 5 of 90 epochs, of each run's budget
    c.train.num_epochs, c.train.num_steps = 0.0, budget_steps(8 * PER_DEVICE)  # D = 8
    if variants & {"ensemble", "diloco"}:
      c.method.steps_per_worker = budget_steps(c.method.num_workers * PER_DEVICE)
    else:
      c.cost.devices = 8
    c.eval.target_resolution = 0.05  # steps to target known to 5% (evals near it)
    c.train.timing_warmup_steps = 20
    c.tune.stop_losers = True
    for key, value in cadence(c.method.steps_per_worker or c.train.num_steps).items():
      config_lib.set_dotted(c, key, value)
  if "tiny" in variants:
    # Compile-light, for tests on tfds.testing.mock_data (random images of random small
    # sizes, 1,000 classes): ResNet-18's block at width 4 in two one-block stages, 32 px.
    c.data.image_size, c.data.eval_resize = 32, 36
    c.data.num_threads, c.data.prefetch = 2, 2
    c.model.name, c.model.width, c.model.stem = "resnet18", 4, "small"
    c.model.stage_sizes = (1, 1)
    c.model.dtype = "float32"
    c.train.batch_size = 8
    c.train.num_epochs, c.train.num_steps = 0.0, 4
    c.optim.warmup_fraction = 0.25
    c.train.log_every_steps = 2
    c.train.timing_warmup_steps = 1
    c.eval.every_steps, c.eval.batch_size, c.eval.num_examples = 2, 16, 16
    c.eval.target_value = 0.0  # mock labels are noise: every evaluation reaches it
    c.checkpoint.every_steps = 2
    c.method.steps_per_worker = 4 if variants & {"ensemble", "diloco"} else 0
    c.method.sync_every = 2 if "diloco" in variants else 0
    c.cost.calibration_steps = 6  # a sweep's calibration run: its mechanism, not a timing
  return c


def cadence(steps: int) -> dict:
  """Evaluations and checkpoints every 2% of a run's `steps`: 50 evaluations place the
  target's step (5% near it), and a preempted run loses at most 2% of its budget."""
  every = max(1, steps // EVALS_PER_BUDGET)
  return {"eval.every_steps": every, "checkpoint.every_steps": every}


def sweep_grid(name: str = "full") -> dict:
  """{curve: {point: (variant, overrides)}} for experiments/sweeps/cost_vs_time.py.

  Sized for real hardware, 128 images per device or worker (one H100 in bf16 runs batch
  256 at 5,213 images/s, experiments/results/bench/h100/; 128 keeps it busy and lets
  D = 256 fit the 90-epoch budget in 3,519 steps):

  - data_parallel at D = 8 .. 256 devices (global batch 1,024 .. 32,768, BatchNorm per
    device, `method.batchnorm`): the recipe holds
    its accuracy to 8,192 with the linear rule (Goyal et al., 2017) and its steps to
    target stop halving between 8,192 and 65,536 (Shallue et al., 2018), so the curve
    crosses the critical batch (critical_batch_grid measures it).
  - dp_short_schedule: D = 64 with full cosine schedules of 30, 45 and 60 epochs.
  - No smaller-model baseline: ResNet-18 and ResNet-34 end at 69.8% and 73.3% after the
    same 90 epochs (torchvision's recipe), short of 75%.
  - ensemble at N = 8 .. 64 workers, one per device, L by the budget rule (112,603 ..
    14,076 steps: 11.3 .. 1.4 epochs a worker).
  - ensemble_proxy_routed: the same N, worker i on k-means cluster i of a cheap proxy's
    embedding (c-BTM's routed experts for images), each validation image routed by its
    embedding; the pool's build is on its critical path. The embedded workload's PCA of
    the pixels does not scale to 224 px (a 150,528-wide covariance).
  - diloco with N = 8 over H = 50 .. 500 steps between outer steps.

  The rules of docs/methodology.md, per point: the learning rate tuned on seed 0 around
  0.1 x B/256 (B the point's per-model batch: the linear rule), with tuning runs that can
  no longer win stopped early; warm-up 5/90 of the run's own budget; the budget rule
  (SWEEP_EXAMPLES: 90 epochs shared by all models); runs stop at 75% top-1, evaluated
  every 2% of the budget and every 5% of the steps near the target. At the measured H100
  rate the grid's 3 seeds take ~0.5M device-hours before stopping at the target; run
  fewer seeds or curves first (--seeds=0, --curves=...).

  `smoke`: the same curves on `tiny` (mock data in the tests, seconds).
  """
  def dp(d, **extra):  # per-device BatchNorm, as the recipe's (Goyal et al.: 32 per GPU)
    steps = extra.pop("train.num_steps", budget_steps(PER_DEVICE * d))
    return ("sweep", {"train.batch_size": PER_DEVICE * d, "cost.devices": d,
                      "train.num_steps": steps, "method.batchnorm": "per_device",
                      **cadence(steps), **extra})

  def ensemble(n, variant="ensemble,sweep", **extra):
    steps = extra.pop("method.steps_per_worker", budget_steps(PER_DEVICE * n))
    return (variant, {"method.num_workers": n, "method.steps_per_worker": steps,
                      **cadence(steps), **extra})

  routed = {"distill.builder": "kmeans", "distill.embedding": "proxy",
            "method.aggregation": "routed,logits,probs"}

  if name == "smoke":  # mock data, seconds: one rate, no extension
    fixed = {"tune.factors": (1.0,), "tune.max_extensions": 0}
    tiny_routed = {**routed, "distill.proxy_models": 1, "distill.proxy_steps": 4}
    return {
        "data_parallel": {f"D{d}": ("sweep,tiny", {"train.batch_size": 8 * d,
                                                   "cost.devices": d, **fixed})
                          for d in (1, 2)},
        "ensemble": {f"N{n}_L4": ("ensemble,sweep,tiny", {"method.num_workers": n, **fixed})
                     for n in (2, 4)},
        "ensemble_proxy_routed": {"N2_L4": ("ensemble,sweep,tiny", {
            "method.num_workers": 2, **tiny_routed, **fixed})},
        "diloco": {"H2": ("diloco,sweep,tiny", {"method.num_workers": 2, **fixed})},
    }
  if name != "full":
    raise ValueError(f"unknown grid {name!r} of imagenet_resnet50.py; choose full or smoke")
  return {
      "data_parallel": {f"D{d}": dp(d) for d in (8, 16, 32, 64, 128, 256)},
      "dp_short_schedule": {
          f"D64_E{e}": dp(64, **{"train.num_steps": budget_steps(
              PER_DEVICE * 64, e * IMAGENET_TRAIN_EXAMPLES)}) for e in (30, 45, 60)},
      "ensemble": {f"N{n}_L{budget_steps(PER_DEVICE * n)}": ensemble(n)
                   for n in (8, 16, 32, 64)},
      "ensemble_proxy_routed": {f"N{n}_L{budget_steps(PER_DEVICE * n)}": ensemble(n, **routed)
                                for n in (8, 16, 32, 64)},
      "diloco": {f"H{h}": ensemble(8, "diloco,sweep", **{"method.sync_every": h})
                 for h in (50, 100, 250, 500)},
  }


def critical_batch_grid(name: str = "full") -> dict:
  """Data-parallel's critical batch, for experiments/sweeps/critical_batch.py.

  ResNet-50 at global batch B = 1,024 .. 65,536 images, 128 per device (D = 8 .. 512):
  the recipe keeps its 90-epoch accuracy up to B = 8,192 with the linear rule (Goyal et
  al., 2017), and Shallue et al. (2018) saw its steps to target stop halving somewhere
  between 8,192 and 65,536, so the range brackets the knee. 128 images per device keep an
  accelerator busy (one H100 in bf16 runs batch 256 at 5,213 images/s,
  experiments/results/bench/h100/).

  The recipe's rules, per point: peak lr 0.1 B / 256 (SGD + Nesterov), tuned around it
  with the smaller B's choice as warm start (linear scaling overshoots past the knee);
  warm-up 5 of the 90 epochs, as a fraction of the point's budget. Budget: the recipe's
  90 epochs, at least 2,000 steps (90 epochs at B = 65,536 are 1,760). Runs stop at 75%
  top-1, evaluated every 2% of the budget and every 5% of the steps near it; a
  checkpoint every 2% bounds what a preempted run loses. About 6 device-hours per
  90-epoch run at the measured H100 rate, before stopping at the target.
  """
  if name != "full":
    raise ValueError(f"unknown critical-batch grid {name!r} of imagenet_resnet50.py; choose "
                     "full")
  return {"variant": "", "per_device": 128, "batches": tuple(1024 * 2**i for i in range(7)),
          "budget_examples": 90 * IMAGENET_TRAIN_EXAMPLES, "min_steps": 2000,
          "warmup_fraction": 5 / 90, "evals_per_budget": 50, "checkpoints_per_budget": 50,
          "overrides": {"eval.target_resolution": 0.05, "tune.stop_losers": True,
                        "tune.fields": ("optim.learning_rate", "train.schedule_fraction")}}
