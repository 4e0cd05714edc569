"""The committed pools' configs, and a stand-in for their data: what the key test hashes.

`tests/data/pool_keys.json` maps each committed results.json that records a pool to the key
the code of 75ab1a7 (before the builder registry) computed for its config over `StubData`;
`test_pool_keys.py` checks this code computes the same. The real keys also hash the data's
fingerprint (`pools.fingerprint`), which no change here touches. Regenerate (only when a
key is meant to change, with its records migrated):
`PYTHONPATH=$PWD python tests/pool_keys_lib.py > tests/data/pool_keys.json`.
"""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def committed_pool_runs() -> list[str]:
  """The committed results.json files whose run read a pool of a builder that keeps the
  keys of 75ab1a7 (`Builder.legacy_key`: the builders that existed then)."""
  from ensemble_jax import stored
  from ensemble_jax.distill.registry import BUILDERS

  out = subprocess.check_output(["git", "ls-files", "experiments/results"], cwd=REPO,
                                text=True)
  runs = []
  for path in out.split():
    if not path.endswith("results.json"):
      continue
    try:
      config = stored.load(os.path.join(REPO, path)).get("config") or {}
    except json.JSONDecodeError:
      continue
    builder = config.get("distill", {}).get("builder", "none")
    if builder != "none" and BUILDERS[builder].legacy_key:
      runs.append(path)
  return runs


def pool_config(path: str):
  """The run's recorded config on today's schema (fields it predates at their defaults)."""
  from ensemble_jax import config_lib, stored

  recorded = stored.load(os.path.join(REPO, path))["config"]
  config = config_lib.base_config()
  known = dict(config_lib.flat(config))
  for key, value in config_lib.flat(recorded):
    if key in known and key != "mesh":
      config_lib.set_dotted(config, key, tuple(value) if isinstance(value, list) else value)
  return config


class StubData:
  """The fields of a dataset a cache key reads, the same for every config."""

  class _Source:
    def __init__(self, n: int):
      self.n = n

    def __len__(self):
      return self.n

    def get(self, i: int):
      return {"label": np.int32(i % 10), "image": np.full((2, 2, 1), i, np.uint8)}

  def __init__(self, info: dict):
    self.info, self.train, self.eval = info, self._Source(100), self._Source(10_000)


def key_of(path: str) -> str:
  from ensemble_jax.distill import pools

  config = pool_config(path)
  consumers = 1 if config.method.name == "data_parallel" else config.method.num_workers
  return pools.cache_key(config, StubData({"dataset": config.data.dataset}), consumers)


if __name__ == "__main__":
  print(json.dumps({path: key_of(path) for path in committed_pool_runs()}, indent=0,
                   sort_keys=True))
