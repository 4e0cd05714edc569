"""A routed PCA pool's build at ImageNet's scale, per process, and projected to D processes.

  python -m experiments.bench.pools_scale [--images=100000] [--workers=8,64] \\
      [--kmeans_examples=1281167] [--out=experiments/results/bench/pools_scale.json]

Synthetic ImageNet-shaped images (`--source_size`, 64x64x3 uint8: a class's blocky
prototype plus noise; generated per chunk, no JPEG decode) are streamed in chunks through
`clusters.PixelPCA` as `pools.pixel_embedding` builds them for ImageNet with
`distill.pca_image_size` (16: the eval transform's resize and center crop to 16x16x3,
768 pixels, as many as a Fashion-MNIST image). What is measured, in this one process:

- featurisation, the part a D-process run divides by D (each process reads its contiguous
  share of the chunks; `shards`): read, resize, standardise, each chunk's float64 sum and
  products, and the projections of `pca.fit`, less the synthetic source's own generation
  and the eigendecomposition (both timed inside the fit): seconds per 100k images.
- replicated in every process: the eigendecomposition of the P x P covariance; balanced
  k-means (`clusters.kmeans`, 20 Lloyd steps, the host greedy at each) on the gathered
  [E, pca_dim] projections at E = `--kmeans_examples` (the fitted projections tiled, with a
  little noise) for k = each of `--workers`; routing `--eval_examples` eval images (their
  projection at the featurisation's rate, the routing weights timed here).

The projection to D processes is a model: featurisation x 1,281,167 / D plus the
replicated parts, each measured here. What a process receives in the exchange (every
chunk's P x P float64 products and the projections) is computed from the shapes; its time
on a real interconnect is not measured (one host). Peak host memory is this process's
maxrss. The load averages before and after are recorded: on a shared machine every time
is an upper bound.
"""
from __future__ import annotations

import json
import os
import resource
import time

import numpy as np
from absl import flags

from experiments import cli
from experiments.configs import imagenet_resnet50
from ensemble_jax.distill import clusters, pools

FLAGS = flags.FlagValues()
flags.DEFINE_integer("images", 100_000, "synthetic training images featurised",
                     flag_values=FLAGS)
flags.DEFINE_integer("source_size", 64, "the synthetic images' side (3 channels)",
                     flag_values=FLAGS)
flags.DEFINE_integer("pca_image_size", 16, "distill.pca_image_size: the PCA's image side",
                     flag_values=FLAGS)
flags.DEFINE_integer("pca_dim", 32, "distill.pca_dim", flag_values=FLAGS)
flags.DEFINE_string("workers", "8,64", "comma-separated k of the k-means (one per worker)",
                    flag_values=FLAGS)
flags.DEFINE_integer("kmeans_examples", 1_281_167, "E of the replicated k-means",
                     flag_values=FLAGS)
