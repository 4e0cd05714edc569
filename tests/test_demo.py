"""`make demo` ends with a few lines a newcomer reads: each point, then the verdict."""
from experiments import demo
from tests.test_report import _sweep


def test_the_demo_ends_with_its_points_and_the_verdict_in_few_lines(tmp_path):
  _sweep(tmp_path)  # DP D1, D4; ensemble N4_L100 (both seeds reach), N8_L50 (one misses)
  lines = demo.summary(str(tmp_path), preset="nvlink").splitlines()
  assert len(lines) <= 15
  assert lines[1].split()[:3] == ["data_parallel", "D1", "400"]
  assert "missed the target" in next(line for line in lines if "N8_L50" in line)
  assert lines[-3].startswith("Best method point ensemble N4_L100: time ratio ")
  assert lines[-1].startswith(f"Full tables: {tmp_path}/table.md")
