"""The communication model against hand-computed values, and the critical paths."""
import pytest

from ensemble_jax import costs


def test_ring_allreduce_by_hand():
  link = costs.Interconnect("test", bandwidth=1e9, latency=1e-5)
  # 8 devices, 100 MB: 2*7/8 * 0.1 s + 14 * 10 us = 0.175 s + 0.14 ms
  assert costs.allreduce_time(100e6, 8, link) == pytest.approx(0.175 + 14e-5)
  assert costs.allreduce_time(100e6, 8, link, overlap=0.5) == pytest.approx((0.175 + 14e-5) / 2)
  assert costs.allreduce_time(100e6, 1, link) == 0.0
  # ResNet-50 gradients (25,557,032 fp32 = 102.2 MB) over 10 GbE on 8 hosts: ~0.144 s
  eth = costs.INTERCONNECTS["eth10g"]
  assert costs.allreduce_time(25_557_032 * 4, 8, eth) == pytest.approx(
      2 * 7 / 8 * 102_228_128 / 1.25e9 + 14 * 50e-6)


def test_critical_paths():
  assert costs.critical_path_data_parallel(100, 0.2, 0.05) == pytest.approx(25.0)
  assert costs.critical_path_ensemble(50, 0.2, pool_time=3.0, aggregation_time=0.5) == \
      pytest.approx(13.5)
  assert costs.critical_path_diloco(100, 0.2, 10, 0.05) == pytest.approx(20.5)


def test_communication_per_method():
  dp = costs.communication("data_parallel", param_bytes=4e6, steps=10, mesh_shape={"data": 4})
  assert dp["allreduces"] == 10 and dp["devices"] == 4
  link = costs.INTERCONNECTS["ib800"]
  assert dp["per_preset"]["ib800"]["total_s"] == pytest.approx(
      10 * costs.allreduce_time(4e6, 4, link))
  ens = costs.communication("ensemble", param_bytes=4e6, steps=10,
                            mesh_shape={"worker": 8, "data": 1}, num_workers=8)
  assert ens["allreduces"] == 0 and ens["per_preset"]["eth10g"]["total_s"] == 0.0
  dl = costs.communication("diloco", param_bytes=4e6, steps=10, mesh_shape={"worker": 8},
                           num_workers=8, sync_every=5)
  assert dl["allreduces"] == 2 and dl["devices"] == 8
