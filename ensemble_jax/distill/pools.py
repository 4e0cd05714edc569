"""Pools: the data each worker's distilled sequence draws from, built above the loop.

`create` builds the pool `config.distill.builder` names, or reads it from its cache, and
hands it to the loop; the builders, the cache key and the cost: docs/design.md.
"""
from __future__ import annotations

import copy
import dataclasses
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

from ensemble_jax import config_lib, costs, record, stored, train
from ensemble_jax import data as data_lib
from ensemble_jax.data import images, pipeline
from ensemble_jax import aggregate
from ensemble_jax.distill import clusters, coresets, scores
from ensemble_jax.distill import pool as pool_lib
from ensemble_jax.distill import synthetic  # noqa: F401  (registers the distillers)
from ensemble_jax.distill.registry import (BUILDERS, BuildInputs, Built, pool_info,
                                          register_builder)
from ensemble_jax.methods import ensemble
from ensemble_jax.methods import step as step_lib

def create(config, data, num_consumers: int, workdir: str) -> pool_lib.Pool | None:
  """The run's distilled pool, built or read from cache, split for `num_consumers` workers
  (the method's `num_workers`); None when config.distill.builder is 'none'."""
  if BUILDERS[config.distill.builder].build is None:
    return None
  path = cache_path(config, data, num_consumers, workdir)
  if os.path.exists(path):
    logging.info("distill: the %s pool read from %s", config.distill.builder, path)
    built = _read(path)
    built.info["cached"] = path
  else:
    logging.info("distill: building the %s pool for %d workers (cached in %s)",
                 config.distill.builder, num_consumers, path)
    built = build(config, data, num_consumers, _proxy_dir(path))
    logging.info("distill: pool built in %.1f s", built.info["build_time_s"])
    _write(path, built)
    built.info = {**built.info, "cached": False}
  return pool_of(built, data, config.seed, config.distill.synthetic_fraction,
                 config.distill.synthetic_augment)


def pool_of(built: Built, data, seed: int, switch_fraction: float = 0.0,
            synthetic_augment: str = "dsa") -> pool_lib.Pool:
  """The loop's view of a built pool: its sampler over what its indices refer to (the
  training split, or the pool's own data after it). A pool with data of its own and
  `then` pools reads its own for `switch_fraction` of a run, then `then` (0: only its own);
  its own examples are augmented in training as `synthetic_augment` says."""
  source, pools = None, built.pools
  num_examples = len(data.train)
  if built.source is not None:
    source = images.ImageSource(built.source["image"], built.source["label"],
                                data.num_classes, "distilled")
    if switch_fraction:  # the training split, then the pool's own examples
      source = SyntheticSource(source, real=data.train)
      pools = [p + len(data.train) for p in pools]
    else:
      source = SyntheticSource(source)
    num_examples = len(source)
  sampler = pool_lib.PoolSampler(pools, num_examples, seed, built.weights)
  info = built.info
  if switch_fraction:
    if built.then is None:
      raise ValueError("a staged pool needs the builder's `then` pools (what follows its own)")
    sampler = pool_lib.StagedSampler(
        sampler, pool_lib.PoolSampler(built.then, num_examples, seed), switch_fraction)
  if built.source is not None:
    info = {**info, "distillation": {**info.get("distillation", {}),
                                     "synthetic_fraction": switch_fraction,
                                     "train_augmentation": synthetic_augment}}
  return pool_lib.Pool(sampler, info, built.route, source)


