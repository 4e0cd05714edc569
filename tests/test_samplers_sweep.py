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


def test_every_committed_row_reads_back_as_finished_under_the_sweeps_config():
  # The sweep asks `run.finished_results` as every entry point does: a committed row its
  # config would train again, or refuse, is a sweep that cannot resume.
  import glob

  from ensemble_jax import run as run_lib
  from tests.conftest import REPO

  for workload, name in (("fashion", "samplers"), ("pydocs", "samplers_pydocs")):
    workdir = os.path.join(REPO, "experiments", "results", name)
    rows = sorted(glob.glob(os.path.join(workdir, "*", "seed*", "results.json")))
    assert len(rows) >= 9
    for path in rows:
      run_dir = os.path.dirname(path)
      sampler, seed = run_dir.split(os.sep)[-2], int(run_dir[-1])
      config = samplers.get_config(sampler, seed, workdir, "full", workload)
      assert run_lib.finished_results(config, run_dir) is not None, run_dir


def test_a_routed_pool_scoring_the_whole_split_has_no_rest_to_route(tmp_path):
  # eval.num_examples = 0 scores the whole split: score_rest_at_end has nothing to route,
  # so the routed k-means row validates; with a rest, an unroutable one is refused.
  from ensemble_jax import validation
  from ensemble_jax.config_lib import ConfigError

  config = samplers.get_config("kmeans_routed", 0, str(tmp_path), "full", "fashion")
  assert config.eval.score_rest_at_end and config.eval.num_examples == 0
  validation.validate(config)
  config.eval.num_examples = 2000
  with pytest.raises(ConfigError, match="score_rest_at_end"):
    validation.validate(config)
