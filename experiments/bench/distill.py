"""A distiller's iteration: FLOPs from XLA and time, one worker and stacked.

  python -m experiments.bench.distill [--distiller=distribution_matching] [--workers=1,8]
      [--ipc=10] [--real_per_class=256,64] [--iterations=3]
      [--out=experiments/results/bench/distill.json]

One worker's iteration compiled alone gives its FLOPs (XLA's count on CPU, the same
program as in a pool build); the stacked program of N workers (unrolled on CPU) is timed
over `--iterations` after a warm-up chunk. The load average is recorded beside each case;
a figure measured beside other work measures that work too. `--iterations=0` counts the
FLOPs only, nothing run: gradient matching's iteration at ipc 10 and 256 real per class
is ~20 TFLOP (minutes per iteration on 2 cores).
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np
from absl import flags

from experiments import cli

FLAGS = flags.FlagValues()
flags.DEFINE_enum("distiller", "distribution_matching",
                  ["distribution_matching", "gradient_matching"], "which distiller",
                  flag_values=FLAGS)
flags.DEFINE_list("workers", ["1", "8"], "stacked workers per case", flag_values=FLAGS)
flags.DEFINE_integer("ipc", 10, "images per class", flag_values=FLAGS)
flags.DEFINE_list("real_per_class", ["256", "64"], "real images per class and iteration: "
                  "the paper's protocol and the grid's", flag_values=FLAGS)
flags.DEFINE_integer("iterations", 3, "timed iterations per case", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the cases as JSON here", flag_values=FLAGS)


def measure(distiller: str, workers: int, ipc: int, real_per_class: int,
            iterations: int) -> dict:
  from ensemble_jax.data import images as images_lib
  from ensemble_jax.distill import synthetic

  train, _ = images_lib.load_fashion_mnist_idx()
  pool, counts, _ = synthetic.worker_pools(train.images, train.labels, workers, 10, seed=0)
  kind = {"distribution_matching": synthetic.DistributionMatching,
          "gradient_matching": synthetic.GradientMatching}[distiller]
  cfg = kind(images_per_class=ipc, iterations=1 + iterations, real_per_class=real_per_class)
  mesh = jax.make_mesh((1,), ("worker",), devices=jax.devices()[:1])
  case = {"distiller": distiller, "workers": workers, "images_per_class": ipc,
          "real_per_class": real_per_class, "backend": jax.default_backend()}
  if isinstance(cfg, synthetic.GradientMatching):
    case["outer_loop"], case["inner_loop"] = cfg.loops
  if iterations == 0:
    d = synthetic.make_distiller(cfg, mesh, 10, pool.shape[3:])
    return {**case, "flops_per_iteration_per_worker": d.flops_per_iteration(pool[0], counts[0]),
            "load_average": os.getloadavg()[0]}
  seconds = []
  out = synthetic.distil(cfg, mesh, pool, counts, np.arange(workers, dtype=np.int32),
                         chunk=1, on_chunk=lambda it, loss, state: seconds.append(
                             time.perf_counter()) and False)
  per_iteration = float(np.median(np.diff(seconds[1:]))) if len(seconds) > 2 else float("nan")
  return {**case, "flops_per_iteration_per_worker": out["flops_per_iteration"],
          "s_per_iteration": per_iteration,
          "s_per_iteration_per_worker": per_iteration / workers,
          "timed_iterations": len(seconds) - 2, "load_average": os.getloadavg()[0]}


def main(argv) -> int:
  cli.parse(FLAGS, argv, __doc__)
  cases = []
  for n, real in [(int(n), int(r)) for r in FLAGS.real_per_class for n in FLAGS.workers]:
    case = measure(FLAGS.distiller, n, FLAGS.ipc, real, FLAGS.iterations)
    timed = (f"; {case['s_per_iteration']:.2f} s per iteration "
             f"({case['s_per_iteration_per_worker']:.2f} s per worker"
             if "s_per_iteration" in case else " (not run")
    print(f"{FLAGS.distiller}, N={case['workers']}, {real} real per class: "
          f"{case['flops_per_iteration_per_worker'] / 1e9:.0f} GFLOP per "
          f"worker-iteration{timed}; load {case['load_average']:.1f})", flush=True)
    cases.append(case)
  if FLAGS.out:
    cli.write_json(FLAGS.out, cases)
  return 0


if __name__ == "__main__":
  cli.run(main)
