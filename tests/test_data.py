"""Samplers, the grain pipeline, the TFDS path (mocked) and missing-data errors."""
import os
import shutil

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ensemble_jax import run
from ensemble_jax.data import fetch, images, pipeline
from ensemble_jax.data import samplers

pytestmark = pytest.mark.unit


def test_random_sampler_is_a_seeded_epoch_permutation():
  s = samplers.RandomSampler(100, num_consumers=2, seed=0)
  epoch = np.concatenate([s.batch_indices(0, k, 10) for k in range(10)])
  assert sorted(epoch) == list(range(100))  # without replacement inside an epoch
  again = samplers.RandomSampler(100, num_consumers=2, seed=0)
  assert np.array_equal(s.batch_indices(1, 3, 16), again.batch_indices(1, 3, 16))
  assert not np.array_equal(s.batch_indices(0, 3, 16), s.batch_indices(1, 3, 16))
  other = samplers.RandomSampler(100, num_consumers=2, seed=1)
  assert not np.array_equal(s.batch_indices(0, 3, 16), other.batch_indices(0, 3, 16))
  # a batch straddling the epoch boundary continues into the next permutation
  straddle = s.batch_indices(0, 6, 16)
  assert np.array_equal(straddle[:4], epoch[96:])
  next_epoch = np.concatenate([s.batch_indices(0, k, 10) for k in range(10, 20)])
  assert sorted(next_epoch) == list(range(100))
  assert np.array_equal(straddle[4:], next_epoch[:12])


def test_disjoint_sampler_partitions_the_data():
  s = samplers.create_sampler("disjoint", 103, num_consumers=4, seed=0)
  pools = [set(s.pool(i)) for i in range(4)]
  assert sum(map(len, pools)) == 103 and set().union(*pools) == set(range(103))
  for i in range(4):
    assert set(s.batch_indices(i, 5, 64)) <= pools[i]
  with pytest.raises(ValueError, match="choose one of"):
    samplers.create_sampler("nope", 10, 1, 0)


def _layout(shape, spec):
  mesh = Mesh(np.array(jax.devices()), ("data",))
  return pipeline.BatchLayout(shape, NamedSharding(mesh, spec))


@pytest.fixture(scope="module")
def fashion(request):
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  return config, images.load(config.data, "test")


def test_train_batches_deterministic_in_seed(fashion):
  config, data = fashion
  layout = _layout((32,), P("data"))
  transform = images.make_transform(config.data, train=True)

  def batches(seed):
    return pipeline.TrainBatches(data.train, samplers.RandomSampler(len(data.train), 1, seed),
                                 transform, layout, seed)

  a, b, c = batches(0), batches(0), batches(1)
  first = a.local_batch(7)
  assert first["image"].shape == (32, 28, 28, 1) and first["image"].dtype == np.uint8
  assert first["label"].shape == (32,) and first["label"].dtype == np.int32
  assert np.array_equal(first["image"], b.local_batch(7)["image"])
  assert not np.array_equal(first["image"], c.local_batch(7)["image"])
  assert not np.array_equal(first["image"], a.local_batch(8)["image"])
  # the iterator yields global arrays sharded over `data`, starting at any step
  it = a.iterate(start_step=7, num_steps=9)
  g = next(it)
  assert isinstance(g["image"], jax.Array) and g["image"].sharding == layout.sharding
  assert np.array_equal(np.asarray(g["image"]), first["image"])
  assert len(list(it)) == 1


def test_stacked_layout_gives_each_consumer_its_stream(fashion):
  config, data = fashion
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("worker", "data"))
  layout = pipeline.BatchLayout((4, 8), NamedSharding(mesh, P("worker", "data")))
  sampler = samplers.RandomSampler(len(data.train), 4, 0)
  tb = pipeline.TrainBatches(data.train, sampler, images.make_transform(config.data, False),
                             layout, 0)
  batch = tb.local_batch(2)
  assert batch["image"].shape == (4, 8, 28, 28, 1)
  for w in range(4):
    expected = data.train.labels[sampler.batch_indices(w, 2, 8)]
    assert np.array_equal(batch["label"][w], expected)


