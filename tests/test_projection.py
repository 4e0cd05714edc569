"""The projection's arithmetic on a hand-computed case (experiments/projection.py)."""
import dataclasses

import pytest

from ensemble_jax import costs
from experiments import projection

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
  assert by["ensemble", 4]["time_ratio"] == pytest.approx(40.0 / n4)
  assert by["ensemble", 4]["compute_ratio"] == pytest.approx(400e9 / 400e9)
  # D=16 adds the N=16 point: 50 * 0.1 = 5 s on 16 * 50 GFLOP.
  assert by["ensemble", 16]["method_point"] == "N16_L50"
  assert by["ensemble", 16]["time_ratio"] == pytest.approx(8.0)
  assert by["ensemble", 16]["compute_ratio"] == pytest.approx(400e9 / 800e9)
  # D=2: no ensemble point fits; DiLoCo neither.
  assert ("ensemble", 2) not in by and ("diloco", 2) not in by
  # DiLoCo: 9 outer steps before its target and the deployable one (per run): 10
  # all-reduces of 0.606 s over its 4 workers.
  assert by["diloco", 4]["method_time_s"] == pytest.approx(10.0 + 10 * 0.606)
  with_dp = projection.project(points[:2], devices=(4,), presets={"test": LINK})
  assert with_dp == []  # no method curve: nothing to compare


def test_critical_batch_points_extend_dp_beyond_the_grid():
  grid = _points()
  summary = {"per_device": 128, "rows": [
      {"batch": 512, "devices": 4, "median_steps": 100, "evals_to_target": 9,
       "seeds_reached": 3},  # in the grid
      {"batch": 2048, "devices": 16, "median_steps": 60, "evals_to_target": 6,
       "seeds_reached": 2},
      {"batch": 4096, "devices": 32, "median_steps": None, "evals_to_target": None,
       "seeds_reached": 0}]}  # missed
  (b2048,) = projection.critical_batch_points(summary, grid)
  assert (b2048.name, b2048.devices, b2048.steps, b2048.seeds) == ("B2048", 16, 60, 2)
  assert b2048.device_step_s == pytest.approx(0.2)  # 128 per device vs the grid's 64
  # Ghost BatchNorm: only the gradient all-reduce per step, not the 30 statistic ones; the
  # grid DP step's eval collectives on 16 devices.
  grad = 2 * 15 / 16 * 0.4 + 30e-3
  evals = 6 * 2 * (2 * 15 / 16 * 192e-9 + 30e-3)
  assert b2048.time_s(LINK) == pytest.approx(60 * (0.2 + grad) + evals)
  assert b2048.flops() == pytest.approx(60 * 16 * 2e9)


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
