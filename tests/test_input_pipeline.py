"""The input-pipeline benchmark at a tiny size: its ImageNet copy reads back, its JSON is whole."""
import io
import json

import numpy as np
from PIL import Image
import pytest

from experiments.bench import input_pipeline

pytestmark = pytest.mark.e2e


def test_synthetic_imagenet_reads_back_through_tfds(tmp_path):
  from ensemble_jax.data import images

  written = input_pipeline.write_imagenet(str(tmp_path), {"train": 3, "validation": 2})
  train = images.load_tfds("imagenet2012", "train", str(tmp_path))
  assert len(train) == 3 and train.num_classes == 1000
  assert len(images.load_tfds("imagenet2012", "validation", str(tmp_path))) == 2
  for i, jpeg in enumerate(written["jpegs"]):
    example = train.get(i)
    assert np.array_equal(example["image"], np.asarray(Image.open(io.BytesIO(jpeg))))
    assert 0 <= example["label"] < 1000


def test_the_benchmark_writes_its_numbers(tmp_path):
  out = tmp_path / "bench.json"
  assert input_pipeline.main(["input_pipeline", "--images=8", "--batch=4", "--steps=2",
                              "--text=generated", "--text_bytes=40000", "--bpe_vocab=400",
                              f"--out={out}"]) == 0
  r = json.loads(out.read_text())
  im, tx = r["images"], r["text"]
  assert im["dataset"]["train_images"] == 8 and im["image_size"] == 224
  assert set(im["stages_one_thread"]) == {"read_decode", "jpeg_decode_only", "train_transform"}
  assert im["pipeline"]["images"] == 8 and im["pipeline"]["images_per_cpu_s"] > 0
  assert im["cores_per_accelerator"] == round(
      input_pipeline.H100_IMAGES_PER_S / im["pipeline"]["images_per_cpu_s"], 1)
  assert set(tx["caches"]) == {"byte", "bpe"}
  assert tx["caches"]["byte"]["bytes_per_token"] == 1.0  # pure ASCII
  assert tx["caches"]["bpe"]["bytes_per_token"] > 1 and tx["caches"]["bpe"]["vocab_size"] == 400
  assert tx["windows"]["windows"] == 8 and tx["windows"]["context"] == 1024
  for row in (im["pipeline"], tx["caches"]["bpe"], tx["windows"]):
    assert row["cpu_s"] > 0 and row["wall_s"] > 0
  assert r["machine"]["cores"] >= 1
