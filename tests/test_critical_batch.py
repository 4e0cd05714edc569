"""The critical-batch sweep runs its smoke grid, tunes on seed 0, resumes, and reports."""
import json

import pytest

from experiments.sweeps import critical_batch


def test_smoke_sweep_tunes_on_seed0_then_skips_finished_runs(tmp_path):
  # B = 16: 2 simulated devices of 8 (2 microbatches, the noise scale); 2 lrs on seed 0,
  # the better one on seed 1.
  first = critical_batch.run("fashion", str(tmp_path), seeds=[0, 1], grid="smoke",
                             lrs=[1.0, 2.0], batches=[16])
  assert first == {"trained": 3, "skipped": 0}
  (row,) = json.loads((tmp_path / "summary.json").read_text())["rows"]
  assert row["batch"] == 16 and row["devices"] == row["microbatches"] == 2
  assert row["seeds"] == 2 and row["lr_multiplier"] in (1.0, 2.0)
  assert (tmp_path / "B16" / f"lr{row['lr_multiplier']:g}" / "seed1").is_dir()
  b16 = json.loads((tmp_path / "B16" / "lr1" / "seed0" / "results.json").read_text())
  assert b16["config"]["train"]["noise_scale"] and b16["noise_scale"]["steps"] > 0
  # The whole smoke grid, lr 1: B = 8 (one device: one batch size, no noise scale) is new.
  again = critical_batch.run("fashion", str(tmp_path), seeds=[0], grid="smoke", lrs=[1.0])
  assert again == {"trained": 1, "skipped": 1}
  b8 = json.loads((tmp_path / "B8" / "lr1" / "seed0" / "results.json").read_text())
  assert "noise_scale" not in b8 and b8["config"]["train"]["microbatches"] == 1
  assert [r["batch"] for r in json.loads((tmp_path / "summary.json").read_text())["rows"]] \
      == [8, 16]
  assert "| 16 | 2 |" in (tmp_path / "table.md").read_text()
  assert (tmp_path / "critical_batch.png").stat().st_size > 0


def test_fit_recovers_the_knee_of_the_empirical_model():
  points = [(b, 100.0 * (1 + 512 / b)) for b in (64, 256, 1024, 4096)]
  fit = critical_batch.fit_critical_batch(points)
  assert fit["s_min"] == pytest.approx(100.0) and fit["b_crit"] == pytest.approx(512.0)
  assert critical_batch.fit_critical_batch(points[:1]) is None


def test_points_simulate_devices_as_microbatches():
  w = critical_batch.WORKLOADS["fashion"]
  config = critical_batch.point_config(w, 4096, seed=2, lr_multiplier=0.5)
  assert config.train.microbatches == config.cost.devices == 64
  assert config.train.noise_scale and config.train.stop_at_target and config.seed == 2
  assert config.train.num_steps == 200  # the floor: 2 epochs would be 30 steps
  assert config.optim.warmup_steps == 10 and config.eval.every_steps == 2
  assert critical_batch.budget_steps(w, 64) == 1875  # 2 epochs of 60,000
