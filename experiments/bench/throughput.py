"""Train-step throughput and MFU of the headline models (ResNet-50, GPT-2 small) on one device.

  python -m experiments.bench.throughput [--models=resnet50,gpt2_small] [--steps=20] \
      [--resnet_batch=256] [--gpt2_batch=16,32] [--attention=einsum,fused] [--dtype=bfloat16] \
      [--out=results.json] [--trace_dir=DIR] [--hlo_dir=DIR]
  python -m experiments.bench.throughput --top_kernels=DIR/.../perfetto_trace.json.gz
  python -m experiments.bench.throughput --table=LABEL=results.json,LABEL=other.json

Each model is built from its workload config (`imagenet_resnet50.py`, `pile_gpt2.py`: its
optimizer, compute dtype, 224x224 images / context 1024) and its data-parallel train step
(`step.train_step`, the one every method runs) is jitted on one device, fed a synthetic batch
already on the device, and timed: the median of `--steps` steps after two warm-up steps.
FLOPs per step are read from the compiled program (XLA cost analysis) and also counted
analytically (what MFU conventionally uses): GPT-2 6 N + 12 L T D per token (PaLM, App. B),
ResNet-50 3 x its forward FLOPs (2 x 4.09 G multiply-adds per 224x224 image). MFU is the
analytic FLOPs per second over the device's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s; pass
`--peak_tflops` for another device). GPT-2 runs once per `--attention` implementation
(`config.model.attention`) and `--gpt2_batch`, side by side.
Nothing is modelled: every time is measured.
"""
from __future__ import annotations

import json
import os
import statistics
import time

from absl import flags

from experiments import cli
from experiments.bench import step_times

# Dense bf16 peak of the devices this has run on (vendor datasheets, without sparsity).
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
RESNET50_FORWARD_FLOPS = 2 * 4.09e9  # per 224x224 image (multiply-adds x 2)


FLAGS = flags.FlagValues()
flags.DEFINE_string("models", "resnet50,gpt2_small", "comma-separated", flag_values=FLAGS)
flags.DEFINE_integer("steps", 20, "timed steps per model", flag_values=FLAGS)
flags.DEFINE_integer("resnet_batch", 256, "ResNet-50's batch", flag_values=FLAGS)
flags.DEFINE_list("gpt2_batch", ["16"], "GPT-2's batches (sequences), each timed",
                  flag_values=FLAGS)
flags.DEFINE_integer("gpt2_vocab", 50257, "50304 (a multiple of 128, as nanoGPT pads) "
                     "measures aligned LM-head GEMMs", flag_values=FLAGS)
flags.DEFINE_string("attention", "einsum,fused", "GPT-2's, each timed", flag_values=FLAGS)
flags.DEFINE_string("dtype", "bfloat16", "compute dtype (params stay float32)",
                    flag_values=FLAGS)
