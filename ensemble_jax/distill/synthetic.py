"""Synthetic distilled sets, stacked over workers: distribution matching (Zhao & Bilen
2023) and gradient matching with siamese augmentation (Zhao, Mopuri & Bilen 2021; Zhao &
Bilen 2021, "DSA").

A distilled set is `images_per_class` learned images per class, moved by SGD with momentum
on a matching objective against batches of `real_per_class` real images of each class,
both passed through one siamese augmentation (`augment.siamese`):

- distribution matching: the mean embedding of each class's synthetic and real images under
  a randomly initialised embedding network drawn afresh at every iteration;
- gradient matching: each iteration a fresh network; `outer_loop` times, per class, the
  gradient of the network's cross-entropy on the real batch against that on the synthetic
  images (1 - cosine per output channel, summed over layers), then `inner_loop` epochs of
  training the network on the synthetic set.

Each worker distils its own set from its own data (`pool_NxCxMxHxWxI`, class by class)
from its own seed: N independent problems, stacked on a leading `worker` axis and run
under `shard_map` with no collective between workers, like the ensemble's train step.
The run checkpoints (orbax) every `checkpoint_every` iterations and resumes bit for bit:
every random draw is a function of (worker seed, iteration).
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ensemble_jax.data import images as images_lib
from ensemble_jax.distill import augment, registry
from ensemble_jax.sharding import map_local_workers, resolve_local_strategy
from ensemble_jax.models.convnet import ConvNet


@dataclasses.dataclass(frozen=True)
class Distillation:
  """What every distiller shares: the set, the image optimiser, the network, the data."""
  images_per_class: int = 10
  iterations: int = 20_000
  real_per_class: int = 256  # real images per class and matching step
  lr: float = 1.0  # SGD on the images, momentum 0.5 (the papers')
  momentum: float = 0.5
  init: str = "real"  # 'real': random real images of the class; 'noise': N(0, 1)
  width: int = 128  # the matched ConvNet's
  depth: int = 3
  dsa: augment.DSA = augment.DSA()
  mean: tuple[float, ...] = (0.2861,)  # the data's per-channel normalisation
  std: tuple[float, ...] = (0.3530,)

  def __post_init__(self):
    name = type(self).__name__
    for field in ("images_per_class", "iterations", "real_per_class", "width", "depth"):
      if getattr(self, field) < 1:
        raise ValueError(f"{name}: {field}={getattr(self, field)} must be >= 1")
    if self.init not in ("real", "noise"):
      raise ValueError(f"{name}: init={self.init!r}: choose 'real' or 'noise'")


@dataclasses.dataclass(frozen=True)
class DistributionMatching(Distillation):
  pass


# The reference code's `get_loops`: images per class -> (outer_loop, inner_loop).
PAPER_LOOPS = {1: (1, 1), 10: (10, 50), 20: (20, 25), 30: (30, 20), 40: (40, 15),
               50: (50, 10)}


@dataclasses.dataclass(frozen=True)
class GradientMatching(Distillation):
  iterations: int = 1000  # each a fresh network (the paper's 1,000)
  lr: float = 0.1  # SGD on the images, momentum 0.5
  net_lr: float = 0.01  # SGD on the network in the inner loop, no momentum
  batch_train: int = 256  # the inner loop's batch of synthetic images
  outer_loop: int = 0  # matching steps per iteration; 0: the paper's for images_per_class
  inner_loop: int = 0  # epochs on the synthetic set after each but the last; 0: the paper's

  def __post_init__(self):
    super().__post_init__()
    if not (self.outer_loop and self.inner_loop) and self.images_per_class not in PAPER_LOOPS:
      raise ValueError(f"GradientMatching: the paper sets outer and inner loops only for "
                       f"{sorted(PAPER_LOOPS)} images per class, not {self.images_per_class}:"
                       " set outer_loop and inner_loop")

  @property
  def loops(self) -> tuple[int, int]:
    paper = PAPER_LOOPS.get(self.images_per_class, (0, 0))
    return self.outer_loop or paper[0], self.inner_loop or paper[1]


def normalize(images_u8, cfg: Distillation):
  return images_lib.normalize(images_u8, cfg.mean, cfg.std)


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


def worker_pools(images_ExHxWxI: np.ndarray, labels_E: np.ndarray, num_workers: int,
                 num_classes: int, seed: int):
  """Each worker's class-stratified share grouped by class, padded to one size: (uint8
  [N, C, M, H, W, I], counts [N, C], the shares' example indices)."""
  shares = stratified_shares(labels_E, num_workers, num_classes, seed)
  size = max(int(np.bincount(labels_E[s], minlength=num_classes).max()) for s in shares)
  grouped = [class_pool(images_ExHxWxI[s], labels_E[s], num_classes, size) for s in shares]
  return np.stack([p for p, _ in grouped]), np.stack([c for _, c in grouped]), shares


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


