"""The samplers sweep runs end to end on a smoke grid, writes its table, and resumes."""
import json
import os

import pytest

from experiments.sweeps import samplers

pytestmark = pytest.mark.e2e


def test_smoke_samplers_sweep(tmp_path):
  chosen = ["random", "gradmatch"]  # no pool, and a weighted coreset (tests/test_pools.py: more)
  summary = samplers.run(str(tmp_path), seeds=[0], grid="smoke", samplers=chosen)
  assert list(summary) == chosen
  assert summary["random"]["build_time_s"]["mean"] == 0.0  # no pool to build
  assert summary["gradmatch"]["build_time_s"]["mean"] > 0
  table = (tmp_path / "table.md").read_text()
  assert all(f"| {s} | 1 |" in table for s in chosen)
  results = json.loads((tmp_path / "gradmatch" / "seed0" / "results.json").read_text())
  assert results["distill"]["weighted"] is True
  mtime = (tmp_path / "gradmatch" / "seed0" / "results.json").stat().st_mtime
  samplers.run(str(tmp_path), seeds=[0], grid="smoke", samplers=chosen)  # read back
  assert (tmp_path / "gradmatch" / "seed0" / "results.json").stat().st_mtime == mtime


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


@pytest.mark.parametrize("workload, committed", [
    ("fashion", "experiments/results/samplers/random/seed0/results.json"),
    ("pydocs", "experiments/results/samplers_pydocs/random/seed0/results.json")])
def test_new_rows_warm_up_as_the_committed_rows_did(workload, committed):
  # The cost-vs-time grid's warm-up rule (a fraction of the budget) must not leak into this
  # sweep: a row added now is compared with rows measured under the old warm-up.
  import ml_collections

  from ensemble_jax import optim
  from tests.conftest import REPO

  with open(os.path.join(REPO, committed)) as f:
    old = ml_collections.ConfigDict(json.load(f)["config"]["optim"])
  old.warmup_fraction = old.get("warmup_fraction", 0.0)
  new = samplers.get_config("random", 0, "/tmp/unused", "full", workload).optim
  steps, per_epoch = (200, 937) if workload == "fashion" else (400, 1000)
  assert (optim.warmup_steps(new, steps, per_epoch)
          == optim.warmup_steps(old, steps, per_epoch) > 0)
