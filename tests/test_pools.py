"""Pools wired into runs: a proxy through the engine, cost in results.json, a cache that is
reused and invalidated, coreset weights in the loss."""
import glob

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ensemble_jax import aggregate, config_lib, optim, run, validation
from ensemble_jax.distill import pool as pool_lib
from ensemble_jax.distill import pools
from ensemble_jax.methods import step as step_lib
from ensemble_jax.models import resnet

pytestmark = pytest.mark.unit


def _config(builder, cache_dir, **distill):
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.mesh = [("worker", 2), ("data", -1)]
  c.method.num_workers = 2
  c.data.train_examples = 256
  c.distill.builder = builder
  c.distill.proxy_steps, c.distill.proxy_width, c.distill.fraction = 2, 2, 0.25
  c.distill.cache_dir = str(cache_dir)
  for k, v in distill.items():
    c.distill[k] = v
  return c


@pytest.mark.e2e
def test_pool_is_built_costed_cached_and_invalidated(tmp_path):
  cache = tmp_path / "pools"
  r = run.train_and_evaluate(_config("el2n", cache), str(tmp_path / "a"))
  first = r["distill"]
  # 25% of 256, rounded within each class
  assert first["cached"] is False and abs(first["pool_size"] - 64) <= 5
  assert first["build_time_s"] > 0 and first["build_flops"] > first["proxy"]["flops"] > 0
  assert first["pool_sizes"] == [first["pool_size"]] * 2  # 'shared': both draw the pool
  assert len(glob.glob(str(cache / "*.npz"))) == 1
  assert glob.glob(str(cache / "proxy_*" / "results.json"))  # the proxy's own run record
  # The pool's cost is part of the method's: its compute and its critical path.
  assert r["cost"]["measured"]["flops"] == pytest.approx(
      r["flops_per_step"] * r["steps"] + first["build_flops"])
  # The pool phase alone (no training): the same config reads the cache, and reports the
  # original build's cost, which a run charges whether the pool was cached or not ...
  again = run.build_pool(_config("el2n", cache), str(tmp_path / "b"))
  assert again["cached"] and again["build_time_s"] == first["build_time_s"]
  assert again["build_flops"] == first["build_flops"]
  # ... and a field the pool depends on builds a new one.
  changed = run.build_pool(_config("el2n", cache, fraction=0.5), str(tmp_path / "c"))
  assert changed["cached"] is False and abs(changed["pool_size"] - 128) <= 5
  assert len(glob.glob(str(cache / "*.npz"))) == 2


@pytest.mark.e2e
def test_kmeans_pool_trains_routed_experts(tmp_path):
  config = _config("kmeans", tmp_path / "pools", split="disjoint")
  config.method.aggregation = "logits,routed,probs"
  r = run.train_and_evaluate(config, str(tmp_path / "run"))
  info = r["distill"]
  assert info["weighted"] is False and info["proxy"]["kind"] == "standard"
  assert info["pool_sizes"] == [128, 128]  # balanced: the 256 examples in two clusters
  routed, uniform = r["ensemble"]["routed"], r["ensemble"]["probs"]
  # Every eval example routed somewhere (an example with no weight would have nll inf),
  # and by its own weights: a uniform average would equal the 'probs' ensemble.
  assert routed["num_examples"] == uniform["num_examples"] == r["ensemble"]["logits"][
      "num_examples"] > 0
  assert np.isfinite(routed["nll"])
  assert routed["nll"] != pytest.approx(uniform["nll"], rel=1e-6)


@pytest.mark.e2e
@pytest.mark.parametrize("method,proxy", [("craig", "standard"), ("gradmatch", "lipt")])
def test_coreset_pools_are_weighted_and_split_disjointly(tmp_path, method, proxy):
  """The pool phase alone (the loop that reads a pool is tested above)."""
  info = run.build_pool(_config(method, tmp_path / "pools", split="disjoint", proxy=proxy),
                        str(tmp_path / "run"))
  assert info["weighted"] is True and info["proxy"]["kind"] == proxy
  # a ~64-example coreset split disjointly over the two workers
  assert len(info["pool_sizes"]) == 2
  assert sum(info["pool_sizes"]) == info["pool_size"] <= 69