flags.DEFINE_float("peak_tflops", 0.0, "0: from the device kind", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the rows as JSON here", flag_values=FLAGS)
flags.DEFINE_string("trace_dir", "", "also trace 3 steps per model (Perfetto JSON) under this "
                    "folder", flag_values=FLAGS)
flags.DEFINE_string("hlo_dir", "", "also write each compiled step's optimised HLO (the "
                    "fusions a trace's kernel names refer to) under this folder",
                    flag_values=FLAGS)
flags.DEFINE_list("table", [], "print the rows of these --out files as one Markdown table, "
                  "each given as LABEL=PATH (LABEL names the code measured)", flag_values=FLAGS)
flags.DEFINE_string("top_kernels", "", "print where the device time goes in this "
                    "perfetto_trace.json.gz", flag_values=FLAGS)


def _peak_tflops(device, override: float) -> float | None:
  if override > 0:
    return override
  return next((v for k, v in PEAK_TFLOPS.items() if k in device.device_kind), None)


def _workload(name: str, args, attention: str = "einsum", gpt2_batch: int = 16):
  """(config, model, batch, analytic train FLOPs per step, items per step, item name)."""
  import numpy as np

  from ensemble_jax.models import create_model
  from experiments.configs import imagenet_resnet50, pile_gpt2

  rng = np.random.default_rng(0)
  if name == "resnet50":
    config = imagenet_resnet50.get_config()
    config.model.dtype = args.dtype
    b = args.resnet_batch
    model = create_model(config.model, num_classes=1000)
    batch = {"image": rng.integers(0, 255, (b, 224, 224, 3), dtype=np.uint8),
             "label": rng.integers(0, 1000, (b,), dtype=np.int32)}
    return config, model, batch, 3 * RESNET50_FORWARD_FLOPS * b, b, "images"
  if name == "gpt2_small":
    config = pile_gpt2.get_config()
    config.model.dtype, config.model.attention = args.dtype, attention
    b, t, vocab = gpt2_batch, config.data.context, args.gpt2_vocab
    model = create_model(config.model, num_classes=vocab, context=t)
    batch = {"tokens": rng.integers(0, vocab, (b, t + 1), dtype=np.int32)}
    return config, model, batch, None, b * t, "tokens"
  raise ValueError(f"unknown model {name!r}; choose from resnet50, gpt2_small")


def measure(name: str, args, attention: str = "einsum", gpt2_batch: int = 16) -> dict:
  import jax
  import jax.numpy as jnp

  from ensemble_jax import costs, optim
  from ensemble_jax.methods import step as step_lib

  config, model, batch, flops_analytic, items, item_name = _workload(name, args, attention,
                                                                     gpt2_batch)
  b = len(next(iter(batch.values())))
  tx = optim.create_optimizer(config.optim, b, total_steps=1000, steps_per_epoch=100)
  cfg = step_lib.StepConfig.from_config(config)
  inputs = step_lib.model_inputs({k: v[:1] for k, v in batch.items()}, cfg)
  init_input = jax.ShapeDtypeStruct(inputs.shape, inputs.dtype if config.task == "lm"
                                    else jnp.float32)
  state = step_lib.create_train_state(model, tx, jax.random.key(0), init_input)
  n_params = step_lib.num_params(state.params)
  if flops_analytic is None:  # GPT-2: 6 N per token + attention 12 L T D per token (PaLM)
    layers, d, t = model.num_layers, model.embed_dim, config.data.context
    n_no_embed = n_params - model.context * d  # position embeddings do no matmul work
    flops_analytic = (6 * n_no_embed + 12 * layers * t * d) * items
  batch = jax.device_put(batch)
  step = jax.jit(step_lib.train_step, static_argnums=3, donate_argnums=0)
  rng = jax.random.key(1)
  t0 = time.perf_counter()
  compiled = step.lower(state, batch, rng, cfg).compile()
  compile_s = time.perf_counter() - t0
  # What results.json records (costs.flops); on GPU it misses the GEMMs and convolutions
  # XLA hands to cuBLAS / cuDNN, hence the analytic count beside it (MFU uses that one).
  flops_xla = costs.flops(compiled)
  label = name + (f"_{attention}_b{b}" if name.startswith("gpt2") else "")
  if args.hlo_dir:
    os.makedirs(args.hlo_dir, exist_ok=True)
    with open(os.path.join(args.hlo_dir, f"{label}.hlo.txt"), "w") as f:
      f.write(compiled.as_text())
  times, state, m = step_times(compiled, state, batch, rng, args.steps, warmup=2)
  step_s = statistics.median(times)
  if args.trace_dir:
    with jax.profiler.trace(f"{args.trace_dir}/{label}", create_perfetto_trace=True):
      for _ in range(3):
        state, m = compiled(state, batch, rng)
      jax.block_until_ready(m)
  device = jax.devices()[0]
  peak = _peak_tflops(device, args.peak_tflops)
  mem = device.memory_stats() or {}
  return {
      "model": name, "attention": attention if name.startswith("gpt2") else None,
      "device": device.device_kind, "backend": jax.default_backend(),
      "jax": jax.__version__, "dtype": args.dtype,
      "vocab": args.gpt2_vocab if name.startswith("gpt2") else None, "batch": b, "params": n_params,
      "step_s": step_s, "step_s_min": min(times), "step_s_max": max(times),
      "steps_timed": args.steps, "compile_s": compile_s,
      f"{item_name}_per_s": items / step_s,
      "flops_per_step_xla": flops_xla, "flops_per_step_analytic": flops_analytic,
      "tflops_per_s_analytic": flops_analytic / step_s / 1e12,
      "peak_tflops": peak,
      "mfu": flops_analytic / step_s / (peak * 1e12) if peak else None,
      # The process's peak so far: a row's own only for the first model a process runs.
      "peak_memory_gib": mem.get("peak_bytes_in_use", 0) / 2**30 or None,
      "loss_finite": bool(jnp.isfinite(m["loss"])),
  }


def table(runs: list[tuple[str, str]]) -> str:
  """Markdown: one row per row of each (label, --out JSON file), as the docs give them."""
  lines = ["| code | batch | step | throughput | MFU |", "| --- | --- | --- | --- | --- |"]
  for label, path in runs:
    with open(path) as f:
      rows = json.load(f)
    for r in rows:
      if "tokens_per_s" in r:  # per step: batch x context tokens
        context = round(r["tokens_per_s"] * r["step_s"] / r["batch"])
        shape, rate = f"{r['batch']} x {context}", f"{r['tokens_per_s']:,.0f} tokens/s"
      else:
        shape, rate = f"{r['batch']} x 224²", f"{r['images_per_s']:,.0f} images/s"
      mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
      lines.append(f"| {label} | {shape} | {1e3 * r['step_s']:.1f} ms | {rate} | {mfu} |")
  return "\n".join(lines) + "\n"


def top_kernels(path: str, top: int = 25) -> None:
  """Device time per kernel name in a Perfetto trace, largest first (GPU streams only)."""
  import collections
  import gzip

  with gzip.open(path, "rt") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  names = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "thread_name"}
  pids = {e.get("pid"): e["args"]["name"] for e in events
          if e.get("ph") == "M" and e.get("name") == "process_name"}
  total = collections.Counter()
  for e in events:
    if e.get("ph") != "X" or "/device:GPU" not in pids.get(e.get("pid"), ""):
      continue
    if "Stream" not in names.get((e.get("pid"), e.get("tid")), "Stream"):
      continue
    total[e["name"]] += e.get("dur", 0)
  all_us = sum(total.values())
  print(f"{all_us / 1e3:.1f} ms of kernels in {path}")
  for kernel, us in total.most_common(top):
    print(f"{us / 1e3:9.2f} ms {100 * us / all_us:5.1f}%  {kernel[:110]}")


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  if FLAGS.top_kernels:
    top_kernels(FLAGS.top_kernels)
    return 0
  if FLAGS.table:
    print(table([tuple(entry.split("=", 1)) for entry in FLAGS.table]), end="")
    return 0
  rows = []
  gpt2 = [(a, int(b)) for a in FLAGS.attention.split(",") for b in FLAGS.gpt2_batch]
  runs = [(name, *run) for name in FLAGS.models.split(",")
          for run in (gpt2 if name.startswith("gpt2") else [("einsum", 0)])]
  for name, attention, gpt2_batch in runs:
    row = measure(name, FLAGS, attention, gpt2_batch)
    rows.append(row)
    item = "images" if "images_per_s" in row else "tokens"
    mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "n/a"
    label = f"{name} ({attention}, V={row['vocab']})" if row["attention"] else name
    print(f"{label:>29} {row['device']} {row['dtype']} batch {row['batch']}: "
          f"{1e3 * row['step_s']:.1f} ms/step, {row[f'{item}_per_s']:,.0f} {item}/s, "
          f"{row['tflops_per_s_analytic']:.0f} TFLOP/s (analytic), MFU {mfu}; "
          f"XLA counts {row['flops_per_step_xla'] / 1e12:.2f} TFLOP/step, analytic "
          f"{row['flops_per_step_analytic'] / 1e12:.2f}; compile {row['compile_s']:.0f} s",
          flush=True)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  cli.run(main)
