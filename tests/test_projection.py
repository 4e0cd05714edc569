"""The projection's arithmetic on a hand-computed case (experiments/projection.py)."""
import dataclasses

import pytest

from ensemble_jax import costs
from experiments import projection

pytestmark = pytest.mark.unit

LINK = costs.Interconnect("test", bandwidth=1e9, latency=1e-3, models="a 1 GB/s test link")


def _allreduce(per, nbytes, group, count=1):
  return costs.ProgramCollective("test", per, "all-reduce", int(nbytes), group, count)


def _point(curve, name, method, devices, steps, step_s=0.1, flops=1e9, nbytes=4e8, **kw):
  return projection.Point(curve, name, method, devices, steps, step_s, flops, nbytes, **kw)


def _points():
  bn = _allreduce("step", 64, 4, count=30)  # a BatchNorm model's statistic reductions
  return [
      _point("data_parallel", "D1", "data_parallel", 1, 400, batch_per_device=64),
      _point("data_parallel", "D4", "data_parallel", 4, 120, batch_per_device=64,
             collectives=(_allreduce("step", 4e8, 4), bn, _allreduce("eval", 192, 4, 2)),
             units=(("eval", 10.0), ("sync", 0.0))),
      _point("ensemble", "N4_L100", "ensemble", 4, 100, pool_s=2.0,
             collectives=(_allreduce("eval", 1e6, 4, 2),), units=(("eval", 5.0),)),
      _point("ensemble", "N16_L50", "ensemble", 16, 50, seeds=3),
      _point("diloco", "H10", "diloco", 4, 100,
             collectives=(_allreduce("sync", 4e8, 4), _allreduce("run", 4e8, 4)),
             units=(("eval", 0.0), ("sync", 9.0)))]


def test_projection_by_hand():
  points = _points()
  rows = projection.project(points, devices=(2, 4, 16), presets={"test": LINK})
  by = {(r["method"], r["devices"]): r for r in rows}
  # D=4: DP at 4 devices: the gradient's ring all-reduce 2*3/4 * 0.4 s + 2*3 ms = 0.606 s
  # and 30 statistic reductions of 6 ms (+ 64 B) per step, so 120 * (0.1 + 0.606 + 0.18)
  # s; DP at one device, 400 * 0.1 = 40 s, is faster.
  d4 = points[1].time_s(LINK)
  assert d4 == pytest.approx(120 * (0.1 + 0.606 + 30 * (1.5 * 64e-9 + 6e-3))
                             + 10 * 2 * (1.5 * 192e-9 + 6e-3))
  assert by["ensemble", 4]["baseline_time_s"] == pytest.approx(40.0)
  assert by["ensemble", 4]["baseline"] == "data_parallel D1"
  # The ensemble's N=4 point: pool 2 s + 100 * 0.1 s + 5 evals x 2 all-reduces of 1 MB
  # over 4 (1.5 ms + 6 ms each); 4 * 100 * 1 GFLOP.
  n4 = 2.0 + 10.0 + 5 * 2 * 7.5e-3
  assert by["ensemble", 4]["method_time_s"] == pytest.approx(n4)
  # Matched budgets: within its 400 GFLOP the fastest baseline is DP D1; no baseline is as
  # fast as its 12 s, so it has no compute ratio (a win, said as such in the table).
  assert by["ensemble", 4]["time_ratio"] == pytest.approx(40.0 / n4)
  assert by["ensemble", 4]["time_baseline"] == "data_parallel D1"
  assert by["ensemble", 4]["compute_ratio"] is None
  assert projection.wins(by["ensemble", 4])
  # D=16 adds the N=16 point: 50 * 0.1 = 5 s on 16 * 50 GFLOP.
  assert by["ensemble", 16]["method_point"] == "N16_L50"
  assert by["ensemble", 16]["time_ratio"] == pytest.approx(8.0)
  assert by["ensemble", 16]["compute_ratio"] is None
  assert "no baseline as fast" in projection.table(rows, "t")
  # D=2: no ensemble point fits; DiLoCo neither.
  assert ("ensemble", 2) not in by and ("diloco", 2) not in by
  # DiLoCo: 9 outer steps before its target and the deployable one (per run): 10
  # all-reduces of 0.606 s over its 4 workers.
  assert by["diloco", 4]["method_time_s"] == pytest.approx(10.0 + 10 * 0.606)
  with_dp = projection.project(points[:2], devices=(4,), presets={"test": LINK})
  assert with_dp == []  # no method curve: nothing to compare


