"""The on-disk token cache: a corpus tokenized once, split by document, memory-mapped back.

Tokenizing is the slow part, so each split's documents, each followed by EOS, are written as
one 1-D `.npy` stream (`{train,eval}.npy` + `stats.json`). A document goes to eval iff a hash
of its id says so, so the split does not depend on file order, on the rest of the corpus or
on Python's hash seed. The format on disk is shared with existing runs: keep it.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import struct
import tempfile
import time
from typing import Iterable

import numpy as np
from absl import logging

from ensemble_jax.data import fetch
from ensemble_jax.data.text_readers import Document

SPLITS = ("train", "eval")
_CACHE_VERSION = 1
_BATCH_DOCS, _BATCH_CHARS = 256, 1 << 22  # documents handed to the tokenizer at once


def split_hash(doc_id: str) -> float:
  """A stable uniform in [0, 1) from the id: first 8 bytes of its sha1."""
  return int.from_bytes(hashlib.sha1(doc_id.encode("utf-8")).digest()[:8], "big") / 2**64


def is_eval(doc_id: str, val_fraction: float) -> bool:
  return split_hash(doc_id) < val_fraction


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 65535 else np.int32)


class _NpyWriter:
  """Appends to a 1-D .npy file without holding it in memory.

  Its length is known only at the end. A fixed-size header is reserved and rewritten on
  close; the .npy format pads its header with spaces, so any length fits.
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


def default_root(data_dir: str = "") -> pathlib.Path:
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


def build(documents: Iterable[Document], tokenizer, val_fraction: float,
          cache_dir: str | os.PathLike, source_name: str = "", reader_counts: dict | None = None
          ) -> dict:
  """Tokenizes `documents` into cache_dir/{train,eval}.npy + stats.json, unless already there.

  Returns the stats: documents and tokens per split, "cached" saying whether it was
  reused, and `reader_counts`, what the documents' reader counted while reading. The
  directory is built under a temporary name and renamed, so it is complete or absent.
  """
  cache_dir = pathlib.Path(cache_dir)
  stats_path = cache_dir / "stats.json"
  if stats_path.is_file():
    return {**_read_stats(cache_dir), "cached": True}
  cache_dir.parent.mkdir(parents=True, exist_ok=True)
  # Unique per builder (hosts sharing a file system may build at once); renamed when done.
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.tmp-", dir=cache_dir.parent))
  dtype = token_dtype(tokenizer.vocab_size)
  writers = {split: _NpyWriter(staging / f"{split}.npy", dtype) for split in SPLITS}
  start = time.monotonic()
  logging.info("token cache: tokenizing %s into %s (once; later runs read it back)",
               source_name or "the corpus", cache_dir)
  try:
    counts = _tokenize(documents, tokenizer, val_fraction, writers)
    for w in writers.values():
      w.close()
    if not counts["train_documents"] + counts["eval_documents"]:
      raise fetch.DataError(
          f"empty corpus: {source_name or 'the documents given'} yielded 0 non-empty documents "
          f"({counts['empty_documents']} empty). Check config.data.path / dataset and, for "
          "Pile shards, config.data.pile_subsets and config.data.text_key.")
    stats = {**(reader_counts or {}), **counts,
             **{f"{split}_tokens": writers[split].count for split in SPLITS},
             "tokenizer": tokenizer.fingerprint, "vocab_size": int(tokenizer.vocab_size),
             "eos_id": int(tokenizer.eos_id), "val_fraction": float(val_fraction),
             "source": source_name, "build_seconds": round(time.monotonic() - start, 3)}
    (staging / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True))
    logging.info("token cache: %d documents, %d tokens in %.1f s",
                 counts["train_documents"] + counts["eval_documents"],
                 sum(writers[split].count for split in SPLITS), stats["build_seconds"])
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


def _corrupt(cache_dir: pathlib.Path, path: pathlib.Path, what: str) -> fetch.DataError:
  return fetch.DataError(f"token cache file {path} {what}; delete the cache with `rm -r "
                         f"{cache_dir}` and run again: it is rebuilt from the corpus.")


def _read_stats(cache_dir: pathlib.Path) -> dict:
  path = cache_dir / "stats.json"
  try:
    return json.loads(path.read_text())
  except ValueError as e:
    raise _corrupt(cache_dir, path, f"is corrupt ({e})") from None


def load(cache_dir: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
  """({split: memory-mapped stream}, stats) of a cache written by `build`."""
  cache_dir = pathlib.Path(cache_dir)
  stats_path = cache_dir / "stats.json"
  if not stats_path.is_file():
    raise FileNotFoundError(f"no token cache in {cache_dir} (stats.json missing); build it with "
                            "token_cache.build, or delete the directory and load again.")
  stats = _read_stats(cache_dir)
  streams = {}
  for split in SPLITS:
    path = cache_dir / f"{split}.npy"
    try:
      streams[split] = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
      raise _corrupt(cache_dir, path, f"is truncated or corrupt ({e})") from None
    if len(streams[split]) != stats.get(f"{split}_tokens"):
      raise _corrupt(cache_dir, path, f"holds {len(streams[split])} tokens, not the "
                                      f"{stats.get(f'{split}_tokens')} of stats.json")
  return streams, stats
