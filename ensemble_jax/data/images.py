"""Image sources and transforms.

The sources are the embedded Fashion-MNIST idx files, a class-per-folder image tree, and
any TFDS image dataset.

Sources give random access to examples {"image": HxWxI uint8, "label": int32}. Transforms
are pure numpy functions of (example, uniforms). The uniforms are drawn per consumer batch
from (seed, consumer, step), so augmentation does not depend on how rows are split over
processes. Normalisation happens on device (`normalize`), so hosts ship uint8.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import math
import os
import zlib
from typing import Callable

import numpy as np
from PIL import Image

from ensemble_jax import config_lib
from ensemble_jax.data import fetch


@dataclasses.dataclass
class ImageSource:
  """Random access to a split: `images[i]` is HxWxC uint8 (sizes may vary for TFDS)."""
  images: object  # np.ndarray [N,H,W,C] or a TFDS data source
  labels: np.ndarray | None  # None: labels come with each TFDS record
  num_classes: int
  name: str

  def __len__(self) -> int:
    return len(self.images)

  def get(self, index: int) -> dict[str, np.ndarray]:
    if self.labels is not None:
      image, label = self.images[index], self.labels[index]
    else:
      record = self.images[int(index)]
      image, label = np.asarray(record["image"]), record["label"]
    if image.ndim == 2:
      image = image[..., None]
    return {"image": image, "label": np.int32(label)}

  def get_range(self, begin: int, end: int) -> dict[str, np.ndarray] | None:
    """Examples [begin, end) stacked, as `get` gives them one by one; None when the images
    are records read one at a time (TFDS: their sizes may differ)."""
    if self.labels is None or not isinstance(self.images, np.ndarray):
      return None
    if not 0 <= begin <= end <= len(self):
      raise IndexError(f"range [{begin}, {end}) outside [0, {len(self)})")
    images = self.images[begin:end]
    if images.ndim == 3:
      images = images[..., None]
    return {"image": images, "label": np.asarray(self.labels[begin:end], np.int32)}


@dataclasses.dataclass
class ImageData:
  train: ImageSource
  eval: ImageSource
  num_classes: int
  image_shape: tuple[int, int, int]  # what the model sees: (S, S, C)


def _read_idx(path: str, refetch: str) -> np.ndarray:
  """A read-only idx array from its .gz file.

  Raises DataError naming the file and `refetch` if it is truncated or corrupt. Read once
  per process while the file is unchanged: decompressing Fashion-MNIST takes 0.5 s, and a
  sweep or a test session loads it per run."""
  try:
    stat = os.stat(path)
  except OSError:  # reading it raises the DataError
    return _read_idx_once(path, 0, 0, refetch)
  return _read_idx_once(path, stat.st_mtime_ns, stat.st_size, refetch)


@functools.lru_cache(maxsize=8)
def _read_idx_once(path: str, mtime_ns: int, size: int, refetch: str) -> np.ndarray:
  del mtime_ns, size  # the cache key: a rewritten file is read again
  try:
    with gzip.open(path, "rb") as f:
      raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
      raise ValueError(f"its header says {dims} but it holds {data.size} values")
  except (OSError, EOFError, ValueError, IndexError, zlib.error) as e:
    raise fetch.DataError(f"{path} is truncated or corrupt ({e}); fetch it again with "
                          f"`{refetch}`.") from None
  return data.reshape(dims)


def load_fashion_mnist_idx(data_dir: str = "") -> tuple[ImageSource, ImageSource]:
  root = fetch.require("fashion_mnist", data_dir or None)
  refetch = fetch.fetch_command("fashion_mnist", data_dir, force=True)
  splits = {}
  for split, prefix in (("train", "train"), ("test", "t10k")):
    images = _read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), refetch)[..., None]
    labels = _read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"),
                       refetch).astype(np.int32)
    splits[split] = ImageSource(images, labels, 10, f"fashion_mnist/{split}")
  return splits["train"], splits["test"]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


class FolderImages:
  """`images[i]`: the i-th file of a class-per-folder tree, decoded by PIL when read."""

  def __init__(self, paths: list[str], mode: str):
    self.paths, self.mode = paths, mode  # mode: PIL's "L" (1 channel) or "RGB" (3)

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, index: int) -> np.ndarray:
    path = self.paths[int(index)]
    try:
      with Image.open(path) as image:
        return np.asarray(image.convert(self.mode))
    except OSError as e:
      raise fetch.DataError(f"{path}: not a readable image ({e}); replace or remove it.") \
          from None


def load_folder(root: str, split: str, channels: int,
                classes: list[str] | None = None) -> tuple[ImageSource, list[str]]:
  """Images in `root/split/<class>/<image file>`, torchvision's ImageFolder layout.

  Labels are the class folders' indices in sorted order. They are the train split's, which
  `classes` passes on."""
  split_dir = os.path.join(root, split)
  layout = (f"expected {root}/{{train,{split if split != 'train' else 'test'}}}/<class "
            f"name>/<image files {'|'.join(IMAGE_SUFFIXES)}>")
  if not os.path.isdir(split_dir):
    raise fetch.DataError(f"config.data.data_dir={root!r}: no {split!r} folder; {layout}.")
  found = sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d)))
  classes = classes or found
  unknown = sorted(set(found) - set(classes))
  if unknown:
    raise fetch.DataError(f"{split_dir}: classes {unknown} are not among the train split's "
                          f"{classes}.")
  paths, labels = [], []
  for label, name in enumerate(classes):
    folder = os.path.join(split_dir, name)
    files = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_SUFFIXES)) \
        if os.path.isdir(folder) else []
    paths += [os.path.join(folder, f) for f in files]
    labels += [label] * len(files)
  if not paths:
    raise fetch.DataError(f"{split_dir}: no image files; {layout}.")
  mode = {1: "L", 3: "RGB"}.get(channels)
  if mode is None:
    raise config_lib.ConfigError(f"config.data.mean has {channels} channels: folder images "
                                 "are read as 1 (grayscale) or 3 (RGB).")
  return ImageSource(FolderImages(paths, mode), np.asarray(labels, np.int32), len(classes),
                     f"folder:{split_dir}"), classes


def load_tfds(name: str, split: str, data_dir: str = "") -> ImageSource:
  hint = " --manual_dir=<the downloaded tar files>" if name.startswith("imagenet") else ""
  source = fetch.tfds_source(name, split, data_dir, hint)
  num_classes = source.dataset_info.features["label"].num_classes
  return ImageSource(source, None, num_classes, f"{name}/{split}")


def load(data_config, eval_split: str) -> ImageData:
  if data_config.source == "idx":  # fashion_mnist only (validation.validate says so)
    train, test = load_fashion_mnist_idx(data_config.data_dir)
    if eval_split not in ("test", "validation"):
      raise config_lib.ConfigError(f"config.eval.split={eval_split!r}: the idx files hold "
                                   "'test' only.")
    evaluation = test
  elif data_config.source == "folder":
    channels = len(data_config.mean)
    train, classes = load_folder(data_config.data_dir, "train", channels)
    evaluation, _ = load_folder(data_config.data_dir, eval_split, channels, classes)
  else:
    train = load_tfds(data_config.dataset, "train", data_config.data_dir)
    evaluation = load_tfds(data_config.dataset, eval_split, data_config.data_dir)
  channels = train.get(0)["image"].shape[-1]
  if channels != len(data_config.mean):
    raise config_lib.ConfigError(
        f"config.data.mean={tuple(data_config.mean)} has {len(data_config.mean)} channels but "
        f"{train.name} images have {channels}; set data.mean and data.std per channel.")
  size = data_config.image_size
  return ImageData(train, evaluation, train.num_classes, (size, size, channels))


# ---- image transforms: (image HxWxC uint8, uniforms [NUM_UNIFORMS]) -> SxSxC uint8 ----


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  if image.shape[:2] == (height, width):
    return image
  pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
  out = np.asarray(pil.resize((width, height), Image.BILINEAR))
  return out[..., None] if out.ndim == 2 else out


def _center_crop(image: np.ndarray, size: int, resize_to: int) -> np.ndarray:
  h, w = image.shape[:2]
  if resize_to:
    scale = resize_to / min(h, w)
    image = _resize(image, max(size, round(h * scale)), max(size, round(w * scale)))
  else:
    image = _resize(image, size, size)
  h, w = image.shape[:2]
  top, left = (h - size) // 2, (w - size) // 2
  return image[top:top + size, left:left + size]


def _crop_flip(image: np.ndarray, u: np.ndarray, size: int, padding: int) -> np.ndarray:
  image = _resize(image, size, size)
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  top = int(u[0] * (2 * padding + 1))
  left = int(u[1] * (2 * padding + 1))
  out = padded[top:top + size, left:left + size]
  return out[:, ::-1] if u[2] < 0.5 else out


def _inception_crop(image: np.ndarray, u: np.ndarray, size: int) -> np.ndarray:
  """Random area in [8%, 100%], aspect ratio in [3/4, 4/3], then resize; and a flip."""
  h, w = image.shape[:2]
  area = h * w
  crop = None
  for attempt in range(10):
    target = area * (0.08 + 0.92 * u[2 * attempt])
    log_ratio = math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * u[2 * attempt + 1]
    ratio = math.exp(log_ratio)
    cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
    if 0 < cw <= w and 0 < ch <= h:
      top, left = int(u[20] * (h - ch + 1)), int(u[21] * (w - cw + 1))
      crop = image[top:top + ch, left:left + cw]
      break
  if crop is None:  # fall back to the central square
    s = min(h, w)
    crop = image[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
  out = _resize(np.ascontiguousarray(crop), size, size)
  return out[:, ::-1] if u[22] < 0.5 else out


def make_transform(data_config, train: bool) -> Callable[[dict, np.ndarray], dict]:
  """The example transform the pipeline applies: augments (train) or center-crops (eval)."""
  size = data_config.image_size
  if not train or data_config.train_augment == "none":
    resize = data_config.eval_resize if not train else 0
    image_fn = lambda image, u: _center_crop(image, size, resize)  # noqa: E731
  elif data_config.train_augment == "crop_flip":
    image_fn = lambda image, u: _crop_flip(image, u, size, data_config.crop_padding)  # noqa: E731
  else:
    image_fn = lambda image, u: _inception_crop(image, u, size)  # noqa: E731
  transform = lambda example, u: {**example, "image": image_fn(example["image"], u)}  # noqa: E731
  if not train or data_config.train_augment == "none":
    # Deterministic: a batch [B, H, W, C] of equal-size images at once, as the examples one
    # by one would give it (`transform.batch(examples, uniforms)`).
    resize = data_config.eval_resize if not train else 0
    transform.batch = lambda examples, u: {  # noqa: E731
        **examples, "image": _center_crop_batch(examples["image"], size, resize)}
  return transform


def _center_crop_batch(images: np.ndarray, size: int, resize_to: int) -> np.ndarray:
  """`_center_crop` of every image of [B, H, W, C]: no copy when that is the identity."""
  if not resize_to and images.shape[1:3] == (size, size):
    return images
  return np.stack([_center_crop(image, size, resize_to) for image in images])


def normalize(images_u8, mean, std):
  """On device: uint8 [..., C] -> float32, per-channel standardised."""
  import jax.numpy as jnp

  x = images_u8.astype(jnp.float32) / 255.0
  return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
