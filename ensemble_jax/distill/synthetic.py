"""Synthetic distilled sets: distribution matching (Zhao & Bilen 2023), stacked over workers.

A distilled set is `images_per_class` learned images per class. Distribution matching
learns them so that, under a randomly initialised embedding network drawn afresh at every
iteration, the mean embedding of each class's synthetic images matches that of a batch of
`real_per_class` real images of the class, both passed through one siamese augmentation
(`augment.siamese`). The images move by SGD with momentum on that squared distance.

Each worker distils its own set from its own data (`pool_NxCxMxHxWxI`, class by class)
from its own seed: N independent problems, stacked on a leading `worker` axis and run
under `shard_map` with no collective between workers, like the ensemble's train step.
The run checkpoints (orbax) every `checkpoint_every` iterations and resumes bit for bit:
every random draw is a function of (worker seed, iteration).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ensemble_jax.distill import augment, registry
from ensemble_jax.sharding import map_local_workers, resolve_local_strategy
from ensemble_jax.models.convnet import ConvNet


@dataclasses.dataclass(frozen=True)
class DistributionMatching:
  images_per_class: int = 10
  iterations: int = 20_000
  real_per_class: int = 256  # real images per class and iteration
  lr: float = 1.0  # SGD on the images, momentum 0.5 (the paper's)
  momentum: float = 0.5
  init: str = "real"  # 'real': random real images of the class; 'noise': N(0, 1)
  width: int = 128  # the embedding ConvNet's
  depth: int = 3
  dsa: augment.DSA = augment.DSA()
  mean: tuple[float, ...] = (0.2861,)  # the data's per-channel normalisation
  std: tuple[float, ...] = (0.3530,)

  def __post_init__(self):
    for name in ("images_per_class", "iterations", "real_per_class", "width", "depth"):
      if getattr(self, name) < 1:
        raise ValueError(f"distribution matching: {name}={getattr(self, name)} must be >= 1")
    if self.init not in ("real", "noise"):
      raise ValueError(f"distribution matching: init={self.init!r}: choose 'real' or 'noise'")


def normalize(images_u8, cfg: DistributionMatching):
  x = images_u8.astype(jnp.float32) / 255.0
  return (x - jnp.asarray(cfg.mean)) / jnp.asarray(cfg.std)


def class_pool(images_ExHxWxI: np.ndarray, labels_E: np.ndarray, num_classes: int,
               size: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Images grouped by class, padded to `size` (default the largest class): uint8
  [C, M, H, W, I] and the counts [C]."""
  by_class = [images_ExHxWxI[labels_E == c] for c in range(num_classes)]
  counts = np.array([len(x) for x in by_class], np.int32)
  if counts.min() == 0:
    raise ValueError(f"class {int(counts.argmin())} has no images to distil from")
  size = size or int(counts.max())
  pool = np.zeros((num_classes, size) + images_ExHxWxI.shape[1:], images_ExHxWxI.dtype)
  for c, x in enumerate(by_class):
    pool[c, :len(x)] = x
  return pool, counts


def stratified_shares(labels_E: np.ndarray, num_workers: int, num_classes: int,
                      seed: int) -> list[np.ndarray]:
  """Worker i's class-stratified random share: a disjoint 1/N of every class."""
  rng = np.random.default_rng(seed)
  shares = [[] for _ in range(num_workers)]
  for c in range(num_classes):
    members = rng.permutation(np.flatnonzero(labels_E == c))
    for i, part in enumerate(np.array_split(members, num_workers)):
      shares[i].append(part)
  return [np.sort(np.concatenate(s)) for s in shares]


def _pick(key, counts, size: int, k: int):
  """k distinct indices below `counts` (of `size` slots), uniformly: the papers'
  `permutation(class)[:k]`."""
  noise = jax.random.uniform(key, (size,))
  noise = jnp.where(jnp.arange(size) < counts, noise, 2.0)
  return jnp.argsort(noise)[:k]


def sample_real(key, pool_CxMxHxWxI, counts_C, k: int):
  keys = jax.random.split(key, pool_CxMxHxWxI.shape[0])
  idx_CxK = jax.vmap(lambda kk, n: _pick(kk, n, pool_CxMxHxWxI.shape[1], k))(keys, counts_C)
  return jnp.take_along_axis(pool_CxMxHxWxI, idx_CxK[:, :, None, None, None], axis=1)


