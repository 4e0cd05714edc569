"""Text corpora for language modelling: config -> documents -> token cache -> windows.

The parts are `text_readers`, documents of files or TFDS; `token_cache`, the hashed split
and the tokenized streams on disk; and `windows`, examples over a stream. This module
composes them from `config.data`, which `validation.validate` checks.
An example is {"tokens": int32 [context + 1]}.
"""
from __future__ import annotations

import dataclasses

from absl import logging

from ensemble_jax.data import fetch, token_cache
from ensemble_jax.data.text_readers import (Corpus, files_corpus, missing_path_message,
                                            tfds_corpus)
from ensemble_jax.data.tokenizers import create_tokenizer
from ensemble_jax.data.windows import PackedTokens, dropped_tokens


def corpus_from_config(data_config) -> Corpus:
  """config.data -> where its documents come from ('files' or 'tfds', as validated)."""
  dataset, source = data_config.dataset, data_config.source
  if source == "tfds":
    return tfds_corpus(dataset, "train", data_config.data_dir, data_config.text_key)
  path = data_config.path
  if not path:
    if dataset != "pydocs":
      raise fetch.DatasetUnavailableError(missing_path_message(dataset, path))
    path = str(fetch.require("pydocs", data_config.data_dir or None))
  return files_corpus(path, tuple(data_config.pile_subsets), data_config.text_key, dataset,
                      data_config.skip_bad_lines)


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
  tokenizer = create_tokenizer(data_config.tokenizer, data_config.tokenizer_dir)
  corpus = corpus_from_config(data_config)
  key = token_cache.cache_key(corpus.key, tokenizer, val_fraction,
                  prefix=f"{data_config.dataset}-{tokenizer.name}".replace("/", "_"))
  cache_dir = token_cache.default_root(data_config.data_dir) / key
  build = token_cache.build(corpus.documents(), tokenizer, val_fraction, cache_dir, corpus.name,
                            corpus.counts)
  streams, stats = token_cache.load(cache_dir)
  if stats.get("skipped_lines"):
    logging.warning("skipped %d malformed lines of %s (the first: %s; data.skip_bad_lines)",
                    stats["skipped_lines"], corpus.name, stats["first_skipped_line"])
  stats.update(cached=build["cached"], cache_dir=str(cache_dir), context=context)
  splits = {}
  for split in token_cache.SPLITS:
    splits[split] = PackedTokens(streams[split], context, f"{corpus.name} ({split})")
    stats[f"{split}_windows"] = len(splits[split])
    stats[f"{split}_dropped_tokens"] = dropped_tokens(len(streams[split]), context)
  short = [s for s in token_cache.SPLITS if not len(splits[s])]
  if short:
    counts = ", ".join(f"{s}: {stats[f'{s}_documents']} documents, {stats[f'{s}_tokens']} "
                       "tokens" for s in token_cache.SPLITS)
    raise fetch.DataError(
        f"corpus {corpus.name} is too small: the {' and '.join(short)} split has fewer than "
        f"context + 1 = {context + 1} tokens, so no full window ({counts}). Use a bigger "
        "corpus, a smaller config.data.context or, for an empty eval split, a larger "
        "config.data.val_fraction.")
  return TextData(splits["train"], splits["eval"], int(tokenizer.vocab_size),
                  int(tokenizer.eos_id), tokenizer, stats)
