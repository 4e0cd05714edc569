"""`make demo` ends with a few lines a newcomer reads: each point, then the verdict."""
import json
import os
import re

import pytest

from ensemble_jax import report, validation
from experiments import demo
from experiments.configs import fashion_mnist
from experiments.sweeps import cost_vs_time
from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("grid", ["demo", "one_device"])
def test_a_grid_of_the_full_grids_points_trains_them_at_the_choices_its_tuning_made(grid):
  """The demo's points are the full grid's, at each point's committed tuning.json choice,
  and so are the one-device study's (at other names, one device each)."""
  full = fashion_mnist.sweep_grid("full")
  # one device normalises its whole batch: B256's namesake is the synchronised D = 4
  namesakes = {"B64": ("data_parallel", "D1"), "B256": ("data_parallel_sync_bn", "D4")}
  results = os.path.join(REPO, "experiments", "results", "fashion_mnist")
  for grid_curve, points in fashion_mnist.sweep_grid(grid).items():
    for name, (variant, overrides) in points.items():
      curve, name = namesakes.get(name, (grid_curve, name))
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


def _run(root, curve, point, seed, *, steps, time_s, flops, final, reached):
  """A demo run's results.json, as the sweep writes it (the fields the report reads)."""
  d = root / curve / point / f"seed{seed}"
  d.mkdir(parents=True)
  method = "ensemble" if curve.startswith("ensemble") else "data_parallel"
  r = {"method": method, "config": {"seed": seed}, "steps": steps, "train_time_s": 50.0,
       "final": {"accuracy": final, "num_examples": 2000},
       "target": {"metric": "accuracy", "value": 0.85, "reached": reached,
                  "reached_step": steps if reached else None,
                  "reached_time_s": time_s if reached else None},
       "cost": {"measured": {"steps_to_target": steps, "flops_to_target": flops},
                "modelled": {"devices": 8, "critical_path_s": {
                    p: time_s for p in ("nvlink", "ib_xdr800", "eth10g")}}}}
  (d / "results.json").write_text(json.dumps(r))


def _demo(root, flip: bool):
  """The demo's three runs on seed 0; `flip`: the single-seed flip the issue saw (data-parallel
  D = 8 one image short, the ensemble fast) and the strongest baseline slow."""
  _run(root, "data_parallel", "D8", 0, steps=59, time_s=9.9, flops=1.16e12,
       final=0.8495 if flip else 0.8515, reached=not flip)
  _run(root, *_strongest().split(), 0, steps=118 if flip else 85, time_s=11.0 if flip else 7.5,
       flops=0.6e12 if flip else 0.44e12, final=0.851, reached=True)
  _run(root, "ensemble", "N4_L469", 0, steps=60 if flip else 183, time_s=5.0 if flip else 30.4,
       flops=0.6e12 if flip else 1.8e12, final=0.852, reached=True)


def _strongest() -> str:
  """The committed study's strongest baseline ('dp_small_model_sync_bn D8')."""
  return report.verdict(report.points(report.load_runs(demo.STUDY)))["strongest"]


def test_a_single_seed_flip_does_not_change_the_demos_verdict(tmp_path):
  """The verdict is the committed study's (seeds 1-3 of the full grid), whatever the demo's
  single seeds do: the issue's fresh clone printed "it beats the strongest baseline" when
  data-parallel D = 8 missed by one image and the ensemble ran fast."""
  plain, flipped = tmp_path / "plain", tmp_path / "flipped"
  _demo(plain, flip=False)
  _demo(flipped, flip=True)
  a, b = demo.summary(str(plain)).splitlines(), demo.summary(str(flipped)).splitlines()
  verdict = [line for line in b if line.startswith("Verdict")]
  assert len(verdict) == 1 and verdict == [l for l in a if l.startswith("Verdict")]
  assert "no method point beats the strongest baseline" in verdict[0]
  assert not any("it beats" in line for line in a + b)
  # each run beside its committed counterpart; a miss counted in images
  d8 = next(line for line in b if line.startswith("data-parallel at D = 8"))
  assert "seed 0: missed, by 1 image" in d8 and "81 [75, 85] steps" in d8  # they reached
  assert "where the committed seeds differ" in d8
  ens = next(line for line in b if line.startswith("random streams, N = 4"))
  assert "183 [172, 210] steps, 1.80 [1.69, 2.06] TFLOPs" in ens and "faster than every committed seed" in ens
  # the strongest baseline is the committed study's, derived from its results
  assert _strongest().split()[0].startswith("dp_small_model")
  assert any(line.startswith(f"{demo.named(*_strongest().split())} *") for line in b)
  assert len(b) <= 15


def test_the_demo_names_points_and_presets_as_the_readme_does(tmp_path):
  """One name per thing: the verdict's closest point and preset as the README's verdict
  names them, no directory name or preset key. Fails on ef8466c2, which printed
  `ensemble_pca_routed_small N4_L469` and `eth10g` (the README: "small-model PCA-routed
  experts, N = 4", "10 GbE")."""
  _demo(tmp_path, flip=False)
  text = demo.summary(str(tmp_path))
  assert not re.search(r"eth10g|[a-z]+_\w+ [A-Z][\d.]+", text), text
  closest, preset = re.search(r"the closest, (.+), [\d.]+x \[.* ratio on (.+?), vs ",
                              text).groups()
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  assert closest in readme and preset in readme, (closest, preset)
  assert demo.named("ensemble_pca_routed_small", "N4_L469") == (
      "small-model PCA-routed experts, N = 4")


def test_the_demo_grid_holds_the_committed_strongest_baseline():
  grid = fashion_mnist.sweep_grid("demo")
  curve, point = report.verdict(report.points(report.load_runs(demo.STUDY)))["strongest"].split()
  assert point in grid[curve]
