"""The routed pools' build: array-backed sources read in slices give the same bits as one
example at a time, and the opt-in float32 PCA covariance keeps the clusters' quality."""
import copy

import numpy as np
import pytest

from ensemble_jax import config_lib, validation
from ensemble_jax import data as data_lib
from ensemble_jax.data import images, windows
from ensemble_jax.distill import clusters, pools
from tests.conftest import pca_routed_config

pytestmark = pytest.mark.unit


class _Counted:
  """A source read one example at a time (no `get_range`), counting its reads."""

  def __init__(self, source):
    self.source, self.reads = source, 0

  def __len__(self):
    return len(self.source)

  def get(self, i):
    self.reads += 1
    return self.source.get(i)


class _CountedRanges(_Counted):
  def get_range(self, begin, end):
    return self.source.get_range(begin, end)


def _image_source(n=700, seed=0):
  rng = np.random.default_rng(seed)
  pixels = rng.integers(0, 256, (n, 6, 6)).astype(np.uint8)  # HxW: a channel axis is added
  pixels[: n // 2, :3] //= 4  # two kinds of image: a principal direction to find
  return images.ImageSource(pixels, np.zeros(n, np.int32), 10, "test")


def _eval_transform(size=6):
  c = config_lib.base_config()
  c.data.image_size = size
  return images.make_transform(c.data, train=False)


def test_image_ranges_are_the_examples_stacked():
  source = _image_source(20)
  transform = _eval_transform()
  got = transform.batch(source.get_range(3, 11), np.zeros((8, 8)))
  zeros = np.zeros(8)
  want = [transform(source.get(i), zeros) for i in range(3, 11)]
  for key in ("image", "label"):
    np.testing.assert_array_equal(got[key], np.stack([w[key] for w in want]))
  assert got["image"].dtype == np.uint8 and got["image"].shape == (8, 6, 6, 1)
  head = data_lib.Head(source, 10)
  np.testing.assert_array_equal(head.get_range(2, 10)["image"],
                                source.get_range(2, 10)["image"])
  with pytest.raises(IndexError):
    head.get_range(5, 11)
  # Another size: each image is resized as one by one.
  resized = _eval_transform(4)
  np.testing.assert_array_equal(
      resized.batch(source.get_range(0, 5), np.zeros((5, 8)))["image"],
      np.stack([resized(source.get(i), zeros)["image"] for i in range(5)]))


@pytest.mark.parametrize("cache_bytes", [1 << 28, 0])
def test_pca_of_slices_is_bit_identical_to_the_one_by_one_read(cache_bytes):
  source = _image_source()
  transform = _eval_transform()
  slow, fast = _Counted(source), _CountedRanges(source)
  fits = []
  for s in (slow, fast):
    pca = clusters.PixelPCA(5, (0.5,), (0.25,), transform, chunk=256, cache_bytes=cache_bytes)
    fits.append((pca, pca.fit(s), pca.transform(s)))
  (p0, z0, t0), (p1, z1, t1) = fits
  for a, b in ((z0, z1), (t0, t1), (p0.components_PxD, p1.components_PxD),
               (p0.center_P, p1.center_P)):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  assert p0.flops == p1.flops
  assert slow.reads == 3 * len(source) if cache_bytes == 0 else 2 * len(source)
  assert fast.reads == 0  # read in slices, never one by one


def test_tfidf_of_window_ranges_is_bit_identical_to_the_one_by_one_read():
  rng = np.random.default_rng(1)
  stream = rng.integers(0, 50, 40 * 16 + 1).astype(np.uint16)
  source = windows.PackedTokens(stream, 16)
  np.testing.assert_array_equal(source.get_range(3, 9)["tokens"],
                                np.stack([source.get(i)["tokens"] for i in range(3, 9)]))
  assert source.get_range(4, 4)["tokens"].shape == (0, 17)
  slow, fast = _Counted(source), _CountedRanges(source)
  out = []
  for s in (slow, fast):
    tfidf = clusters.TfIdf(50, dim=4, chunk=7)
    out.append((tfidf.fit(s, seed=0), tfidf.transform(s), tfidf.transform_prefixes(s)))
  for a, b in zip(*out):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  assert fast.reads == 0 and slow.reads > 0


class _NoRanges:
  """A split read one example at a time: the build as it was before sliced reads."""

  def __init__(self, source):
    self.source = source

  def __len__(self):
    return len(self.source)

  def get(self, i):
    return self.source.get(i)


def test_default_pca_pool_is_the_one_by_one_build(tmp_path, monkeypatch):
  config = pca_routed_config()
  data = data_lib.load(config)
  n = config.method.num_workers
  new = pools.build(config, data, n, str(tmp_path / "a"))
  slow_data = data_lib.Data(_NoRanges(data.train), _NoRanges(data.eval), data.num_classes,
                            data.init_input, data.train_transform, data.eval_transform,
                            data.info)
  monkeypatch.setattr(clusters.PixelPCA, "__init__", _without_cache(clusters.PixelPCA.__init__))
  old = pools.build(config, slow_data, n, str(tmp_path / "b"))
  assert len(new.pools) == len(old.pools) == n
  assert all(np.array_equal(a, b) for a, b in zip(new.pools, old.pools))
  assert new.route.shape == old.route.shape == (300, n) and np.array_equal(new.route, old.route)


def _without_cache(init):
  def wrapped(self, *args, **kwargs):
    init(self, *args, **{**kwargs, "cache_bytes": 0})
  return wrapped


def _objective(x_ExD, pools_):
  return sum(float(((x_ExD[p] - x_ExD[p].mean(0)) ** 2).sum()) for p in pools_)


@pytest.mark.parametrize("option,label", [({"pca_covariance": "float32"}, "float32 covariance"),
                                          ({"kmeans_balance": "sinkhorn"},
                                           "sinkhorn-balanced")])
def test_opt_in_pools_are_balanced_deterministic_and_as_tight(tmp_path, option, label):
  """The PCA pools' opt-in builds (float32 covariance; Sinkhorn-balanced k-means on the
  device): sizes within 1, the same pool twice, clusters within 1% of the default's."""
  config = pca_routed_config()
  data = data_lib.load(config)
  n = config.method.num_workers
  default = pools.build(config, data, n, str(tmp_path / "a"))
  opted = pca_routed_config(**option)
  first = pools.build(opted, data, n, str(tmp_path / "b"))
  again = pools.build(opted, data, n, str(tmp_path / "c"))
  assert all(np.array_equal(a, b) for a, b in zip(first.pools, again.pools))  # deterministic
  assert np.array_equal(first.route, again.route)
  sizes = [len(p) for p in first.pools]
  assert sum(sizes) == 3000 and max(sizes) - min(sizes) <= 1
  assert label in first.info["features"]
  # Scored in the default build's features: within 1% of the default's clusters.
  x = pools.pixel_embedding(config, data)[1].astype(np.float64)
  assert _objective(x, first.pools) <= 1.01 * _objective(x, default.pools)


def test_float32_covariance_finds_the_default_components():
  source = _image_source(2000)
  transform = _eval_transform()
  fits = {}
  for covariance in ("float64", "float32"):
    pca = clusters.PixelPCA(4, (0.5,), (0.25,), transform, chunk=300, covariance=covariance)
    fits[covariance] = (pca, pca.fit(source))
  (p64, z64), (p32, z32) = fits["float64"], fits["float32"]
  # The same directions up to sign; projections to float32 precision.
  np.testing.assert_allclose(np.abs(np.sum(p64.components_PxD * p32.components_PxD, 0)), 1.0,
                             atol=1e-4)
  np.testing.assert_allclose(p64.center_P, p32.center_P, atol=1e-5)
  signs = np.sign(np.sum(p64.components_PxD * p32.components_PxD, 0))
  np.testing.assert_allclose(z32 * signs, z64, atol=2e-3 * np.abs(z64).max())
  with pytest.raises(ValueError, match="covariance must be one of"):
    clusters.PixelPCA(4, (0.5,), (0.25,), transform, covariance="float16")


def _config_and_data():
  config = pca_routed_config()
  config.data.train_examples = 256
  return config, data_lib.load(config)


def _key_before(config, data, field: str) -> str:
  """The cache key `config`'s pool had before `distill.<field>` existed."""
  before = copy.deepcopy(config)
  with before.distill.unlocked():
    del before.distill[field]
  return pools.cache_key(before, data, 4)


def test_pca_covariance_enters_the_cache_key_only_when_set(tmp_path):
  config, data = _config_and_data()
  key = pools.cache_key(config, data, 4)
  assert _key_before(config, data, "pca_covariance") == key  # pools cached before: read back
  assert pools.cache_key(_set(config, "float32"), data, 4) != key
  with pytest.raises(config_lib.ConfigError, match="distill.pca_covariance"):
    validation.validate(_set(config, "float16"))


def _set(config, covariance):
  c = copy.deepcopy(config)
  c.distill.pca_covariance = covariance
  return c


def test_pca_image_size_downsamples_and_enters_the_cache_key_only_when_set():
  config, data = _config_and_data()
  key = pools.cache_key(config, data, 4)
  assert _key_before(config, data, "pca_image_size") == key
  small = copy.deepcopy(config)
  small.distill.pca_image_size = 14
  assert pools.cache_key(small, data, 4) != key
  image = pools.pca_transform(small, data)(data.train.get(0), np.zeros(8))["image"]
  assert image.shape == (14, 14, 1)
  assert pools.pca_transform(config, data) is data.eval_transform
  small.distill.pca_image_size = -1
  with pytest.raises(config_lib.ConfigError, match="distill.pca_image_size"):
    validation.validate(small)


def test_process_shares_are_contiguous_and_cover_the_items():
  from ensemble_jax.distill import shards

  for count in (1, 2, 3, 8):
    got = [shards.Processes(i, count).share(7) for i in range(count)]
    assert [r for s in got for r in s] == list(range(7))
    assert max(map(len, got)) - min(map(len, got)) <= 1
  assert not shards.Processes(0, 1).sharded and shards.Processes(1, 2).sharded
  with pytest.raises(ValueError, match=r"process index must lie in \[0, 2\)"):
    shards.Processes(2, 2)
  with pytest.raises(ValueError, match="at least one image"):
    clusters.PixelPCA(2, (0.5,), (0.25,), _eval_transform()).fit(_image_source(0))
