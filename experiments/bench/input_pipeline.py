"""Whether the host input pipeline keeps up with an accelerator: images/s and tokens/s per core.

  python -m experiments.bench.input_pipeline [--images=400] [--batch=128] [--threads=2] \
      [--text=pydocs|generated] [--text_bytes=0] [--bpe_vocab=50257] [--out=input.json]

Images. `--images` synthetic JPEGs (quality 90) of ImageNet's size distribution (short
side log-normal around 340 px, aspect ratios 4:3 / 3:2 / 1:1 and their portraits: about
430x350 on average, ~100 KB each) are written as an `imagenet2012` TFDS array_record
dataset in a temporary directory, without TensorFlow (tfds encodes and serializes the
examples, array_record writes them, tfds writes dataset_info.json and features.json). They
are read back the way `experiments/configs/imagenet_resnet50.py` reads ImageNet:
`ensemble_jax.data.load` (`tfds.data_source`, which decodes the JPEG) and its train
transform (Inception random-resized crop, flip, resize to 224), batched by
`pipeline.TrainBatches` under grain with `--threads` threads. Timed: each stage alone on
one thread (array_record read + deserialize + decode; the JPEG decode alone; the
transform), then the whole pipeline.

Text. A corpus (the Python docs if fetched, else generated words) is written as Pile-style
`.jsonl.zst` shards and built into the token cache (`token_cache.build` over
`text_readers.files_corpus`, as `pile_gpt2.py` does), once with the byte tokenizer and once
with a byte-level BPE of `--bpe_vocab` ids trained here on the corpus (GPT-2's own files
are not on this machine; its vocabulary size and pre-tokenizer are the same, its merges are
not). Then `--batch` random windows of context 1024 a step are read from the cache through
`TrainBatches`.

Throughput is given per CPU-second of the process (user + system time of all its threads,
`getrusage`): work done / CPU time spent, what one fully used core delivers, which does not
depend on how busy the machine is. Wall-clock rates are beside it. Cores per accelerator =
the accelerator's rate / the rate per CPU-second: ResNet-50 on one H100 in bf16 takes 5,213
images/s, GPT-2 small 324,949 tokens/s (`experiments/results/bench/h100/`).
"""
from __future__ import annotations

import io
import json
import os
import platform
import resource
import shutil
import tempfile
import time

import numpy as np
from absl import flags

from ensemble_jax import record
from experiments import cli

H100_IMAGES_PER_S = 5213  # ResNet-50, batch 256, bf16: experiments/results/bench/h100/
H100_TOKENS_PER_S = 324949  # GPT-2 small, fused attention, vocab 50304: the same
CONTEXT = 1024  # pile_gpt2.py's


class Clock:
  """Wall and CPU seconds (all threads of the process) since it started."""

  def __init__(self):
    self.wall0, self.cpu0 = time.perf_counter(), self._cpu()

  @staticmethod
  def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

  def read(self) -> tuple[float, float]:
    return time.perf_counter() - self.wall0, self._cpu() - self.cpu0


def _rates(items: float, wall: float, cpu: float, name: str) -> dict:
  return {f"{name}": items, "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
          f"{name}_per_s_wall": round(items / wall, 2),
          f"{name}_per_cpu_s": round(items / max(cpu, 1e-9), 2),
          "cpu_utilisation": round(cpu / wall, 2)}


# ---------------------------------------------------------------- images


