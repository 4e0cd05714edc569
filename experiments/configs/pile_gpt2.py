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
