"""The critical-batch sweep runs its smoke grid, tunes on seed 0, resumes, and reports."""
import json
import os
import shutil

import pytest

from experiments.sweeps import critical_batch
from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.mark.e2e
def test_smoke_sweep_tunes_on_seed0_then_skips_finished_runs(tmp_path):
  # B = 16: 2 simulated devices of 8 (2 microbatches, the noise scale); the shared tuning
  # rule (smoke: x1 and x2, no extension) on seed 0, the chosen rate on seed 1. B = 16's
  # grid starts from the factor B = 8 chose, so B = 8 must be tuned: an error says so.
  with pytest.raises(SystemExit, match="add 8 to --batches"):
    critical_batch.run("fashion", str(tmp_path), seeds=[0, 1], grid="smoke", batches=[16])
  first = critical_batch.run("fashion", str(tmp_path), seeds=[0, 1], grid="smoke",
                             batches=[8, 16])
  assert first == {"tuning_runs": 4, "trained": 2, "resumed": 0, "from_tuning": 2,
                   "skipped": 0, "read_back": 0, "diverged": 0}
  small = json.loads((tmp_path / "B8" / "tuning.json").read_text())
  assert "warm_start_from_batch" not in small and "warm-start" not in small["rule"]
  (_, row) = json.loads((tmp_path / "summary.json").read_text())["rows"]
  assert row["batch"] == 16 and row["devices"] == row["microbatches"] == 2
  assert row["lr_factor"] in (1.0, 2.0) and row["tuning_runs"] == 2
  # Seed 1 is reported; seed 0, whose run won the choice of rate, is kept apart.
  assert row["seeds"] == 1 and list(row["steps_to_target"]) == ["1"]
  assert row["tuning_seed_steps"] is None or row["tuning_seed_steps"] > 0
  # the projection charges a DP point's evals: known wherever its steps to target are
  assert (row["evals_to_target"] is None) == (row["median_steps"] is None)
  record = json.loads((tmp_path / "B16" / "tuning.json").read_text())
  assert sorted(r["factor"] for r in record["axes"][0]["runs"]) == [1.0, 2.0]
  assert record["warm_start_from_batch"] == 8 and "warm-start" in record["rule"]
  assert "stops" in record["rule"]  # tune.stop_losers
  assert record["axes"][0]["warm_start_factor"] == pytest.approx(
      small["axes"][0]["chosen"] / small["axes"][0]["base"])
  seed0 = json.loads((tmp_path / "B16" / "seed0" / "results.json").read_text())
  chosen = json.loads((tmp_path / "B16" / record["chosen_run"] / "results.json").read_text())
  assert seed0["history"] == chosen["history"] and seed0["tuning"] == record  # not retrained
  seed1 = json.loads((tmp_path / "B16" / "seed1" / "results.json").read_text())
  assert seed1["config"]["seed"] == 1 and seed1["config"]["optim"]["learning_rate"] == \
      record["chosen"]["optim.learning_rate"]
  assert seed0["config"]["train"]["noise_scale"] and seed0["noise_scale"]["steps"] > 0
  again = critical_batch.run("fashion", str(tmp_path), seeds=[0, 1], grid="smoke",
                             batches=[8, 16])
  assert again == {"tuning_runs": 0, "trained": 0, "resumed": 0, "from_tuning": 0,
                   "skipped": 4, "read_back": 4, "diverged": 0}
  assert "| 16 | 2 |" in (tmp_path / "table.md").read_text()
  assert (tmp_path / "critical_batch.png").stat().st_size > 0
  # While only the tuning has run, the report reads the chosen tuning run as seed 0.
  for seed in (0, 1):
    shutil.rmtree(tmp_path / "B16" / f"seed{seed}")
  assert critical_batch.main(["critical_batch", "--grid=smoke", f"--workdir={tmp_path}",
                              "--report_only"]) == 0
  (_, partial) = json.loads((tmp_path / "summary.json").read_text())["rows"]
  assert partial["seeds"] == 1
  assert partial["steps_to_target"] == {"0": critical_batch._steps_to_target(chosen)}
  assert not (tmp_path / "B16" / "seed0").exists()  # read, not trained or copied
  # A sweep over some B reports every B finished under the workdir, not only its own.
  (tmp_path / "summary.json").unlink()
  assert critical_batch.run("fashion", str(tmp_path), seeds=[0], grid="smoke",
                            batches=[8])["trained"] == 0
  rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
  assert [r["batch"] for r in rows] == [8, 16]


