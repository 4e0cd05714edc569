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

import argparse
import os
import statistics
import subprocess
import sys

from experiments.bench import step_times


def _parse():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--devices", type=int, default=8)
  p.add_argument("--batch", type=int, default=128, help="per-worker batch")
  p.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
  p.add_argument("--workers_per_device", default="1,2,4")
  p.add_argument("--strategies", default="unroll,vmap")
  p.add_argument("--width", type=int, default=16)
  p.add_argument("--out", default="", help="also write the measurements as JSON here")
  p.add_argument("--reference_only", action="store_true",
                 help="print one worker's step time in seconds (run with one device)")
  return p.parse_args()


def _host_reference(args) -> float:
  """One worker's step time with the whole host as one device, in a child process."""
  env = dict(os.environ, XLA_FLAGS="")
  cmd = [sys.executable, "-m", "experiments.bench.engine", "--reference_only",
         f"--batch={args.batch}", f"--steps={args.steps}", f"--width={args.width}"]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
  return float(out.stdout.strip().splitlines()[-1])


def main():
  args = _parse()
  t_host = None if args.reference_only else _host_reference(args)
  if not args.reference_only:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.devices}")
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
  model = resnet.create_model("resnet18", num_classes=10, width=args.width, stem="small")
  config = fashion_mnist.get_config("ensemble")
  config.train.batch_size = args.batch
  tx = optim.create_optimizer(config.optim, args.batch, 1000, 100)
  rng = np.random.default_rng(0)
  backend = jax.default_backend()

  # The reference: one worker's step, jitted alone on one device.
  cfg = step_lib.StepConfig.from_config(config)
  single = jax.jit(step_lib.train_step, static_argnums=3, donate_argnums=0)
  state = step_lib.create_train_state(model, tx, jax.random.key(0), init_input)
  batch = {"image": rng.integers(0, 255, (args.batch, *image_shape), dtype=np.uint8),
           "label": rng.integers(0, 10, (args.batch,), dtype=np.int32)}
  times, _, _ = step_times(lambda s, b, r: single(s, b, r, cfg), state, batch,
                           jax.random.key(1), args.steps)
  t_single = statistics.median(times)
  if args.reference_only:
    print(t_single)
    return 0
  print(f"backend={backend} devices={args.devices} batch/worker={args.batch} "
        f"params/worker={step_lib.num_params(state.params):,}")
  print(f"one worker's step, host as one device (the reference): {1e3 * t_host:.1f} ms")
  print(f"one worker's step on one of {args.devices} fake devices:   {1e3 * t_single:.1f} ms\n")
  print(f"{'workers/device':>15}{'N':>5}{'strategy':>10}{'step s':>9}{'ratio':>8}")
  rows, measured = [], []
  for k in [int(x) for x in args.workers_per_device.split(",")]:
    n = k * args.devices
    for strategy in args.strategies.split(","):
      config.mesh = [("worker", args.devices), ("data", 1)]
      config.method.num_workers, config.method.local_strategy = n, strategy
      engine = Ensemble(config, model, tx, make_mesh(config.mesh), init_input)
      states = engine.init(jax.random.key(0))
      local = {"image": rng.integers(0, 255, (n, args.batch, *image_shape), dtype=np.uint8),
               "label": rng.integers(0, 10, (n, args.batch), dtype=np.int32)}
      gbatch = {key: jax.device_put(v, engine.train_layout.sharding) for key, v in local.items()}
      times, _, _ = step_times(engine.train_step, states, gbatch, jax.random.key(1),
                               args.steps)
      t = statistics.median(times)
      ratio = t / (n * t_host)
      rows.append((k, strategy, ratio))
      measured.append({"workers_per_device": k, "num_workers": n, "strategy": strategy,
                       "step_s": t, "ratio": ratio})
      print(f"{k:>15}{n:>5}{strategy:>10}{t:>9.4f}{ratio:>8.2f}", flush=True)
  auto = resolve_local_strategy("auto", backend)
  if args.out:
    import json

    with open(args.out, "w") as f:
      json.dump({"backend": backend, "device": jax.devices()[0].device_kind,
                 "jax": jax.__version__, "devices": args.devices, "batch": args.batch,
                 "params_per_worker": step_lib.num_params(state.params),
                 "reference_step_s": t_host, "single_step_on_one_device_s": t_single,
                 "auto": auto, "rows": measured}, f, indent=1)
  print(f"\nauto picks '{auto}' on {backend}; its ratios: "
        + ", ".join(f"{k}/device {r:.2f}" for k, s, r in rows if s == auto))
  return 0


if __name__ == "__main__":
  sys.exit(main())
