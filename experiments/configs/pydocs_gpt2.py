"""Byte-level GPT-2 on the embedded Python documentation (Debian python3.11-doc, `make data`).

  python -m ensemble_jax.main --config=experiments/configs/pydocs_gpt2.py --workdir=/tmp/lm
  # variants (comma-separated): ensemble, smoke; e.g. pydocs_gpt2.py:ensemble,smoke

Default: data-parallel GPT-2 'mini' (4 layers, 4 heads, 128 wide, byte vocabulary 256,
context 256), AdamW, 32 windows x 256 bytes per step, warmup + cosine. The target
perplexity is set from a measured DP run of this config (see TARGET_PERPLEXITY).
`ensemble`: N=4 workers, each a quarter of the DP steps, so equal total compute.
"""
from ensemble_jax.config_lib import base_config

# Measured: the DP default reaches perplexity 6.29 on 512 validation windows at step 600
# (1 seed, 2 CPU cores); the target is set a little above it so that DP reaches it
# late in its run and other methods are measured against the same bar.
TARGET_PERPLEXITY = 6.5
DP_STEPS = 600


def get_config(arg: str = ""):
  c = base_config()
  c.task = "lm"
  c.data.dataset, c.data.source, c.data.path = "pydocs", "files", ""
  c.data.tokenizer = "byte"
  c.data.context = 256
  c.data.val_fraction = 0.05
  c.data.mean, c.data.std = (), ()
  c.model.name, c.model.size = "gpt2", "mini"
  c.model.dropout = 0.0
  c.optim.name = "adamw"
  c.optim.learning_rate, c.optim.base_batch_size = 3e-3, 32
  c.optim.b2 = 0.99
  c.optim.weight_decay = 0.1
  c.optim.warmup_steps = 30
  c.optim.grad_clip_norm = 1.0
  c.train.batch_size = 32
  c.train.num_epochs, c.train.num_steps = 0.0, DP_STEPS
  c.train.log_every_steps = 50
  c.eval.every_steps = 200
  c.eval.batch_size = 64
  c.eval.num_examples = 512  # validation windows (of ~2k) scored at each eval
  c.eval.split = "validation"
  c.eval.target_metric, c.eval.target_value = "perplexity", TARGET_PERPLEXITY
  variants = set(filter(None, arg.split(",")))
  if variants - {"smoke", "ensemble"}:
    raise ValueError(f"unknown variant(s) {sorted(variants - {'smoke', 'ensemble'})} of "
                     "pydocs_gpt2.py; choose from 'ensemble', 'smoke'")
  if "ensemble" in variants:
    c.method.name = "ensemble"
    c.mesh = [("worker", -1), ("data", 1)]
    c.method.num_workers = 4
    c.method.steps_per_worker = DP_STEPS // 4
    c.method.aggregation = "probs,logits"  # the mixture's perplexity is the proper one
  if "smoke" in variants:
    c.model.size = "tiny"
    c.data.context = 32
    c.train.batch_size = 8
    c.train.num_steps = 4
    c.method.steps_per_worker = 4 if "ensemble" in variants else 0
    c.optim.warmup_steps = 1
    c.train.log_every_steps = 2
    c.eval.every_steps = 2
    c.eval.batch_size = 16
    c.eval.num_examples = 32
    c.eval.target_value = 1000.0
    c.checkpoint.every_steps = 2
  return c