flags.DEFINE_integer("eval_examples", 50_000, "eval images routed", flag_values=FLAGS)
flags.DEFINE_string("processes", "8,64", "comma-separated D of the projection",
                    flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the results as JSON here", flag_values=FLAGS)

IMAGENET = 1_281_167
CHUNK = 4096  # PixelPCA's default, as pools.pixel_embedding builds it


class SyntheticImages:
  """ImageNet-shaped uint8 images [S, S, 3] made per range: a class's blocky prototype plus
  noise. Ranges start at chunk boundaries, so every read of a chunk is the same bits."""

  def __init__(self, n: int, size: int, classes: int = 1000, seed: int = 0):
    self.n, self.size, self.classes, self.seed = n, size, classes, seed
    rng = np.random.default_rng(seed)
    self.prototypes = rng.integers(0, 192, (classes, size // 8, 1, size // 8, 1, 3), np.uint8)
    self.generate_s = self.generate_cpu_s = 0.0  # making images: no part of the build

  def __len__(self) -> int:
    return self.n

  def get_range(self, begin: int, end: int) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    labels = (np.arange(begin, end) * 7919) % self.classes
    rng = np.random.default_rng((self.seed, begin))
    shape = (end - begin, self.size // 8, 8, self.size // 8, 8, 3)
    noise = np.frombuffer(rng.bytes(int(np.prod(shape))), np.uint8).reshape(shape) & 63
    image = (self.prototypes[labels] + noise).reshape(end - begin, self.size, self.size, 3)
    self.generate_s += time.perf_counter() - start
    self.generate_cpu_s += time.process_time() - cpu
    return {"image": image, "label": labels.astype(np.int32)}

  def get(self, i: int) -> dict:
    start = i - i % CHUNK
    example = self.get_range(start, min(start + CHUNK, self.n))
    return {k: v[i - start] for k, v in example.items()}


def pca_transform(size: int):
  """ImageNet's eval transform (resize 256, crop 224) at `distill.pca_image_size = size`,
  made by `pools.pca_transform` as a run makes it."""
  config = imagenet_resnet50.get_config()
  config.distill.pca_image_size = size
  return pools.pca_transform(config, data=None)  # the data's own transform is not read


def timed(fn, *args, **kwargs):
  wall, cpu = time.perf_counter(), time.process_time()
  out = fn(*args, **kwargs)
  return out, time.perf_counter() - wall, time.process_time() - cpu


class Timed:
  """`fn`, its calls' wall and CPU time summed."""

  def __init__(self, fn):
    self.fn, self.wall_s, self.cpu_s = fn, 0.0, 0.0

  def __call__(self, *args, **kwargs):
    out, wall, cpu = timed(self.fn, *args, **kwargs)
    self.wall_s, self.cpu_s = self.wall_s + wall, self.cpu_s + cpu
    return out


def maxrss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(argv):
  cli.parse(FLAGS, argv, __doc__)
  load_before = os.getloadavg()
  imagenet = imagenet_resnet50.get_config().data
  mean, std = imagenet.mean, imagenet.std
  transform = pca_transform(FLAGS.pca_image_size)
  source = SyntheticImages(FLAGS.images, FLAGS.source_size)
  pca = clusters.PixelPCA(FLAGS.pca_dim, mean, std, transform, chunk=CHUNK)
  eigh = Timed(np.linalg.eigh)  # the fit's eigendecomposition, replicated: timed apart
  np.linalg.eigh = eigh
  try:
    z_ExD, fit_wall, fit_cpu = timed(pca.fit, source)
  finally:
    np.linalg.eigh = eigh.fn
  eigh_wall, eigh_cpu = eigh.wall_s, eigh.cpu_s
  p = pca.components_PxD.shape[0]
  rss_after_fit = maxrss_mb()
  gen_fit, gen_fit_cpu = source.generate_s, source.generate_cpu_s
  featurise_wall = fit_wall - gen_fit - eigh_wall
  featurise_cpu = fit_cpu - gen_fit_cpu - eigh_cpu
  row = {
      "images": FLAGS.images, "source_image": [FLAGS.source_size] * 2 + [3],
      "pca_image": [FLAGS.pca_image_size] * 2 + [3], "pixels": p, "pca_dim": FLAGS.pca_dim,
      "chunk": CHUNK,
      "fit": {"wall_s": fit_wall, "cpu_s": fit_cpu, "synthetic_generation_wall_s": gen_fit,
              "synthetic_generation_cpu_s": gen_fit_cpu},
      "eigh": {"wall_s": eigh_wall, "cpu_s": eigh_cpu},
      "featurise_wall_s_per_100k": featurise_wall / FLAGS.images * 1e5,
      "featurise_cpu_s_per_100k": featurise_cpu / FLAGS.images * 1e5,
  }
  print(f"fit of {FLAGS.images} images (P = {p}): {fit_wall:.1f} s wall {fit_cpu:.1f} s cpu "
        f"(of which generation {gen_fit:.1f} s; eigh {eigh_wall:.1f} s): "
        f"{row['featurise_wall_s_per_100k']:.1f} s wall, "
        f"{row['featurise_cpu_s_per_100k']:.1f} s cpu per 100k images", flush=True)

  # Eval routing: projections at the featurisation's rate, then the routing weights.
  mean_D, std_D = z_ExD.mean(0), z_ExD.std(0) + 1e-6
  rng = np.random.default_rng(2)
  eval_ExD = (np.resize(z_ExD, (FLAGS.eval_examples, FLAGS.pca_dim)) - mean_D) / std_D
  train_ExD = (np.resize(z_ExD, (FLAGS.kmeans_examples, FLAGS.pca_dim)) - mean_D) / std_D
  train_ExD += rng.normal(0, 0.01, train_ExD.shape).astype(np.float32)  # no exact duplicates
  del z_ExD
  row["kmeans"] = {}
  for k in [int(w) for w in FLAGS.workers.split(",")]:
    clusters.kmeans(train_ExD[:4 * k], k, seed=0, iters=1, balanced=True)  # compiles
    (assign, centroids), wall, cpu = timed(clusters.kmeans, train_ExD, k, seed=0, iters=20,
                                           balanced=True)
    sizes = np.bincount(assign, minlength=k)
    route_fn = lambda c=centroids, k=k: np.asarray(clusters.routing_weights(  # noqa: E731
        eval_ExD, c, 0.1 * FLAGS.pca_dim, min(2, k)))
    route_fn()  # compiles
    route, route_wall, route_cpu = timed(route_fn)
    assert route.shape == (FLAGS.eval_examples, k)
    row["kmeans"][str(k)] = {"examples": FLAGS.kmeans_examples, "wall_s": wall, "cpu_s": cpu,
                             "sizes_within_one": int(sizes.max() - sizes.min()) <= 1,
                             "routing_wall_s": route_wall, "routing_cpu_s": route_cpu}
    print(f"k = {k}: balanced k-means of {FLAGS.kmeans_examples} x {FLAGS.pca_dim}: "
          f"{wall:.1f} s wall {cpu:.1f} s cpu; routing {FLAGS.eval_examples}: "
          f"{route_wall:.2f} s", flush=True)

  chunks = -(-IMAGENET // CHUNK)
  scale = IMAGENET / FLAGS.kmeans_examples  # Lloyd's steps and the greedy: ~linear in E
  row["projection"] = {"kmeans_scaled_by": scale}
  for d in [1] + [int(x) for x in FLAGS.processes.split(",")]:
    for k, km in row["kmeans"].items():
      share = -(-IMAGENET // d) + -(-FLAGS.eval_examples // d)  # its train and eval images
      out = {}
      for clock, featurise in (("wall", featurise_wall), ("cpu", featurise_cpu)):
        f = featurise / FLAGS.images * share
        r = (eigh_wall if clock == "wall" else eigh_cpu) + (
            km[f"{clock}_s"] * scale + km[f"routing_{clock}_s"])
        out[clock] = {"featurise_s": f, "replicated_s": r, "build_s_without_exchange": f + r}
      row["projection"][f"D{d}_k{k}"] = {
          **out, "exchange_bytes_received_per_process": 0 if d == 1 else (
              chunks * p * p * 8 + IMAGENET * FLAGS.pca_dim * 4),
          "own_products_bytes_per_process": 0 if d == 1 else -(-chunks // d) * p * p * 8}
  row["maxrss_mb"] = {"after_fit": rss_after_fit, "end": maxrss_mb()}
  row["loadavg_1_5_15"] = {"before": list(load_before), "after": list(os.getloadavg())}
  row["cpu_count"] = os.cpu_count()
  row["openblas_num_threads"] = os.environ.get("OPENBLAS_NUM_THREADS", "")
  print(json.dumps(row["projection"], indent=1))
  print(f"peak host memory {row['maxrss_mb']['end']:.0f} MB; load "
        f"{load_before[0]:.1f} -> {row['loadavg_1_5_15']['after'][0]:.1f}", flush=True)
  if FLAGS.out:
    cli.write_json(FLAGS.out, row)


if __name__ == "__main__":
  cli.run(main)
