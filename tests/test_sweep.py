"""The cost-vs-time sweep runs its grid, writes the report, and skips finished points."""
import os

from experiments.sweeps import cost_vs_time
from tests.conftest import REPO


def test_smoke_sweep_runs_then_skips_finished_points(tmp_path):
  config = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
  first = cost_vs_time.run(config, str(tmp_path), seeds=[0], grid="smoke")
  assert first == {"trained": 3, "skipped": 0}
  for method, point in (("data_parallel", "D1"), ("data_parallel", "D2"),
                        ("ensemble", "N8_L4")):
    assert (tmp_path / method / point / "seed0" / "results.json").exists()
  assert (tmp_path / "table.md").exists()
  assert (tmp_path / "cost_vs_time_ib_xdr800.png").exists()
  again = cost_vs_time.run(config, str(tmp_path), seeds=[0], grid="smoke")
  assert again == {"trained": 0, "skipped": 3}


def test_recost_rewrites_cost_blocks_from_calibration(tmp_path):
  import json

  config = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
  cost_vs_time.run(config, str(tmp_path), seeds=[0], grid="smoke", curves=["data_parallel"])
  path = tmp_path / "data_parallel" / "D2" / "seed0" / "results.json"
  before = json.loads(path.read_text())
  calibration = next((tmp_path / "calibration").glob("*/results.json"))
  record = json.loads(calibration.read_text())
  record["step_time_s"] = 1.5  # as if re-timed
  calibration.write_text(json.dumps(record))
  assert cost_vs_time.recost(config, str(tmp_path), "smoke") == 2
  after = json.loads(path.read_text())
  assert after["cost"]["modelled"]["device_step_time_s"] == 1.5
  assert after["cost"]["measured"] == before["cost"]["measured"]
  # The collectives the run read off its programs (D2: compiled on 2 of the 8 devices) stay.
  assert after["cost"]["modelled"]["collectives"] == before["cost"]["modelled"]["collectives"]
  assert "{'data': 2} mesh" in after["cost"]["modelled"]["collectives_source"]
  steps = after["cost"]["measured"]["steps_to_target"]
  assert after["cost"]["modelled"]["critical_path_s"]["nvlink"] >= steps * 1.5