def matching_loss(syn_CxSxHxWxI, real_CxRxHxWxI, key, cfg: DistributionMatching, net):
  """Sum over classes of |mean embed(real) - mean embed(syn)|^2 under a fresh random net."""
  net_key, aug_key = jax.random.split(key)
  params = net.init(net_key, syn_CxSxHxWxI[0])

  def one_class(syn_SxHxWxI, real_RxHxWxI, k):
    syn_a, real_a = augment.siamese(k, cfg.dsa, syn_SxHxWxI, real_RxHxWxI)
    embed = functools.partial(net.apply, params, method=ConvNet.embed)
    mean_real_D = jax.lax.stop_gradient(embed(real_a).mean(0))
    return jnp.sum((mean_real_D - embed(syn_a).mean(0)) ** 2)

  keys = jax.random.split(aug_key, syn_CxSxHxWxI.shape[0])
  return jax.vmap(one_class)(syn_CxSxHxWxI, real_CxRxHxWxI, keys).sum()


class Distiller:
  """N workers' distribution matching, stacked over the mesh's `worker` axis."""

  def __init__(self, cfg: DistributionMatching, mesh: Mesh, num_classes: int,
               image_shape: tuple[int, int, int], local_strategy: str = "auto"):
    self.cfg, self.mesh = cfg, mesh
    self.net = ConvNet(num_classes, in_channels=image_shape[-1], width=cfg.width,
                       depth=cfg.depth)
    self.tx = optax.sgd(cfg.lr, momentum=cfg.momentum)
    self.strategy = resolve_local_strategy(local_strategy, jax.default_backend())
    self.per_worker = NamedSharding(mesh, P("worker"))
    self._chunks = {}

  # ---- one worker ----
  def init_one(self, seed, pool_CxMxHxWxI, counts_C):
    cfg = self.cfg
    key = jax.random.fold_in(jax.random.key(seed), -1 % 2**31)
    if cfg.init == "real":
      syn = normalize(sample_real(key, pool_CxMxHxWxI, counts_C, cfg.images_per_class), cfg)
    else:
      shape = (pool_CxMxHxWxI.shape[0], cfg.images_per_class) + pool_CxMxHxWxI.shape[2:]
      syn = jax.random.normal(key, shape)
    return {"images": syn, "opt": self.tx.init(syn)}

  def iteration_one(self, it, seed, state, pool_CxMxHxWxI, counts_C):
    cfg = self.cfg
    key = jax.random.fold_in(jax.random.key(seed), it)
    real_key, loss_key = jax.random.split(key)
    real = normalize(sample_real(real_key, pool_CxMxHxWxI, counts_C, cfg.real_per_class), cfg)
    loss, grads = jax.value_and_grad(matching_loss)(state["images"], real, loss_key, cfg,
                                                    self.net)
    updates, opt = self.tx.update(grads, state["opt"], state["images"])
    return {"images": optax.apply_updates(state["images"], updates), "opt": opt}, loss

  # ---- stacked ----
  def init(self, seeds_N, pool_NxCxMxHxWxI, counts_NxC):
    local = lambda s, p, c: map_local_workers(lambda j, *a: self.init_one(*a), self.strategy,
                                              s, p, c)
    fn = jax.shard_map(local, mesh=self.mesh, in_specs=(P("worker"),) * 3,
                       out_specs=P("worker"), check_vma=False)
    return jax.jit(fn, out_shardings=self.per_worker)(seeds_N, pool_NxCxMxHxWxI, counts_NxC)

  def chunk_fn(self, length: int):
    """A compiled run of `length` iterations from a traced start: (state, start, seeds,
    pool, counts) -> (state, mean loss per worker over the chunk)."""
    if length in self._chunks:
      return self._chunks[length]

    def local(state, start, seeds, pool, counts):
      def body(i, carry):
        st, total = carry
        new, loss = map_local_workers(
            lambda j, sd, s, p, c: self.iteration_one(start + i, sd, s, p, c),
            self.strategy, seeds, st, pool, counts)
        return new, total + loss
      state, total = jax.lax.fori_loop(0, length, body,
                                       (state, jnp.zeros(seeds.shape, jnp.float32)))
      return state, total / length

    fn = jax.shard_map(local, mesh=self.mesh,
                       in_specs=(P("worker"), P(), P("worker"), P("worker"), P("worker")),
                       out_specs=(P("worker"), P("worker")), check_vma=False)
    self._chunks[length] = jax.jit(fn, out_shardings=(self.per_worker, self.per_worker),
                                   donate_argnums=0)
    return self._chunks[length]

  def flops_per_iteration(self, pool_CxMxHxWxI, counts_C) -> float:
    """One worker's iteration, as XLA counts it (compiled alone, unsharded)."""
    from ensemble_jax import costs

    state = jax.eval_shape(self.init_one, 0, pool_CxMxHxWxI, counts_C)
    fn = jax.jit(lambda s, p, c: self.iteration_one(0, 0, s, p, c))
    return costs.flops(fn.lower(state, pool_CxMxHxWxI, counts_C).compile())