@pytest.mark.e2e
def test_pixel_pca_pools_are_routed_clusters_without_a_proxy(tmp_path):
  config = _config("kmeans", tmp_path / "pools", embedding="pca", pca_dim=8)
  config.method.aggregation = "logits,routed,probs"
  r = run.train_and_evaluate(config, str(tmp_path / "run"))
  info = r["distill"]
  assert info["pool_sizes"] == [128, 128] and info["proxy"] is None  # balanced, no proxy
  assert "PCA" in info["features"] and info["build_flops"] > 2 * 256 * 784 * 784
  assert not glob.glob(str(tmp_path / "pools" / "proxy_*"))  # nothing was trained for it
  routed, uniform = r["ensemble"]["routed"], r["ensemble"]["probs"]
  assert np.isfinite(routed["nll"]) and routed["nll"] != pytest.approx(uniform["nll"], rel=1e-6)


class _Images:
  def __init__(self, images):
    self.images = images

  def __len__(self):
    return len(self.images)

  def get(self, i):
    return {"image": self.images[i], "label": np.int32(0)}


def test_pixel_pca_finds_the_planted_directions():
  from ensemble_jax.distill import clusters

  rng = np.random.default_rng(0)
  u, v = np.linalg.qr(rng.standard_normal((48, 2)))[0].T  # two orthonormal pixel directions
  a, b = 40 * rng.standard_normal((500, 1)), 15 * rng.standard_normal((500, 1))
  x = 128 + a * u + b * v + rng.standard_normal((500, 48))
  images = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(500, 4, 4, 3)
  pca = clusters.PixelPCA(2, mean=(0.5,) * 3, std=(0.25,) * 3,
                          transform=lambda example, u: example, chunk=128)
  z = pca.fit(_Images(images))
  # The first component is u (the larger variance), the second v, up to sign.
  assert abs(pca.components_PxD[:, 0] @ u) > 0.99 and abs(pca.components_PxD[:, 1] @ v) > 0.99
  assert z.shape == (500, 2) and z[:, 0].var() > 4 * z[:, 1].var()
  np.testing.assert_allclose(pca.transform(_Images(images[:7])), z[:7], rtol=1e-4, atol=1e-3)
  with pytest.raises(ValueError, match="dim must lie in"):
    clusters.PixelPCA(49, (0.5,) * 3, (0.25,) * 3, lambda e, u: e).fit(_Images(images))


# make test runs each file's tests on one xdist worker (--dist loadfile): made once.
@pytest.fixture(scope="module")
def text_pool_run(tmp_path_factory):
  """A text pool built before training (a sweep's quiet phase), then a run of its config
  at twice the learning rate: (the config, the build's info, the run's results, the pool
  cache)."""
  import copy

  from experiments.configs import pydocs_gpt2

  tmp_path = tmp_path_factory.mktemp("text_pool")
  c = pydocs_gpt2.get_config("ensemble,tiny")
  c.mesh = [("worker", 2), ("data", -1)]
  c.method.num_workers, c.method.aggregation = 2, "routed,probs"
  c.data.train_examples = 256
  c.distill.builder, c.distill.tfidf_dim = "kmeans", 8
  c.distill.cache_dir = str(tmp_path / "pools")
  built = run.build_pool(c, str(tmp_path / "pools"))
  faster = copy.deepcopy(c)
  faster.optim.learning_rate *= 2
  r = run.train_and_evaluate(faster, str(tmp_path / "run"), pool_config=c)
  return c, built, r, tmp_path / "pools"


@pytest.mark.e2e
def test_text_pools_are_tfidf_clusters_routed_at_eval(text_pool_run):
  config, _, r, _ = text_pool_run
  info = r["distill"]
  assert info["pool_sizes"] == [128, 128] and info["proxy"] is None  # balanced, no proxy
  assert "tf-idf" in info["features"] and info["build_flops"] > 0
  routed = r["ensemble"]["routed"]
  assert np.isfinite(routed["perplexity"]) and routed["num_tokens"] == r["ensemble"][
      "probs"]["num_tokens"]
  c = config.copy_and_resolve_references()
  c.distill.builder, c.method.aggregation = "el2n", "probs"
  with pytest.raises(config_lib.ConfigError, match="use 'none' or 'kmeans' for task 'lm'"):
    validation.validate(c)


