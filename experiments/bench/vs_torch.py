"""GPT-2's train step on CPU beside Hugging Face GPT2LMHeadModel + torch AdamW, one process.

  python -m experiments.bench.vs_torch [--sizes=small,mini,tiny] [--rounds=5] \
      [--baseline_rev=<git rev>] [--out=vs_torch.json]

Per size, the codebase's data-parallel train step (`step.train_step`: forward, backward,
clipped AdamW; float32, dropout 0) is timed beside the same model in Hugging Face
`GPT2LMHeadModel` with `torch.optim.AdamW` eager, on the same token batch, and, with
`--baseline_rev`, beside this codebase as it was at that revision (its `ensemble_jax`
package extracted with `git archive`: the model and the step). Each implementation lives in its own worker process
(in one process, the idle framework's thread pool slowed the other up to 8x); they take
turns step by step, their order rotated each round, so a busy machine slows each alike.
Every step's wall time and its worker's CPU time (all threads) are recorded; ratios are
of medians.
Sizes: `small` (GPT-2 small, vocabulary 50257, --batch x --context), and the docs
sweeps' `mini` (32 x 256 bytes) and `tiny` (16 x 128 bytes) of pydocs_gpt2.py.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time

from absl import flags

from experiments import cli

FLAGS = flags.FlagValues()
flags.DEFINE_string("sizes", "small,mini,tiny", "comma-separated", flag_values=FLAGS)
flags.DEFINE_integer("rounds", 5, "timed steps per implementation", flag_values=FLAGS)
flags.DEFINE_integer("batch", 4, "GPT-2 small's batch (sequences)", flag_values=FLAGS)
flags.DEFINE_integer("context", 256, "GPT-2 small's sequence length", flag_values=FLAGS)
flags.DEFINE_string("baseline_rev", "", "also time ensemble_jax as of this git revision",
                    flag_values=FLAGS)
flags.DEFINE_string("torch_threads", "0,1", "torch runs once per entry (0: torch's "
                    "default, one per core); ratios are to the fastest", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the rows as JSON here", flag_values=FLAGS)

# size -> (vocabulary, batch, context); None: from the flags.
WORKLOADS = {"small": (50257, None, None), "mini": (256, 32, 256), "tiny": (256, 16, 128)}


def _config(size: str):
  from experiments.configs import pile_gpt2, pydocs_gpt2

  config = (pile_gpt2 if size == "small" else pydocs_gpt2).get_config()
  config.model.size, config.model.dtype, config.model.dropout = size, "float32", 0.0
  config.model.attention, config.model.remat = "einsum", False
  return config


def package_at(rev: str, where: str) -> str:
  """The `ensemble_jax` package as of git revision `rev`, extracted under `where`; the
  folder to put first on a worker's sys.path."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  archive = subprocess.run(["git", "archive", rev, "ensemble_jax"], cwd=root, check=True,
                           capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
  return where


def jax_step(size: str, tokens, package_dir: str = ""):
  """A zero-argument callable running one jitted train step and waiting for it, of this
  codebase or of the `ensemble_jax` package in `package_dir` (`package_at`)."""
  if package_dir:  # this worker process imported the current package already: drop it
    import sys
    sys.path.insert(0, package_dir)
    for name in [m for m in sys.modules if m.split(".")[0] == "ensemble_jax"]:
      del sys.modules[name]
  import jax
  import jax.numpy as jnp

  from ensemble_jax import optim
  from ensemble_jax.methods import step as step_lib
  from ensemble_jax.models import gpt2

  if package_dir and not gpt2.__file__.startswith(package_dir):
    raise RuntimeError(f"ensemble_jax was imported from {gpt2.__file__} before {package_dir}")
  config = _config(size)
  vocab, t = WORKLOADS[size][0], tokens.shape[1] - 1
  model = gpt2.create_model(size, vocab_size=vocab, context=max(t, 256),
                                         dtype=jnp.float32)
  tx = optim.create_optimizer(config.optim, len(tokens), total_steps=1000,
                              steps_per_epoch=100)
  cfg = step_lib.StepConfig.from_config(config)
  batch = {"tokens": jnp.asarray(tokens)}
  inputs = step_lib.model_inputs({"tokens": batch["tokens"][:1]}, cfg)
  state = step_lib.create_train_state(model, tx, jax.random.key(0),
                                      jax.ShapeDtypeStruct(inputs.shape, inputs.dtype))
  step = jax.jit(step_lib.train_step, static_argnums=3, donate_argnums=0)
  compiled = step.lower(state, batch, jax.random.key(1), cfg).compile()
  box = [state]

  def run():
    box[0], metrics = compiled(box[0], batch, jax.random.key(1))
    return float(jax.block_until_ready(metrics["loss"]))
  return run


