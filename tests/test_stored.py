"""Stored records read under today's names: committed results, studies and pools keep the
names they were written with (`ensemble_jax/stored.py`)."""
import json
import os
import subprocess

import numpy as np
import pytest

from ensemble_jax import config_lib, resume, stored
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def _old(config) -> dict:
  """`config` as a run recorded it before `distill.builder` was `distill.method`."""
  d = json.loads(json.dumps(config.to_dict()))
  d["distill"]["method"] = d["distill"].pop("builder")
  return d


def test_a_record_with_the_old_names_reads_under_todays():
  config = config_lib.base_config()
  config.distill.builder = "el2n"
  record = {"config": _old(config), "distill": {"method": "el2n", "pool_size": 3}, "steps": 5}
  migrated = stored.migrate(record)
  assert migrated["config"] == json.loads(json.dumps(config.to_dict()))
  assert migrated["distill"] == {"builder": "el2n", "pool_size": 3}
  assert migrated["steps"] == 5 and record["distill"] == {"method": "el2n", "pool_size": 3}
  assert stored.migrate(migrated) == migrated  # today's names are left as they are


def test_a_record_from_before_a_field_reads_as_what_it_trained_with():
  """Runs recorded before method.batchnorm synchronised their BatchNorm: they compare as
  that, so a point now per-device is a change (the study guard's refusal), except where
  the run stands for one device per model, whose program is the same either way."""
  config = config_lib.base_config()
  config.cost.devices = 8
  old = json.loads(json.dumps(config.to_dict()))
  del old["method"]["batchnorm"]
  assert stored.migrate_config(old)["method"]["batchnorm"] == "synchronised"
  assert "batchnorm" not in old["method"]  # the record itself is left as it is
  config.method.batchnorm = "per_device"
  assert resume.config_changes(old, config) == {
      "method.batchnorm": ("synchronised", "per_device")}
  config.cost.devices = old["cost"]["devices"] = 1
  assert resume.config_changes(old, config) == {}


def test_every_committed_config_reads_under_todays_schema():
  """Every committed results.json (and the legacy fixtures): its config names only fields
  the schema knows, its pool's block only today's keys."""
  paths = subprocess.check_output(["git", "ls-files", "experiments/results", "tests/data"],
                                  cwd=REPO, text=True).split()
  known = dict(config_lib.flat(config_lib.base_config()))
  read = 0
  for path in paths:
    if not path.endswith("results.json") and "legacy_results" not in path:
      continue
    r = stored.load(os.path.join(REPO, path))
    if not isinstance(r.get("config"), dict):
      continue
    read += 1
    assert {k for k, _ in config_lib.flat(r["config"])} <= set(known), path
    assert "method" not in (r.get("distill") or {}), path
  assert read > 1000


def test_a_changed_builder_is_a_change_whatever_name_the_run_stored_it_under():
  """`config_changes` compares only the fields a saved config holds: read under the old name,
  a run's builder would never be compared (`test_resume.py` refuses the resumed run)."""
  now = config_lib.base_config()
  now.distill.builder = "kmeans"
  saved = config_lib.base_config()
  saved.distill.builder = "el2n"
  assert resume.config_changes(_old(saved), now) == {"distill.builder": ("el2n", "kmeans")}
  assert resume.config_changes(_old(now), now) == {}


def test_a_studys_points_read_under_todays_names(tmp_path):
  from experiments.sweeps import study

  point = config_lib.base_config()
  point.distill.builder = "el2n"
  held = {"config": "c.py", "grid": "full", "settings": {}, "points": {"p": _old(point)}}
  (tmp_path / study.STUDY_FILE).write_text(json.dumps(held))
  read = study.read(str(tmp_path))
  assert read["points"]["p"] == json.loads(json.dumps(point.to_dict()))
  assert study.differences(read, {**held, "points": read["points"]}) == {}
  other = config_lib.base_config()
  other.distill.builder = "kmeans"
  assert study.differences(read, {**held, "points": {"p": other.to_dict()}}) == {
      "p: distill.builder": ("el2n", "kmeans")}


def test_a_cached_pools_info_reads_under_todays_keys(tmp_path):
  from ensemble_jax.distill import pools
  from ensemble_jax.distill.registry import Built

  path = str(tmp_path / "pool.npz")
  pools._write(path, Built([np.arange(3)], {"method": "el2n", "pool_size": 3}))
  assert pools._read(path).info == {"builder": "el2n", "pool_size": 3}
