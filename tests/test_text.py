"""Text data: tokenizers, readers, the hashed split, windows, the token cache and load()."""
import json
import os
import pathlib
import time
import types

import numpy as np
import pytest

from ensemble_jax.data import fetch, text, text_readers, token_cache, tokenizers, windows

pytestmark = pytest.mark.unit

EOS = tokenizers.GPT2_EOS


def _config(**overrides):
  config = dict(dataset="files", source="files", path="", data_dir="", tokenizer="byte",
                tokenizer_dir="", context=8, val_fraction=0.25, pile_subsets=(),
                text_key="text", skip_bad_lines=False)
  config.update(overrides)
  return types.SimpleNamespace(**config)


def _write_tree(root: pathlib.Path, files: dict) -> pathlib.Path:
  for rel, content in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
  return root


def _split_docs(stream: np.ndarray, tokenizer) -> list[str]:
  """Documents of a packed stream (EOS-terminated)."""
  ends = np.flatnonzero(np.asarray(stream) == tokenizer.eos_id)
  starts = np.concatenate([[0], ends[:-1] + 1])
  return [tokenizer.decode(stream[s:e]) for s, e in zip(starts, ends)]


def test_byte_tokenizer_round_trip():
  tok = tokenizers.create_tokenizer("byte")
  assert (tok.vocab_size, tok.eos_id) == (256, 0)
  s = "plain ASCII\r\n\ttabs, héllo wörld, ☃, 😀, 中文"
  ids = tok.encode(s)
  assert ids.dtype == np.int32 and ids.tolist() == list(s.encode("utf-8"))
  assert tok.decode(ids) == s
  assert tok.encode("a\0b").tolist() == [97, 98]  # NUL is EOS: dropped from text
  assert tok.decode([0xff, 97]) == "\ufffda"
  with pytest.raises(ValueError, match="unknown tokenizer 'nope'"):
    tokenizers.create_tokenizer("nope")


def test_packing_tiles_the_stream_exactly_once(tmp_path):
  rng = np.random.default_rng(0)
  docs = [rng.integers(1, 128, size=n) for n in (5, 1, 17, 40, 3, 9, 0 + 2)]
  # Packed as the cache packs them: each document's tokens (ASCII bytes here), then EOS.
  texts = [(f"d{i}", bytes(d.tolist()).decode("ascii")) for i, d in enumerate(docs)]
  token_cache.build(texts, tokenizers.ByteTokenizer(), 1e-9, tmp_path / "c")
  stream = np.asarray(token_cache.load(tmp_path / "c")[0]["train"])
  ends = np.cumsum([len(d) + 1 for d in docs]) - 1
  assert np.array_equal(np.flatnonzero(stream == 0), ends)  # one EOS after each document
  for context in (1, 4, 7, 16):
    source = windows.PackedTokens(stream, context)
    n = len(source)
    assert n == (len(stream) - 1) // context
    examples = [source.get(i)["tokens"] for i in range(n)]
    assert all(w.shape == (context + 1,) and w.dtype == np.int32 for w in examples)
    targets = np.concatenate([w[1:] for w in examples])
    assert np.array_equal(targets, stream[1:n * context + 1])  # none lost, none repeated
    inputs = np.concatenate([w[:-1] for w in examples])
    assert np.array_equal(inputs, stream[:n * context])
    assert windows.dropped_tokens(len(stream), context) == len(stream) - n * context - 1
    with pytest.raises(IndexError):
      source.get(n)
  assert len(windows.PackedTokens(stream[:4], 4)) == 0 and windows.dropped_tokens(4, 4) == 4


def test_split_is_a_stable_hash_of_the_document_id(tmp_path):
  ids = [f"doc{i}.txt" for i in range(20000)]
  frac = np.mean([token_cache.is_eval(d, 0.05) for d in ids])
  assert 0.045 < frac < 0.055
  assert token_cache.split_hash("a/b.rst.txt") == token_cache.split_hash("a/b.rst.txt")
  # Hash seed independence: the hash is sha1, pinned here.
  assert token_cache.split_hash("x") == int("11f6ad8ec52a2984", 16) / 2**64

  tok = tokenizers.ByteTokenizer()
  docs = [(f"d{i}", f"document number {i}") for i in range(200)]
  splits = []
  for order, docs_in_order in enumerate((docs, docs[::-1])):
    cache = tmp_path / f"cache{order}"
    token_cache.build(docs_in_order, tok, 0.3, cache)
    streams, stats = token_cache.load(cache)
    splits.append({s: set(_split_docs(streams[s], tok)) for s in token_cache.SPLITS})
    assert stats["train_documents"] + stats["eval_documents"] == 200
  assert splits[0] == splits[1]  # file order does not matter
  train, evaluation = splits[0]["train"], splits[0]["eval"]
  assert not train & evaluation and len(train | evaluation) == 200
  assert 40 < len(evaluation) < 80
  assert evaluation == {t for d, t in docs if token_cache.is_eval(d, 0.3)}