def test_eval_batches_pad_with_mask(fashion):
  config, data = fashion
  eb = pipeline.EvalBatches(data.eval, images.make_transform(config.data, False),
                            _layout((64,), P("data")), num_examples=100)
  batches = list(eb)
  assert len(batches) == 2
  masks = np.concatenate([np.asarray(b["mask"]) for b in batches])
  assert masks.sum() == 100 and masks[:100].all()


def test_eval_batches_from_an_offset_hold_the_rest_of_the_split(fashion):
  """eval.score_rest_at_end: the examples past the scored ones, each once, in order."""
  config, data = fashion
  layout = _layout((64,), P("data"))
  transform = images.make_transform(config.data, False)
  route = np.arange(len(data.eval), dtype=np.float32)[:, None]
  rest = pipeline.EvalBatches(data.eval, transform, layout, per_example={"route": route},
                              first=len(data.eval) - 100)
  batches = list(rest)
  mask = np.concatenate([np.asarray(b["mask"]) for b in batches]) > 0
  assert rest.num_examples == 100 and mask.sum() == 100
  labels = np.concatenate([np.asarray(b["label"]) for b in batches])[mask]
  assert np.array_equal(labels, data.eval.labels[-100:])
  rows = np.concatenate([np.asarray(b["route"])[:, 0] for b in batches])[mask]
  assert np.array_equal(rows, np.arange(len(data.eval) - 100, len(data.eval)))


def test_missing_idx_dataset_names_path_and_command(fashion, tmp_path):
  config, _ = fashion
  config.data.data_dir = str(tmp_path)
  with pytest.raises(fetch.DatasetUnavailableError) as e:
    images.load(config.data, "test")
  assert str(tmp_path) in str(e.value) and "make data" in str(e.value)


def test_missing_tfds_dataset_says_how_to_prepare(fashion, tmp_path):
  config, _ = fashion
  config.data.source, config.data.data_dir = "tfds", str(tmp_path)
  with pytest.raises(fetch.DatasetUnavailableError) as e:
    images.load(config.data, "test")
  # Nothing is downloaded or built (download=False): the message says what to run.
  assert str(e.value) == (
      f"TFDS dataset 'fashion_mnist' (split 'train') cannot be read from {tmp_path}: nothing "
      f"prepared at {tmp_path / 'fashion_mnist'}. Prepare it once as array_record: `tfds build "
      f"fashion_mnist --data_dir={tmp_path} --file_format=array_record` (the build needs "
      f"TensorFlow: pip install tensorflow), then run with --config.data.data_dir={tmp_path}.")
  assert os.listdir(tmp_path) == []


def test_idx_files_are_read_once_per_process_until_they_change(tmp_path):
  source = fetch.require("fashion_mnist")
  shutil.copytree(source, tmp_path / "fashion_mnist")
  first, _ = images.load_fashion_mnist_idx(str(tmp_path))
  again, _ = images.load_fashion_mnist_idx(str(tmp_path))
  assert np.shares_memory(again.images, first.images) and not first.images.flags.writeable
  path = tmp_path / "fashion_mnist" / "train-images-idx3-ubyte.gz"
  path.write_bytes(path.read_bytes()[:100])  # rewritten: read again, and found damaged
  with pytest.raises(fetch.DataError, match="truncated or corrupt"):
    images.load_fashion_mnist_idx(str(tmp_path))


