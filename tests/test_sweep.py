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
  assert (tmp_path / "table.md").exists() and (tmp_path / "cost_vs_time_ib800.png").exists()
  again = cost_vs_time.run(config, str(tmp_path), seeds=[0], grid="smoke")
  assert again == {"trained": 0, "skipped": 3}
