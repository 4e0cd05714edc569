"""The projection's arithmetic on a hand-computed case (experiments/projection.py)."""
import pytest

from ensemble_jax import costs
from experiments import projection

LINK = costs.Interconnect("test", bandwidth=1e9, latency=1e-3, models="a 1 GB/s test link")


def _point(curve, name, method, devices, steps, step_s=0.1, flops=1e9, nbytes=4e8, **kw):
  return projection.Point(curve, name, method, devices, steps, step_s, flops, nbytes, **kw)


def test_projection_by_hand():
  points = [_point("data_parallel", "D1", "data_parallel", 1, 400),
            _point("data_parallel", "D4", "data_parallel", 4, 120),
            _point("ensemble", "N4_L100", "ensemble", 4, 100, pool_s=2.0),
            _point("ensemble", "N16_L50", "ensemble", 16, 50),
            _point("diloco", "H10", "diloco", 4, 100, sync_every=10)]
  rows = projection.project(points, devices=(2, 4, 16), presets={"test": LINK})
  by = {(r["method"], r["devices"]): r for r in rows}
  # D=4: DP at 4 devices: ring all-reduce 2*3/4 * 0.4 s + 2*3 ms = 0.606 s per step, so
  # 120 * (0.1 + 0.606) = 84.72 s; DP at one device: 400 * 0.1 = 40 s is faster.
  assert by["ensemble", 4]["baseline_time_s"] == pytest.approx(40.0)
  assert by["ensemble", 4]["baseline"] == "data_parallel D1"
  # The ensemble's N=4 point: pool 2 s + 100 * 0.1 s = 12 s, 4 * 100 * 1 GFLOP.
  assert by["ensemble", 4]["method_time_s"] == pytest.approx(12.0)
  assert by["ensemble", 4]["time_ratio"] == pytest.approx(40.0 / 12.0)
  assert by["ensemble", 4]["compute_ratio"] == pytest.approx(400e9 / 400e9)
  # D=16 adds the N=16 point: 50 * 0.1 = 5 s on 16 * 50 GFLOP.
  assert by["ensemble", 16]["method_point"] == "N16_L50"
  assert by["ensemble", 16]["time_ratio"] == pytest.approx(8.0)
  assert by["ensemble", 16]["compute_ratio"] == pytest.approx(400e9 / 800e9)
  # D=2: no ensemble point fits; DiLoCo neither.
  assert ("ensemble", 2) not in by and ("diloco", 2) not in by
  # DiLoCo to its target at step 100: outer steps at 10, ..., 90 and the deployable one at
  # 100 (costs.diloco_syncs_to): 10 all-reduces of 0.606 s over its 4 workers.
  assert by["diloco", 4]["method_time_s"] == pytest.approx(10.0 + 10 * 0.606)
  with_dp = projection.project(points[:2], devices=(4,), presets={"test": LINK})
  assert with_dp == []  # no method curve: nothing to compare


def test_what_if_keeps_each_points_size_relative_to_the_full_model(tmp_path):
  bench = tmp_path / "bench.json"
  bench.write_text('[{"model": "resnet50", "attention": null, "vocab": null, "step_s": 0.05,'
                   ' "flops_per_step_analytic": 6e12, "params": 25000000}]')
  points = [_point("data_parallel", "D1", "data_parallel", 1, 400, flops=4e9, nbytes=8e5),
            _point("dp_small_model", "D1", "data_parallel", 1, 500, flops=1e9, nbytes=2e5)]
  big, small = projection.what_if(points, "resnet50", str(bench))
  assert (big.device_step_s, big.flops_per_device_step, big.param_bytes) == (0.05, 6e12, 1e8)
  assert small.device_step_s == pytest.approx(0.0125) and small.param_bytes == pytest.approx(2.5e7)
  assert small.steps == 500  # the measured step counts are kept