def _zst(path: pathlib.Path, lines: list[str]) -> None:
  import zstandard

  path.write_bytes(zstandard.ZstdCompressor().compress("\n".join(lines).encode() + b"\n"))


def _pile_record(text_: str, subset: str) -> str:
  return json.dumps({"text": text_, "meta": {"pile_set_name": subset}})


def test_jsonl_zst_shards_with_subset_filter(tmp_path):
  pile = tmp_path / "pile"
  (pile / "train").mkdir(parents=True)
  _zst(pile / "train" / "00.jsonl.zst", [
      _pile_record("wiki one", "Wikipedia (en)"),
      _pile_record("code one", "Github"),
      "",  # blank lines are skipped but still counted
      _pile_record("wiki two \ud800 lone surrogate", "Wikipedia (en)"),
  ])
  (pile / "val.jsonl").write_text(_pile_record("arxiv one", "ArXiv") + "\n")
  docs = list(text_readers.read_jsonl(pile / "train" / "00.jsonl.zst"))
  assert [d for d, _ in docs] == ["00.jsonl.zst:1", "00.jsonl.zst:2", "00.jsonl.zst:4"]
  assert docs[2][1] == "wiki two \ufffd lone surrogate"  # valid UTF-8 for any tokenizer

  root, rels = text_readers.list_corpus_files(pile)
  assert rels == ["train/00.jsonl.zst", "val.jsonl"]
  wiki = list(text_readers.read_files(root, rels, pile_subsets=("Wikipedia (en)",)))
  assert [d for d, _ in wiki] == ["train/00.jsonl.zst:1", "train/00.jsonl.zst:4"]
  both = list(text_readers.read_files(root, rels, pile_subsets=("Github", "ArXiv")))
  assert [t for _, t in both] == ["code one", "arxiv one"]

  config = _config(dataset="pile", path=str(pile), data_dir=str(tmp_path / "cache"),
                   pile_subsets=("Wikipedia (en)",), context=4, val_fraction=0.5)
  config.val_fraction = next(  # one doc per split
      f for f in np.linspace(0.05, 0.95, 19)
      if token_cache.is_eval(wiki[0][0], f) != token_cache.is_eval(wiki[1][0], f))
  data = text.load(config)
  assert data.stats["train_documents"] + data.stats["eval_documents"] == 2
  all_docs = _split_docs(data.train.stream, data.tokenizer) + _split_docs(data.eval.stream,
                                                                          data.tokenizer)
  assert sorted(all_docs) == sorted(t for _, t in wiki)

  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "ok"}\nnot json\n')
  with pytest.raises(fetch.DataError, match=r"bad.jsonl:2 is not valid JSON .*"
                                            r"config.data.skip_bad_lines=True"):
    list(text_readers.read_jsonl(bad))
  with pytest.raises(fetch.DataError, match="bad.jsonl:1 has no string field 'content'"):
    list(text_readers.read_jsonl(bad, text_key="content"))


def test_bad_jsonl_lines_stop_the_run_or_are_skipped_and_counted(tmp_path):
  corpus = _write_tree(tmp_path / "corpus", {"a.jsonl": "\n".join(
      ['{"text": "first document, long enough for a window"}', '{"text": "cut off',
       '["a list"]', '{"body": "no text field"}', '{"text": "second document, also long"}'])})
  cache = str(tmp_path / "cache")
  with pytest.raises(fetch.DataError, match=r"a.jsonl:2 is not valid JSON"):
    text.load(_config(path=str(corpus), data_dir=cache, val_fraction=0.5))
  assert not os.listdir(tmp_path / "cache" / "tokens")  # no half-built cache left behind
  data = text.load(_config(path=str(corpus), data_dir=cache, val_fraction=0.5,
                           skip_bad_lines=True))
  assert data.stats["skipped_lines"] == 3
  assert data.stats["first_skipped_line"] == f"{corpus / 'a.jsonl'}:2"
  assert data.stats["train_documents"] + data.stats["eval_documents"] == 2
  again = text.load(_config(path=str(corpus), data_dir=cache, val_fraction=0.5,
                            skip_bad_lines=True))
  assert again.stats["cached"] and again.stats["skipped_lines"] == 3  # kept with the cache
  # The cache of the skipping reader is not the strict reader's: that one still stops.
  with pytest.raises(fetch.DataError, match=r"a.jsonl:2"):
    text.load(_config(path=str(corpus), data_dir=cache, val_fraction=0.5))