def test_fit_recovers_the_knee_of_the_empirical_model():
  points = [(b, 100.0 * (1 + 512 / b)) for b in (64, 256, 1024, 4096)]
  fit = critical_batch.fit_critical_batch(points)
  assert fit["s_min"] == pytest.approx(100.0) and fit["b_crit"] == pytest.approx(512.0)
  assert critical_batch.fit_critical_batch(points[:1]) is None


def test_points_simulate_devices_as_microbatches():
  w = critical_batch.WORKLOADS["fashion"]
  config = critical_batch.point_config(w, 4096, seed=2)
  assert config.train.microbatches == config.cost.devices == 64
  assert config.train.noise_scale and config.train.stop_at_target and config.seed == 2
  assert config.train.num_steps == 200  # the floor: 2 epochs would be 30 steps
  assert config.optim.warmup_fraction == 0.05 and config.eval.every_steps == 2
  # a run cut off mid-way resumes from its last checkpoint, not from step 0 (the docs' B =
  # 4,096 x2 run once lost 235 steps, 25 minutes here, to a session's end)
  assert config.checkpoint.every_steps == 12
  one_device = critical_batch.point_config(w, 64, seed=0)  # one batch size: no noise scale
  assert one_device.train.microbatches == 1 and not one_device.train.noise_scale
  assert critical_batch.budget_steps(w, 64) == 1875  # 2 epochs of 60,000


@pytest.mark.parametrize("workload", [*sorted(critical_batch.WORKLOADS),
                                      "experiments/configs/imagenet_resnet50.py",
                                      "experiments/configs/pile_gpt2.py"])
def test_every_point_is_a_valid_run_and_a_valid_cluster(workload):
  """Every B of the full grids builds a config the loop accepts on one device and on the D
  devices it stands for (its cost report compiles it there): B = 1,024 once stopped the
  Fashion-MNIST sweep (an eval batch of 1,000 on 16 devices), and B >= 8,192 would have
  split each device's 64 rows into D > 64 microbatches."""
  from ensemble_jax import communication, config_lib, validation
  from ensemble_jax.methods import data_parallel

  w = critical_batch.load_workload(os.path.join(REPO, workload) if "/" in workload else workload)
  for batch in w.batches:
    config = critical_batch.point_config(w, batch, seed=0)
    devices = batch // w.per_device
    data_parallel.check_batch_sizes(config, 1)
    for field in ("train.batch_size", "eval.batch_size"):  # DataParallel.cluster_mesh's
      data_parallel.check_divisible(config_lib.get(config, field), field, devices, "D")
    cluster = communication.cluster_config(config, {"data": 1}, {"data": devices})
    validation.validate(cluster)
    data_parallel.check_batch_sizes(cluster, devices)
    microbatch = cluster.train.batch_size // (devices * cluster.train.microbatches)
    assert microbatch == w.per_device, (batch, microbatch)  # one simulated device's rows


def test_table_marks_a_row_that_only_the_tuning_seed_stands_for():
  # Before a B's other seeds run, its row is the tuning run, which won the choice: the
  # table says so instead of passing it off as a reported seed.
  def row(batch, steps, tuning_seed_only):
    return {"batch": batch, "devices": batch // 64, "lr_factor": 1.0, "lr_at_edge": False,
            "schedule_fraction": 0.5, "step_budget": 200, "peak_learning_rate": 0.01,
            "steps_to_target": {"0" if tuning_seed_only else "1": steps},
            "seeds": 1, "seeds_reached": 1, "median_steps": steps, "min_steps": steps,
            "max_steps": steps, "b_simple_at_target": None,
            "tuning_seed_only": tuning_seed_only}
  summary = {"target": "accuracy 0.85", "per_device": 64, "fit": None, "b_simple": None,
             "rows": [row(1024, 80, False), row(2048, 56, True)]}
  lines = critical_batch.table(summary).splitlines()
  assert "| 80 (1 seed) |" in next(l for l in lines if l.startswith("| 1024 "))
  assert "| 56 (the tuning seed only) |" in next(l for l in lines if l.startswith("| 2048 "))


def test_the_knee_is_fitted_without_rows_the_tuning_seed_alone_stands_for():
  # The tuning run won the choice (biased low): like the projection, the fit leaves it out.
  def row(batch, steps, tuning_seed_only=False):
    return {"batch": batch, "median_steps": steps, "tuning_seed_only": tuning_seed_only}
  reported = [row(64, 340), row(128, 200), row(256, 130)]
  assert critical_batch.fit_rows(reported + [row(512, 20, True)]) == \
      critical_batch.fit_critical_batch([(64, 340), (128, 200), (256, 130)])
  assert critical_batch.fit_rows([row(64, 340), row(128, 200, True)]) is None
