"""Pools: the data each worker's distilled sequence draws from, built from a cheap proxy.

Built by `ensemble_jax/run.py` before the loop starts and handed to it (`train.fit(...,
pool=)`): this module stands above the loop, which knows nothing about distillation.
`config.distill.method` picks the builder:
  none                 no pool: the loop uses the method's own sampler (config.method.sampler:
                       random | disjoint)
  el2n | grand | loss  the `fraction` of hardest (or easiest) examples by score, averaged
                       over the proxies (Paul et al. 2021), per class if asked
  kmeans               k = number of workers clusters of proxy embeddings (penultimate
                       layer), or with `embedding='pca'` of the top `pca_dim` principal
                       components of the standardised pixels (no proxy: seconds to build);
                       worker i draws cluster i. For language models (c-BTM): the
                       clusters of the windows' tf-idf (SVD to `tfidf_dim`), no proxy; with
                       `routed` aggregation each eval position is routed on the tf-idf of
                       its running prefix (its context), never on the tokens it predicts
  craig | gradmatch    a weighted coreset of `fraction` on closed-form last-layer gradients
                       of all proxies (concatenated), per class; the weights go into the loss
A selected pool is shared by the workers, split disjointly, or bagged (`distill.split`).
In a multi-process run the proxy-free routed pools (PCA, tf-idf) are built sharded: each
process reads and featurises its share of the training chunks, and every process ends
with the one-process pool, bit for bit (`shards`, `clusters.PixelPCA`, `clusters.TfIdf`).

The proxy is `distill.proxy_models` ResNets of width `proxy_width`, trained
`proxy_steps` each by the stacked engine through the one training loop (its results.json
sits next to the cached pool): independent models on the full data (`proxy='standard'`),
or the lightweight distributed proxy of Ro et al. 2023 (`proxy='lipt'`): members from one
shared init, each on its own disjoint subset, with crop+flip augmentation and a SNIP mask
fixed at init (`lipt_sparsity`), merged by weight averaging into one proxy. Building costs
time and compute, which are part of the method: `build_time_s` (wall clock of proxy
training, scoring and selection) and `build_flops` (XLA: proxy training + scoring forward
passes; the selection's own arithmetic is not counted) go into results.json `distill` and
the cost report. Pools are
cached as `<cache_dir>/<key>.npz`, the key hashing every config field the pool depends on
and the data's fingerprint; a cached pool is reused and reports its original cost.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import time

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ensemble_jax import config_lib, costs, train
from ensemble_jax import data as data_lib
from ensemble_jax.data import images, pipeline, samplers
from ensemble_jax.distill import clusters, coresets, scores
from ensemble_jax.methods import ensemble
from ensemble_jax.methods import step as step_lib

SCORES = {"el2n": scores.el2n_scores, "loss": scores.loss_scores}


def create(config, data, num_consumers: int, workdir: str) -> samplers.Pool | None:
  """The run's distilled pool, built or read from cache, split for `num_consumers` workers
  (the method's `num_workers`); None when config.distill.method is 'none'."""
  if config.distill.method == "none":
    return None
  path = cache_path(config, data, num_consumers, workdir)
  if os.path.exists(path):
    logging.info("distill: the %s pool read from %s", config.distill.method, path)
    pools, weights, route, info = _read(path)
    info["cached"] = path
  else:
    logging.info("distill: building the %s pool for %d workers (proxy training, scoring, "
                 "selection; cached in %s)", config.distill.method, num_consumers, path)
    pools, weights, route, info = build(config, data, num_consumers, _proxy_dir(path))
    logging.info("distill: pool built in %.1f s", info["build_time_s"])
    _write(path, pools, weights, route, info)
    info = {**info, "cached": False}
  return samplers.Pool(samplers.PoolSampler(pools, len(data.train), config.seed, weights), info,
                       route)


def cache_path(config, data, num_consumers: int, workdir: str) -> str:
  """Where `config`'s pool is cached: `<distill.cache_dir or workdir/pools>/<key>.npz`."""
  return os.path.join(config.distill.cache_dir or os.path.join(workdir, "pools"),
                      f"{cache_key(config, data, num_consumers)}.npz")


class PoolChanged(ValueError):
  """This code builds another pool than the one cached (or recorded) for runs."""


def retime(config, data, num_consumers: int, path: str, recorded: dict) -> dict:
  """Builds the pool cached in `path` again from `config` with this code, timed, and keeps
  the new build's `info` (its build time, on a host doing nothing else, as the sweeps'
  quiet phase times it). The pool must come out the same: bit for bit as cached, or, where
  the cache file was not kept (caches are not committed), with the cluster sizes its runs
  recorded (`recorded`, a run's `distill` block), and then written back. Runs trained on
  the cached pool, so a pool that changed means runs to train again, not a time to
  replace. `path`, not `config`'s cache key, names the pool: keys grow with the config's
  fields. The new info's `retimed` says which check it passed."""
  if not proxy_free(config):
    raise ValueError(f"distill.method={config.distill.method!r} trains a proxy: only the "
                     "proxy-free pools (PCA of pixels, tf-idf of text) are re-timed here")
  built = build(config, data, num_consumers, _proxy_dir(path))
  if os.path.exists(path):
    cached, check = _read(path), "bit for bit the cached pool"
    for name, old, new in zip(("pools", "weights", "route"), cached[:3], built[:3]):
      same = (old is None) == (new is None) and (old is None or (
          len(old) == len(new) and all(np.array_equal(a, b) for a, b in zip(old, new))
          if name == "pools" else np.array_equal(old, new)))
      if not same:
        raise PoolChanged(f"the pool cached in {path} and the one this code builds differ in "
                         f"their {name}: the runs that read it trained on another pool; "
                         "train them again rather than re-time it")
  else:
    check = "the cluster sizes its runs recorded (the cached pool was not kept)"
    if built[3]["pool_sizes"] != recorded["pool_sizes"]:
      raise PoolChanged(f"no cached pool {path}, and this code's build has other cluster sizes "
                       "than its runs recorded: they trained on another pool; train them "
                       "again rather than re-time it")
  info = {**built[3], "retimed": check}
  _write(path, *built[:3], info)
  return info


def proxy_free(config) -> bool:
  """Whether `config`'s pool is built without training a proxy: k-means of the pixels' PCA,
  or of the windows' tf-idf (language models)."""
  d = config.distill
  return d.method == "kmeans" and (config.task == "lm" or d.embedding == "pca")


def _proxy_dir(path: str) -> str:
  return os.path.join(os.path.dirname(path), f"proxy_{os.path.basename(path)[:-len('.npz')]}")


def _read(path: str):
  """(pools, weights or None, route or None, info) of a cached pool."""
  with np.load(path) as f:
    pools = np.split(f["indices"], f["offsets"][1:-1])
    weights = f["weights"] if f["weights"].size else None
    route = f["route"] if f["route"].size else None
    return pools, weights, route, json.loads(str(f["info"]))


def _write(path: str, pools, weights, route, info) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  offsets = np.cumsum([0] + [len(p) for p in pools])
  tmp = f"{path}.{os.getpid()}.tmp.npz"  # the processes of a multi-host run write alike
  np.savez(tmp, indices=np.concatenate(pools), offsets=offsets,
           weights=np.zeros(0) if weights is None else weights,
           route=np.zeros(0) if route is None else route, info=json.dumps(info))
  os.replace(tmp, path)  # whole or absent: an interrupted build leaves no pool behind


def _routed(config) -> bool:
  return "routed" in config_lib.aggregation_modes(config)


def _scored_eval(config, data):
  """The eval examples the run scores: the first `eval.num_examples` (all when 0), as
  `pipeline.EvalBatches` reads them; only these are routed."""
  n = len(data.eval)
  scored = getattr(getattr(config, "eval", None), "num_examples", 0)  # 0 or unset: all
  return _Head(data.eval, min(scored or n, n))


class _Head:
  """The first `n` examples of a pipeline source."""

  def __init__(self, source, n: int):
    self.source, self.n = source, n

  def __len__(self) -> int:
    return self.n

  def get(self, i: int):
    if not 0 <= i < self.n:
      raise IndexError(i)
    return self.source.get(i)

  def get_range(self, begin: int, end: int):
    if not 0 <= begin <= end <= self.n:
      raise IndexError((begin, end))
    return data_lib.get_range(self.source, begin, end)


# distill fields added after pools were cached, with the value every earlier pool was built
# with: at that value a field stays out of the key, so those pools are read back.
_ADDED_FIELDS = {"pca_covariance": "float64", "pca_image_size": 0,
                 "kmeans_balance": "greedy"}


def cache_key(config, data, num_consumers: int) -> str:
  """A hash of everything a pool depends on: distill, model, data, optim, seed, workers."""
  fields = {"distill": {k: v for k, v in config.distill.items() if k != "cache_dir" and not (
                k in _ADDED_FIELDS and v == _ADDED_FIELDS[k])},
            "routed": _routed(config), "eval_split": config.eval.split,
            "model": config.model.to_dict(), "data": config.data.to_dict(),
            "optim": config.optim.to_dict(), "batch": config.train.batch_size,
            "seed": config.seed, "consumers": num_consumers,
            "fingerprint": fingerprint(data)}
  if _routed(config) and len(_scored_eval(config, data)) < len(data.eval):
    # The routing covers only the examples the evaluation scores.
    fields["routed_eval_examples"] = len(_scored_eval(config, data))
  if _routed(config) and config.eval.score_rest_at_end:
    fields["routed_rest"] = True  # the rest of the split routed too, untimed
  if _routed(config) and config.task == "lm":
    # Text pools once routed each window on all of its tokens, targets included: a new key,
    # so no such cached routing is ever read back.
    fields["route_scheme"] = "prefix"
  if config.distill.method != "none" and config.distill.proxy == "lipt":
    # LiPT proxies were once pruned by value (zero-initialised parameters frozen) and merged
    # with averaged BatchNorm statistics: a new key, so no such pool is read back.
    fields["lipt_proxy"] = "snip_mask_in_state,bn_reestimated"
  if config.distill.get("kmeans_balance") == "sinkhorn":
    # The Sinkhorn balance once took one price step per Lloyd step at a fixed temperature:
    # a new key, so no such pool is read back.
    fields["sinkhorn_scheme"] = "annealed_overrelaxed"
  blob = json.dumps(fields, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fingerprint(data) -> str:
  """Size, info and a hash of a spread of training examples."""
  n = len(data.train)
  h = hashlib.sha256(json.dumps(data.info, sort_keys=True, default=str).encode())
  for i in np.linspace(0, n - 1, num=min(n, 64)).astype(int):
    for key, value in sorted(data.train.get(int(i)).items()):
      h.update(key.encode() + np.ascontiguousarray(value).tobytes())
  return h.hexdigest()[:16]


def proxy_config(config):
  """The proxy run: the stacked engine with `proxy_models` small workers on random streams."""
  d = config.distill
  p = copy.deepcopy(config)
  p.method.name, p.method.sampler, p.method.aggregation = "ensemble", "random", "logits"
  p.method.num_workers, p.method.steps_per_worker = d.proxy_models, d.proxy_steps
  p.method.shared_init = False
  p.model.width = d.proxy_width
  if d.proxy == "lipt":
    p.method.shared_init, p.method.sampler = True, "disjoint"
    p.data.train_augment, p.model.sparsity = "crop_flip", d.lipt_sparsity
  workers = math.gcd(d.proxy_models, jax.device_count())
  p.mesh = [("worker", workers), ("data", jax.device_count() // workers)]
  p.train.stop_at_target = False
  p.eval.every_steps, p.eval.num_examples = d.proxy_steps, min(config.eval.num_examples or 1000,
                                                               1000)
  p.checkpoint.every_steps = 0
  p.distill.method = "none"
  return p


def build(config, data, num_consumers: int, proxy_dir: str):
  """Trains the proxies, scores the training set and selects the pools.

  The proxies run in `proxy_dir`. Returns (pools, weights, eval routing or None, info)."""
  d = config.distill
  start = time.perf_counter()
  if config.task == "lm":
    return _text_clusters(config, data, num_consumers, start)
  if d.method == "kmeans" and d.embedding == "pca":
    return _pixel_clusters(config, data, num_consumers, start)
  proxy = train.fit(proxy_config(config), proxy_dir)
  proxy_flops = proxy.results["flops_per_step"] * proxy.results["steps"]
  proxy_state = merged_proxy(proxy, config.seed) if d.proxy == "lipt" else proxy.state
  logits_MxExC, features_MxExD, labels_E, score_flops = forward(
      proxy_state, proxy.method.step_config, data.train, data.eval_transform,
      config.eval.batch_size)
  scoring_done = time.perf_counter()
  weights = route = None
  if d.method in ("el2n", "loss", "grand"):
    selected, pools = _scored(config, logits_MxExC, features_MxExD, labels_E, num_consumers)
  elif d.method == "kmeans":
    selected, pools, route, eval_flops = _proxy_clusters(
        config, data, proxy, proxy_state, features_MxExD, num_consumers)
    if route is not None:
      score_flops += eval_flops
  else:
    selected, weights, pools = _coreset(config, logits_MxExC, features_MxExD, labels_E,
                                        num_consumers)
  info = {
      "method": d.method, "pool_size": int(len(selected)),
      "pool_sizes": [int(len(p)) for p in pools], "split": d.split,
      "build_time_s": time.perf_counter() - start,
      "build_flops": proxy_flops + score_flops,
      "proxy": {"kind": d.proxy, "models": d.proxy_models, "steps": d.proxy_steps,
                "width": d.proxy_width,
                "train_time_s": proxy.results["train_time_s"],
                "wall_time_s": proxy.results["wall_time_s"], "flops": proxy_flops,
                "accuracy": proxy.results["final"].get("accuracy")},
      "scoring_flops": score_flops,
      "selection_time_s": time.perf_counter() - scoring_done,
      "weighted": weights is not None,
  }
  return pools, weights, route, info


def _scored(config, logits_MxExC, features_MxExD, labels_E, num_consumers: int):
  """Keeps the `fraction` of examples the proxies score hardest or easiest; and its split."""
  d = config.distill
  per_proxy = [scores.grand_scores(l, labels_E, f) if d.method == "grand" else
               SCORES[d.method](l, labels_E) for l, f in zip(logits_MxExC, features_MxExD)]
  selected = scores.select_by_score(scores.average_over_proxies(per_proxy), d.fraction,
                                    d.keep, labels_E, d.per_class)
  return selected, split(selected, num_consumers, config.seed, d.split)


def _proxy_clusters(config, data, proxy, proxy_state, features_MxExD, num_consumers: int):
  """Balanced k-means of proxy 0's embeddings, one cluster per worker.

  With `routed` aggregation every eval example is routed by proxy 0's embedding of it.
  Returns (selected, pools, eval routing or None, the FLOPs of embedding the eval split).
  """
  d = config.distill
  mean, std = features_MxExD[0].mean(0), features_MxExD[0].std(0) + 1e-6
  assignment, centroids = clusters.kmeans((features_MxExD[0] - mean) / std, num_consumers,
                                          seed=config.seed, balanced=d.balanced,
                                          balance=d.kmeans_balance)
  pools = [np.flatnonzero(assignment == i) for i in range(num_consumers)]
  selected = np.arange(len(assignment))
  route, eval_flops = None, 0.0
  if _routed(config):
    _, eval_features, _, eval_flops = forward(
        proxy_state, proxy.method.step_config, _scored_eval(config, data), data.eval_transform,
        config.eval.batch_size)
    route = np.asarray(clusters.routing_weights(
        (eval_features[0] - mean) / std, centroids,
        d.route_temperature * centroids.shape[1], min(d.route_top_k, num_consumers)))
  return selected, pools, route, eval_flops


def _coreset(config, logits_MxExC, features_MxExD, labels_E, num_consumers: int):
  """CRAIG or GradMatch on all proxies' last-layer gradients side by side.

  Returns (selected, weights [E] with mean 1 over the coreset, pools)."""
  d = config.distill
  n = len(labels_E)

  def gradients(rows):  # [len(rows), D]: computed per class when selecting per class
    return np.concatenate([coresets.last_layer_gradients(
        f[rows], l[rows], labels_E[rows], include_weight=d.gradient == "last_layer")
        for l, f in zip(logits_MxExC, features_MxExD)], axis=1)

  k = max(1, int(round(d.fraction * n)))
  kwargs = {"lam": d.gradmatch_lambda} if d.method == "gradmatch" else {}
  select = coresets.gradmatch if d.method == "gradmatch" else coresets.craig
  if d.per_class:
    selected, w = coresets.per_class(select, gradients, labels_E, k, **kwargs)
  else:
    selected, w = select(gradients(np.arange(n)), k, **kwargs)
  weights = np.zeros(n, np.float32)
  weights[selected] = w / w.mean()  # mean weight 1 over the coreset
  return selected, weights, split(selected, num_consumers, config.seed, d.split)


def pixel_embedding(config, data):
  """What the PCA pool clusters: (the fitted `PixelPCA`, the training images' standardised
  projections [E, pca_dim], their mean and std before standardising)."""
  d = config.distill
  pca = clusters.PixelPCA(d.pca_dim, config.data.mean, config.data.std,
                          pca_transform(config, data), covariance=d.pca_covariance)
  train_ExD = pca.fit(data.train)
  mean, std = train_ExD.mean(0), train_ExD.std(0) + 1e-6
  return pca, (train_ExD - mean) / std, mean, std


def pca_transform(config, data):
  """The images the PCA reads: the eval transform's, at `distill.pca_image_size` if set
  (the eval resize scaled alike, then the center crop)."""
  size = config.distill.pca_image_size
  if not size or size == config.data.image_size:
    return data.eval_transform
  small = copy.deepcopy(config.data)
  small.image_size = size
  small.eval_resize = round(config.data.eval_resize * size / config.data.image_size)
  return images.make_transform(small, train=False)


def _pixel_clusters(config, data, num_consumers: int, start: float):
  """Balanced k-means of the standardised pixels' top principal components, no proxy;
  with `routed` aggregation each eval image is routed by its own projection."""
  d, iters = config.distill, 20
  pca, train_ExD, mean, std = pixel_embedding(config, data)
  assignment, centroids = clusters.kmeans(train_ExD, num_consumers, seed=config.seed,
                                          iters=iters, balanced=d.balanced,
                                          balance=d.kmeans_balance)
  pools = [np.flatnonzero(assignment == i) for i in range(num_consumers)]
  route = None
  if _routed(config):  # the proxy path's rule: temperature per standardised dimension
    # Projected in whole chunks of `pca.chunk` images, as the whole split is: a BLAS product
    # of another shape may round differently, and the routing would not be the same.
    def routing(rows: int) -> np.ndarray:  # of the first `rows` eval images
      whole = _Head(data.eval, min(len(data.eval), -(-rows // pca.chunk) * pca.chunk))
      return np.asarray(clusters.routing_weights(
          (pca.transform(whole)[:rows] - mean) / std, centroids,
          d.route_temperature * centroids.shape[1], min(d.route_top_k, num_consumers)))

    route = routing(len(_scored_eval(config, data)))
  build_time_s = time.perf_counter() - start
  if route is not None and config.eval.score_rest_at_end:
    # The rest of the split, scored once at the end: routed after the build is timed (no
    # part of the run's cost); the scored rows stay the timed routing's.
    route = np.concatenate([route, routing(len(data.eval))[len(route):]])
  n, dim = train_ExD.shape
  features = f"PCA of standardised pixels to {dim}"
  if d.pca_image_size and d.pca_image_size != config.data.image_size:
    features += f" (images at {d.pca_image_size}x{d.pca_image_size})"
  if d.pca_covariance != "float64":
    features += f" ({d.pca_covariance} covariance)"
  if d.kmeans_balance != "greedy":
    features += f" ({d.kmeans_balance}-balanced k-means)"
  info = {
      "method": "kmeans", "features": features,
      "pool_size": n, "pool_sizes": [int(len(p)) for p in pools], "split": "clusters",
      "build_time_s": build_time_s,
      # The covariance and projections (PixelPCA.flops) plus Lloyd's distances (3 E k D
      # per iteration and the final assignment); the eigendecomposition (P^3) is host-only.
      "build_flops": pca.flops + float(3 * n * num_consumers * dim * (iters + 1)),
      "proxy": None, "scoring_flops": 0.0, "selection_time_s": build_time_s,
      "weighted": False,
  }
  return pools, None, route, info


def text_embedding(config, data):
  """What the text pool clusters: (the fitted `TfIdf`, the training windows' embeddings)."""
  tfidf = clusters.TfIdf(data.num_classes, config.distill.tfidf_dim)
  return tfidf, tfidf.fit(data.train, seed=config.seed)


def _text_clusters(config, data, num_consumers: int, start: float):
  """c-BTM: balanced k-means of the training windows' tf-idf; each eval position routed by
  the tf-idf of its running prefix [E, T, N], so no prediction's routing sees its target."""
  d = config.distill
  tfidf, train_ExD = text_embedding(config, data)
  iters = 20
  assignment, centroids = clusters.kmeans(train_ExD, num_consumers, seed=config.seed,
                                          iters=iters, balanced=d.balanced,
                                          balance=d.kmeans_balance)
  pools = [np.flatnonzero(assignment == i) for i in range(num_consumers)]
  route = None
  if _routed(config):
    prefixes_ExTxD = tfidf.transform_prefixes(_scored_eval(config, data))
    m, t, dim = prefixes_ExTxD.shape
    route = np.zeros((m, t, num_consumers), np.float32)
    rows = max(1, 65536 // max(t, 1))  # windows per routing call: bounded device memory
    for i in range(0, m, rows):
      # Blocks of the shapes the whole split is routed in: another shape may round apart.
      block = prefixes_ExTxD[i:i + rows]
      size = min(rows, len(data.eval) - i)
      block = np.concatenate([block, np.zeros((size - len(block), t, dim), block.dtype)])
      route[i:i + rows] = np.asarray(clusters.routing_weights(
          block.reshape(-1, dim), centroids, d.route_temperature,
          min(d.route_top_k, num_consumers))).reshape(-1, t, num_consumers)[:len(route) - i]
  n, dim = train_ExD.shape
  info = {
      "method": "kmeans", "features": f"tf-idf of token windows, SVD to {dim}" + (
          f" ({d.kmeans_balance}-balanced k-means)" if d.kmeans_balance != "greedy" else ""),
      "pool_size": n, "pool_sizes": [int(len(p)) for p in pools], "split": "clusters",
      "build_time_s": time.perf_counter() - start,
      # Lloyd's distances (3 E k D per iteration, plus the final assignment); the tf-idf
      # counting and the sparse SVD run on the host and are in build_time_s only.
      "build_flops": float(3 * n * num_consumers * dim * (iters + 1)),
      "proxy": None, "scoring_flops": 0.0, "selection_time_s": time.perf_counter() - start,
      "weighted": False,
  }
  return pools, None, route, info


def merged_proxy(proxy, seed: int):
  """Ro et al.'s merged proxy: the members' weight average, as a stack of one.

  Its BatchNorm statistics are re-estimated for the merged weights on the members' own
  augmented train batches. That is the soup aggregation's rule; the members' averaged
  statistics would not match the merged weights."""
  method, data = proxy.method, proxy.data
  train_batches = pipeline.TrainBatches(data.train, method.sampler(len(data.train), seed),
                                        data.train_transform, method.train_layout, seed)
  bn_batches = ensemble.stacked_train_batches(train_batches,
                                              method.config.method.soup_bn_batches)
  one = jax.jit(functools.partial(ensemble.soup_state, method.model, method.step_config))(
      proxy.state, jax.numpy.ones(method.num_workers), bn_batches)
  stack = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731
  # The members' masks differ; the merged proxy only predicts, so it carries none.
  return proxy.state.replace(params=stack(one.params), batch_stats=stack(one.batch_stats),
                             prune_mask=None)


def split(selected, num_consumers: int, seed: int, how: str) -> list[np.ndarray]:
  if how == "shared":
    return [np.asarray(selected)] * num_consumers
  return samplers.split_pool(selected, num_consumers, seed, disjoint=how == "disjoint")


def forward(stacked_state, step_config, source, transform, batch_size: int):
  """Every proxy's eval-mode logits and penultimate features on a whole split.

  Returns logits [M, E, C], features [M, E, D], labels [E] and their XLA FLOPs. Batches
  have a fixed size and are sharded over all devices."""
  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  batch_size = -(-batch_size // mesh.size) * mesh.size
  layout = pipeline.BatchLayout((batch_size,), NamedSharding(mesh, P("data")))
  batches = pipeline.EvalBatches(source, transform, layout)
  num_models = jax.tree.leaves(stacked_state.params)[0].shape[0]
  replicated = NamedSharding(mesh, P())

  @jax.jit
  def apply(state, batch):
    logits, features = step_lib.predict_with_features(state, batch, step_config)
    return logits, features, batch["label"]

  members = [jax.device_put(jax.tree.map(lambda x, m=m: x[m], stacked_state), replicated)
             for m in range(num_models)]
  outs, labels, compiled = [], [], None
  for batch in batches:  # each example is loaded once and scored by every proxy
    if compiled is None:
      compiled = apply.lower(members[0], batch).compile()
    per_member = [compiled(member, batch) for member in members]
    outs.append([[np.asarray(x) for x in o[:2]] for o in per_member])
    labels.append(np.asarray(per_member[0][2]))
  n = len(source)
  logits = np.stack([np.concatenate([o[m][0] for o in outs])[:n] for m in range(num_models)])
  features = np.stack([np.concatenate([o[m][1] for o in outs])[:n] for m in range(num_models)])
  labels = np.concatenate(labels)[:n]
  flops = costs.flops(compiled) * mesh.size * batches.num_batches * num_models
  return logits, features, labels.astype(np.int32), flops