def test_building_the_token_cache_says_what_and_how_long(tmp_path, caplog):
  corpus = _write_tree(tmp_path / "corpus", {f"{i}.txt": "some text " * 20 for i in range(8)})
  config = _config(path=str(corpus), data_dir=str(tmp_path / "cache"))
  with caplog.at_level("INFO"):
    data = text.load(config)
  assert f"token cache: tokenizing {corpus} into " in caplog.text
  assert "token cache: 8 documents, 1608 tokens in " in caplog.text
  assert data.stats["train_tokens"] + data.stats["eval_tokens"] == 1608


@pytest.mark.parametrize("damage", ["truncate train.npy", "corrupt stats.json"])
def test_a_damaged_token_cache_names_the_file_and_how_to_rebuild_it(tmp_path, damage):
  corpus = _write_tree(tmp_path / "corpus", {f"{i}.txt": "some text " * 20 for i in range(8)})
  config = _config(path=str(corpus), data_dir=str(tmp_path / "cache"))
  data = text.load(config)
  cache_dir = pathlib.Path(data.stats["cache_dir"])
  name = damage.split()[1]
  with open(cache_dir / name, "r+b") as f:
    f.truncate(200 if name.endswith(".npy") else 10)
  with pytest.raises(fetch.DataError) as e:
    text.load(config)
  message = str(e.value)
  assert f"token cache file {cache_dir / name} is" in message and "\n" not in message
  assert f"`rm -r {cache_dir}` and run again" in message


def test_txt_tree_reads_every_txt_sorted(tmp_path):
  root = _write_tree(tmp_path / "docs", {
      "b.txt": "bee", "a/z.rst.txt": "zed\r\n", "a/y.txt": "why", "notes.md": "skipped",
      "c.rst": "skipped too"})
  docs = text_readers.read_files(*text_readers.list_corpus_files(root))
  assert list(docs) == [("a/y.txt", "why"), ("a/z.rst.txt", "zed\r\n"), ("b.txt", "bee")]
  # A glob and a single file work as config.data.path too.
  root_g, rels = text_readers.list_corpus_files(str(root / "a" / "*.txt"))
  assert (root_g, rels) == (root / "a", ["y.txt", "z.rst.txt"])
  assert text_readers.list_corpus_files(root / "b.txt") == (root, ["b.txt"])


def _train_tiny_bpe():
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=[EOS], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  corpus = ["the quick brown fox jumps over the lazy dog. ", "def f(x):\n    return x + 1\n",
            "héllo wörld, ☃ 😀"] * 30
  tok.train_from_iterator(corpus, trainer)
  return tok


def test_bpe_from_local_tokenizer_json_and_vocab_merges(tmp_path, monkeypatch):
  tok = _train_tiny_bpe()
  (tmp_path / "json").mkdir()
  (tmp_path / "files").mkdir()
  tok.save(str(tmp_path / "json" / "tokenizer.json"))
  tok.model.save(str(tmp_path / "files"))  # vocab.json + merges.txt
  (tmp_path / "files" / "vocab.json").rename(tmp_path / "files" / "encoder.json")  # GPT-2 names
  (tmp_path / "files" / "merges.txt").rename(tmp_path / "files" / "vocab.bpe")

  from_json = tokenizers.create_tokenizer("gpt2", str(tmp_path / "json"))
  monkeypatch.setenv(tokenizers.ENV_VAR, str(tmp_path / "files"))
  from_files = tokenizers.create_tokenizer("gpt2")
  s = f"the lazy fox said héllo ☃\n\tunseen zebra 😀 {EOS} and \0 NUL"
  for bpe in (from_json, from_files):
    assert bpe.vocab_size == 320 and bpe.eos_id == tok.token_to_id(EOS) == 0
    ids = bpe.encode(s)
    assert ids.dtype == np.int32 and bpe.decode(ids) == s
    assert bpe.eos_id not in ids.tolist()  # a literal "<|endoftext|>" is just text
    assert len(ids) < len(s.encode())  # merges apply
    assert bpe.decode([bpe.eos_id]) == EOS
    assert [x.tolist() for x in bpe.encode_batch(["a b", s])] == [bpe.encode("a b").tolist(),
                                                                  ids.tolist()]
  assert from_json.encode(s).tolist() == from_files.encode(s).tolist()

  root = _write_tree(tmp_path / "corpus", {f"{i}.txt": f"the quick fox {i} " * 5
                                           for i in range(8)})
  data = text.load(_config(path=str(root), data_dir=str(tmp_path / "cache"), tokenizer="gpt2",
                           tokenizer_dir=str(tmp_path / "json"), context=4, val_fraction=0.3))
  assert data.train.stream.dtype == np.uint16 and data.eos_id == 0
  docs = _split_docs(data.train.stream, data.tokenizer) + _split_docs(data.eval.stream,
                                                                      data.tokenizer)
  assert sorted(docs) == sorted(f"the quick fox {i} " * 5 for i in range(8))


