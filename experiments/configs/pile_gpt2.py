"""GPT-2 small (124,439,808 params) on the Pile, target perplexity 10.

  make pile PILE_DIR=/data/pile TOKENIZER_DIR=/data/gpt2-tokenizer
  # = python -m ensemble_jax.main --config=experiments/configs/pile_gpt2.py --workdir=... \
  #     --config.data.path=$PILE_DIR --config.data.tokenizer_dir=$TOKENIZER_DIR

PILE_DIR holds the shards `*.jsonl.zst` (or `*.jsonl`), one JSON object per line:
{"text": ..., "meta": {"pile_set_name": ...}}. TOKENIZER_DIR holds GPT-2's
`encoder.json` + `vocab.bpe` (or a `tokenizer.json`). The recipe follows GPT-2/nanoGPT:
context 1024, 512 sequences per step (0.5M tokens), AdamW (b2 0.95, wd 0.1), peak lr 6e-4,
2000 warmup steps, cosine over 60k steps (~31B tokens), grad clip 1.0, bf16 compute.
The first run tokenizes the shards into a cache (`config.data.data_dir`/tokens).
"""
from ensemble_jax.config_lib import base_config


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
  if arg:
    raise ValueError(f"unknown variant {arg!r} of pile_gpt2.py")
  return c


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
                        "tune.stop_losers": True}}