def gradient_distance(grads_real, grads_syn):
  """The papers' 'ours' distance: per output channel of every weight, 1 - the cosine of
  the two gradients over its inputs, summed. Biases and norm scales (1-D) are skipped, as
  the reference's `distance_wb` returns 0 for them."""
  total = 0.0
  for gr, gs in zip(jax.tree.leaves(grads_real), jax.tree.leaves(grads_syn)):
    if gr.ndim < 2:
      continue
    # Flax kernels put the output channel last (conv HxWxIxO, dense IxO).
    gr_KxO, gs_KxO = gr.reshape(-1, gr.shape[-1]), gs.reshape(-1, gs.shape[-1])
    norms_O = jnp.linalg.norm(gr_KxO, axis=0) * jnp.linalg.norm(gs_KxO, axis=0)
    total = total + jnp.sum(1 - jnp.sum(gr_KxO * gs_KxO, axis=0) / (norms_O + 1e-6))
  return total


def _epoch_order(epoch_key, n: int, b: int):
  """An epoch's shuffled order of n examples, padded with -1 to whole batches of b."""
  return jnp.concatenate([jax.random.permutation(epoch_key, n),
                          -jnp.ones(b * -(-n // b) - n, jnp.int32)])


def _batch(order, j, b: int):
  """Batch j of an `_epoch_order`: indices [b] and weights [b], 0 on the padding of the
  last, short batch (the loss's mean is over its real rows, as PyTorch's DataLoader's)."""
  idx = jax.lax.dynamic_slice(order, (j * b,), (b,))
  return jnp.maximum(idx, 0), (idx >= 0).astype(jnp.float32)


def _cross_entropy(net, params, x_BxHxWxI, labels_B, weights_B=None):
  ce_B = optax.softmax_cross_entropy_with_integer_labels(net.apply(params, x_BxHxWxI), labels_B)
  if weights_B is None:
    return ce_B.mean()
  return jnp.sum(weights_B * ce_B) / jnp.sum(weights_B)


def class_gradient_distance(params, syn_SxHxWxI, real_RxHxWxI, c, key, cfg: GradientMatching,
                            net):
  """One class's term: the distance between the network's gradients on its real and on its
  synthetic images, both through one siamese augmentation."""
  grad = jax.grad(functools.partial(_cross_entropy, net))
  syn_a, real_a = augment.siamese(key, cfg.dsa, syn_SxHxWxI, real_RxHxWxI)
  g_real = jax.lax.stop_gradient(grad(params, real_a, jnp.full(real_a.shape[0], c)))
  return gradient_distance(g_real, grad(params, syn_a, jnp.full(syn_a.shape[0], c)))


def gradient_matching_loss(syn_CxSxHxWxI, real_CxRxHxWxI, params, key, cfg: GradientMatching,
                           net):
  """Sum over classes of `class_gradient_distance`.

  The classes run one after another (`lax.map`), as in the reference: vmapped, their
  weight gradients become grouped convolutions, which XLA:CPU ran ~5x slower inside a
  loop (0.41 s vs 0.14 s an iteration at the tests' shapes); unrolled, ten classes trace
  ten times."""
  c = syn_CxSxHxWxI.shape[0]
  return jax.lax.map(lambda a: class_gradient_distance(params, *a, cfg, net),
                     (syn_CxSxHxWxI, real_CxRxHxWxI, jnp.arange(c),
                      jax.random.split(key, c))).sum()


class Distiller(abc.ABC):
  """N workers' distillations, stacked over the mesh's `worker` axis.

  A distiller is one `iteration_one` (a worker's iteration, a pure function of the
  iteration, its seed, its set and its data) and its `flops_per_iteration`; this class
  stacks, shards and chunks it. Build one with `make_distiller`."""

  def __init__(self, cfg: Distillation, mesh: Mesh, num_classes: int,
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

  @abc.abstractmethod
  def iteration_one(self, it, seed, state, pool_CxMxHxWxI, counts_C):
    """(state, loss): one worker's iteration `it`."""

  @abc.abstractmethod
  def flops_per_iteration(self, pool_CxMxHxWxI, counts_C) -> float:
    """One worker's iteration, as XLA counts it (compiled alone, unsharded)."""

  def _step_images(self, state, grads):
    updates, opt = self.tx.update(grads, state["opt"], state["images"])
    return {"images": optax.apply_updates(state["images"], updates), "opt": opt}

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


class DistributionMatchingDistiller(Distiller):
  """An iteration: one step on the images, a fresh random embedding network."""

  def iteration_one(self, it, seed, state, pool_CxMxHxWxI, counts_C):
    cfg = self.cfg
    key = jax.random.fold_in(jax.random.key(seed), it)
    real_key, loss_key = jax.random.split(key)
    real = normalize(sample_real(real_key, pool_CxMxHxWxI, counts_C, cfg.real_per_class), cfg)
    loss, grads = jax.value_and_grad(matching_loss)(state["images"], real, loss_key, cfg,
                                                    self.net)
    return self._step_images(state, grads), loss

  def flops_per_iteration(self, pool_CxMxHxWxI, counts_C) -> float:
    from ensemble_jax import costs

    state = jax.eval_shape(self.init_one, 0, pool_CxMxHxWxI, counts_C)
    fn = jax.jit(lambda s, p, c: self.iteration_one(0, 0, s, p, c))
    return costs.flops(fn.lower(state, pool_CxMxHxWxI, counts_C).compile())


class GradientMatchingDistiller(Distiller):
  """An iteration: a fresh network; `outer_loop` matching steps on the images, each but
  the last followed by `inner_loop` epochs of the network's SGD on the synthetic set
  (per-example DSA, as the reference trains it). The loss is the mean over the matching
  steps of the class-summed distance."""

  def iteration_one(self, it, seed, state, pool_CxMxHxWxI, counts_C):
    outer, _ = self.cfg.loops
    key = jax.random.fold_in(jax.random.key(seed), it)
    net_key, key = jax.random.split(key)
    params = self.net.init(net_key, state["images"][0])

    def outer_step(ol, carry):
      state, params, total = carry
      match_key, train_key = jax.random.split(jax.random.fold_in(key, ol))
      state, loss = self._match(match_key, state, params, pool_CxMxHxWxI, counts_C)
      params = jax.lax.cond(ol < outer - 1,
                            lambda p: self._train(train_key, p, state["images"]),
                            lambda p: p, params)
      return state, params, total + loss

    state, _, total = jax.lax.fori_loop(0, outer, outer_step,
                                        (state, params, jnp.zeros((), jnp.float32)))
    return state, total / outer

  def _match(self, key, state, params, pool_CxMxHxWxI, counts_C):
    cfg = self.cfg
    real_key, loss_key = jax.random.split(key)
    real = normalize(sample_real(real_key, pool_CxMxHxWxI, counts_C, cfg.real_per_class), cfg)
    loss, grads = jax.value_and_grad(gradient_matching_loss)(state["images"], real, params,
                                                             loss_key, cfg, self.net)
    return self._step_images(state, grads), loss

  def _batches(self, images_CxSxHxWxI) -> tuple[int, int]:
    n = images_CxSxHxWxI.shape[0] * images_CxSxHxWxI.shape[1]
    b = min(self.cfg.batch_train, n)
    return b, -(-n // b)

  def _train(self, key, params, images_CxSxHxWxI):
    _, batches = self._batches(images_CxSxHxWxI)
    images = jax.lax.stop_gradient(images_CxSxHxWxI)
    return jax.lax.fori_loop(0, self.cfg.loops[1] * batches,
                             lambda t, p: self._train_step(key, t, p, images), params)

  def _train_step(self, key, t, params, images_CxSxHxWxI):
    """Step t of the inner loop: batch t % batches of epoch t // batches, shuffled."""
    cfg = self.cfg
    c, s = images_CxSxHxWxI.shape[:2]
    n, (b, batches) = c * s, self._batches(images_CxSxHxWxI)
    x_all = images_CxSxHxWxI.reshape((n,) + images_CxSxHxWxI.shape[2:])
    labels = jnp.repeat(jnp.arange(c), s)
    epoch_key = jax.random.fold_in(key, t // batches)
    idx, w = _batch(_epoch_order(epoch_key, n, b), t % batches, b)
    x = augment.per_example(jax.random.fold_in(epoch_key, t % batches + 1), cfg.dsa,
                            x_all[idx])
    grads = jax.grad(functools.partial(_cross_entropy, self.net))(params, x, labels[idx], w)
    return jax.tree.map(lambda p, g: p - cfg.net_lr * g, params, grads)

  def flops_per_iteration(self, pool_CxMxHxWxI, counts_C) -> float:
    """XLA counts a loop's body once, whatever its trip count: the iteration's FLOPs are a
    class's matching term (its value and gradient in the images) times classes and outer
    steps, and an inner training step's times theirs, each compiled alone (the sampling,
    the image update and the network's initialisation, elementwise, aside)."""
    from ensemble_jax import costs

    cfg, (outer, inner) = self.cfg, self.cfg.loops
    state = jax.eval_shape(self.init_one, 0, pool_CxMxHxWxI, counts_C)
    syn = state["images"]
    params = jax.eval_shape(lambda s: self.net.init(jax.random.key(0), s[0]), syn)
    syn_S = jax.ShapeDtypeStruct(syn.shape[1:], syn.dtype)
    real = jax.ShapeDtypeStruct((cfg.real_per_class,) + syn.shape[2:], syn.dtype)
    one_class = jax.value_and_grad(class_gradient_distance, argnums=1)
    term = jax.jit(lambda w, s, r: one_class(w, s, r, 0, jax.random.key(0), cfg, self.net))
    step = jax.jit(lambda w, x: self._train_step(jax.random.key(0), 0, w, x))
    term_flops = costs.flops(term.lower(params, syn_S, real).compile())
    step_flops = costs.flops(step.lower(params, syn).compile())
    _, batches = self._batches(syn)
    return (outer * syn.shape[0] * term_flops
            + (outer - 1) * inner * batches * step_flops)


_DISTILLERS = {DistributionMatching: DistributionMatchingDistiller,
               GradientMatching: GradientMatchingDistiller}


# One distiller per (config, mesh, shapes) in a process: a resumed, stopped or repeated
# distillation (a rerun, the tests' stop-and-resume pairs) reuses the compiled chunks, and
# its FLOPs are counted once (`_iteration_flops`).
@functools.lru_cache(maxsize=8)
def make_distiller(cfg: Distillation, mesh: Mesh, num_classes: int,
                   image_shape: tuple[int, int, int], local_strategy: str = "auto") -> Distiller:
  """The stacked distiller of `cfg`'s kind."""
  return _DISTILLERS[type(cfg)](cfg, mesh, num_classes, image_shape, local_strategy)


@functools.lru_cache(maxsize=8)
def _iteration_flops(distiller: Distiller, pool: jax.ShapeDtypeStruct,
                     counts: jax.ShapeDtypeStruct) -> float:
  return distiller.flops_per_iteration(pool, counts)


def distil(cfg: Distillation, mesh: Mesh, pool_NxCxMxHxWxI: np.ndarray,
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
  distiller = make_distiller(cfg, mesh, num_classes, pool_NxCxMxHxWxI.shape[3:],
                             local_strategy)
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
    watch = checkpoint.PreemptionWatch.active
    stopping = it < end and watch is not None and watch.received is not None
    if ckpt is not None:
      ckpt.save(it, state, {"step": it, "loss": losses, "time_s": elapsed},
                force=it == end or stopping)
    if stopping:  # a stop request: the chunk checkpointed, then the installed watch's exit
      if ckpt is not None:
        ckpt.close()
      checkpoint.PreemptionWatch.stop_before(
          f"the distillation past iteration {it} of {end}"
          + (f" (checkpointed in {checkpoint_dir}: rerun the same command to resume)"
             if ckpt is not None else ""))
  if ckpt is not None:
    ckpt.close()
  s = cfg.images_per_class
  return {"images": np.asarray(state["images"]),
          "labels": np.repeat(np.arange(num_classes, dtype=np.int32), s),
          "loss": losses, "iterations": it, "time_s": elapsed,
          "flops_per_iteration": _iteration_flops(
              distiller, *(jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
                           for x in (pool_NxCxMxHxWxI, counts_NxC)))}


# How `iteration_time` reads its timed chunks: the median, as every calibration reads its
# timed steps. A record without `iteration_time_statistic` took the fastest chunk.
ITERATION_STATISTIC = "median"


def iteration_statistic(distillation: dict) -> str:
  """Which statistic of its timed chunks a record's `iteration_time_s` is."""
  return distillation.get("iteration_time_statistic", "fastest")


def iteration_time(cfg: Distillation, pool_CxMxHxWxI: np.ndarray, counts_C: np.ndarray,
                   seed: int, *, length: int = 3, repeats: int = 3) -> tuple[float, list]:
  """(seconds per iteration of ONE set's distillation on one device, each chunk's): the
  median of `repeats` compiled chunks of `length` iterations after a warm-up chunk, as a
  calibration takes the median of its timed steps (the fastest would price the build
  lower than the steps it is compared with). A build charges iterations x this, the time
  of N distillations run in parallel on N devices, whatever the host ran them on."""
  mesh = jax.make_mesh((1,), ("worker",), devices=jax.devices()[:1])
  distiller = make_distiller(cfg, mesh, pool_CxMxHxWxI.shape[0], pool_CxMxHxWxI.shape[2:])
  put = lambda x: jax.device_put(x[None], distiller.per_worker)
  pool, counts = put(pool_CxMxHxWxI), put(counts_C)
  seeds = put(np.asarray(seed, np.int32))
  state = distiller.init(seeds, pool, counts)
  run = distiller.chunk_fn(length)
  times = []
  for r in range(repeats + 1):
    t0 = time.perf_counter()
    state, loss = run(state, jnp.int32(r * length), seeds, pool, counts)
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
  chunks = [t / length for t in times[1:]]
  return statistics.median(chunks), chunks


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

  loss_fn = functools.partial(_cross_entropy, net)

  def train_one(images, labels, k):
    init_key, k = jax.random.split(k)
    params = net.init(init_key, images[:1])

    def epoch(carry, e):
      ek = jax.random.fold_in(k, e)
      order = _epoch_order(ek, n, b)

      def step(carry, s):
        params, opt = carry
        idx, w = _batch(order, s, b)
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
             dsa: augment.DSA, cfg_norm: Distillation, vmap_models: bool | None = None) -> dict:
  """Test accuracies of `ev.models` ConvNets trained on (images, labels) alone: images are
  normalised floats (a synthetic set) or uint8 (real images, normalised here). The models
  train vmapped on accelerators and one after another on CPU (vmapped convolutions of
  different weights become slow grouped ones there), unless `vmap_models` says."""
  if vmap_models is None:
    vmap_models = jax.default_backend() != "cpu"
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


def _distribution_matching(config) -> DistributionMatching:
  d = config.distill
  return DistributionMatching(
      images_per_class=d.images_per_class, iterations=d.iterations,
      real_per_class=d.real_per_class, lr=d.image_lr, width=d.embed_width,
      mean=tuple(config.data.mean), std=tuple(config.data.std))


def _gradient_matching(config) -> GradientMatching:
  d = config.distill
  return GradientMatching(
      images_per_class=d.images_per_class, iterations=d.iterations,
      real_per_class=d.real_per_class, lr=d.gm_image_lr, net_lr=d.gm_net_lr,
      width=d.embed_width, mean=tuple(config.data.mean), std=tuple(config.data.std))


def _check_gradient_matching(config) -> None:
  from ensemble_jax.config_lib import ConfigError

  ipc = config.distill.images_per_class
  if ipc not in PAPER_LOOPS:
    raise ConfigError(
        f"config.distill.images_per_class={ipc}: gradient matching takes its outer and inner"
        f" loops from the paper's table, which sets them for {sorted(PAPER_LOOPS)} only.")


def _mixed_workers(method) -> bool:
  """An ensemble's: workers of their own, their predictions mixed (`Method.mixes_workers`)."""
  return method.stacked and method.mixes_workers


# The config each distiller builds from (`config.distill.builder` -> its dataclass).
_CONFIGS = {"distribution_matching": _distribution_matching,
            "gradient_matching": _gradient_matching}
_SHARED_FIELDS = ("distill.images_per_class", "distill.iterations", "distill.real_per_class",
                  "distill.embed_width", "data", "seed")


def distillation_inputs(config, data, n: int):
  """What `build_synthetic` distils `n` sets from: (its distiller's config, the mesh of the
  devices the sets share, each worker's class-stratified pool and counts, the shares they
  come from, each worker's seed)."""
  from ensemble_jax import data as data_lib

  train = data_lib.get_range(data.train, 0, len(data.train))
  if train is None:
    from ensemble_jax.config_lib import ConfigError
    raise ConfigError(f"config.distill.builder={config.distill.builder!r} reads the training "
                      "images into memory: use a source with arrays (Fashion-MNIST idx, "
                      "image folders), not TFDS records.")
  labels = np.asarray(train["label"])
  pool, counts, shares = worker_pools(train["image"], labels, n, data.num_classes, config.seed)
  devices = math.gcd(n, jax.device_count())
  mesh = jax.make_mesh((devices,), ("worker",), devices=jax.devices()[:devices])
  seeds = np.asarray([config.seed * 1000 + i for i in range(n)], np.int32)
  return _CONFIGS[config.distill.builder](config), mesh, pool, counts, shares, seeds


@registry.register_builder("gradient_matching", methods=_mixed_workers, timed_apart=True,
                           synthetic=True,
                           fields=_SHARED_FIELDS + ("distill.gm_image_lr", "distill.gm_net_lr"),
                           check=_check_gradient_matching)
@registry.register_builder("distribution_matching", methods=_mixed_workers, timed_apart=True,
                           synthetic=True, fields=_SHARED_FIELDS + ("distill.image_lr",))
def build_synthetic(inputs: registry.BuildInputs) -> registry.Built:
  """Each worker's synthetic set, distilled (by `config.distill.builder`) from its own
  class-stratified share, and that share (`then`: what a distilled warm start,
  `distill.synthetic_fraction`, reads next)."""
  config, data, n = inputs.config, inputs.data, inputs.num_consumers
  d = config.distill
  cfg, mesh, pool, counts, shares, seeds = distillation_inputs(config, data, n)
  devices = mesh.devices.size
  out = distil(cfg, mesh, pool, counts, seeds,
               checkpoint_dir=os.path.join(inputs.proxy_dir, "distillation"),
               checkpoint_every=max(1, min(500, d.iterations)))
  std, mean = np.asarray(cfg.std, np.float32), np.asarray(cfg.mean, np.float32)
  images = (out["images"].reshape((-1,) + pool.shape[3:]) * std + mean) * 255.0
  per_set = out["labels"].size
  synthetic = [np.arange(i * per_set, (i + 1) * per_set) for i in range(n)]
  source = {"image": images.astype(np.float32), "label": np.tile(out["labels"], n)}
  # The N distillations run in parallel on N devices: the build's time is one set's on one
  # device (iterations x its iteration, timed apart: the host ran all N on its cores), its
  # compute all N sets'.
  host_wall_s = time.perf_counter() - inputs.start
  per_iteration_s, chunks_s = iteration_time(cfg, pool[0], counts[0], int(seeds[0]))
  info = registry.pool_info(
      inputs, synthetic, pool_size=per_set, split="per_worker",
      build_flops=n * out["iterations"] * out["flops_per_iteration"],
      features="synthetic", build_time_s=out["iterations"] * per_iteration_s)
  info["distillation"] = {
      "images_per_class": d.images_per_class,
      "iterations": out["iterations"], "real_per_class": d.real_per_class,
      "image_lr": cfg.lr, "embedding": f"ConvNet-{cfg.depth} width {cfg.width}",
      "augmentation": "dsa (siamese)",
      "flops_per_iteration": out["flops_per_iteration"],
      "iteration_time_s": per_iteration_s, "iteration_time_statistic": ITERATION_STATISTIC,
      "iteration_chunks_s": chunks_s, "host_wall_time_s": host_wall_s,
      "host_load_average": os.getloadavg()[0], "sets_per_device": n // devices}
  if isinstance(cfg, GradientMatching):
    info["distillation"].update(net_lr=cfg.net_lr, outer_loop=cfg.loops[0],
                                inner_loop=cfg.loops[1])
  return registry.Built(synthetic, info, source=source, then=shares)
