"""Pool builders: `config.distill.builder` -> `Builder`, and what a builder returns.

A builder is one function and one registration (docs/design.md, "Adding a builder"):

    @registry.register_builder("mine", fields=("distill.fraction", "seed"))
    def build_mine(inputs: registry.BuildInputs) -> registry.Built:
      pools = [...]  # per worker, the training-example indices it draws from
      return registry.Built(pools, registry.pool_info(inputs, pools, pool_size=...,
                                                      build_flops=0.0))

`fields` are the config fields the builder reads (dotted); `own_fields` ({name: default or
config_lib.Field}) new ones of its own under `distill.`, which join the schema and its
fields. The build reads `inputs.config` through a view that refuses any other field.
Validation checks those and no others; the cache key (`pools.cache_key`) hashes those and
the data's fingerprint, so a field the builder does not read never rebuilds its pool. The
built-ins (`pools.py`) keep the key every committed pool was cached under (`legacy_key`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from ensemble_jax import config_lib
from ensemble_jax.registry import Registry

# What a builder that trains a proxy (`pools.train_proxy`) reads besides its own fields.
PROXY_FIELDS = ("distill.proxy_models", "distill.proxy_steps", "distill.proxy_width",
                "distill.proxy", "distill.lipt_sparsity", "model", "data", "optim",
                "train.batch_size", "eval.batch_size", "eval.num_examples", "seed")


@dataclasses.dataclass(frozen=True)
class BuildInputs:
  """What a builder receives: the run's config and data, its workers, where a proxy may
  run, and when the build started (`pool_info` times the build from it)."""
  config: object
  data: object  # data.Data: train/eval sources, transforms, num_classes
  num_consumers: int  # the method's workers: one pool each
  proxy_dir: str  # a workdir of the builder's own (a proxy's run)
  start: float = dataclasses.field(default_factory=time.perf_counter)


@dataclasses.dataclass
class Built:
  """What a builder returns: per-worker pools, loss weights, eval routing, and its info."""
  pools: list  # per worker: the training-example indices it draws from
  info: dict  # results.json `distill`: built by `pool_info`
  weights: np.ndarray | None = None  # [train examples] loss weights (coresets), or None
  route: np.ndarray | None = None  # eval routing [E, N] or [E, T, N] (`routes`), or None
  # Data of the pool's own, which `pools` (and `then`) index instead of the training split:
  # {'image': [S, H, W, C] float32 in pixel units (0-255, unclipped), 'label': [S] int32}.
  source: dict | None = None
  # per worker: what it may draw from after its own data (`distill.synthetic_fraction` of a
  # run; indices into the training split)
  then: list | None = None


@dataclasses.dataclass(frozen=True)
class Builder:
  """A registered pool builder and what validation, the cache and the engine must know.

  build: BuildInputs -> Built; None for 'none' (no pool: the method's own sampler).
  fields: the config fields it reads, dotted ('distill.fraction', 'seed', 'data', ...).
  proxy: whether it trains a proxy (a bool, or config -> bool): then it reads PROXY_FIELDS.
  routes: it can route eval examples, for a `routed` aggregation mode (`Built.route`).
  tasks: the config.task values it serves (None: all).
  methods: method class -> whether it serves that method (its capabilities, `Method.stacked`
    ...: a subclass is served as its parent is), or None: all.
  check: config -> None, raising ConfigError on a value it cannot use (beyond `fields`'
    own checks in validation.py).
  legacy_key: hash the key every pool built before this registry was cached under
    (`pools.cache_key`), so committed pools keep their keys: its `fields` are declared for
    reading, the key staying the one they were cached under.
  timed_apart: its `build_time_s` is timed apart (a calibrated iteration x iterations),
    not the build's wall clock, so a sweep need not build it in its quiet phase.
  synthetic: its pools hold examples of their own (`Built.source`), which the step
    augments as `distill.synthetic_augment` says: a sweep prices that augmentation
    (`cost_vs_time.augment_factor`).
  """
  name: str
  build: Callable | None
  fields: tuple[str, ...] = ()
  proxy: bool | Callable = False
  routes: bool = False
  tasks: tuple[str, ...] | None = ("classification",)
  methods: Callable[[type], bool] | None = None
  check: Callable | None = None
  legacy_key: bool = False
  timed_apart: bool = False
  synthetic: bool = False
  own_fields: tuple[str, ...] = ()  # dotted: the fields it declared (`own_fields=`)

  def uses_proxy(self, config) -> bool:
    return bool(self.proxy(config) if callable(self.proxy) else self.proxy)

  def reads(self, config) -> tuple[str, ...]:
    """Every config field this build of `config` reads."""
    return self.fields + (PROXY_FIELDS if self.uses_proxy(config) else ())

  def view(self, config):
    """`config` as its build reads it: the fields it declares (and its own name)."""
    return config_lib.View(config, self.reads(config) + ("distill.builder",),
                           f"pool builder {self.name!r}")


def _builder(name: str, build, *, fields=(), own_fields=(), **declaration) -> Builder:
  return Builder(name, build, fields=tuple(fields) + tuple(own_fields),
                 own_fields=tuple(own_fields), **declaration)


BUILDERS: Registry[Builder] = Registry("distill.builder", builtins="ensemble_jax.distill.pools",
                                       entry=_builder)

# Decorator: `@register_builder("name", fields=..., own_fields=..., ...)` registers
# `build(inputs: BuildInputs) -> Built` as `distill.builder=name` (BUILDERS.register itself);
# the keywords are the other `Builder` fields.
register_builder = BUILDERS.register


def pool_info(inputs: BuildInputs, pools, *, pool_size: int, build_flops: float,
              split: str | None = None, features: str | None = None, proxy: dict | None = None,
              scoring_flops: float = 0.0, build_time_s: float | None = None,
              selection_time_s: float | None = None, weighted: bool = False) -> dict:
  """The one form of a pool's `info` (results.json `distill`, the cost report's build).

  build_time_s: the wall clock of the build, by default from `inputs.start` until now;
  selection_time_s: of the selection alone, by default the whole build."""
  build_time_s = time.perf_counter() - inputs.start if build_time_s is None else build_time_s
  info = {"builder": inputs.config.distill.builder}
  if features is not None:
    info["features"] = features
  info.update({
      "pool_size": int(pool_size), "pool_sizes": [int(len(p)) for p in pools],
      "split": config_lib.full_config(inputs.config).distill.split if split is None else split,
      "build_time_s": build_time_s, "build_flops": float(build_flops), "proxy": proxy,
      "scoring_flops": float(scoring_flops),
      "selection_time_s": build_time_s if selection_time_s is None else selection_time_s,
      "weighted": weighted})
  return info
