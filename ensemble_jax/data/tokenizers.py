"""Tokenizers for language modelling: raw UTF-8 bytes, or GPT-2 BPE from local files.

Both map text <-> int32 id arrays and expose `vocab_size`, `eos_id` (the id packed between
documents) and `fingerprint` (identifies the vocabulary, for the token cache key). Nothing
here downloads: the BPE files must already be on disk.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Iterable, Sequence

import numpy as np

from ensemble_jax.data import fetch

ENV_VAR = "TOKENIZER_DIR"
GPT2_EOS = "<|endoftext|>"

# Looked for in this order; the first complete set wins.
_JSON_FILE = "tokenizer.json"
_VOCAB_FILES = ("encoder.json", "vocab.json")
_MERGES_FILES = ("vocab.bpe", "merges.txt")


class TokenizerUnavailableError(fetch.DatasetUnavailableError):
  """The tokenizer's vocabulary files are not on disk."""


class ByteTokenizer:
  """UTF-8 bytes as ids (vocab 256). Needs no files and never sees an unknown token.

  EOS is the NUL byte (id 0): real text never contains it, so `encode` drops NUL bytes from
  its input and id 0 in a packed stream always means a document boundary.
  """
  name = "byte"
  vocab_size = 256
  eos_id = 0
  fingerprint = "byte"

  def encode(self, text: str) -> np.ndarray:
    data = text.encode("utf-8", errors="replace").replace(b"\0", b"")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: Iterable[int]) -> str:
    return bytes(np.asarray(ids, dtype=np.uint8)).decode("utf-8", errors="replace")


def _sha1_files(paths: Sequence[pathlib.Path]) -> str:
  h = hashlib.sha1()
  for path in paths:
    h.update(path.name.encode())
    h.update(path.read_bytes())
  return h.hexdigest()[:16]


def _missing_message(directory: pathlib.Path, what: str) -> str:
  return (
      f"GPT-2 BPE tokenizer files not found: {what} in {directory}. Looked for "
      f"{_JSON_FILE!r}, or {' / '.join(_VOCAB_FILES)} together with "
      f"{' / '.join(_MERGES_FILES)}.\n"
      "Nothing is downloaded here. Put either the GPT-2 encoder.json and vocab.bpe (from "
      "the openai/gpt-2 release, models/124M/) or tokenizer.json (from the Hugging Face "
      f"'gpt2' model repository) into a directory, then set config.data.tokenizer_dir or "
      f"${ENV_VAR} to it; or use config.data.tokenizer='byte', which needs no files.")


class BPETokenizer:
  """GPT-2 byte-level BPE loaded from local files through the `tokenizers` library.

  `directory` holds `tokenizer.json`, or `encoder.json` (vocab.json) + `vocab.bpe`
  (merges.txt). A literal "<|endoftext|>" inside a document is encoded as ordinary text, so
  `eos_id` appears in a packed stream only at document boundaries.
  """
  name = "gpt2"

  def __init__(self, directory: str | os.PathLike):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # only on this path

    directory = pathlib.Path(directory).expanduser()
    if not directory.is_dir():
      raise TokenizerUnavailableError(_missing_message(directory, "the directory does not exist"))
    vocab = next((directory / f for f in _VOCAB_FILES if (directory / f).is_file()), None)
    merges = next((directory / f for f in _MERGES_FILES if (directory / f).is_file()), None)
    if (directory / _JSON_FILE).is_file():
      files = [directory / _JSON_FILE]
      tok = Tokenizer.from_file(str(files[0]))
    elif vocab is not None and merges is not None:
      files = [vocab, merges]
      tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
      tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
      tok.decoder = decoders.ByteLevel()
      if tok.token_to_id(GPT2_EOS) is not None:
        tok.add_special_tokens([GPT2_EOS])
    else:
      present = sorted(p.name for p in directory.iterdir())[:20]
      raise TokenizerUnavailableError(_missing_message(
          directory, f"the directory holds {present or 'nothing'}"))
    eos_id = tok.token_to_id(GPT2_EOS)
    if eos_id is None:
      raise ValueError(f"the tokenizer in {directory} has no {GPT2_EOS!r} token; GPT-2 "
                       "packing needs it as the end-of-document id. Add it as a special token.")
    tok.encode_special_tokens = True  # documents never produce EOS by themselves
    self._tok = tok
    self.directory = directory
    self.files = tuple(files)
    self.eos_id = int(eos_id)
    self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
    self.fingerprint = f"gpt2-{_sha1_files(files)}"

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def default_tokenizer_dir() -> pathlib.Path:
  """$TOKENIZER_DIR if set, else <data cache>/tokenizers/gpt2."""
  env = os.environ.get(ENV_VAR)
  if env:
    return pathlib.Path(env).expanduser()
  return fetch.default_cache_dir() / "tokenizers" / "gpt2"


def create_tokenizer(name: str, tokenizer_dir: str = ""):
  """'byte' or 'gpt2' (files from `tokenizer_dir`, else $TOKENIZER_DIR or the cache)."""
  if name == "byte":
    return ByteTokenizer()
  if name == "gpt2":
    return BPETokenizer(tokenizer_dir or default_tokenizer_dir())
  raise ValueError(f"unknown tokenizer {name!r}: set config.data.tokenizer to 'byte' or 'gpt2'.")
