"""The samplers sweep runs end to end on a smoke grid, writes its table, and resumes."""
import json

import pytest

from experiments.sweeps import samplers


def test_smoke_samplers_sweep(tmp_path):
  chosen = ["random", "el2n", "gradmatch"]
  summary = samplers.run(str(tmp_path), seeds=[0], grid="smoke", samplers=chosen)
  assert list(summary) == chosen
  assert summary["random"]["build_time_s"]["mean"] == 0.0  # no pool to build
  assert summary["el2n"]["build_time_s"]["mean"] > 0
  table = (tmp_path / "table.md").read_text()
  assert all(f"| {s} | 1 |" in table for s in chosen)
  results = json.loads((tmp_path / "gradmatch" / "seed0" / "results.json").read_text())
  assert results["distill"]["weighted"] is True
  mtime = (tmp_path / "el2n" / "seed0" / "results.json").stat().st_mtime
  samplers.run(str(tmp_path), seeds=[0], grid="smoke", samplers=chosen)  # read back
  assert (tmp_path / "el2n" / "seed0" / "results.json").stat().st_mtime == mtime


def test_smoke_text_samplers_sweep(tmp_path):
  chosen = ["random", "kmeans_routed"]
  summary = samplers.run(str(tmp_path), seeds=[0], grid="smoke", samplers=chosen,
                         workload="pydocs")
  assert list(summary) == chosen and summary["kmeans_routed"]["build_time_s"]["mean"] > 0
  assert summary["random"]["perplexity"]["mean"] > 1
  assert "ensemble perplexity (headline aggregation)" in (tmp_path / "table.md").read_text()
  results = json.loads((tmp_path / "kmeans_routed" / "seed0" / "results.json").read_text())
  assert results["distill"]["pool_sizes"] == [128, 128]
  with pytest.raises(ValueError, match=r"samplers \['el2n'\] unknown for workload 'pydocs'"):
    samplers.run(str(tmp_path), seeds=[0], grid="smoke", samplers=["el2n"], workload="pydocs")