def test_critical_batch_points_extend_dp_beyond_the_grid_at_its_per_device_batch():
  """The sweep ran 128 examples a device, the grid 64: each global batch B runs at the
  grid's 64 a device on B / 64 devices, with the grid's measured step (the steps to target
  at B do not depend on how B is split). Fails on a projection that kept the sweep's split
  and scaled the step by 2 (B = 512 then sat on 4 devices, inside the grid)."""
  grid = _points()
  summary = {"per_device": 128, "rows": [
      {"batch": 256, "devices": 2, "median_steps": 150, "evals_to_target": 9,
       "seeds_reached": 3},  # 4 devices of 64: in the grid
      {"batch": 512, "devices": 4, "median_steps": 100, "evals_to_target": 8,
       "seeds_reached": 3},
      {"batch": 1000, "devices": 10, "median_steps": 80, "evals_to_target": 7,
       "seeds_reached": 3},  # 64 does not divide it: the sweep's split, its step scaled
      {"batch": 2048, "devices": 16, "median_steps": 60, "evals_to_target": 6,
       "seeds_reached": 2},
      {"batch": 4096, "devices": 32, "median_steps": None, "evals_to_target": None,
       "seeds_reached": 0}]}  # missed
  b512, b1000, b2048 = projection.critical_batch_points(summary, grid)
  assert (b512.name, b512.devices, b512.steps, b512.batch_per_device) == ("B512", 8, 100, 64)
  assert (b2048.name, b2048.devices, b2048.steps, b2048.seeds) == ("B2048", 32, 60, 2)
  assert b2048.device_step_s == pytest.approx(0.1)  # the grid's step at 64 a device
  assert (b1000.devices, b1000.device_step_s) == (10, pytest.approx(0.2))
  # Ghost BatchNorm: only the gradient all-reduce per step, not the 30 statistic ones; the
  # grid DP step's eval collectives on 32 devices.
  grad = 2 * 31 / 32 * 0.4 + 62e-3
  evals = 6 * 2 * (2 * 31 / 32 * 192e-9 + 62e-3)
  assert b2048.time_s(LINK) == pytest.approx(60 * (0.1 + grad) + evals)
  assert b2048.flops() == pytest.approx(60 * 2048 / 64 * 1e9)  # as on 16 devices of 128


def test_the_small_models_sweep_extends_its_own_curve():
  """A second critical-batch sweep (the small model's) extends dp_small_model from its own
  largest grid point, its step and parameters, not data-parallel's."""
  small = _point("dp_small_model", "D2", "data_parallel", 2, 300, step_s=0.05, nbytes=1e6,
                 batch_per_device=64)
  summary = {"per_device": 64, "rows": [
      {"batch": 128, "devices": 2, "median_steps": 300, "evals_to_target": 9,
       "seeds_reached": 3},  # in its grid
      {"batch": 512, "devices": 8, "median_steps": 90, "evals_to_target": 8,
       "seeds_reached": 3},
      # no seed but the tuning seed has run: the run that won the choice is not reported
      {"batch": 1024, "devices": 16, "median_steps": 50, "evals_to_target": 8,
       "seeds_reached": 1, "tuning_seed_only": True}]}
  [b512] = projection.critical_batch_points(summary, _points() + [small], "dp_small_model")
  assert (b512.curve, b512.name, b512.devices, b512.steps) == ("dp_small_model", "B512", 8, 90)
  assert (b512.device_step_s, b512.param_bytes) == (0.05, 1e6)
  assert projection.critical_batch_points(summary, _points(), "dp_small_model") == []


