"""Text corpora for language modelling: documents -> token streams -> packed windows.

Documents come from `*.txt` trees (the embedded Python docs), Pile-style `.jsonl[.zst]`
shards or a TFDS text dataset. A document goes to eval iff a hash of its id says so, so the
split does not depend on file order, on the rest of the corpus or on Python's hash seed.
Each split's documents, each followed by EOS, are tokenized into one stream, cached on disk
as .npy (tokenizing is the slow part) and memory-mapped back.

An example is {"tokens": int32 [context + 1]}: window i = stream[i*context : i*context +
context + 1], so the targets (tokens[1:]) of consecutive windows tile the stream exactly
once. The tail too short for a full window is dropped and counted in `stats`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import struct
import tempfile
import time
from typing import Callable, Iterable, Iterator

import numpy as np

from ensemble_jax.data import fetch
from ensemble_jax.data.tokenizers import create_tokenizer

SPLITS = ("train", "eval")
_CACHE_VERSION = 1
_TEXT_SUFFIXES = (".txt",)
_JSONL_SUFFIXES = (".jsonl", ".jsonl.zst")
_BATCH_DOCS, _BATCH_CHARS = 256, 1 << 22  # documents handed to the tokenizer at once

PILE_LAYOUT = (
    "PILE_DIR/*.jsonl.zst or *.jsonl (subdirectories such as train/ are searched too), one "
    'JSON object per line: {"text": ..., "meta": {"pile_set_name": ...}}')

Document = tuple[str, str]  # (doc_id, text)
_SURROGATE = re.compile("[\ud800-\udfff]")


# ---- document readers: generators of (doc_id, text) ----


def _valid_unicode(text: str) -> str:
  """JSON escapes can hold lone surrogates, which no UTF-8 tokenizer accepts."""
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return _SURROGATE.sub("\ufffd", text)


def read_jsonl(path: str | os.PathLike, pile_subsets: Iterable[str] = (),
               text_key: str = "text", name: str = "") -> Iterator[Document]:
  """One document per JSON line (the Pile's layout); `.zst` shards are decompressed as a stream.

  doc_id is f"{name}:{line_number}" (name defaults to the file name; line numbers from 1).
  `pile_subsets` keeps only records whose meta.pile_set_name is listed (empty: all).
  """
  path = pathlib.Path(path)
  name = name or path.name
  allowed = frozenset(pile_subsets)
  with contextlib.ExitStack() as stack:
    raw = stack.enter_context(open(path, "rb"))
    if path.name.endswith(".zst"):
      import zstandard  # only on this path

      # Pile shards were compressed with long windows: allow them.
      raw = stack.enter_context(
          zstandard.ZstdDecompressor(max_window_size=2**31).stream_reader(raw))
    lines = stack.enter_context(
        io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n"))
    for line_number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_number} is not valid JSON ({e}); expected {PILE_LAYOUT}"
                         ) from None
      if not isinstance(record, dict):
        raise ValueError(f"{path}:{line_number} holds a JSON {type(record).__name__}, not an "
                         f"object; expected {PILE_LAYOUT}")
      if allowed:
        meta = record.get("meta")
        if not isinstance(meta, dict) or meta.get("pile_set_name") not in allowed:
          continue
      text = record.get(text_key)
      if not isinstance(text, str):
        raise ValueError(f"{path}:{line_number} has no string field {text_key!r} (keys: "
                         f"{sorted(record)}); set config.data.text_key to the text field.")
      yield f"{name}:{line_number}", _valid_unicode(text)


def _read_text_file(root: pathlib.Path, rel: str) -> Document:
  # Bytes, not read_text: keep "\r\n" etc. exactly as in the file.
  return rel, (root / rel).read_bytes().decode("utf-8", errors="replace")


def list_corpus_files(path: str | os.PathLike, suffixes=_TEXT_SUFFIXES + _JSONL_SUFFIXES
                      ) -> tuple[pathlib.Path, list[str]]:
  """(root, sorted relative posix paths) of the corpus files under a directory, file or glob."""
  path_s = os.path.expanduser(os.fspath(path))
  p = pathlib.Path(path_s)
  if p.is_dir():
    root = p
    files = [f for f in p.rglob("*") if f.name.endswith(suffixes) and f.is_file()]
  elif p.is_file():
    root, files = p.parent, [p]
  elif glob.has_magic(path_s):
    files = [pathlib.Path(f) for f in glob.glob(path_s, recursive=True) if os.path.isfile(f)]
    root = pathlib.Path(os.path.commonpath([f.parent for f in files])) if files else p.parent
  else:
    raise FileNotFoundError(path_s)
  return root, sorted(f.relative_to(root).as_posix() for f in files)


def read_files(root: str | os.PathLike, relpaths: Iterable[str], pile_subsets=(),
               text_key: str = "text") -> Iterator[Document]:
  """Documents of each file in order: a `.txt` file is one, a `.jsonl[.zst]` one per line."""
  root = pathlib.Path(root)
  for rel in relpaths:
    if rel.endswith(_JSONL_SUFFIXES):
      yield from read_jsonl(root / rel, pile_subsets, text_key, name=rel)
    else:
      yield _read_text_file(root, rel)


def read_text_tree(root: str | os.PathLike) -> Iterator[Document]:
  """Every `*.txt` (so also `*.rst.txt`) under `root`, sorted by relative path = doc_id."""
  root, relpaths = list_corpus_files(root, _TEXT_SUFFIXES)
  for rel in relpaths:
    yield _read_text_file(root, rel)


def _tfds_source(name: str, split: str, data_dir: str):
  import tensorflow_datasets as tfds  # heavy import, only on this path

  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None)
  except Exception as e:  # tfds raises several types for "not prepared"
    where = data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")
    raise fetch.DatasetUnavailableError(
        f"TFDS dataset {name!r} (split {split!r}) is not prepared under {where}: {e}\n"
        f"Prepare it as array_record, e.g. `tfds build {name} --data_dir={where} "
        "--file_format=array_record`, then set config.data.data_dir.") from e


def _tfds_text(source, name: str, text_key: str) -> Callable[[int], str]:
  features = source.dataset_info.features
  if text_key not in features:
    raise ValueError(f"TFDS dataset {name!r} has no feature {text_key!r} (features: "
                     f"{sorted(features)}); set config.data.text_key to its text feature.")

  def text(index: int) -> str:
    value = source[index][text_key]
    if isinstance(value, np.ndarray):
      value = value.item()
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
  return text


def read_tfds(name: str, split: str = "train", data_dir: str = "", text_key: str = "text"
              ) -> Iterator[Document]:
  """Records of a prepared (array_record) TFDS text dataset; doc_id is f"{name}/{split}:{i}"."""
  source = _tfds_source(name, split, data_dir)
  text = _tfds_text(source, name, text_key)
  for index in range(len(source)):
    yield f"{name}/{split}:{index}", text(index)


# ---- split and packing ----


def split_hash(doc_id: str) -> float:
  """A stable uniform in [0, 1) from the id: first 8 bytes of its sha1."""
  return int.from_bytes(hashlib.sha1(doc_id.encode("utf-8")).digest()[:8], "big") / 2**64


def is_eval(doc_id: str, val_fraction: float) -> bool:
  return split_hash(doc_id) < val_fraction


def num_windows(num_tokens: int, context: int) -> int:
  """Full windows of context + 1 tokens at stride context."""
  return max(0, (num_tokens - 1) // context)


def dropped_tokens(num_tokens: int, context: int) -> int:
  """Tokens of the ragged tail that no window uses as a target."""
  n = num_windows(num_tokens, context)
  return num_tokens - (n * context + 1) if n else num_tokens


def pack(token_arrays: Iterable[np.ndarray], eos_id: int) -> np.ndarray:
  """Documents' tokens, each followed by EOS, as one int32 stream (in memory; see the cache)."""
  parts = []
  for tokens in token_arrays:
    parts += [np.asarray(tokens, np.int32), np.array([eos_id], np.int32)]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


class PackedTokens:
  """A pipeline source over a 1-D token stream: example i is window i of context + 1 tokens."""

  def __init__(self, stream: np.ndarray, context: int, name: str = ""):
    if stream.ndim != 1:
      raise ValueError(f"{name or 'token stream'}: expected a 1-D stream, got {stream.shape}")
    if context < 1:
      raise ValueError(f"context={context} must be >= 1")
    self.stream, self.context, self.name = stream, int(context), name
    self._len = num_windows(len(stream), self.context)

  def __len__(self) -> int:
    return self._len

  def get(self, index: int) -> dict[str, np.ndarray]:
    index = int(index)
    if not 0 <= index < self._len:
      raise IndexError(f"window {index} out of range for {self._len} windows of {self.name}")
    start = index * self.context
    return {"tokens": np.asarray(self.stream[start:start + self.context + 1], dtype=np.int32)}


# ---- token cache ----


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 65535 else np.int32)


