"""Per-worker cost of the stacked engine relative to one single-worker step.

  python -m experiments.bench.engine [--devices=8] [--batch=128] [--steps=3]

For k workers per device (N = k * devices) and each local strategy, times the compiled
stacked step and divides by N x the time of one worker's step jitted alone, measured in
the same run. Fake devices come from XLA_FLAGS, set here before JAX is imported, and
share the host's cores; so the reference is one worker's step in a child process that
sees the whole host as one device (what one worker costs run alone). Ideal is 1.00.
The step on one of the fake devices is printed too: it is slower, since a fake device
gets only part of the host's threads.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys

from absl import flags

from experiments import cli
from experiments.bench import step_times


FLAGS = flags.FlagValues()
flags.DEFINE_integer("devices", 8, "fake CPU devices", flag_values=FLAGS)
flags.DEFINE_integer("batch", 128, "per-worker batch", flag_values=FLAGS)
flags.DEFINE_integer("steps", 3, "timed steps per measurement", flag_values=FLAGS)
flags.DEFINE_string("workers_per_device", "1,2,4", "comma-separated k", flag_values=FLAGS)
flags.DEFINE_string("strategies", "unroll,vmap", "comma-separated local strategies",
                    flag_values=FLAGS)
flags.DEFINE_integer("width", 16, "ResNet-18 width", flag_values=FLAGS)
flags.DEFINE_string("out", "", "also write the measurements as JSON here", flag_values=FLAGS)
flags.DEFINE_bool("reference_only", False, "print one worker's step time in seconds (run with "
                  "one device)", flag_values=FLAGS)


def _host_reference(args) -> float:
  """One worker's step time with the whole host as one device, in a child process."""
  env = dict(os.environ, XLA_FLAGS="")
  cmd = [sys.executable, "-m", "experiments.bench.engine", "--reference_only",
         f"--batch={args.batch}", f"--steps={args.steps}", f"--width={args.width}"]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
  return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  t_host = None if FLAGS.reference_only else _host_reference(FLAGS)
  if not FLAGS.reference_only:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={FLAGS.devices}")
  global jax
  import jax
  import numpy as np

  from ensemble_jax import optim
  from ensemble_jax.methods import step as step_lib
  from ensemble_jax.methods.ensemble import Ensemble, resolve_local_strategy
  from ensemble_jax.models import resnet
  from ensemble_jax.sharding import make_mesh
  from experiments.configs import fashion_mnist

  init_input = jax.ShapeDtypeStruct((1, 28, 28, 1), jax.numpy.float32)
  image_shape = init_input.shape[1:]
  model = resnet.create_model("resnet18", num_classes=10, width=FLAGS.width, stem="small")
  config = fashion_mnist.get_config("ensemble")
  config.train.batch_size = FLAGS.batch
  tx = optim.create_optimizer(config.optim, FLAGS.batch, 1000, 100)
  rng = np.random.default_rng(0)
  backend = jax.default_backend()

  # The reference: one worker's step, jitted alone on one device.
  cfg = step_lib.StepConfig.from_config(config)
  single = jax.jit(step_lib.train_step, static_argnums=3, donate_argnums=0)
  state = step_lib.create_train_state(model, tx, jax.random.key(0), init_input)
  batch = {"image": rng.integers(0, 255, (FLAGS.batch, *image_shape), dtype=np.uint8),
           "label": rng.integers(0, 10, (FLAGS.batch,), dtype=np.int32)}
  times, _, _ = step_times(lambda s, b, r: single(s, b, r, cfg), state, batch,
                           jax.random.key(1), FLAGS.steps)
  t_single = statistics.median(times)
  if FLAGS.reference_only:
    print(t_single)
    return 0
  print(f"backend={backend} devices={FLAGS.devices} batch/worker={FLAGS.batch} "
        f"params/worker={step_lib.num_params(state.params):,}")
  print(f"one worker's step, host as one device (the reference): {1e3 * t_host:.1f} ms")
  print(f"one worker's step on one of {FLAGS.devices} fake devices:   {1e3 * t_single:.1f} ms\n")
  print(f"{'workers/device':>15}{'N':>5}{'strategy':>10}{'step s':>9}{'ratio':>8}")
  rows, measured = [], []
  for k in [int(x) for x in FLAGS.workers_per_device.split(",")]:
    n = k * FLAGS.devices
    for strategy in FLAGS.strategies.split(","):
      config.mesh = [("worker", FLAGS.devices), ("data", 1)]
      config.method.num_workers, config.method.local_strategy = n, strategy
      engine = Ensemble(config, model, tx, make_mesh(config.mesh), init_input)
      states = engine.init(jax.random.key(0))
      local = {"image": rng.integers(0, 255, (n, FLAGS.batch, *image_shape), dtype=np.uint8),
               "label": rng.integers(0, 10, (n, FLAGS.batch), dtype=np.int32)}
      gbatch = {key: jax.device_put(v, engine.train_layout.sharding) for key, v in local.items()}
      times, _, _ = step_times(engine.train_step, states, gbatch, jax.random.key(1),
                               FLAGS.steps)
      t = statistics.median(times)
      ratio = t / (n * t_host)
      rows.append((k, strategy, ratio))
      measured.append({"workers_per_device": k, "num_workers": n, "strategy": strategy,
                       "step_s": t, "ratio": ratio})
      print(f"{k:>15}{n:>5}{strategy:>10}{t:>9.4f}{ratio:>8.2f}", flush=True)
  auto = resolve_local_strategy("auto", backend)
  if FLAGS.out:
    import json

    with open(FLAGS.out, "w") as f:
      json.dump({"backend": backend, "device": jax.devices()[0].device_kind,
                 "jax": jax.__version__, "devices": FLAGS.devices, "batch": FLAGS.batch,
                 "params_per_worker": step_lib.num_params(state.params),
                 "reference_step_s": t_host, "single_step_on_one_device_s": t_single,
                 "auto": auto, "rows": measured}, f, indent=1)
  print(f"\nauto picks '{auto}' on {backend}; its ratios: "
        + ", ".join(f"{k}/device {r:.2f}" for k, s, r in rows if s == auto))
  return 0


if __name__ == "__main__":
  cli.run(main)
