"""The report regenerates the same table from the same JSON, and draws the figure."""
import json
import os

from ensemble_jax import report


def _write(root, name, method, reached, time_s, step, flops_per_step, workers=None):
  os.makedirs(root / name)
  r = {"method": method, "config": {"seed": 0}, "steps": 100, "train_time_s": 50.0,
       "flops_per_step": flops_per_step, "final": {"accuracy": 0.9},
       "target": {"metric": "accuracy", "value": 0.9, "reached": reached,
                  "reached_step": step if reached else None,
                  "reached_time_s": time_s if reached else None}}
  if workers:
    r["num_workers"] = workers
  (root / name / "results.json").write_text(json.dumps(r))


def test_table_and_png_from_json(tmp_path):
  _write(tmp_path, "dp", "data_parallel", True, 40.0, 80, 1e10)
  _write(tmp_path, "ens_a", "ensemble", True, 10.0, 20, 8e10, workers=8)
  _write(tmp_path, "ens_b", "ensemble", False, 0, 0, 8e10, workers=8)
  out = tmp_path / "out"
  assert report.main([str(tmp_path), f"--out={out}"]) == 0
  first = (out / "table.md").read_text()
  assert report.main([str(tmp_path), f"--out={out}"]) == 0
  assert (out / "table.md").read_text() == first  # regenerates identically
  assert (out / "cost_vs_time.png").stat().st_size > 1000
  assert "| ens_a | ensemble | 8 | 0 | accuracy >= 0.9 | yes | 10.0 | 1.60 |" in first
  assert "| ens_b | ensemble | 8 | 0 | accuracy >= 0.9 | no | 50.0 | 8.00 |" in first
  assert "| data_parallel | 40.0 | 0.80 | 1 |" in first


def test_pareto_front():
  assert report.pareto([(1, 5), (2, 3), (3, 4), (4, 1)]) == [(1, 5), (2, 3), (4, 1)]