@pytest.mark.parametrize("damage", ["truncate", "garble", "empty"])
def test_a_truncated_idx_file_names_it_and_the_command_that_fetches_it_again(tmp_path, damage):
  source = fetch.require("fashion_mnist")
  shutil.copytree(source, tmp_path / "fashion_mnist")
  path = tmp_path / "fashion_mnist" / "t10k-labels-idx1-ubyte.gz"
  raw = path.read_bytes()
  path.write_bytes({"truncate": raw[:len(raw) // 2], "garble": raw[:20] + b"x" * 100,
                    "empty": b""}[damage])
  with pytest.raises(fetch.DataError) as e:
    images.load_fashion_mnist_idx(str(tmp_path))
  assert str(e.value).startswith(f"{path} is truncated or corrupt (")
  assert str(e.value).endswith(
      f"; fetch it again with `python -m ensemble_jax.data.fetch --force --data_dir {tmp_path} "
      "fashion_mnist`.")


def test_tfds_imagenet_inception_crop_under_mock_data():
  from experiments.configs import imagenet_resnet50

  config = imagenet_resnet50.get_config()
  config.data.image_size, config.data.eval_resize = 32, 36
  with tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE):
    data = images.load(config.data, "validation")
  assert data.num_classes == 1000 and data.image_shape == (32, 32, 3)
  for train in (True, False):
    transform = images.make_transform(config.data, train=train)
    u = np.random.default_rng(0).random(pipeline.NUM_UNIFORMS)
    for i in range(4):  # mocked images come in random small sizes
      out = transform(data.train.get(i), u)["image"]
      assert out.shape == (32, 32, 3) and out.dtype == np.uint8


@pytest.mark.e2e
def test_train_and_evaluate_on_tfds_mock(tiny_config, tmp_path):
  tiny_config.data.source = "tfds"
  tiny_config.train.num_steps = 2
  with tfds.testing.mock_data(num_examples=256, policy=tfds.testing.MockPolicy.USE_CODE):
    r = run.train_and_evaluate(tiny_config, str(tmp_path))
  assert r["steps"] == 2 and r["final"]["num_examples"] == 128


def _image_folder(root, split, per_class, size=12, mode="RGB"):
  """A class-per-folder tree of PNGs: class i's images are bright in channel i."""
  from PIL import Image

  rng = np.random.default_rng(len(split))
  for label, name in enumerate(("cat", "dog", "emu")):
    os.makedirs(root / split / name, exist_ok=True)
    for j in range(per_class):
      pixels = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
      pixels[..., label] += 180
      Image.fromarray(pixels).convert(mode).save(root / split / name / f"{j}.png")


@pytest.mark.e2e
def test_own_images_in_class_folders_train_end_to_end(tiny_config, tmp_path):
  """data.source='folder': a user's own dataset without TensorFlow, through the same
  pipeline, transforms and loop as every other image source."""
  root = tmp_path / "pets"
  _image_folder(root, "train", 16)
  _image_folder(root, "test", 4)
  (root / "train" / "README.txt").write_text("not a class")  # files beside classes: ignored
  config = tiny_config
  config.data.source, config.data.dataset, config.data.data_dir = "folder", "pets", str(root)
  config.data.image_size, config.data.mean, config.data.std = 12, (0.5,) * 3, (0.25,) * 3
  config.eval.num_examples = 12
  train, classes = images.load_folder(str(root), "train", 3)
  assert classes == ["cat", "dog", "emu"] and len(train) == 48 and train.num_classes == 3
  example = train.get(16)  # the first dog
  assert example["label"] == 1 and example["image"].shape == (12, 12, 3)
  assert example["image"][..., 1].mean() > example["image"][..., 0].mean() + 100
  r = run.train_and_evaluate(config, str(tmp_path / "run"))
  assert r["data"] == {"train_examples": 48, "eval_examples": 12}
  assert r["final"]["num_examples"] == 12 and 0.0 <= r["final"]["accuracy"] <= 1.0


def test_folder_errors_name_the_path_and_the_layout(tmp_path):
  with pytest.raises(fetch.DataError, match=r"no 'train' folder; expected .*/<class name>/"):
    images.load_folder(str(tmp_path), "train", 3)
  _image_folder(tmp_path, "train", 1)
  (tmp_path / "test" / "yak").mkdir(parents=True)
  with pytest.raises(fetch.DataError, match=r"classes \['yak'\] are not among the train "):
    images.load_folder(str(tmp_path), "test", 3, ["cat", "dog", "emu"])
  (tmp_path / "train" / "cat" / "0.png").write_bytes(b"not a png")
  source, _ = images.load_folder(str(tmp_path), "train", 1)
  with pytest.raises(fetch.DataError, match=r"cat/0.png: not a readable image"):
    source.get(0)