def image_sizes(n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
  """(height, width) pairs shaped like ImageNet's train set: mostly 4:3 around 500x375."""
  short = np.clip(rng.lognormal(np.log(330), 0.25, n), 80, 900)
  aspects = rng.choice([4 / 3, 3 / 2, 1.0, 3 / 4, 2 / 3], size=n, p=[0.6, 0.15, 0.1, 0.1, 0.05])
  out = []
  for s, a in zip(short, aspects):
    h, w = (s, s * a) if a >= 1 else (s / a, s)
    out.append((int(round(h)), int(round(w))))
  return out


def synthetic_jpeg(height: int, width: int, rng: np.random.Generator, quality: int = 90) -> bytes:
  """A photo-like JPEG: smooth colour fields, mid-frequency texture and sensor noise."""
  from PIL import Image

  def field(step: int, amplitude: float) -> np.ndarray:
    small = rng.random((height // step + 2, width // step + 2, 3)) * 255
    img = Image.fromarray(small.astype(np.uint8)).resize((width, height), Image.BICUBIC)
    return (np.asarray(img, np.float32) - 128) * amplitude

  pixels = 128 + field(48, 0.9) + field(3, 0.5) + rng.normal(0, 14, (height, width, 3))
  buf = io.BytesIO()
  Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
  return buf.getvalue()


def write_imagenet(data_dir: str, splits: dict[str, int], seed: int = 0) -> dict:
  """`imagenet2012` as TFDS array_record under data_dir, no TensorFlow; what was written."""
  import tensorflow_datasets as tfds
  from array_record.python import array_record_module
  from tensorflow_datasets.core import example_serializer, naming
  from tensorflow_datasets.core import splits as splits_lib

  builder = tfds.builder("imagenet2012", data_dir=data_dir, file_format="array_record")
  features = builder.info.features
  serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
  os.makedirs(builder.data_dir, exist_ok=True)
  rng = np.random.default_rng(seed)
  infos, jpegs, sizes = [], [], []
  for split, n in splits.items():
    template = naming.ShardedFileTemplate(data_dir=builder.data_dir, dataset_name="imagenet2012",
                                          split=split, filetype_suffix="array_record")
    writer = array_record_module.ArrayRecordWriter(
        os.fspath(template.sharded_filepath(shard_index=0, num_shards=1)), "group_size:1")
    num_bytes = 0
    for i, (h, w) in enumerate(image_sizes(n, rng)):
      jpeg = synthetic_jpeg(h, w, rng)
      record = serializer.serialize_example(features.encode_example(
          {"image": io.BytesIO(jpeg), "label": int(rng.integers(1000)),
           "file_name": f"{split}_{i:06d}.JPEG"}))
      writer.write(record)
      num_bytes += len(record)
      if split == "train":
        jpegs.append(jpeg)
        sizes.append((h, w))
    writer.close()
    infos.append(splits_lib.SplitInfo(name=split, shard_lengths=[n], num_bytes=num_bytes,
                                      filename_template=template))
  builder.info.set_splits(splits_lib.SplitDict(infos))
  builder.info.set_file_format("array_record")
  builder.info.write_to_directory(builder.data_dir)
  hw = np.asarray(sizes, np.float64)
  return {"jpegs": jpegs, "summary": {
      "train_images": splits["train"], "jpeg_quality": 90,
      "mean_height": round(float(hw[:, 0].mean()), 1),
      "mean_width": round(float(hw[:, 1].mean()), 1),
      "mean_megapixels": round(float((hw[:, 0] * hw[:, 1]).mean() / 1e6), 4),
      "mean_jpeg_kb": round(float(np.mean([len(j) for j in jpegs]) / 1e3), 1)}}


def _layout(leading: int):
  import jax

  from ensemble_jax.data import pipeline

  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
  return pipeline.BatchLayout((leading,), jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("data")))


def _run_pipeline(source, transform, batch: int, steps: int, threads: int, seed: int = 0
                  ) -> tuple[float, float]:
  """(wall s, CPU s) of `steps` training batches through TrainBatches.iterate, from the
  iterator's creation (its threads start reading ahead at once) to the last batch."""
  from ensemble_jax.data import pipeline, samplers

  sampler = samplers.RandomSampler(len(source), 1, seed)
  batches = pipeline.TrainBatches(source, sampler, transform, _layout(batch), seed)
  clock = Clock()
  for b in batches.iterate(0, steps, prefetch=4, num_threads=threads):
    for v in b.values():
      v.block_until_ready()
  return clock.read()


def bench_images(num_images: int, batch: int, threads: int, steps: int) -> dict:
  import tensorflow_datasets as tfds  # noqa: F401  (imported before the clock starts)
  from PIL import Image, features

  from ensemble_jax import data as data_lib
  from ensemble_jax.data import pipeline
  from experiments.configs import imagenet_resnet50

  root = tempfile.mkdtemp(prefix="imagenet-bench-")
  try:
    clock = Clock()
    written = write_imagenet(root, {"train": num_images, "validation": 8})
    write_s = clock.read()[0]
    config = imagenet_resnet50.get_config()
    config.data.data_dir = root
    data = data_lib.load(config)  # the run's own loader: tfds.data_source, its transforms
    source, transform = data.train, data.train_transform
    n = len(source)
    rng = np.random.default_rng(1)
    uniforms = rng.random((n, pipeline.NUM_UNIFORMS))
    source.get(0)  # first touch: opens the array_record file
    stages = {}
    clock = Clock()
    decoded = [source.get(i) for i in range(n)]
    stages["read_decode"] = _rates(n, *clock.read(), "images")
    clock = Clock()
    for jpeg in written["jpegs"]:
      with Image.open(io.BytesIO(jpeg)) as im:
        np.asarray(im)
    stages["jpeg_decode_only"] = _rates(n, *clock.read(), "images")
    clock = Clock()
    for example, u in zip(decoded, uniforms):
      transform(example, u)
    stages["train_transform"] = _rates(n, *clock.read(), "images")
    del decoded
    wall, cpu = _run_pipeline(source, transform, batch, steps, threads)
    whole = _rates(batch * steps, wall, cpu, "images")
    whole.update(batch=batch, steps=steps, grain_threads=threads)
    per_cpu_s = whole["images_per_cpu_s"]
    return {"dataset": written["summary"], "write_s": round(write_s, 2),
            "image_size": config.data.image_size, "augment": config.data.train_augment,
            "decoder": "PIL " + Image.__version__ + (
                " (libjpeg-turbo)" if features.check_feature("libjpeg_turbo") else ""),
            "stages_one_thread": stages, "pipeline": whole,
            "accelerator_images_per_s": H100_IMAGES_PER_S,
            "cores_per_accelerator": round(H100_IMAGES_PER_S / per_cpu_s, 1)}
  finally:
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- text


def corpus_documents(kind: str, max_bytes: int, seed: int = 0) -> tuple[str, list[str]]:
  """(what it is, the documents): the fetched Python docs, or generated English-like words."""
  if kind == "pydocs":
    from ensemble_jax.data import fetch, text_readers

    try:
      root = fetch.require("pydocs")
    except fetch.DatasetUnavailableError:
      kind = "generated"
    else:
      corpus = text_readers.files_corpus(str(root), dataset="pydocs")
      docs, total = [], 0
      for _, text in corpus.documents():
        docs.append(text)
        total += len(text.encode())
        if max_bytes and total >= max_bytes:
          break
      return "pydocs (Python 3.11 documentation sources)", docs
  rng = np.random.default_rng(seed)
  letters = np.asarray(list("etaoinshrdlcumwfgypbvkjxqz"))
  weights = 1 / np.arange(1, 27) ** 0.9
  words = ["".join(rng.choice(letters, size=rng.integers(1, 10), p=weights / weights.sum()))
           for _ in range(5000)]
  zipf = 1 / np.arange(1, len(words) + 1)
  zipf /= zipf.sum()
  docs, total = [], 0
  target = max_bytes or 4_000_000
  while total < target:
    n = int(rng.integers(50, 2000))
    text = " ".join(rng.choice(words, size=n, p=zipf)) + ".\n"
    docs.append(text)
    total += len(text)
  return "generated (Zipf-distributed pseudo-words)", docs


def write_pile_shards(root: str, documents: list[str], shards: int = 2) -> None:
  import zstandard

  os.makedirs(root, exist_ok=True)
  for s in range(shards):
    lines = "".join(json.dumps({"text": t, "meta": {"pile_set_name": "Pile-CC"}}) + "\n"
                    for t in documents[s::shards])
    with open(os.path.join(root, f"{s:02d}.jsonl.zst"), "wb") as f:
      f.write(zstandard.ZstdCompressor(level=3).compress(lines.encode()))


def train_bpe(documents: list[str], vocab_size: int, out_dir: str) -> None:
  """A GPT-2-shaped byte-level BPE (tokenizer.json) trained on `documents`."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(documents, trainer)
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, "tokenizer.json"))


def bench_text(kind: str, max_bytes: int, bpe_vocab: int, batch: int, threads: int,
               steps: int) -> dict:
  from ensemble_jax.data import text_readers, token_cache, tokenizers, windows

  root = tempfile.mkdtemp(prefix="pile-bench-")
  try:
    name, documents = corpus_documents(kind, max_bytes)
    corpus_bytes = sum(len(d.encode()) for d in documents)
    write_pile_shards(os.path.join(root, "pile"), documents)
    clock = Clock()
    train_bpe(documents, bpe_vocab, os.path.join(root, "bpe"))
    bpe_train_s = clock.read()[0]
    corpus = text_readers.files_corpus(os.path.join(root, "pile"), dataset="pile")
    clock = Clock()
    read_docs = sum(1 for _ in corpus.documents())
    reading = _rates(corpus_bytes, *clock.read(), "bytes")
    out = {"corpus": name, "documents": read_docs, "corpus_mb": round(corpus_bytes / 1e6, 2),
           "read_jsonl_zst": reading, "caches": {}}
    for tok_name, tokenizer in (("byte", tokenizers.ByteTokenizer()),
                                ("bpe", tokenizers.create_tokenizer("gpt2",
                                                                    os.path.join(root, "bpe")))):
      corpus = text_readers.files_corpus(os.path.join(root, "pile"), dataset="pile")
      cache_dir = os.path.join(root, f"cache-{tok_name}")
      clock = Clock()
      stats = token_cache.build(corpus.documents(), tokenizer, 0.01, cache_dir, corpus.name)
      tokens = stats["train_tokens"] + stats["eval_tokens"]
      row = _rates(tokens, *clock.read(), "tokens")
      row.update(vocab_size=int(tokenizer.vocab_size),
                 bytes_per_token=round(corpus_bytes / tokens, 3),
                 core_hours_per_billion_tokens=round(1e9 / row["tokens_per_cpu_s"] / 3600, 2))
      out["caches"][tok_name] = row
    out["bpe"] = {"vocab_size": bpe_vocab, "trained_on": "the corpus itself",
                  "train_s": round(bpe_train_s, 2), "library": "tokenizers " +
                  __import__("tokenizers").__version__}
    streams, _ = token_cache.load(os.path.join(root, "cache-bpe"))
    source = windows.PackedTokens(streams["train"], CONTEXT, "bench")
    if len(source) < 1:
      raise SystemExit(f"the corpus is too small for one window of {CONTEXT + 1} tokens")
    wall, cpu = _run_pipeline(source, lambda example, u: example, batch, steps, threads)
    win = _rates(batch * steps, wall, cpu, "windows")
    win.update(context=CONTEXT, batch=batch, steps=steps, grain_threads=threads,
               tokens_per_cpu_s=round(win["windows_per_cpu_s"] * CONTEXT, 1),
               cores_per_accelerator=round(H100_TOKENS_PER_S / CONTEXT
                                           / win["windows_per_cpu_s"], 4))
    out["windows"] = win
    out["accelerator_tokens_per_s"] = H100_TOKENS_PER_S
    return out
  finally:
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- main


def machine() -> dict:
  """The host (`record.host_info`: CPU model and features, jax), its cores and load."""
  return {**record.host_info(), "cores": os.cpu_count(),
          "load_average_1m": round(os.getloadavg()[0], 2), "python": platform.python_version()}


FLAGS = flags.FlagValues()
flags.DEFINE_integer("images", 400, "synthetic JPEGs written and read", flag_values=FLAGS)
flags.DEFINE_integer("batch", 128, "images (windows) per pipeline batch", flag_values=FLAGS)
flags.DEFINE_integer("steps", 0, "pipeline batches timed; 0: images // batch, at least 2",
                     flag_values=FLAGS)
flags.DEFINE_integer("threads", 2, "grain threads (config.data.num_threads)", flag_values=FLAGS)
flags.DEFINE_enum("text", "pydocs", ["pydocs", "generated"],
                  "corpus: the fetched Python docs (generated if absent) or generated words",
                  flag_values=FLAGS)
flags.DEFINE_integer("text_bytes", 0, "cap on the corpus's size; 0: all of it (pydocs) or 4 MB",
                     flag_values=FLAGS)
flags.DEFINE_integer("bpe_vocab", 50257, "the trained BPE's vocabulary size", flag_values=FLAGS)
flags.DEFINE_string("out", "", "write the results as JSON here", flag_values=FLAGS)


def summary(r: dict) -> str:
  im, tx = r["images"], r["text"]
  st = im["stages_one_thread"]
  lines = [
      f"images ({im['dataset']['train_images']} JPEGs, mean {im['dataset']['mean_width']:.0f}x"
      f"{im['dataset']['mean_height']:.0f}, {im['dataset']['mean_jpeg_kb']} KB), "
      "per CPU-second (wall-clock):",
      *(f"  {k:<18} {v['images_per_cpu_s']:8.1f} images/s  ({v['images_per_s_wall']:.1f})"
        for k, v in st.items()),
      f"  pipeline {im['pipeline']['grain_threads']} threads {im['pipeline']['images_per_cpu_s']:8.1f}"
      f" images/s  ({im['pipeline']['images_per_s_wall']:.1f})",
      f"  cores to feed {H100_IMAGES_PER_S} images/s: {im['cores_per_accelerator']}",
      f"text ({tx['corpus']}, {tx['corpus_mb']} MB), per CPU-second (wall-clock):",
      *(f"  cache build {k:<5} {v['tokens_per_cpu_s']:12.0f} tokens/s  "
        f"({v['tokens_per_s_wall']:.0f}), {v['bytes_per_token']} bytes/token"
        for k, v in tx["caches"].items()),
      f"  windows of {CONTEXT}: {tx['windows']['windows_per_cpu_s']:.0f} windows/s "
      f"({tx['windows']['windows_per_s_wall']:.0f}); cores to feed {H100_TOKENS_PER_S} "
      f"tokens/s: {tx['windows']['cores_per_accelerator']}"]
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  steps = FLAGS.steps or max(2, FLAGS.images // FLAGS.batch)
  start = time.perf_counter()
  result = {"machine": machine(),
            "images": bench_images(FLAGS.images, FLAGS.batch, FLAGS.threads, steps),
            "text": bench_text(FLAGS.text, FLAGS.text_bytes, FLAGS.bpe_vocab, FLAGS.batch,
                               FLAGS.threads, steps)}
  result["machine"]["load_average_1m_end"] = round(os.getloadavg()[0], 2)
  result["total_s"] = round(time.perf_counter() - start, 1)
  print(summary(result))
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  cli.run(main)