def test_compute_ratio_is_at_matched_time_not_fastest_against_fastest():
  """DiLoCo's point is cheap (400 GFLOP) and slow (10 s): fastest against fastest it would
  read data-parallel B4096's 16 TFLOP / 400 GFLOP = 40x "in compute" beside a 0.2x time
  ratio. At its
  own time the cheapest baseline is the small model on 2 devices (8 s, 200 GFLOP): 0.5x;
  within its own compute the fastest baseline is that same point: 8 s / 10 s. Neither is a
  win. Fails on the fastest-vs-fastest ratio (compute_ratio 40)."""
  points = [
      _point("data_parallel", "D1", "data_parallel", 1, 400, flops=1e9),  # 40 s, 400 GF
      _point("data_parallel", "B4096", "data_parallel", 16, 20, flops=50e9),  # 2 s, 16 TF
      _point("dp_small_model", "D2", "data_parallel", 2, 80, flops=1.25e9),  # 8 s, 200 GF
      _point("diloco", "H10", "diloco", 4, 100, flops=1e9)]  # 10 s, 400 GF
  rows = projection.project(points, devices=(16,), presets={"test": LINK})
  [row] = rows
  assert (row["baseline"], row["method_point"]) == ("data_parallel B4096", "H10")
  assert row["baseline_time_s"] == pytest.approx(2.0)
  assert row["baseline_flops"] / row["method_flops"] == pytest.approx(40.0)  # unmatched
  assert row["compute_ratio"] == pytest.approx(200e9 / 400e9)
  assert row["compute_baseline"] == "dp_small_model D2"
  assert row["time_ratio"] == pytest.approx(8.0 / 10.0)
  assert row["time_baseline"] == "dp_small_model D2"
  assert not projection.wins(row)
  text = projection.table(rows, "t")
  assert ("| 0.80x [0.80, 0.80] (vs dp_small_model D2) | 0.50x [0.50, 0.50] (vs "
          "dp_small_model D2) |") in text
  assert "- diloco, test: never up to D = 16" in text


def test_what_if_keeps_each_points_size_relative_to_the_full_model(tmp_path):
  bench = tmp_path / "bench.json"
  bench.write_text('[{"model": "resnet50", "attention": null, "vocab": null, "step_s": 0.05,'
                   ' "flops_per_step_analytic": 6e12, "params": 25000000}]')
  points = [_point("data_parallel", "D1", "data_parallel", 1, 400, flops=4e9, nbytes=8e5,
                   collectives=(_allreduce("step", 8e5, 2),
                                dataclasses.replace(_allreduce("eval", 4e4, 2), program="eval"))),
            _point("dp_small_model", "D1", "data_parallel", 1, 500, flops=1e9, nbytes=2e5)]
  big, small = projection.what_if(points, "resnet50", 10, str(bench))
  assert (big.device_step_s, big.flops_per_device_step, big.param_bytes) == (0.05, 6e12, 1e8)
  assert big.collectives[0].bytes == 100_000_000  # the gradient: scaled with the parameters
  assert big.collectives[1].bytes == 4_000_000  # 10 -> 1,000 classes' logits, not x125
  assert small.device_step_s == pytest.approx(0.0125) and small.param_bytes == pytest.approx(2.5e7)
  assert small.steps == 500  # the measured step counts are kept


def test_other_sweeps_join_their_curves_and_the_grid_keeps_its_points():
  grid = _points()
  many = [_point("ensemble", "N4_L100", "ensemble", 4, 999),  # the grid's point, re-measured
          _point("ensemble", "N64_L20", "ensemble", 64, 20)]
  joined = projection.join(grid, many)
  assert [p.steps for p in joined if p.name == "N4_L100"] == [100]
  rows = projection.project(joined, devices=(16, 64), presets={"test": LINK})
  ens = {r["devices"]: r["method_point"] for r in rows if r["method"] == "ensemble"}
  assert ens == {16: "N16_L50", 64: "N64_L20"}  # N <= D: the new point only from D = 64
  # The table says how many seeds each point averages (the many-worker points: fewer).
  text = projection.table(rows, "t")
  assert "| N64_L20 (1) |" in text and "| N16_L50 (3) |" in text


def test_what_if_widens_only_the_program_that_reduces_logits(tmp_path):
  """A language-model ensemble reduces its logits once, at the end (`final_eval`): a wider
  vocabulary widens that; its evaluations' target log-probabilities are kept."""
  bench = tmp_path / "bench.json"
  bench.write_text('[{"model": "gpt2_small", "attention": "fused", "vocab": 50257, "step_s": 0.2,'
                   ' "flops_per_step_analytic": 1e13, "params": 124000000}]')
  final = dataclasses.replace(_allreduce("run", 1 << 20, 4), program="final_eval")
  evaluate = dataclasses.replace(_allreduce("eval", 4096, 4, 2), program="eval")
  points = [_point("data_parallel", "D1", "data_parallel", 1, 400, nbytes=4e6),
            _point("ensemble", "N4_L100", "ensemble", 4, 100, nbytes=4e6,
                   collectives=(evaluate, final), units=(("eval", 5.0),))]
  _, ens = projection.what_if(points, "gpt2_small", 256, str(bench))
  assert ens.collectives[0].bytes == 4096  # one log-probability per worker and token
  assert ens.collectives[1].bytes == int((1 << 20) * 50257 / 256)  # the logits, once
  assert projection.output_programs(points[0]) == {"eval"}  # no final_eval: eval's logits


