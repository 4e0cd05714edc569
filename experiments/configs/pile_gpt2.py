"""GPT-2 small (124,439,808 params) on the Pile, target perplexity 10.

  make pile PILE_DIR=/data/pile TOKENIZER_DIR=/data/gpt2-tokenizer   # the cost-vs-time study
  make pile-run PILE_DIR=/data/pile TOKENIZER_DIR=/data/gpt2-tokenizer   # one run, this recipe
  # = python -m ensemble_jax.main --config=experiments/configs/pile_gpt2.py --workdir=... \
  #     --config.data.path=$PILE_DIR --config.data.tokenizer_dir=$TOKENIZER_DIR
  # variants (comma-separated): ensemble, diloco, sweep, tiny; e.g. pile_gpt2.py:sweep,ensemble

PILE_DIR holds the shards `*.jsonl.zst` (or `*.jsonl`), one JSON object per line:
{"text": ..., "meta": {"pile_set_name": ...}}. TOKENIZER_DIR holds GPT-2's
`encoder.json` + `vocab.bpe` (or a `tokenizer.json`). The recipe follows GPT-2/nanoGPT:
context 1024, 512 sequences per step (0.5M tokens), AdamW (b2 0.95, wd 0.1), peak lr 6e-4,
2000 warmup steps, cosine over 60k steps (~31B tokens), grad clip 1.0, bf16 compute.
The first run tokenizes the shards into a cache (`config.data.data_dir`/tokens).
`ensemble`: N = 8 workers of 16 sequences a step, each L = 240,000 steps (the recipe's
tokens shared among them: equal compute), lr 6e-4 x sqrt(16/512). `diloco`: the same
workers with an outer Nesterov step every H = 100 steps. `sweep`: the cost-vs-time
workload (`sweep_grid`): 16 sequences per device or worker, the budget rule
SWEEP_SEQUENCES, warm-up 1/30 of each run's budget. `tiny`: compile-light, for tests on
generated shards (GPT-2 tiny, context 32, a few steps).
"""
from ensemble_jax import config_lib
from ensemble_jax.config_lib import base_config

PER_DEVICE = 16  # sequences of 1,024 tokens per device (data-parallel) or per worker
# The budget rule, one for every point of every curve: the recipe's 60,000 steps x 512
# sequences (~31B tokens), all models together (16 D per data-parallel step, 16 N per
# ensemble or DiLoCo step).
SWEEP_SEQUENCES = 60_000 * 512
EVALS_PER_BUDGET = 100  # an evaluation every 1% of a run's budget (5% near the target)