class SyntheticSource:
  """A pool's own examples, each marked `synthetic` for the step's augmentation
  (`distill.synthetic_augment`, `step.augmented`); with `real` ahead of them, its
  examples first, as floats, marked 0."""

  def __init__(self, synthetic, real=None):
    self.synthetic, self.real = synthetic, real
    self.offset = 0 if real is None else len(real)

  def __len__(self) -> int:
    return self.offset + len(self.synthetic)

  def get(self, index: int) -> dict:
    index = int(index)
    if index < self.offset:
      example = self.real.get(index)
      return {**example, "image": np.asarray(example["image"], np.float32),
              "synthetic": np.float32(0)}
    return {**self.synthetic.get(index - self.offset), "synthetic": np.float32(1)}


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
  fields. The new info's `retimed` says which check it passed, `retimed_on` on which host
  and at what load average."""
  if not proxy_free(config):
    raise ValueError(f"distill.builder={config.distill.builder!r} trains a proxy: only the "
                     "proxy-free pools (PCA of pixels, tf-idf of text) are re-timed here")
  built = build(config, data, num_consumers, _proxy_dir(path))
  if os.path.exists(path):
    cached, check = _read(path), "bit for bit the cached pool"
    for name in ("pools", "weights", "route"):
      old, new = getattr(cached, name), getattr(built, name)
      same = (old is None) == (new is None) and (old is None or (
          len(old) == len(new) and all(np.array_equal(a, b) for a, b in zip(old, new))
          if name == "pools" else np.array_equal(old, new)))
      if not same:
        raise PoolChanged(f"the pool cached in {path} and the one this code builds differ in "
                         f"their {name}: the runs that read it trained on another pool; "
                         "train them again rather than re-time it")
  else:
    check = "the cluster sizes its runs recorded (the cached pool was not kept)"
    if built.info["pool_sizes"] != recorded["pool_sizes"]:
      raise PoolChanged(f"no cached pool {path}, and this code's build has other cluster sizes "
                       "than its runs recorded: they trained on another pool; train them "
                       "again rather than re-time it")
  # Where and how quietly it was timed: a pool's build time is host work, read beside it.
  built.info = {**built.info, "retimed": check,
                "retimed_on": {**record.host_info(), "load_average_1min": os.getloadavg()[0]}}
  _write(path, built)
  return built.info


def proxy_free(config) -> bool:
  """Whether `config`'s pool is built without training a proxy."""
  return not BUILDERS[config.distill.builder].uses_proxy(config)


def _proxy_dir(path: str) -> str:
  return os.path.join(os.path.dirname(path), f"proxy_{os.path.basename(path)[:-len('.npz')]}")


def _read(path: str) -> Built:
  """A cached pool, its info under today's keys."""
  with np.load(path) as f:
    built = Built(pools=np.split(f["indices"], f["offsets"][1:-1]),
                  info=stored.migrate_info(json.loads(str(f["info"]))),
                  weights=f["weights"] if f["weights"].size else None,
                  route=f["route"] if f["route"].size else None)
    if "source_image" in f:  # a pool carrying data of its own
      built.source = {"image": f["source_image"], "label": f["source_label"]}
    if "then_indices" in f:
      built.then = np.split(f["then_indices"], f["then_offsets"][1:-1])
  return built


def _write(path: str, built: Built) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  offsets = np.cumsum([0] + [len(p) for p in built.pools])
  tmp = f"{path}.{os.getpid()}.tmp.npz"  # the processes of a multi-host run write alike
  extra = {}
  if built.source is not None:
    extra.update(source_image=built.source["image"], source_label=built.source["label"])
  if built.then is not None:
    extra.update(then_indices=np.concatenate(built.then),
                 then_offsets=np.cumsum([0] + [len(p) for p in built.then]))
  np.savez(tmp, indices=np.concatenate(built.pools), offsets=offsets,
           weights=np.zeros(0) if built.weights is None else built.weights,
           route=np.zeros(0) if built.route is None else built.route,
           info=json.dumps(built.info), **extra)
  os.replace(tmp, path)  # whole or absent: an interrupted build leaves no pool behind


def _routed(config) -> bool:
  return aggregate.routed(config_lib.aggregation_modes(config))


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


# The distill fields every pool built before the builder registry hashed, read or not, and
# `distill.builder` hashed as "method": `legacy_key` builders hash them so that those pools
# keep their keys. A field of theirs added to the schema since enters their key only away
# from its default (the value every earlier pool was built with); others never do.
LEGACY_KEY_FIELDS = ("fraction", "keep", "per_class", "split", "gradient",
                     "gradmatch_lambda", "balanced", "tfidf_dim", "embedding", "pca_dim",
                     "route_temperature", "route_top_k", "proxy_models", "proxy_steps",
                     "proxy_width", "proxy", "lipt_sparsity")