def distil(cfg: DistributionMatching, mesh: Mesh, pool_NxCxMxHxWxI: np.ndarray,
           counts_NxC: np.ndarray, seeds_N: np.ndarray, *, checkpoint_dir: str | None = None,
           chunk: int = 50, checkpoint_every: int = 500, on_chunk=None,
           local_strategy: str = "auto", stop_at: int | None = None) -> dict:
  """Runs (or resumes) the N distillations -> {'images': [N, C, S, H, W, I] float32,
  'labels': [C*S], 'loss': per-chunk mean losses [chunks, N], 'iterations', 'time_s'}.

  `on_chunk(iteration, losses_N, state)` is called at iteration 0 (losses NaN) and after
  each chunk (evaluation curves, progress); it returns True to end the run there (a time
  budget). `stop_at` ends early
  (a test's stand-in for a kill) after checkpointing."""
  from ensemble_jax import checkpoint

  n, num_classes = pool_NxCxMxHxWxI.shape[:2]
  distiller = Distiller(cfg, mesh, num_classes, pool_NxCxMxHxWxI.shape[3:], local_strategy)
  put = lambda x: jax.device_put(x, distiller.per_worker)
  pool, counts, seeds = put(pool_NxCxMxHxWxI), put(counts_NxC), put(np.asarray(seeds_N,
                                                                               np.int32))
  state = distiller.init(seeds, pool, counts)
  start, losses, elapsed = 0, [], 0.0
  ckpt = None
  if checkpoint_dir:
    ckpt = checkpoint.Checkpointer(checkpoint_dir, every_steps=checkpoint_every, max_to_keep=2)
    state, meta = ckpt.restore(state)
    if meta:
      start, losses, elapsed = meta["step"], meta["loss"], meta["time_s"]
  end = cfg.iterations if stop_at is None else min(stop_at, cfg.iterations)
  if on_chunk is not None and start == 0 and on_chunk(0, np.full(n, np.nan), state):
    end = 0
  it = start
  while it < end:
    length = min(chunk, end - it, checkpoint_every - it % checkpoint_every)
    t0 = time.perf_counter()
    state, loss_N = distiller.chunk_fn(length)(state, jnp.int32(it), seeds, pool, counts)
    loss_N = np.asarray(loss_N)  # waits for the chunk
    elapsed += time.perf_counter() - t0
    it += length
    losses.append([it] + loss_N.tolist())
    if on_chunk is not None and on_chunk(it, loss_N, state):
      end = it
    if ckpt is not None:
      ckpt.save(it, state, {"step": it, "loss": losses, "time_s": elapsed},
                force=it == end)
  if ckpt is not None:
    ckpt.close()
  s = cfg.images_per_class
  return {"images": np.asarray(state["images"]),
          "labels": np.repeat(np.arange(num_classes, dtype=np.int32), s),
          "loss": losses, "iterations": it, "time_s": elapsed,
          "flops_per_iteration": distiller.flops_per_iteration(pool_NxCxMxHxWxI[0],
                                                               counts_NxC[0])}


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """The field's test of a distilled set: ConvNets trained from scratch on it alone."""
  models: int = 5
  epochs: int = 1000  # over the set; the rate drops x0.1 after half of them
  batch_size: int = 256
  lr: float = 0.01  # SGD, momentum 0.9, weight decay 5e-4 (coupled, as PyTorch's)
  momentum: float = 0.9
  weight_decay: float = 5e-4
  augment: bool = True  # DSA per example, one family per batch
  width: int = 128
  depth: int = 3