@pytest.mark.e2e
def test_a_pool_built_before_training_is_read_by_runs_at_other_rates(text_pool_run):
  """The quiet phase builds a point's pool; its runs at other learning rates read it, and
  its quiet build time, instead of building their own (the pool key holds the rate).
  (Moved from tests/test_sweep.py, which trained the same text-pool run again.)"""
  _, built, r, pool_dir = text_pool_run
  assert built["cached"] is False and built["build_time_s"] > 0
  assert r["distill"]["cached"] and r["distill"]["build_time_s"] == built["build_time_s"]
  assert len(list(pool_dir.glob("*.npz"))) == 1


@pytest.mark.e2e
def test_a_pool_built_again_by_newer_code_is_retimed_only_if_it_is_the_same(text_pool_run,
                                                                            tmp_path):
  """--recost --retime_pools: the pool built again by this code, timed, must come out the
  same; it keeps its arrays, takes the new build time, and the run is priced with it. A
  pool built otherwise, or whose cache is gone and whose rebuild has other cluster sizes
  than its runs recorded, is an error naming it."""
  import json
  import shutil

  from experiments.sweeps import cost_vs_time

  c, built, r, fixture_pools = text_pool_run
  shutil.copytree(fixture_pools, tmp_path / "pools")  # the module's run stays as it was
  path = tmp_path / "results.json"
  shutil.copy(fixture_pools.parent / "run" / "results.json", path)
  [cached] = (tmp_path / "pools").glob("*.npz")
  arrays = dict(np.load(cached))
  retimed = run.retime_pool(c, str(tmp_path / "pools"), str(cached), r["distill"])
  assert retimed["build_time_s"] != built["build_time_s"]
  assert retimed["retimed"] == "bit for bit the cached pool"
  assert retimed["retimed_on"]["jaxlib"] and retimed["retimed_on"]["load_average_1min"] >= 0
  again = dict(np.load(cached))
  assert all(np.array_equal(arrays[k], again[k]) for k in arrays if k != "info")
  assert json.loads(str(again["info"]))["build_time_s"] == retimed["build_time_s"]
  cost_vs_time._recost_file(str(path), None, None, {cached.name: retimed})
  after = json.loads(path.read_text())
  assert after["distill"] == {**retimed, "cached": r["distill"]["cached"]}
  pool_s = after["cost"]["measured"]["pool_build_time_s"]
  assert pool_s == retimed["build_time_s"]
  assert (after["cost"]["modelled"]["critical_path_s"]["nvlink"] - pool_s == pytest.approx(
      r["cost"]["modelled"]["critical_path_s"]["nvlink"] - built["build_time_s"]))
  # Two workers' clusters swapped: not the pool the runs trained on.
  np.savez(cached, **dict(arrays, indices=np.roll(arrays["indices"],
                                                  len(arrays["indices"]) // 2)))
  with pytest.raises(pools.PoolChanged, match=f"{cached.name}.*differ in their pools"):
    run.retime_pool(c, str(tmp_path / "pools"), str(cached), r["distill"])
  # Caches are not committed: a pool whose file is gone is built again and checked against
  # the cluster sizes its runs recorded, then kept.
  cached.unlink()
  rebuilt = run.retime_pool(c, str(tmp_path / "pools"), str(cached), r["distill"])
  assert rebuilt["retimed"].startswith("the cluster sizes") and cached.exists()
  cached.unlink()
  with pytest.raises(pools.PoolChanged, match="other cluster sizes"):
    run.retime_pool(c, str(tmp_path / "pools"), str(cached),
                    {**r["distill"], "pool_sizes": [1, 255]})


@pytest.mark.integration
def test_routed_combine_uses_per_example_weights():
  logits_NxBxC = jax.random.normal(jax.random.key(0), (3, 5, 4))
  route_NxB = jax.nn.one_hot(jnp.array([0, 2, 1, 1, 0]), 3).T  # example b -> one worker
  mixed_BxC = aggregate.combine(logits_NxBxC, route_NxB, "probs")
  chosen_BxC = logits_NxBxC[jnp.array([0, 2, 1, 1, 0]), jnp.arange(5)]
  np.testing.assert_allclose(mixed_BxC, jax.nn.log_softmax(chosen_BxC), atol=1e-5)
  # Per-worker weights broadcast as before.
  np.testing.assert_allclose(aggregate.combine(logits_NxBxC, jnp.ones(3), "logits"),
                             logits_NxBxC.mean(0), atol=1e-6)


def test_distill_config_errors():
  c = _config("coreset", "/tmp/x")
  with pytest.raises(config_lib.ConfigError, match="distill.builder='coreset'"):
    validation.validate(c)
  c = _config("el2n", "/tmp/x")
  c.method.aggregation = "logits,routed"
  with pytest.raises(config_lib.ConfigError, match="'routed'"):
    validation.validate(c)
  c = _config("el2n", "/tmp/x", fraction=1.5)
  with pytest.raises(config_lib.ConfigError, match="distill.fraction=1.5"):
    validation.validate(c)


# Unit tests of the step jit what they call: run op by op, a tiny ResNet's step compiles each
# of its hundreds of operations apart (tens of seconds on 2 cores, against ~2 s jitted).
_train_step = jax.jit(step_lib.train_step, static_argnums=3)


def _tiny_resnet():
  """ResNet-18's blocks in two one-block stages at width 2: light to compile."""
  return resnet.create_model("resnet18", num_classes=10, width=2, stem="small",
                             stage_sizes=(1, 1))


@pytest.mark.integration
def test_weights_enter_the_loss():
  model = _tiny_resnet()
  state = jax.jit(lambda key: step_lib.create_train_state(
      model, optax.sgd(0.0), key, jax.ShapeDtypeStruct((1, 8, 8, 1), jnp.float32)))(
          jax.random.key(0))
  images = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
  labels = jnp.array([0, 1, 2, 3])
  weights = jnp.array([2.0, 1.0, 0.5, 0.0])  # sum 3.5: not the batch size
  cfg = step_lib.StepConfig(mean=(0.0,), std=(1.0,))
  _, m_w = _train_step(state, {"image": images, "label": labels, "weight": weights},
                       jax.random.key(2), cfg)
  _, m_1 = _train_step(state, {"image": images, "label": labels, "weight": jnp.ones(4)},
                       jax.random.key(2), cfg)
  _, m_none = _train_step(state, {"image": images, "label": labels}, jax.random.key(2), cfg)
  assert float(m_1["loss"]) == pytest.approx(float(m_none["loss"]), rel=1e-6)
  # The definition, computed apart from the step: train-mode logits of the step's inputs
  # (BatchNorm on the whole batch, weights or not), per-example cross-entropy, then
  # sum_i w_i l_i / sum_i w_i.
  logits_BxC, _ = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))(
      {"params": state.params, "batch_stats": state.batch_stats},
      step_lib.model_inputs({"image": images}, cfg))
  loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, labels)
  expected = float(jnp.sum(weights * loss_B) / jnp.sum(weights))
  assert float(m_w["loss"]) == pytest.approx(expected, rel=1e-5)
  assert expected != pytest.approx(float(loss_B.mean()), rel=1e-4)  # the weights matter here


