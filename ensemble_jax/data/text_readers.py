"""Where documents come from: generators of (doc_id, text) over files or a TFDS dataset.

doc_id names a document stably: a relative path, `file:line` or `name/split:index`. The
train/eval split hashes it, so it must not depend on file order or on the machine.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import json
import os
import pathlib
import re
from typing import Callable, Iterable, Iterator

import numpy as np

from ensemble_jax.data import fetch

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".jsonl.zst")

PILE_LAYOUT = (
    "PILE_DIR/*.jsonl.zst or *.jsonl (subdirectories such as train/ are searched too), one "
    'JSON object per line: {"text": ..., "meta": {"pile_set_name": ...}}')

Document = tuple[str, str]  # (doc_id, text)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_unicode(text: str) -> str:
  """JSON escapes can hold lone surrogates, which no UTF-8 tokenizer accepts."""
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return _SURROGATE.sub("\ufffd", text)


SKIP_HINT = ("fix or delete the line, or set config.data.skip_bad_lines=True to skip such "
             "lines (counted in results.json's data.skipped_lines)")


def read_jsonl(path: str | os.PathLike, pile_subsets: Iterable[str] = (),
               text_key: str = "text", name: str = "", skipped: dict | None = None
               ) -> Iterator[Document]:
  """One document per JSON line, the Pile's layout.

  `.zst` shards are decompressed as a stream. doc_id is f"{name}:{line_number}", with name
  defaulting to the file name and lines counted from 1. `pile_subsets` keeps only records
  whose meta.pile_set_name is listed; empty keeps all.

  A line that is not a JSON object with a string `text_key` raises DataError naming
  file:line. Given a `skipped` dict, such a line is skipped and counted there instead, in
  `skipped_lines` and `first_skipped_line` (file:line).
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
      problem, record = None, None
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        problem = f"is not valid JSON ({e}); {SKIP_HINT}"
      if problem is None and not isinstance(record, dict):
        problem = f"holds a JSON {type(record).__name__}, not an object; {SKIP_HINT}"
      if problem is None and allowed:
        meta = record.get("meta")
        if not isinstance(meta, dict) or meta.get("pile_set_name") not in allowed:
          continue
      if problem is None and not isinstance(record.get(text_key), str):
        problem = (f"has no string field {text_key!r} (keys: {sorted(record)}); set "
                   f"config.data.text_key to the text field, or {SKIP_HINT}")
      if problem is None:
        yield f"{name}:{line_number}", _valid_unicode(record[text_key])
      elif skipped is None:
        raise fetch.DataError(f"{path}:{line_number} {problem}. Expected {PILE_LAYOUT}.")
      else:
        skipped["skipped_lines"] = skipped.get("skipped_lines", 0) + 1
        skipped.setdefault("first_skipped_line", f"{path}:{line_number}")


def _read_text_file(root: pathlib.Path, rel: str) -> Document:
  # Bytes, not read_text: keep "\r\n" etc. exactly as in the file.
  return rel, (root / rel).read_bytes().decode("utf-8", errors="replace")


def list_corpus_files(path: str | os.PathLike, suffixes=TEXT_SUFFIXES + JSONL_SUFFIXES
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
               text_key: str = "text", skipped: dict | None = None) -> Iterator[Document]:
  """Documents of each file in order.

  A `.txt` file is one document, a `.jsonl[.zst]` file one per line. If `skipped` is given,
  bad lines are skipped and counted in it (see `read_jsonl`)."""
  root = pathlib.Path(root)
  for rel in relpaths:
    if rel.endswith(JSONL_SUFFIXES):
      yield from read_jsonl(root / rel, pile_subsets, text_key, name=rel, skipped=skipped)
    else:
      yield _read_text_file(root, rel)


def _tfds_text(source, name: str, text_key: str) -> Callable[[int], str]:
  features = source.dataset_info.features
  if text_key not in features:
    raise fetch.DataError(f"TFDS dataset {name!r} has no feature {text_key!r} (features: "
                     f"{sorted(features)}); set config.data.text_key to its text feature.")

  def text(index: int) -> str:
    value = source[index][text_key]
    if isinstance(value, np.ndarray):
      value = value.item()
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
  return text


@dataclasses.dataclass
class Corpus:
  """Where documents come from: `key` identifies the content (for the cache key)."""
  name: str  # for messages: a path or a TFDS name
  key: dict
  documents: Callable[[], Iterator[Document]]
  # What reading the documents counted (skipped_lines, first_skipped_line); complete once
  # documents() is exhausted.
  counts: dict = dataclasses.field(default_factory=dict)


def missing_path_message(dataset: str, path: str) -> str:
  if dataset == "pile":
    return (f"Pile shards not found at {path or '(config.data.path is empty)'}. Set "
            f"config.data.path to a directory laid out as {PILE_LAYOUT}; nothing is downloaded.")
  return (f"text corpus not found at {path or '(config.data.path is empty)'}: set "
          "config.data.path to a directory (every *.txt file is a document; *.jsonl[.zst] files "
          "hold one JSON document per line), a file or a glob; or use dataset='pydocs' with "
          "path='' for the embedded Python docs (fetched by `make data`).")


def files_corpus(path: str, pile_subsets=(), text_key: str = "text", dataset: str = "",
                 skip_bad_lines: bool = False) -> Corpus:
  """Documents from a directory, file or glob of `.txt` / `.jsonl[.zst]` files.

  With `skip_bad_lines`, malformed `.jsonl` lines are skipped and counted in
  Corpus.counts."""
  try:
    root, relpaths = list_corpus_files(path)
  except FileNotFoundError:
    raise fetch.DatasetUnavailableError(missing_path_message(dataset, path)) from None
  if not relpaths:
    kinds = "*.jsonl / *.jsonl.zst" if dataset == "pile" else "*.txt, *.jsonl or *.jsonl.zst"
    raise fetch.DataError(f"empty corpus: found 0 files ({kinds}) under {path}. "
                          + missing_path_message(dataset, path))
  files = []
  for rel in relpaths:
    st = (root / rel).stat()
    files.append([rel, st.st_size, st.st_mtime_ns])
  key = {"kind": "files", "root": str(root.resolve()), "files": files,
         "pile_subsets": sorted(pile_subsets), "text_key": text_key}
  counts: dict = {}
  skipped = counts if skip_bad_lines else None  # None: a bad line is an error
  if skip_bad_lines:  # a different stream from the same files (keys of old caches unchanged)
    key["skip_bad_lines"] = True
  return Corpus(str(path), key,
                lambda: read_files(root, relpaths, pile_subsets, text_key, skipped), counts)


def tfds_corpus(name: str, split: str = "train", data_dir: str = "", text_key: str = "text"
                ) -> Corpus:
  source = fetch.tfds_source(name, split, data_dir)
  text = _tfds_text(source, name, text_key)
  key = {"kind": "tfds", "name": name, "split": split, "data_dir": data_dir,
         "version": str(source.dataset_info.version), "num_records": len(source),
         "text_key": text_key}

  def documents():
    for index in range(len(source)):
      yield f"{name}/{split}:{index}", text(index)
  return Corpus(f"TFDS {name}/{split}", key, documents)