@functools.lru_cache(maxsize=16)
def _trainer(n: int, num_classes: int, in_channels: int, ev: Evaluation, dsa: augment.DSA,
             vmap_models: bool):
  """A compiled (images [n, ...], labels [n], keys [M]) -> params [M, ...]: M ConvNets
  trained by the protocol, each with its own init, order and augmentation."""
  net = ConvNet(num_classes, in_channels=in_channels, width=ev.width, depth=ev.depth)
  b = min(ev.batch_size, n)
  steps_per_epoch = -(-n // b)
  # The papers' `for ep in range(Epoch + 1)`, the rate x0.1 after epoch Epoch // 2 + 1.
  boundary = (ev.epochs // 2 + 2) * steps_per_epoch
  tx = optax.chain(optax.add_decayed_weights(ev.weight_decay),
                   optax.sgd(optax.piecewise_constant_schedule(ev.lr, {boundary: 0.1}),
                             momentum=ev.momentum))

  def loss_fn(params, x, y, w):
    ce = optax.softmax_cross_entropy_with_integer_labels(net.apply(params, x), y)
    return jnp.sum(w * ce) / jnp.sum(w)

  def train_one(images, labels, k):
    init_key, k = jax.random.split(k)
    params = net.init(init_key, images[:1])

    def epoch(carry, e):
      ek = jax.random.fold_in(k, e)
      order = jax.random.permutation(ek, n)
      order = jnp.concatenate([order, -jnp.ones(steps_per_epoch * b - n, order.dtype)])

      def step(carry, s):
        params, opt = carry
        idx = jax.lax.dynamic_slice(order, (s * b,), (b,))
        w, idx = (idx >= 0).astype(jnp.float32), jnp.maximum(idx, 0)
        x = images[idx]
        if ev.augment:
          x = augment.per_example(jax.random.fold_in(ek, s + 1), dsa, x)
        updates, opt = tx.update(jax.grad(loss_fn)(params, x, labels[idx], w), opt, params)
        return (optax.apply_updates(params, updates), opt), None

      return jax.lax.scan(step, carry, jnp.arange(steps_per_epoch))[0], None

    (params, _), _ = jax.lax.scan(epoch, (params, tx.init(params)), jnp.arange(ev.epochs + 1))
    return params

  if vmap_models:
    return jax.jit(jax.vmap(train_one, in_axes=(None, None, 0)))
  one = jax.jit(train_one)
  return lambda images, labels, keys: jax.tree.map(
      lambda *x: jnp.stack(x), *[one(images, labels, k) for k in keys])


def evaluate(images_SxHxWxI, labels_S, test_images_u8, test_labels, key, ev: Evaluation,
             dsa: augment.DSA, cfg_norm: DistributionMatching, vmap_models: bool = True) -> dict:
  """Test accuracies of `ev.models` ConvNets trained on (images, labels) alone: images are
  normalised floats (a synthetic set) or uint8 (real images, normalised here)."""
  images = jnp.asarray(images_SxHxWxI)
  if images.dtype == jnp.uint8:
    images = normalize(images, cfg_norm)
  num_classes = int(np.max(test_labels)) + 1
  n = images.shape[0]
  train = _trainer(n, num_classes, images.shape[-1], ev, dsa, vmap_models)
  t0 = time.perf_counter()
  params_M = jax.block_until_ready(
      train(images, jnp.asarray(labels_S, jnp.int32), jax.random.split(key, ev.models)))
  train_s = time.perf_counter() - t0
  net = ConvNet(num_classes, in_channels=images.shape[-1], width=ev.width, depth=ev.depth)
  accs = _accuracies(net, params_M, test_images_u8, test_labels, cfg_norm)
  b = min(ev.batch_size, n)
  return {"accuracy": accs, "mean": float(np.mean(accs)), "std": float(np.std(accs)),
          "train_time_s": train_s, "steps": (ev.epochs + 1) * -(-n // b)}


def _accuracies(net, params_M, images_u8, labels, cfg_norm, chunk: int = 2000) -> list[float]:
  correct_M = jax.jit(jax.vmap(lambda p, x, y: jnp.sum(
      jnp.argmax(net.apply(p, normalize(x, cfg_norm)), -1) == y), in_axes=(0, None, None)))
  hits_M = sum(np.asarray(correct_M(params_M, images_u8[i:i + chunk], labels[i:i + chunk]))
               for i in range(0, len(labels), chunk))
  return [float(h) / len(labels) for h in hits_M]


@registry.register_builder("distribution_matching", fields=(
    "distill.images_per_class", "distill.iterations", "distill.real_per_class",
    "distill.image_lr", "distill.embed_width", "data", "seed"),
    methods=("ensemble",))
def build_distribution_matching(inputs: registry.BuildInputs) -> registry.Built:
  """Each worker's synthetic set, distilled from its own class-stratified share, and that
  share (`then`: what a distilled warm start, `distill.synthetic_fraction`, reads next)."""
  from ensemble_jax import data as data_lib

  config, data, n = inputs.config, inputs.data, inputs.num_consumers
  d = config.distill
  train = data_lib.get_range(data.train, 0, len(data.train))
  if train is None:
    from ensemble_jax.config_lib import ConfigError
    raise ConfigError("config.distill.method='distribution_matching' reads the training "
                      "images into memory: use a source with arrays (Fashion-MNIST idx, "
                      "image folders), not TFDS records.")
  labels = np.asarray(train["label"])
  shares = stratified_shares(labels, n, data.num_classes, config.seed)
  size = max(int(np.bincount(labels[s], minlength=data.num_classes).max()) for s in shares)
  grouped = [class_pool(train["image"][s], labels[s], data.num_classes, size) for s in shares]
  pool = np.stack([p for p, _ in grouped])
  counts = np.stack([c for _, c in grouped])
  cfg = DistributionMatching(
      images_per_class=d.images_per_class, iterations=d.iterations,
      real_per_class=d.real_per_class, lr=d.image_lr, width=d.embed_width,
      mean=tuple(config.data.mean), std=tuple(config.data.std))
  devices = math.gcd(n, jax.device_count())
  mesh = jax.make_mesh((devices,), ("worker",), devices=jax.devices()[:devices])
  seeds = np.asarray([config.seed * 1000 + i for i in range(n)], np.int32)
  out = distil(cfg, mesh, pool, counts, seeds,
               checkpoint_dir=os.path.join(inputs.proxy_dir, "distillation"),
               checkpoint_every=max(1, min(500, d.iterations)))
  std, mean = np.asarray(cfg.std, np.float32), np.asarray(cfg.mean, np.float32)
  images = (out["images"].reshape((-1,) + pool.shape[3:]) * std + mean) * 255.0
  per_set = out["labels"].size
  synthetic = [np.arange(i * per_set, (i + 1) * per_set) for i in range(n)]
  source = {"image": images.astype(np.float32), "label": np.tile(out["labels"], n)}
  # The N distillations run in parallel on N devices: the build's time is one worker's,
  # its compute all of theirs.
  sets_per_device = n // devices
  info = registry.pool_info(
      inputs, synthetic, pool_size=per_set, split="per_worker",
      build_flops=n * out["iterations"] * out["flops_per_iteration"],
      features="synthetic",
      build_time_s=(time.perf_counter() - inputs.start) / sets_per_device)
  info["distillation"] = {
      "method": "distribution_matching", "images_per_class": d.images_per_class,
      "iterations": out["iterations"], "real_per_class": d.real_per_class,
      "image_lr": d.image_lr, "embedding": f"ConvNet-{cfg.depth} width {cfg.width}",
      "augmentation": "dsa (siamese)",
      "flops_per_iteration": out["flops_per_iteration"],
      "host_wall_time_s": time.perf_counter() - inputs.start,
      "sets_per_device": sets_per_device}
  return registry.Built(synthetic, info, source=source, then=shares)
