"""Stored records read under today's names.

results.json, a checkpoint's record, a study's points and a cached pool's info keep the
names of the code that wrote them, and are never rewritten for a rename: they are read
through `load` (a results.json) or `migrate*`, which rename what `RENAMED` lists and leave
a record already under today's names as it is.
"""
from __future__ import annotations

import json

from ensemble_jax import config_lib

# Config fields renamed since runs were first recorded: {old dotted name: today's}. A
# config or an override naming an old one is a ConfigError naming today's.
RENAMED = {"distill.method": "distill.builder"}
# Config fields added since runs were first recorded: {dotted name: the value every run
# from before it trained with}, so that a record without one compares as what it did.
ADDED = {"method.batchnorm": "synchronised", "eval.target_values": [], "plugins": "",
         "tune.objective": "steps_to_target"}
# The keys of a pool's info (results.json `distill`) renamed with them.
INFO_RENAMED = {"method": "builder"}
# What every run's results.json holds (`record.build`); a results.json without them is
# some other tool's (a distillation benchmark's), not a run's.
RUN_KEYS = ("method", "config", "steps", "final", "target", "cost")


class NotARun(ValueError):
  """A results.json that is not a run's record: the report skips it, saying why."""


def load(path: str) -> dict:
  """A results.json under today's names."""
  with open(path) as f:
    return migrate(json.load(f))


def load_run(path: str) -> dict:
  """A run's results.json under today's names; NotARun if the file is no run's record."""
  with open(path) as f:
    try:
      record = json.load(f)
    except ValueError as e:  # json.JSONDecodeError
      raise NotARun(f"not JSON ({e})") from None
  missing = [k for k in RUN_KEYS if not isinstance(record, dict) or k not in record]
  if missing:
    raise NotARun(f"not a run's results.json (it has no {', '.join(missing)})")
  return migrate(record)


def migrate(record: dict) -> dict:
  """results.json or a checkpoint's record under today's names: its `config`, its pool's
  info (`distill`), and its targets (`targets`, from before the ladder: its one `target`)."""
  record = dict(record)
  if isinstance(record.get("target"), dict) and "targets" not in record:
    record["targets"] = [record["target"]]  # one target: the ladder's one rung
  if isinstance(record.get("config"), dict):
    record["config"] = migrate_config(record["config"])
  if isinstance(record.get("distill"), dict):
    record["distill"] = migrate_info(record["distill"])
  return record


def migrate_config(config: dict) -> dict:
  """A stored config (`config.to_dict()` as JSON) under today's field names, with the
  fields added since (`ADDED`) at the value it trained with."""
  config = _renamed(config, RENAMED)
  for dotted, before in ADDED.items():
    node, leaf = _parent(config, dotted)
    if isinstance(node, dict) and leaf not in node:
      node[leaf] = before
  return config


def migrate_info(info: dict) -> dict:
  """A pool's info (`distill.registry.pool_info`) under today's keys."""
  return _renamed(info, INFO_RENAMED)


def _parent(tree: dict, dotted: str) -> tuple[dict | None, str]:
  """The dict that holds `dotted`'s last key in `tree` (None if a key on the way is
  missing), and that key."""
  *path, leaf = dotted.split(".")
  node = tree
  for key in path:
    node = node.get(key) if isinstance(node, dict) else None
  return node, leaf


def _copied(tree):
  """A copy of a JSON tree (dicts, lists, scalars): copy.deepcopy's result, without its
  memo (a record is no graph), several times faster on the thousands the docs read."""
  if isinstance(tree, dict):
    return {k: _copied(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_copied(v) for v in tree]
  return tree


def _renamed(tree: dict, renames: dict[str, str]) -> dict:
  """A copy of `tree` with each dotted field of `renames` it holds under its new name."""
  tree = _copied(tree)
  for old, new in renames.items():
    node, leaf = _parent(tree, old)
    if isinstance(node, dict) and leaf in node:
      config_lib.set_dotted(tree, new, node.pop(leaf))
  return tree