def torch_step(size: str, tokens):
  """The same step in Hugging Face GPT2LMHeadModel + torch.optim.AdamW, eager."""
  import torch
  import torch.nn.functional as F
  from transformers import GPT2Config, GPT2LMHeadModel

  from ensemble_jax.models import gpt2

  config, shape = _config(size), gpt2.SIZES[size]
  vocab, t = WORKLOADS[size][0], tokens.shape[1] - 1
  torch.manual_seed(0)
  model = GPT2LMHeadModel(GPT2Config(
      vocab_size=vocab, n_positions=max(t, 256), n_embd=shape["embed_dim"],
      n_layer=shape["num_layers"], n_head=shape["num_heads"], activation_function="gelu_new",
      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
      bos_token_id=vocab - 1, eos_token_id=vocab - 1)).train()
  o = config.optim
  opt = torch.optim.AdamW(model.parameters(), lr=o.learning_rate, betas=(o.b1, o.b2),
                          weight_decay=o.weight_decay)
  x = torch.as_tensor(tokens[:, :-1], dtype=torch.long)
  y = torch.as_tensor(tokens[:, 1:], dtype=torch.long)

  def run():
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    if o.grad_clip_norm:
      torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip_norm)
    opt.step()
    return float(loss.detach())
  return run


def _worker(conn, kind: str, size: str, tokens, arg) -> None:
  """Builds one implementation's step, then times one step per message until None."""
  if kind == "torch":
    import torch

    if arg:  # on a busy machine torch's spinning OpenMP barriers can cost 10x at 2 threads
      torch.set_num_threads(arg)
    run = torch_step(size, tokens)
  else:
    run = jax_step(size, tokens, arg)
  run()  # warm-up (and JAX's first dispatch)
  conn.send("ready")
  while conn.recv() is not None:
    w0, c0 = time.perf_counter(), time.process_time()
    loss = run()
    conn.send((time.perf_counter() - w0, time.process_time() - c0, loss))


def compare(size: str, rounds: int, baseline_rev: str) -> dict:
  import multiprocessing

  import numpy as np

  vocab, b, t = WORKLOADS[size]
  b, t = b or FLAGS.batch, t or FLAGS.context
  tokens = np.random.default_rng(0).integers(0, vocab, (b, t + 1), dtype=np.int32)
  impls = {"jax": ("jax", "")}
  if baseline_rev:
    impls["jax_before"] = ("jax", package_at(baseline_rev, tempfile.mkdtemp()))
  for n in map(int, FLAGS.torch_threads.split(",")):
    impls["torch" + (f"_{n}thread" if n else "")] = ("torch", n)
  ctx = multiprocessing.get_context("spawn")
  conns, procs = {}, []
  for name, (kind, rev) in impls.items():  # built one at a time: no compile overlaps
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, kind, size, tokens, rev), daemon=True)
    proc.start()
    procs.append(proc)
    assert parent.recv() == "ready", name
    conns[name] = parent
  wall = {k: [] for k in impls}
  cpu = {k: [] for k in impls}
  names = list(impls)
  for r in range(rounds):
    for k in names[r % len(names):] + names[:r % len(names)]:
      conns[k].send(True)
      w, c, _ = conns[k].recv()
      wall[k].append(w)
      cpu[k].append(c)
  for conn in conns.values():
    conn.send(None)
  for proc in procs:
    proc.join()
  steps = impls
  med = lambda xs: statistics.median(xs)
  row = {"size": size, "batch": b, "context": t, "vocab": vocab, "dtype": "float32",
         "rounds": rounds, "baseline_rev": baseline_rev or None, "cpus": os.cpu_count(),
         "wall_s": wall, "cpu_s": cpu,
         "median_wall_s": {k: med(v) for k, v in wall.items()},
         "median_cpu_s": {k: med(v) for k, v in cpu.items()}}
  # > 1: faster than the fastest torch configuration.
  torch_names = [k for k in steps if k.startswith("torch")]
  best_wall = min(med(wall[k]) for k in torch_names)
  best_cpu = min(med(cpu[k]) for k in torch_names)
  row["speed_vs_torch_wall"] = {k: best_wall / med(wall[k]) for k in steps
                                if k not in torch_names}
  row["speed_vs_torch_cpu"] = {k: best_cpu / med(cpu[k]) for k in steps
                               if k not in torch_names}
  return row


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  import jax
  import torch
  import transformers

  rows = []
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # inherited by the workers
  for size in FLAGS.sizes.split(","):
    row = compare(size, FLAGS.rounds, FLAGS.baseline_rev)
    row.update(jax=jax.__version__, torch=torch.__version__,
               transformers=transformers.__version__, torch_threads=torch.get_num_threads())
    rows.append(row)
    for k in row["median_wall_s"]:
      vs = (f"  vs torch: {row['speed_vs_torch_wall'][k]:.2f}x wall, "
            f"{row['speed_vs_torch_cpu'][k]:.2f}x cpu" if k in row["speed_vs_torch_wall"]
            else "")
      print(f"{size:>6} B={row['batch']} T={row['context']} {k:>10}: "
            f"{row['median_wall_s'][k]:.3f} s wall, {row['median_cpu_s'][k]:.3f} s cpu{vs}",
            flush=True)
    if FLAGS.out:  # after each size: a long run keeps what it has measured
      with open(FLAGS.out, "w") as f:
        json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  cli.run(main)
