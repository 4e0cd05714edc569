"""The samplers sweep runs end to end on a smoke grid, writes its table, and resumes."""
import json

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