class _NpyWriter:
  """Appends to a 1-D .npy whose length is known only at the end, without holding it in memory.

  A fixed-size header is reserved and rewritten on close (the .npy format pads its header with
  spaces, so any length fits).
  """
  _HEADER_BYTES = 128
  _FLUSH_TOKENS = 1 << 22

  def __init__(self, path: pathlib.Path, dtype: np.dtype):
    self.path, self.dtype, self.count = path, np.dtype(dtype), 0
    self._file = open(path, "wb")
    self._file.write(b"\0" * self._HEADER_BYTES)
    self._pending, self._pending_tokens = [], 0

  def append(self, tokens: np.ndarray) -> None:
    self._pending.append(tokens)
    self._pending_tokens += len(tokens)
    if self._pending_tokens >= self._FLUSH_TOKENS:
      self._flush()

  def _flush(self) -> None:
    if self._pending:
      data = np.concatenate(self._pending).astype(self.dtype)
      self._file.write(data.tobytes())
      self.count += len(data)
    self._pending, self._pending_tokens = [], 0

  def close(self) -> None:
    self._flush()
    header = repr({"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                   "shape": (self.count,)}).encode("latin1")
    magic = b"\x93NUMPY\x01\x00"
    body_len = self._HEADER_BYTES - len(magic) - 2
    self._file.seek(0)
    self._file.write(magic + struct.pack("<H", body_len) + header.ljust(body_len - 1) + b"\n")
    self._file.close()

  def abort(self) -> None:
    self._file.close()


def cache_key(corpus_key: dict, tokenizer, val_fraction: float, prefix: str = "") -> str:
  """A short hash of what determines the token streams (not the context: windows are views)."""
  blob = json.dumps({"version": _CACHE_VERSION, "corpus": corpus_key,
                     "tokenizer": tokenizer.fingerprint, "val_fraction": float(val_fraction)},
                    sort_keys=True)
  digest = hashlib.sha1(blob.encode()).hexdigest()[:16]
  return f"{prefix}-{digest}" if prefix else digest


def default_token_cache_root(data_dir: str = "") -> pathlib.Path:
  base = pathlib.Path(data_dir).expanduser() if data_dir else fetch.default_cache_dir()
  return base / "tokens"


def _tokenize(documents: Iterable[Document], tokenizer, val_fraction: float,
              writers: dict[str, _NpyWriter]) -> dict[str, int]:
  counts = {f"{split}_documents": 0 for split in SPLITS}
  counts["empty_documents"] = 0
  eos = np.array([tokenizer.eos_id], np.int32)
  batch: list[Document] = []

  def flush():
    for (doc_id, _), tokens in zip(batch, tokenizer.encode_batch([t for _, t in batch])):
      if not len(tokens):
        counts["empty_documents"] += 1
        continue
      split = "eval" if is_eval(doc_id, val_fraction) else "train"
      writers[split].append(tokens)
      writers[split].append(eos)
      counts[f"{split}_documents"] += 1
    batch.clear()

  chars = 0
  for doc in documents:
    batch.append(doc)
    chars += len(doc[1])
    if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
      flush()
      chars = 0
  flush()
  return counts


def build_token_cache(documents: Iterable[Document], tokenizer, val_fraction: float,
                      cache_dir: str | os.PathLike, source_name: str = "") -> dict:
  """Tokenizes `documents` into cache_dir/{train,eval}.npy + stats.json, unless already there.

  Returns the stats (documents and tokens per split; "cached": whether it was reused).
  The directory is built under a temporary name and renamed, so it is complete or absent.
  """
  cache_dir = pathlib.Path(cache_dir)
  stats_path = cache_dir / "stats.json"
  if stats_path.is_file():
    return {**json.loads(stats_path.read_text()), "cached": True}
  cache_dir.parent.mkdir(parents=True, exist_ok=True)
  # Unique per builder (hosts sharing a file system may build at once); renamed when done.
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.tmp-", dir=cache_dir.parent))
  dtype = token_dtype(tokenizer.vocab_size)
  writers = {split: _NpyWriter(staging / f"{split}.npy", dtype) for split in SPLITS}
  start = time.monotonic()
  try:
    counts = _tokenize(documents, tokenizer, val_fraction, writers)
    for w in writers.values():
      w.close()
    if not counts["train_documents"] + counts["eval_documents"]:
      raise ValueError(
          f"empty corpus: {source_name or 'the documents given'} yielded 0 non-empty documents "
          f"({counts['empty_documents']} empty). Check config.data.path / dataset and, for "
          "Pile shards, config.data.pile_subsets and config.data.text_key.")
    stats = {**counts, **{f"{split}_tokens": writers[split].count for split in SPLITS},
             "tokenizer": tokenizer.fingerprint, "vocab_size": int(tokenizer.vocab_size),
             "eos_id": int(tokenizer.eos_id), "val_fraction": float(val_fraction),
             "source": source_name, "build_seconds": round(time.monotonic() - start, 3)}
    (staging / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True))
    try:
      os.rename(staging, cache_dir)
    except OSError:
      if not (cache_dir / "stats.json").is_file():  # not a concurrent builder's finished copy
        raise
      shutil.rmtree(staging, ignore_errors=True)
  except BaseException:
    for w in writers.values():
      w.abort()
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return {**stats, "cached": False}


def load_token_cache(cache_dir: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
  """({split: memory-mapped stream}, stats) of a cache written by `build_token_cache`."""
  cache_dir = pathlib.Path(cache_dir)
  stats_path = cache_dir / "stats.json"
  if not stats_path.is_file():
    raise FileNotFoundError(f"no token cache in {cache_dir} (stats.json missing); build it with "
                            "build_token_cache, or delete the directory and load again.")
  streams = {split: np.load(cache_dir / f"{split}.npy", mmap_mode="r") for split in SPLITS}
  return streams, json.loads(stats_path.read_text())


# ---- corpora from the config ----


@dataclasses.dataclass
class Corpus:
  """Where documents come from: `key` identifies the content (for the cache key)."""
  name: str  # for messages: a path or a TFDS name
  key: dict
  documents: Callable[[], Iterator[Document]]


def _missing_path_message(dataset: str, path: str) -> str:
  if dataset == "pile":
    return (f"Pile shards not found at {path or '(config.data.path is empty)'}. Set "
            f"config.data.path to a directory laid out as {PILE_LAYOUT}; nothing is downloaded.")
  return (f"text corpus not found at {path or '(config.data.path is empty)'}: set "
          "config.data.path to a directory (every *.txt file is a document; *.jsonl[.zst] files "
          "hold one JSON document per line), a file or a glob; or use dataset='pydocs' with "
          "path='' for the embedded Python docs (fetched by `make data`).")


def files_corpus(path: str, pile_subsets=(), text_key: str = "text", dataset: str = ""
                 ) -> Corpus:
  """Documents from a directory, file or glob of `.txt` / `.jsonl[.zst]` files."""
  try:
    root, relpaths = list_corpus_files(path)
  except FileNotFoundError:
    raise fetch.DatasetUnavailableError(_missing_path_message(dataset, path)) from None
  if not relpaths:
    kinds = "*.jsonl / *.jsonl.zst" if dataset == "pile" else "*.txt, *.jsonl or *.jsonl.zst"
    raise ValueError(f"empty corpus: found 0 files ({kinds}) under {path}. "
                     + _missing_path_message(dataset, path))
  files = []
  for rel in relpaths:
    st = (root / rel).stat()
    files.append([rel, st.st_size, st.st_mtime_ns])
  key = {"kind": "files", "root": str(root.resolve()), "files": files,
         "pile_subsets": sorted(pile_subsets), "text_key": text_key}
  return Corpus(str(path), key, lambda: read_files(root, relpaths, pile_subsets, text_key))


def tfds_corpus(name: str, split: str = "train", data_dir: str = "", text_key: str = "text"
                ) -> Corpus:
  source = _tfds_source(name, split, data_dir)
  text = _tfds_text(source, name, text_key)
  key = {"kind": "tfds", "name": name, "split": split, "data_dir": data_dir,
         "version": str(source.dataset_info.version), "num_records": len(source),
         "text_key": text_key}

  def documents():
    for index in range(len(source)):
      yield f"{name}/{split}:{index}", text(index)
  return Corpus(f"TFDS {name}/{split}", key, documents)


def corpus_from_config(data_config) -> Corpus:
  dataset, source = data_config.dataset, data_config.source
  if source == "tfds":
    return tfds_corpus(dataset, "train", data_config.data_dir, data_config.text_key)
  if source != "files":
    raise ValueError(f"config.data.source={source!r} is not a text source: use 'files' "
                     "(pydocs, pile, any directory/file/glob) or 'tfds'.")
  path = data_config.path
  if not path:
    if dataset != "pydocs":
      raise fetch.DatasetUnavailableError(_missing_path_message(dataset, path))
    path = str(fetch.require("pydocs", data_config.data_dir or None))
  return files_corpus(path, tuple(data_config.pile_subsets), data_config.text_key, dataset)


@dataclasses.dataclass
class TextData:
  """What training needs: the two window sources and the vocabulary facts."""
  train: PackedTokens
  eval: PackedTokens
  vocab_size: int
  eos_id: int
  tokenizer: object
  stats: dict  # documents / tokens / windows / dropped tail tokens per split, cache dir


def load(data_config) -> TextData:
  """Reads, splits, tokenizes (or reuses the cache) and packs the configured corpus."""
  context, val_fraction = int(data_config.context), float(data_config.val_fraction)
  if context < 1:
    raise ValueError(f"config.data.context={context} must be >= 1")
  if not 0 < val_fraction < 1:
    raise ValueError(f"config.data.val_fraction={val_fraction} must be in (0, 1): the eval "
                     "split is the documents whose id hashes below it.")
  tokenizer = create_tokenizer(data_config.tokenizer, data_config.tokenizer_dir)
  corpus = corpus_from_config(data_config)
  key = cache_key(corpus.key, tokenizer, val_fraction,
                  prefix=f"{data_config.dataset}-{tokenizer.name}".replace("/", "_"))
  cache_dir = default_token_cache_root(data_config.data_dir) / key
  build = build_token_cache(corpus.documents(), tokenizer, val_fraction, cache_dir, corpus.name)
  streams, stats = load_token_cache(cache_dir)
  stats.update(cached=build["cached"], cache_dir=str(cache_dir), context=context)
  splits = {}
  for split in SPLITS:
    splits[split] = PackedTokens(streams[split], context, f"{corpus.name} ({split})")
    stats[f"{split}_windows"] = len(splits[split])
    stats[f"{split}_dropped_tokens"] = dropped_tokens(len(streams[split]), context)
  short = [s for s in SPLITS if not len(splits[s])]
  if short:
    counts = ", ".join(f"{s}: {stats[f'{s}_documents']} documents, {stats[f'{s}_tokens']} "
                       "tokens" for s in SPLITS)
    raise ValueError(
        f"corpus {corpus.name} is too small: the {' and '.join(short)} split has fewer than "
        f"context + 1 = {context + 1} tokens, so no full window ({counts}). Use a bigger "
        "corpus, a smaller config.data.context or, for an empty eval split, a larger "
        "config.data.val_fraction.")
  return TextData(splits["train"], splits["eval"], int(tokenizer.vocab_size),
                  int(tokenizer.eos_id), tokenizer, stats)


def make_transform(data_config=None, train: bool = True):
  """Windows need no transform; the pipeline still takes one."""
  del data_config, train
  return lambda example, uniforms: example