def test_pool_sampler_weights_are_checked():
  with pytest.raises(ValueError, match="non-negative"):
    pool_lib.PoolSampler([np.arange(4)], 4, weights=-np.ones(4))


def _stacked_states(n, tx=optax.sgd(0.0)):
  model = _tiny_resnet()
  init = lambda key: step_lib.create_train_state(  # noqa: E731
      model, tx, key, jax.ShapeDtypeStruct((1, 8, 8, 1), jnp.float32), sparse=True)
  return jax.jit(jax.vmap(init))(jax.random.split(jax.random.key(0), n))


@pytest.mark.integration
def test_soup_averages_weights_and_reestimates_its_own_batchnorm_statistics():
  """The merged LiPT proxy and the soup aggregation: mean weights, and BatchNorm statistics
  of those weights on train batches -- not the members' averaged statistics (the LiPT
  proxy averaged them up to 3c6ac85)."""
  from ensemble_jax.methods import ensemble

  model = _tiny_resnet()
  stacked = _stacked_states(3)
  stacked = stacked.replace(batch_stats=jax.tree.map(  # members with their own statistics
      lambda x: x + jax.random.uniform(jax.random.key(3), x.shape), stacked.batch_stats))
  cfg = step_lib.StepConfig(mean=(0.0,), std=(1.0,))
  images = jax.random.uniform(jax.random.key(4), (2, 3, 8, 8, 8, 1)) * 255  # [S, N, b, ...]
  bn_batches = {"image": images, "label": jnp.zeros((2, 3, 8), jnp.int32)}
  merged = jax.jit(ensemble.soup_state, static_argnums=(0, 1))(model, cfg, stacked,
                                                                jnp.ones(3), bn_batches)
  for a, b in zip(jax.tree.leaves(merged.params), jax.tree.leaves(stacked.params)):
    np.testing.assert_allclose(a, b.mean(0), rtol=1e-6, atol=1e-7)
  like = jax.tree.map(lambda x: x[0], stacked.batch_stats)
  statistics = jax.jit(step_lib.batch_statistics, static_argnums=(0, 4))
  expected = [statistics(model, merged.params, like,
                         jax.tree.map(lambda x, s=s: x[s], bn_batches), cfg) for s in range(2)]
  for got, e0, e1, members in zip(jax.tree.leaves(merged.batch_stats),
                                  jax.tree.leaves(expected[0]), jax.tree.leaves(expected[1]),
                                  jax.tree.leaves(stacked.batch_stats)):
    np.testing.assert_allclose(got, (e0 + e1) / 2, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, members.mean(0), rtol=1e-3)