def test_missing_tokenizer_files_say_where_and_how(tmp_path):
  with pytest.raises(tokenizers.TokenizerUnavailableError) as e:
    tokenizers.create_tokenizer("gpt2", str(tmp_path / "nowhere"))
  msg = str(e.value)
  assert str(tmp_path / "nowhere") in msg and "does not exist" in msg
  for hint in ("encoder.json", "vocab.bpe", "tokenizer.json", "config.data.tokenizer_dir",
               "TOKENIZER_DIR"):
    assert hint in msg
  (tmp_path / "half").mkdir()
  (tmp_path / "half" / "encoder.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match=r"holds \['encoder.json'\]"):
    tokenizers.BPETokenizer(tmp_path / "half")


def test_token_cache_is_reused_without_tokenizing(tmp_path, monkeypatch):
  root = _write_tree(tmp_path / "corpus", {f"d{i}.txt": f"document {i} " * 20 for i in range(30)})
  config = _config(path=str(root), data_dir=str(tmp_path / "cache"))
  first = text.load(config)
  assert not first.stats["cached"]
  assert pathlib.Path(first.stats["cache_dir"]).parent == tmp_path / "cache" / "tokens"
  assert not [p for p in (tmp_path / "cache" / "tokens").iterdir() if ".tmp" in p.name]

  def fail(self, _):
    raise AssertionError("re-tokenized although cached")
  monkeypatch.setattr(tokenizers.ByteTokenizer, "encode", fail)
  config.context = 16  # windows are views of the stream: a new context reuses the cache
  second = text.load(config)
  assert second.stats["cached"] and second.stats["cache_dir"] == first.stats["cache_dir"]
  assert isinstance(second.train.stream, np.memmap) and second.train.stream.dtype == np.uint16
  assert np.array_equal(first.train.stream, second.train.stream)
  assert np.array_equal(np.load(os.path.join(first.stats["cache_dir"], "eval.npy")),
                        first.eval.stream)  # a valid .npy without mmap too
  assert len(second.train) == (len(second.train.stream) - 1) // 16

  config.val_fraction = 0.5  # a different split is a different cache: tokenizes
  with pytest.raises(AssertionError, match="re-tokenized"):
    text.load(config)
  assert not [p for p in (tmp_path / "cache" / "tokens").iterdir() if ".tmp" in p.name]


class _BigVocab(tokenizers.ByteTokenizer):
  vocab_size, eos_id, fingerprint = 70000, 69999, "big"

  def encode(self, s):
    return super().encode(s) + 65536  # ids beyond uint16


def test_cache_dtype_follows_vocab_size(tmp_path):
  assert token_cache.token_dtype(65535) == np.uint16 and token_cache.token_dtype(65536) == np.int32
  tok = _BigVocab()
  token_cache.build([("a", "abc"), ("b", "de")], tok, 0.01, tmp_path / "c")
  streams, stats = token_cache.load(tmp_path / "c")
  assert streams["train"].dtype == np.int32 and stats["train_tokens"] == 7
  assert streams["train"].tolist() == [65536 + 97, 65536 + 98, 65536 + 99, 69999,
                                       65536 + 100, 65536 + 101, 69999]


def test_empty_or_missing_corpus_errors(tmp_path):
  cache = str(tmp_path / "cache")
  empty = _write_tree(tmp_path / "empty", {"a.txt": "", "b.txt": "\0"})
  with pytest.raises(ValueError, match=r"empty corpus: .*empty yielded 0 non-empty documents "
                                       r"\(2 empty\)"):
    text.load(_config(path=str(empty), data_dir=cache))
  (tmp_path / "nofiles").mkdir()
  with pytest.raises(ValueError, match=r"found 0 files .* under .*nofiles"):
    text.load(_config(path=str(tmp_path / "nofiles"), data_dir=cache))
  tiny = _write_tree(tmp_path / "tiny", {f"{i}.txt": "hi" for i in range(4)})
  with pytest.raises(ValueError, match=r"too small.*context \+ 1 = 65 tokens.*train: \d+ "
                                       r"documents, \d+ tokens"):
    text.load(_config(path=str(tiny), data_dir=cache, context=64))
  with pytest.raises(fetch.DatasetUnavailableError) as e:
    text.load(_config(dataset="pile", path=str(tmp_path / "pile"), data_dir=cache))
  assert str(tmp_path / "pile") in str(e.value)
  assert "*.jsonl.zst" in str(e.value) and "pile_set_name" in str(e.value)
  with pytest.raises(fetch.DatasetUnavailableError, match="config.data.path is empty"):
    text.load(_config(dataset="pile", data_dir=cache))
  with pytest.raises(fetch.DatasetUnavailableError, match="make data"):
    text.load(_config(dataset="pydocs", data_dir=str(tmp_path / "no_data")))


def test_tfds_text_dataset_under_mock_data(tmp_path):
  import tensorflow_datasets as tfds

  config = _config(dataset="lm1b", source="tfds", data_dir=str(tmp_path), context=4,
                   val_fraction=0.5)
  with tfds.testing.mock_data(num_examples=32, policy=tfds.testing.MockPolicy.USE_CODE):
    docs = list(text_readers.tfds_corpus("lm1b", "train", str(tmp_path)).documents())
    data = text.load(config)
    with pytest.raises(ValueError, match="no feature 'body'"):
      text.load(_config(dataset="lm1b", source="tfds", data_dir=str(tmp_path), text_key="body"))
  assert [d for d, _ in docs] == [f"lm1b/train:{i}" for i in range(32)]
  assert all(isinstance(t, str) for _, t in docs)
  n_eval = sum(token_cache.is_eval(d, 0.5) for d, t in docs if t)
  assert data.stats["eval_documents"] == n_eval
  assert data.stats["train_documents"] + n_eval == sum(1 for _, t in docs if t)
  assert data.train.get(0)["tokens"].shape == (5,)


def test_load_embedded_pydocs_with_byte_tokenizer(tmp_path):
  root = fetch.require("pydocs")  # missing: says to run `make data`
  files = sorted(root.rglob("*.txt"))
  config = _config(dataset="pydocs", path=str(root), data_dir=str(tmp_path), context=256,
                   val_fraction=0.05)
  start = time.monotonic()
  data = text.load(config)
  cold = time.monotonic() - start
  start = time.monotonic()
  again = text.load(config)
  warm = time.monotonic() - start
  s = data.stats
  print(f"\npydocs: {s['train_documents']} + {s['eval_documents']} documents, "
        f"{s['train_tokens']} + {s['eval_tokens']} tokens (train + eval), windows "
        f"{s['train_windows']} + {s['eval_windows']}, dropped {s['train_dropped_tokens']} + "
        f"{s['eval_dropped_tokens']}; load {cold:.2f}s cold, {warm:.3f}s cached")
  assert again.stats["cached"] and not s["cached"]
  documents = s["train_documents"] + s["eval_documents"]
  assert documents == len(files) and s["empty_documents"] == 0
  # Bytes + one EOS per document (the docs are valid UTF-8 without NUL).
  assert s["train_tokens"] + s["eval_tokens"] == sum(f.stat().st_size for f in files) + documents
  assert 9e6 < s["train_tokens"] + s["eval_tokens"] < 14e6
  assert 0.02 < s["eval_documents"] / documents < 0.1
  assert (data.vocab_size, data.eos_id) == (256, 0)
  assert len(data.train) == (s["train_tokens"] - 1) // 256
  window = data.eval.get(len(data.eval) - 1)["tokens"]
  assert window.shape == (257,) and window.dtype == np.int32 and window.max() < 256