def budget_steps(sequences_per_step: int, sequences: int = SWEEP_SEQUENCES) -> int:
  """The steps a point may take: `sequences` at `sequences_per_step`, rounded up."""
  return -(-sequences // sequences_per_step)


def get_config(arg: str = ""):
  c = base_config()
  c.task = "lm"
  c.data.dataset, c.data.source = "pile", "files"
  c.data.path = ""  # PILE_DIR; required
  c.data.tokenizer, c.data.tokenizer_dir = "gpt2", ""  # TOKENIZER_DIR; required
  c.data.context = 1024
  c.data.val_fraction = 0.001
  c.data.mean, c.data.std = (), ()
  c.data.num_threads = 8
  c.model.name, c.model.size = "gpt2", "small"
  c.model.dtype = "bfloat16"
  c.model.remat = False
  c.optim.name = "adamw"
  c.optim.learning_rate, c.optim.base_batch_size = 6e-4, 512
  c.optim.b1, c.optim.b2 = 0.9, 0.95
  c.optim.weight_decay = 0.1
  c.optim.warmup_steps = 2000
  c.optim.grad_clip_norm = 1.0
  c.train.batch_size = 512
  c.train.num_epochs, c.train.num_steps = 0.0, 60_000
  c.train.log_every_steps = 100
  c.eval.every_steps = 2000
  c.eval.batch_size = 64
  c.eval.num_examples = 4096
  c.eval.split = "validation"
  c.eval.target_metric, c.eval.target_value = "perplexity", 10.0
  c.checkpoint.every_steps = 1000
  variants = config_lib.parse_variants(arg, ("ensemble", "diloco", "sweep", "tiny"),
                                       "pile_gpt2.py")
  if variants & {"ensemble", "diloco"}:
    c.method.name = "ensemble"
    c.mesh = "worker:-1,data:1"
    c.method.num_workers = 8
    c.train.batch_size = PER_DEVICE  # per worker
    c.optim.lr_scaling = "sqrt"  # Adam: 6e-4 x sqrt(16 / 512)
    c.method.steps_per_worker = budget_steps(8 * PER_DEVICE)  # 8 x 16 x L = the recipe's
    c.optim.warmup_steps, c.optim.warmup_fraction = 0, 1 / 30  # the recipe's 2k of 60k
    c.method.aggregation = "probs,logits"  # the mixture's perplexity is the proper one
  if "diloco" in variants:
    c.method.name, c.method.sync_every = "diloco", 100
    c.method.aggregation = "global"  # one model: the outer params
    c.tune.fields = ("optim.learning_rate", "method.outer_learning_rate")
  if "sweep" in variants:
    c.train.batch_size = PER_DEVICE  # per device (data-parallel) or per worker
    c.optim.lr_scaling = "sqrt"  # Adam at 16 D: 6e-4 x sqrt(16 D / 512)
    c.optim.warmup_steps, c.optim.warmup_fraction = 0, 1 / 30  # of each run's own budget
    c.train.num_steps = budget_steps(8 * PER_DEVICE)  # D = 8
    if variants & {"ensemble", "diloco"}:
      c.method.steps_per_worker = budget_steps(c.method.num_workers * PER_DEVICE)
    else:
      c.cost.devices = 8
    c.eval.target_resolution = 0.05  # steps to target known to 5% (evals near it)
    c.train.timing_warmup_steps = 20
    c.tune.stop_losers = True
    for key, value in cadence(c.method.steps_per_worker or c.train.num_steps).items():
      config_lib.set_dotted(c, key, value)
  if "tiny" in variants:  # compile-light, for tests on generated shards
    c.model.size, c.model.dtype = "tiny", "float32"
    c.data.context, c.data.val_fraction, c.data.num_threads = 32, 0.1, 2
    c.train.batch_size = 8  # 1 a device on the tests' 8
    c.train.num_steps = 4
    c.method.steps_per_worker = 4 if variants & {"ensemble", "diloco"} else 0
    c.method.sync_every = 2 if "diloco" in variants else 0
    c.optim.warmup_fraction = 0.25  # 1 of the 4 steps
    c.train.log_every_steps = 2
    c.train.timing_warmup_steps = 1
    c.eval.every_steps, c.eval.batch_size, c.eval.num_examples = 2, 8, 16
    c.eval.target_value = 1e6  # an untrained tiny model's perplexity is below it
    c.checkpoint.every_steps = 2
    c.cost.calibration_steps = 6  # a sweep's calibration run: its mechanism, not a timing
  return c


def cadence(steps: int) -> dict:
  """Evaluations every 1% of a run's `steps` (placing the target's step, 5% near it) and
  checkpoints every 2% (a preempted run loses at most 2% of its budget)."""
  return {"eval.every_steps": max(1, steps // EVALS_PER_BUDGET),
          "checkpoint.every_steps": max(1, steps // 50)}


def sweep_grid(name: str = "full") -> dict:
  """{curve: {point: (variant, overrides)}} for experiments/sweeps/cost_vs_time.py.

  Sized for real hardware, 16 sequences of 1,024 tokens per device or worker (the batch
  measured on one H100 in bf16: 325k tokens/s, experiments/results/bench/h100/):

  - data_parallel at D = 8 .. 256 devices (128 .. 4,096 sequences, 131k .. 4.2M tokens a
    step): Kaplan et al.'s (2020) fit puts the critical batch near 4M tokens at perplexity
    10, so the curve runs up to it (critical_batch_grid measures it).
  - dp_short_schedule: D = 32 (the recipe's 512 sequences) with full cosine schedules of
    20k, 30k and 40k steps.
  - No smaller-model baseline: GPT-2 small is the family's smallest, and models below
    ~125M parameters end above perplexity 10 on the Pile at this budget.
  - ensemble at N = 8 .. 64 workers, one per device, L by the budget rule (240,000 ..
    30,000 steps).
  - ensemble_tfidf_routed: the same N, c-BTM's routed experts (worker i on tf-idf cluster
    i, each validation position routed on the tf-idf of its prefix); the pool's build is
    on its critical path.
  - diloco with N = 8 over H = 50 .. 500 steps between outer steps.

  The rules of docs/methodology.md, per point: the learning rate tuned on seed 0 around
  6e-4 x sqrt(B / 512) (B the point's per-model batch: Adam's square-root rule), with
  tuning runs that can no longer win stopped early; warm-up 1/30 of the run's own budget
  (the recipe's 2,000 of 60,000 steps); the budget rule (SWEEP_SEQUENCES, ~31B tokens
  shared by all models); runs stop at perplexity 10 on 4,096 validation sequences,
  evaluated every 1% of the budget and every 5% of the steps near the target. At the
  measured H100 rate one 31B-token run is ~27 device-hours; run fewer seeds or curves
  first (--seeds=0, --curves=...).

  `smoke`: the same curves on `tiny` (generated shards in the tests, seconds).
  """
  def dp(d, **extra):
    steps = extra.pop("train.num_steps", budget_steps(PER_DEVICE * d))
    return ("sweep", {"train.batch_size": PER_DEVICE * d, "cost.devices": d,
                      "train.num_steps": steps, **cadence(steps), **extra})

  def ensemble(n, variant="ensemble,sweep", **extra):
    steps = budget_steps(PER_DEVICE * n)
    return (variant, {"method.num_workers": n, "method.steps_per_worker": steps,
                      **cadence(steps), **extra})

  # c-BTM: worker i trains on tf-idf cluster i, each validation window routed by its tf-idf
  routed = {"distill.builder": "kmeans", "method.aggregation": "routed,probs,logits"}

  if name == "smoke":  # generated shards, seconds: one rate, no extension
    fixed = {"tune.factors": (1.0,), "tune.max_extensions": 0}
    return {
        "data_parallel": {f"D{d}": ("sweep,tiny", {"train.batch_size": 8 * d,
                                                   "cost.devices": d, **fixed})
                          for d in (1, 2)},
        "ensemble": {f"N{n}_L4": ("ensemble,sweep,tiny", {"method.num_workers": n, **fixed})
                     for n in (2, 4)},
        "ensemble_tfidf_routed": {"N2_L4": ("ensemble,sweep,tiny", {
            "method.num_workers": 2, **routed, "distill.tfidf_dim": 8, **fixed})},
        "diloco": {"H2": ("diloco,sweep,tiny", {"method.num_workers": 2, **fixed})},
    }
  if name != "full":
    raise ValueError(f"unknown grid {name!r} of pile_gpt2.py; choose full or smoke")
  return {
      "data_parallel": {f"D{d}": dp(d) for d in (8, 16, 32, 64, 128, 256)},
      "dp_short_schedule": {f"D32_S{s // 1000}k": dp(32, **{"train.num_steps": s})
                            for s in (20_000, 30_000, 40_000)},
      "ensemble": {f"N{n}_L{budget_steps(PER_DEVICE * n)}": ensemble(n)
                   for n in (8, 16, 32, 64)},
      "ensemble_tfidf_routed": {f"N{n}_L{budget_steps(PER_DEVICE * n)}": ensemble(n, **routed)
                                for n in (8, 16, 32, 64)},
      "diloco": {f"H{h}": ensemble(8, "diloco,sweep", **{"method.sync_every": h})
                 for h in (50, 100, 250, 500)},
  }


def critical_batch_grid(name: str = "full") -> dict:
  """Data-parallel's critical batch, for experiments/sweeps/critical_batch.py.

  GPT-2 small at global batch B = 64 .. 4,096 sequences of 1,024 tokens (65k .. 4.2M
  tokens), 16 per device (D = 4 .. 256): Kaplan et al.'s (2020) fit B_crit = 2e8 tokens /
  L^4.8 gives ~4M tokens at perplexity 10 (loss 2.3 nats; their fit is on WebText2), so the
  range reaches the knee from below. 16 sequences per device is the batch measured on one
  H100 in bf16 (325k tokens/s, experiments/results/bench/h100/).

  The recipe's rules, per point: AdamW, peak lr 6e-4 at B = 512 scaled by sqrt(B / 512)
  (Adam's usual rule), tuned around it with the smaller B's choice as warm start; warm-up
  1/30 of the budget (the recipe's 2,000 of 60,000 steps). Budget: the recipe's 60,000
  steps x 512 sequences (~31B tokens) at every B, at least 5,000 steps. Runs stop at
  perplexity 10, evaluated every 1% of the budget and every 5% of the steps near it; a
  checkpoint every 2% bounds what a preempted run loses.
  """
  if name != "full":
    raise ValueError(f"unknown critical-batch grid {name!r} of pile_gpt2.py; choose full")
  return {"variant": "", "per_device": 16, "batches": tuple(64 * 2**i for i in range(7)),
          "budget_examples": 60_000 * 512, "min_steps": 5000, "warmup_fraction": 1 / 30,
          "evals_per_budget": 100, "checkpoints_per_budget": 50,
          "overrides": {"optim.lr_scaling": "sqrt", "eval.target_resolution": 0.05,
                        "tune.stop_losers": True,
                        "tune.fields": ("optim.learning_rate", "train.schedule_fraction")}}