def test_a_points_compute_is_the_grids_pool_build_included():
  """The projection's compute of a grid point is the grid's `flops_to_target`, the pool
  build's FLOPs included (issue 58: the routed small-model experts at N = 8 read 0.561
  TFLOP in the grid's table and 0.48 in the projection, the build's 78 GFLOP left out)."""
  import json
  import os
  import statistics

  from ensemble_jax import report
  from tests.conftest import REPO
  results = os.path.join(REPO, "experiments", "results", "fashion_mnist")
  point = next(p for p in projection.load_points(results)
               if (p.curve, p.name) == ("ensemble_pca_routed_small", "N8_L235"))
  runs = []
  for seed in (0, 1, 2, 3):
    with open(os.path.join(results, point.curve, point.name, f"seed{seed}",
                           "results.json")) as f:
      runs.append(json.load(f))
  grid = statistics.median(r["cost"]["measured"]["flops_to_target"]
                           for r in report.reported(runs, report.result_seeds))
  assert point.pool_flops > 7e10
  assert point.flops() == pytest.approx(grid, rel=1e-6)
  # a what-if leaves the build out unless it charges pools, its time and compute alike
  assert projection.what_if([point, dataclasses.replace(point, curve="data_parallel")],
                            "resnet50", 10)[0].pool_flops == 0.0


def test_the_grid_and_the_projection_price_one_data_parallel_step_alike():
  """One rule for data-parallel's collectives: as compiled, for the BatchNorm the steps were
  measured with. The grid's small model at D = 8 is priced by the projection's
  `data_parallel_step` exactly as the grid priced it (synchronised BatchNorm: 35
  all-reduces a step, 34 of them statistics; per-device: one); a synchronised template's
  per-device step (the critical-batch runs') is the gradient all-reduce alone."""
  import json
  import os

  from tests.conftest import REPO
  results = os.path.join(REPO, "experiments", "results", "fashion_mnist")
  template = next(p for p in projection.load_points(results)
                  if (p.curve, p.name) == ("dp_small_model", "D8"))
  with open(os.path.join(results, "dp_small_model", "D8", "seed1", "results.json")) as f:
    run = json.load(f)
  grid = run["cost"]["modelled"]
  assert template.batchnorm == run["config"]["method"].get("batchnorm", "synchronised")
  for name, link in costs.INTERCONNECTS.items():
    step = projection.data_parallel_step(template, 8, template.batchnorm)
    assert sum(c.count * c.seconds(link) for c in step) == pytest.approx(
        grid["communication_s"][name] / grid["units_to_target"]["step"], rel=1e-9)
  assert sum(c.count for c in step) == {"synchronised": 35, "per_device": 1}[template.batchnorm]
  synchronised = dataclasses.replace(template, batchnorm="synchronised")
  ghost = projection.data_parallel_step(synchronised, 16, "per_device")
  assert [(c.kind, c.bytes, c.group_size, c.count) for c in ghost] == [
      ("all-reduce", int(template.param_bytes), 16, 1)]
  with pytest.raises(ValueError, match="batch_norm"):
    projection.data_parallel_step(template, 8, "sometimes")
  with pytest.raises(ValueError, match="no compiled synchronised step"):
    projection.data_parallel_step(dataclasses.replace(template, batchnorm="per_device"), 8,
                                  "synchronised")


def test_a_projected_ratio_within_the_seeds_spread_is_not_a_win():
  """A method point 1.14x faster at the medians (300 against 341 steps) whose seeds' steps
  overlap the baseline's (288-341 against 315-341) does not win; one clear of it does."""
  base = _point("dp_small_model", "D1", "data_parallel", 1, 341, steps_range=(315, 341))
  near = _point("ensemble", "N2", "ensemble", 1, 300, flops=1.2e9, steps_range=(288, 341))
  [row] = projection.project([base, near], devices=(8,), presets={"test": LINK})
  assert row["time_ratio"] == pytest.approx(341 / 300)
  assert row["time_range"] == (pytest.approx(315 / 341), pytest.approx(341 / 288))
  assert row["compute_ratio"] is None and row["compute_range"] == "within the spread"
  assert not projection.wins(row)
  assert "1.14x [0.92, 1.18, within the spread]" in projection.table([row], "t")
  clear = _point("ensemble", "N2", "ensemble", 1, 250, flops=1.2e9, steps_range=(240, 260))
  [row] = projection.project([base, clear], devices=(8,), presets={"test": LINK})
  assert projection.wins(row)
