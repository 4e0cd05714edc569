"""`make demo` ends with a few lines a newcomer reads: each point, then the verdict."""
import json
import os

import pytest

from ensemble_jax import validation
from experiments import demo
from experiments.configs import fashion_mnist
from experiments.sweeps import cost_vs_time
from tests.conftest import REPO
from tests.test_report import _sweep

pytestmark = pytest.mark.unit


def test_the_demo_ends_with_its_points_and_the_verdict_in_few_lines(tmp_path):
  _sweep(tmp_path)  # DP D1, D4; ensemble N4_L100 (both seeds reach), N8_L50 (one misses)
  lines = demo.summary(str(tmp_path), preset="nvlink").splitlines()
  assert len(lines) <= 15
  assert lines[1].split()[:3] == ["data_parallel", "D1", "400"]
  assert "missed the target" in next(line for line in lines if "N8_L50" in line)
  assert lines[-3].startswith("Best method point ensemble N4_L100: time ratio ")
  assert lines[-1].startswith(f"Full tables: {tmp_path}/table.md")


@pytest.mark.parametrize("grid", ["demo", "one_device"])
def test_a_grid_of_the_full_grids_points_trains_them_at_the_choices_its_tuning_made(grid):
  """The demo's points are the full grid's, at each point's committed tuning.json choice,
  and so are the one-device study's (at other names, one device each)."""
  full = fashion_mnist.sweep_grid("full")
  namesakes = {"B64": "D1", "B256": "D4"}
  results = os.path.join(REPO, "experiments", "results", "fashion_mnist")
  for curve, points in fashion_mnist.sweep_grid(grid).items():
    for name, (variant, overrides) in points.items():
      name = namesakes.get(name, name)
      with open(os.path.join(results, curve, name, "tuning.json")) as f:
        chosen = json.load(f)["chosen"]
      assert {k: overrides[k] for k in chosen} == chosen, (curve, name)
      assert overrides["tune.factors"] == (1.0,)
      full_variant, full_overrides = full[curve][name]

      def trained(o):  # what the point trains, apart from its tuned values and layout
        return {k: v for k, v in o.items()
                if not k.startswith("tune.") and k not in chosen and k != "cost.devices"}

      assert variant == full_variant and trained(overrides) == trained(full_overrides)
      devices = 1 if grid == "one_device" else full_overrides.get("cost.devices")
      assert overrides.get("cost.devices") == devices
      validation.validate(cost_vs_time._point_config(fashion_mnist, variant, overrides, 0, "w"))