@pytest.mark.integration
def test_snip_mask_is_data_driven_and_stays_fixed():
  optim_config = config_lib.base_config().optim
  optim_config.warmup_epochs = 0.0  # the first step moves the weights
  tx = optim.create_optimizer(optim_config, 8, 10, 10)
  state = jax.tree.map(lambda x: x[0], _stacked_states(1, tx))
  batch = {"image": jax.random.normal(jax.random.key(1), (8, 8, 8, 1)),
           "label": jnp.arange(8) % 10}
  cfg = step_lib.StepConfig(mean=(0.0,), std=(1.0,))
  pruned = jax.jit(step_lib.snip_prune, static_argnums=(2, 3))(state, batch, cfg, 0.5)
  kernels = [k for k in jax.tree.leaves(pruned.params) if k.ndim > 1]
  zero_fraction = sum(int((k == 0).sum()) for k in kernels) / sum(k.size for k in kernels)
  assert zero_fraction == pytest.approx(0.5, abs=0.01)
  trained, _ = _train_step(pruned, batch, jax.random.key(2), cfg)
  moved = []
  for before, after in zip(jax.tree.leaves(pruned.params), jax.tree.leaves(trained.params)):
    if before.ndim > 1:
      assert bool(jnp.all(after[before == 0] == 0))  # the mask held through AdamW
      moved.append(bool(jnp.any(after[before != 0] != before[before != 0])))
  assert all(moved)  # the kept weights trained


def test_the_pool_bench_loads_a_baseline_beside_this_codes_builders():
  """experiments/bench/pools.py's "old" build: a revision's pools.py with its own builder
  registry (its dataclasses and registrations once failed against this code's)."""
  from ensemble_jax.distill import registry
  from experiments.bench import pools as bench

  kmeans = registry.BUILDERS["kmeans"]
  build = bench.baseline_build("HEAD")
  assert callable(build) and build is not pools.build
  assert registry.BUILDERS["kmeans"] is kmeans


def test_the_pool_bench_gives_a_baseline_its_configs_former_names(monkeypatch):
  """A revision from before a rename (`stored.RENAMED`) reads the field by its former name:
  the bench's "old" build gets the config with both (the rename once broke the bench)."""
  import types

  from experiments.bench import pools as bench

  def read_former_name(config, *args):
    return config.distill.method

  monkeypatch.setattr(bench, "_module_at", lambda *a, **k: types.SimpleNamespace(
      build=read_former_name))
  config = config_lib.base_config()
  config.distill.builder = "kmeans"
  assert bench.baseline_build("HEAD")(config, None, 1, "proxy") == "kmeans"
  assert "method" not in config.distill  # the caller's config is left as it was
