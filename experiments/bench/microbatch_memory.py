"""Peak host memory of one data-parallel step with and without gradient accumulation.

  python -m experiments.bench.microbatch_memory [--batch=8192] [--microbatches=1,16] \
      [--workload=fashion] [--steps=3] [--plan_only] [--out=memory.json]

For each k in `--microbatches`, a fresh subprocess builds the workload's data-parallel
method on one CPU device at global batch `--batch` with `train.microbatches=k` (fashion:
fashion_mnist.py's `sweep` ResNet-18, width 8, 28x28; pydocs: pydocs_gpt2.py's `sweep`
GPT-2 tiny, context 128), compiles the step, runs `--steps` steps on a synthetic batch and
reports its peak resident memory (`getrusage` max RSS: the whole process, Python and JAX
included) and XLA's plan for the step (`compiled.memory_analysis()`: temporary buffers,
the activations mostly). `--plan_only` compiles without running: check that a point fits
before running it. Rows are printed side by side; nothing is modelled.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import flags

from experiments import cli
from experiments.bench import step_times

WORKLOADS = {"fashion": ("experiments.configs.fashion_mnist", "sweep"),
             "pydocs": ("experiments.configs.pydocs_gpt2", "sweep")}


def measure(workload: str, batch: int, k: int, steps: int, run: bool) -> dict:
  """In this process (a fresh one: max RSS is per process): one point's numbers."""
  import importlib
  import resource

  import jax
  import jax.numpy as jnp
  import numpy as np

  from ensemble_jax import optim
  from ensemble_jax.methods.data_parallel import DataParallel
  from ensemble_jax.models import create_model
  from ensemble_jax.sharding import make_mesh

  module, variant = WORKLOADS[workload]
  config = importlib.import_module(module).get_config(variant)
  config.train.batch_size, config.train.microbatches = batch, k
  config.mesh = [("data", 1)]
  rng = np.random.default_rng(0)
  if config.task == "lm":
    vocab, ctx = 256, config.data.context
    init_input = jax.ShapeDtypeStruct((1, ctx), jnp.int32)
    host = {"tokens": rng.integers(0, vocab, (batch, ctx + 1), dtype=np.int32)}
  else:
    vocab, size = 10, config.data.image_size
    init_input = jax.ShapeDtypeStruct((1, size, size, 1), jnp.float32)
    host = {"image": rng.integers(0, 255, (batch, size, size, 1), dtype=np.uint8),
            "label": rng.integers(0, vocab, (batch,), dtype=np.int32)}
  model = create_model(config.model, vocab, config.data.context, in_loop=k > 1)
  tx = optim.create_optimizer(config.optim, batch, 100, 100)
  method = DataParallel(config, model, tx, make_mesh(config.mesh), init_input)
  state = method.init(jax.random.key(0))
  batch_dev = jax.device_put(host, method.train_layout.sharding)
  rng_key = jax.random.key(1)
  compiled = method.train_step.lower(state, batch_dev, rng_key).compile()
  plan = compiled.memory_analysis()
  row = {"workload": workload, "batch": batch, "microbatches": k,
         "microbatch": batch // k, "devices": 1, "backend": jax.default_backend(),
         "xla_temp_bytes": int(plan.temp_size_in_bytes),
         "xla_argument_bytes": int(plan.argument_size_in_bytes)}
  if run:
    times, state, metrics = step_times(compiled, state, batch_dev, rng_key,
                                       max(steps - 1, 1))  # the first call: warm-up
    row["step_time_s"] = float(np.median(times))
    row["loss"] = float(metrics["loss"])
  # Linux reports ru_maxrss in KiB.
  row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return row


def _gib(n) -> str:
  return f"{n / 2**30:.2f}" if isinstance(n, (int, float)) else "-"


def table(rows: list[dict]) -> str:
  lines = ["| batch | k | microbatch | peak RSS (GiB) | XLA temp (GiB) | step (s) |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    step = f"{r['step_time_s']:.2f}" if "step_time_s" in r else "-"
    lines.append(f"| {r['batch']} | {r['microbatches']} | {r['microbatch']} | "
                 f"{_gib(r['peak_rss_bytes'])} | {_gib(r['xla_temp_bytes'])} | {step} |")
  return "\n".join(lines)


FLAGS = flags.FlagValues()
flags.DEFINE_enum("workload", "fashion", sorted(WORKLOADS), "whose sweep config",
                  flag_values=FLAGS)
flags.DEFINE_integer("batch", 8192, "global batch", flag_values=FLAGS)
flags.DEFINE_string("microbatches", "1,16", "comma-separated k, one subprocess each",
                    flag_values=FLAGS)
flags.DEFINE_integer("steps", 3, "steps run per point", flag_values=FLAGS)
flags.DEFINE_bool("plan_only", False, "compile only: XLA's plan", flag_values=FLAGS)
flags.DEFINE_string("out", "", "also write the rows as JSON here", flag_values=FLAGS)
flags.DEFINE_integer("child", 0, "internal: measure this k in this process", flag_values=FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  if FLAGS.child:  # one point, in this fresh process
    print(json.dumps(measure(FLAGS.workload, FLAGS.batch, FLAGS.child, FLAGS.steps,
                             not FLAGS.plan_only)))
    return 0
  rows = []
  for k in [int(x) for x in FLAGS.microbatches.split(",")]:
    cmd = [sys.executable, "-m", "experiments.bench.microbatch_memory",
           f"--workload={FLAGS.workload}", f"--batch={FLAGS.batch}", f"--steps={FLAGS.steps}",
           f"--child={k}"] + (["--plan_only"] if FLAGS.plan_only else [])
    # One CPU device, whatever the caller's XLA_FLAGS: the point is one device's memory.
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS",
                                                                          "cpu")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
      raise SystemExit(f"k={k} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(table(rows[-1:]).splitlines()[-1], flush=True)
  print(table(rows))
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(rows, f, indent=2)
  return 0


if __name__ == "__main__":
  cli.run(main)