def cache_key(config, data, num_consumers: int) -> str:
  """A hash of everything `config`'s pool depends on: the fields its builder reads, the
  workers, the data's fingerprint and, for a routed pool, the eval examples it routes."""
  builder = BUILDERS[config.distill.builder]
  fields = {"consumers": num_consumers, "fingerprint": fingerprint(data)}
  if builder.legacy_key:
    fields.update(_legacy_key_fields(config, builder))
  else:
    fields["builder"] = builder.name
    fields["reads"] = {name: config_lib.get(config, name) for name in builder.reads(config)}
    fields["reads"] = json.loads(json.dumps(fields["reads"], default=_plain))
  if builder.routes and _routed(config):
    fields["routed"] = True
    if len(_scored_eval(config, data)) < len(data.eval):
      # The routing covers only the examples the evaluation scores.
      fields["routed_eval_examples"] = len(_scored_eval(config, data))
    if config.eval.score_rest_at_end:
      fields["routed_rest"] = True  # the rest of the split routed too, untimed
  blob = json.dumps(fields, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _plain(value):
  """ConfigDicts and tuples in JSON form."""
  return value.to_dict() if hasattr(value, "to_dict") else str(value)


def _legacy_key_fields(config, builder) -> dict:
  """The key's fields as every pool built before the registry was cached under."""
  d = config.distill
  default = config_lib.base_config().distill
  distill = {"method": d.builder, **{k: d[k] for k in LEGACY_KEY_FIELDS}}
  for name in builder.fields:
    group, _, field = name.partition(".")
    if group == "distill" and field not in distill:
      if d.get(field, default[field]) != default[field]:  # absent: an older config's
        distill[field] = d[field]
  fields = {"distill": distill, "routed": _routed(config), "eval_split": config.eval.split,
            "model": config.model.to_dict(), "data": config.data.to_dict(),
            "optim": config.optim.to_dict(), "batch": config.train.batch_size,
            "seed": config.seed}
  if _routed(config) and config.task == "lm":
    # Text pools once routed each window on all of its tokens, targets included: a new key,
    # so no such cached routing is ever read back.
    fields["route_scheme"] = "prefix"
  if d.proxy == "lipt":
    # LiPT proxies were once pruned by value (zero-initialised parameters frozen) and merged
    # with averaged BatchNorm statistics: a new key, so no such pool is read back.
    fields["lipt_proxy"] = "snip_mask_in_state,bn_reestimated"
  if d.get("kmeans_balance") == "sinkhorn":
    # The Sinkhorn balance once took one price step per Lloyd step at a fixed temperature:
    # a new key, so no such pool is read back.
    fields["sinkhorn_scheme"] = "annealed_overrelaxed"
  return fields


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
  p.distill.builder = "none"
  return p


def build(config, data, num_consumers: int, proxy_dir: str) -> Built:
  """`config`'s pool, built by its registered builder (not cached); a proxy, if any, runs
  in `proxy_dir`."""
  builder = BUILDERS[config.distill.builder]
  return builder.build(BuildInputs(builder.view(config), data, num_consumers, proxy_dir))


@dataclasses.dataclass
class Proxy:
  """Trained proxies and their outputs over the training set (`train_proxy`)."""
  fit: train.Fit
  state: object  # stacked over the M proxies (one merged proxy for LiPT)
  logits_MxExC: np.ndarray
  features_MxExD: np.ndarray
  labels_E: np.ndarray
  train_flops: float
  scoring_flops: float
  scored_at: float  # perf_counter() once the training set was scored

  def info(self, config) -> dict:
    d, r = config.distill, self.fit.results
    return {"kind": d.proxy, "models": d.proxy_models, "steps": d.proxy_steps,
            "width": d.proxy_width, "train_time_s": r["train_time_s"],
            "wall_time_s": r["wall_time_s"], "flops": self.train_flops,
            "accuracy": r["final"].get("accuracy")}


def train_proxy(inputs: BuildInputs) -> Proxy:
  """Trains `proxy_config`'s proxies through the loop in `inputs.proxy_dir` (its
  results.json sits next to the cached pool) and scores the training set with them."""
  config, data = config_lib.full_config(inputs.config), inputs.data  # PROXY_FIELDS: read
  fit = train.fit(proxy_config(config), inputs.proxy_dir)
  state = merged_proxy(fit, config.seed) if config.distill.proxy == "lipt" else fit.state
  logits, features, labels, flops = forward(state, fit.method.step_config, data.train,
                                            data.eval_transform, config.eval.batch_size)
  return Proxy(fit, state, logits, features, labels,
               fit.results["flops_per_step"] * fit.results["steps"], flops,
               time.perf_counter())


def _proxy_pool(inputs: BuildInputs, proxy: Proxy, selected, pools, weights=None,
                route=None, eval_flops: float = 0.0) -> Built:
  """A pool selected with a proxy's help, its info charging the proxy and the scoring."""
  scoring_flops = proxy.scoring_flops + eval_flops
  info = pool_info(inputs, pools, pool_size=len(selected),
                   build_flops=proxy.train_flops + scoring_flops,
                   proxy=proxy.info(inputs.config), scoring_flops=scoring_flops,
                   selection_time_s=time.perf_counter() - proxy.scored_at,
                   weighted=weights is not None)
  return Built(pools, info, weights, route)


BUILDERS.register("none", None, tasks=None)  # the method's own sampler


def _register_scores(name: str, score) -> None:
  """Builder `name`: keeps the `fraction` of examples the proxies' `score(logits_ExC,
  labels_E, features_ExD)` ranks hardest or easiest, averaged over the proxies."""
  @register_builder(name, fields=("distill.fraction", "distill.keep", "distill.per_class",
                                  "distill.split"), proxy=True, legacy_key=True)
  def build_scored(inputs: BuildInputs) -> Built:
    d, proxy = inputs.config.distill, train_proxy(inputs)
    per_proxy = [score(l, proxy.labels_E, f)
                 for l, f in zip(proxy.logits_MxExC, proxy.features_MxExD)]
    selected = scores.select_by_score(scores.average_over_proxies(per_proxy), d.fraction,
                                      d.keep, proxy.labels_E, d.per_class)
    return _proxy_pool(inputs, proxy, selected,
                       split(selected, inputs.num_consumers, inputs.config.seed, d.split))


_register_scores("el2n", lambda logits, labels, _: scores.el2n_scores(logits, labels))
_register_scores("grand", scores.grand_scores)
_register_scores("loss", lambda logits, labels, _: scores.loss_scores(logits, labels))


def _kmeans_trains_proxy(config) -> bool:
  return config.task != "lm" and config.distill.embedding == "proxy"


def _kmeans_check(config) -> None:
  d = config.distill
  rest = config.eval.score_rest_at_end and config.eval.num_examples > 0  # 0: the whole split
  if rest and _routed(config) and (config.task == "lm" or d.embedding != "pca"):
    raise config_lib.ConfigError(
        f"config.eval.score_rest_at_end=True: with routed aggregation, only distill.embedding="
        "'pca' image pools route the eval examples past eval.num_examples: turn it off.")


def _one_pool_per_worker(method) -> bool:
  """A method whose workers are models of their own, each drawing its own cluster."""
  return method.stacked


@register_builder("kmeans", fields=(
    "distill.balanced", "distill.kmeans_balance", "distill.embedding", "distill.pca_dim",
    "distill.pca_covariance", "distill.pca_image_size", "distill.tfidf_dim",
    "distill.route_temperature", "distill.route_top_k",
    # read too, their legacy key as before (it hashes the data, seed and routing)
    "task", "seed", "data", "method.aggregation", "eval.num_examples",
    "eval.score_rest_at_end"), proxy=_kmeans_trains_proxy,
    routes=True, tasks=None, methods=_one_pool_per_worker, check=_kmeans_check,
    legacy_key=True)
def build_kmeans(inputs: BuildInputs) -> Built:
  """k = workers balanced clusters, worker i drawing cluster i: of a proxy's penultimate
  features, of the pixels' top principal components (`embedding='pca'`, no proxy), or, for
  language models (c-BTM), of the windows' tf-idf (no proxy)."""
  config, data, n = inputs.config, inputs.data, inputs.num_consumers
  if config.task == "lm":
    return _text_clusters(inputs)
  if config.distill.embedding == "pca":
    return _pixel_clusters(inputs)
  proxy = train_proxy(inputs)
  selected, pools, route, eval_flops = _proxy_clusters(config, data, proxy, n)
  return _proxy_pool(inputs, proxy, selected, pools, route=route, eval_flops=eval_flops)


def _proxy_clusters(config, data, proxy: Proxy, num_consumers: int):
  """Balanced k-means of proxy 0's embeddings, one cluster per worker.

  With `routed` aggregation every eval example is routed by proxy 0's embedding of it.
  Returns (selected, pools, eval routing or None, the FLOPs of embedding the eval split).
  """
  d, features_ExD = config.distill, proxy.features_MxExD[0]
  mean, std = features_ExD.mean(0), features_ExD.std(0) + 1e-6
  assignment, centroids = clusters.kmeans((features_ExD - mean) / std, num_consumers,
                                          seed=config.seed, balanced=d.balanced,
                                          balance=d.kmeans_balance)
  pools = [np.flatnonzero(assignment == i) for i in range(num_consumers)]
  selected = np.arange(len(assignment))
  route, eval_flops = None, 0.0
  if _routed(config):
    _, eval_features, _, eval_flops = forward(
        proxy.state, proxy.fit.method.step_config, _scored_eval(config, data),
        data.eval_transform, config.eval.batch_size)
    route = np.asarray(clusters.routing_weights(
        (eval_features[0] - mean) / std, centroids,
        d.route_temperature * centroids.shape[1], min(d.route_top_k, num_consumers)))
  return selected, pools, route, eval_flops


def _register_coreset(name: str, select, fields: tuple[str, ...], **kwargs) -> None:
  """Builder `name`: `select` (CRAIG or GradMatch) on all proxies' last-layer gradients
  side by side; each example's weight, mean 1 over the coreset, enters the loss."""
  @register_builder(name, fields=("distill.fraction", "distill.per_class", "distill.split",
                                  "distill.gradient") + fields, proxy=True, legacy_key=True)
  def build_coreset(inputs: BuildInputs) -> Built:
    d, proxy = inputs.config.distill, train_proxy(inputs)
    labels_E = proxy.labels_E
    n = len(labels_E)

    def gradients(rows):  # [len(rows), D]: computed per class when selecting per class
      return np.concatenate([coresets.last_layer_gradients(
          f[rows], l[rows], labels_E[rows], include_weight=d.gradient == "last_layer")
          for l, f in zip(proxy.logits_MxExC, proxy.features_MxExD)], axis=1)

    k = max(1, int(round(d.fraction * n)))
    options = {key: d[field] for key, field in kwargs.items()}
    if d.per_class:
      selected, w = coresets.per_class(select, gradients, labels_E, k, **options)
    else:
      selected, w = select(gradients(np.arange(n)), k, **options)
    weights = np.zeros(n, np.float32)
    weights[selected] = w / w.mean()  # mean weight 1 over the coreset
    return _proxy_pool(inputs, proxy, selected,
                       split(selected, inputs.num_consumers, inputs.config.seed, d.split),
                       weights)


_register_coreset("craig", coresets.craig, ())
_register_coreset("gradmatch", coresets.gradmatch, ("distill.gradmatch_lambda",),
                  lam="gradmatch_lambda")


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


def _pixel_clusters(inputs: BuildInputs) -> Built:
  """Balanced k-means of the standardised pixels' top principal components, no proxy;
  with `routed` aggregation each eval image is routed by its own projection."""
  config, data, num_consumers = inputs.config, inputs.data, inputs.num_consumers
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
  build_time_s = time.perf_counter() - inputs.start
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
  # The covariance and projections (PixelPCA.flops) plus Lloyd's distances (3 E k D per
  # iteration and the final assignment); the eigendecomposition (P^3) is host-only.
  flops = pca.flops + float(3 * n * num_consumers * dim * (iters + 1))
  info = pool_info(inputs, pools, pool_size=n, split="clusters", features=features,
                   build_flops=flops,
                   build_time_s=build_time_s)
  return Built(pools, info, route=route)


def text_embedding(config, data):
  """What the text pool clusters: (the fitted `TfIdf`, the training windows' embeddings)."""
  tfidf = clusters.TfIdf(data.num_classes, config.distill.tfidf_dim)
  return tfidf, tfidf.fit(data.train, seed=config.seed)


def _text_clusters(inputs: BuildInputs) -> Built:
  """c-BTM: balanced k-means of the training windows' tf-idf; each eval position routed by
  the tf-idf of its running prefix [E, T, N], so no prediction's routing sees its target."""
  config, data, num_consumers = inputs.config, inputs.data, inputs.num_consumers
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
  features = f"tf-idf of token windows, SVD to {dim}" + (
      f" ({d.kmeans_balance}-balanced k-means)" if d.kmeans_balance != "greedy" else "")
  # Lloyd's distances (3 E k D per iteration, plus the final assignment); the tf-idf
  # counting and the sparse SVD run on the host and are in build_time_s only.
  info = pool_info(inputs, pools, pool_size=n, split="clusters", features=features,
                   build_flops=float(3 * n * num_consumers * dim * (iters + 1)))
  return Built(pools, info, route=route)


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
  return pool_lib.split_pool(selected, num_consumers, seed, disjoint=how == "disjoint")


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
