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
  link = costs.INTERCONNECTS["ib_xdr800"]
  assert dp["per_preset"]["ib_xdr800"]["total_s"] == pytest.approx(
      10 * costs.allreduce_time(4e6, 4, link))
  ens = costs.communication("ensemble", param_bytes=4e6, steps=10,
                            mesh_shape={"worker": 8, "data": 1}, num_workers=8)
  assert ens["allreduces"] == 0 and ens["per_preset"]["eth10g"]["total_s"] == 0.0
  dl = costs.communication("diloco", param_bytes=4e6, steps=10, mesh_shape={"worker": 8},
                           num_workers=8, num_syncs=2)
  assert dl["allreduces"] == 2 and dl["devices"] == 8


def _results(method, **extra):
  return {"method": method, "mesh": {"data": 1}, "train_time_s": 40.0, "step_time_s": 0.4,
          "steps": 100, "flops_per_step": 1e9,
          "target": {"reached": True, "reached_step": 60}, **extra}


def test_summary_models_the_cluster_from_the_host_step():
  eth = costs.INTERCONNECTS["eth10g"]
  dp = costs.summary(_results("data_parallel"), param_bytes=4e6, devices=4)
  # The host did 4 devices' work per step: one device's step is 0.1 s, plus the all-reduce.
  assert dp["modelled"]["device_step_time_s"] == pytest.approx(0.1)
  assert dp["modelled"]["critical_path_s"]["eth10g"] == pytest.approx(
      60 * (0.1 + costs.allreduce_time(4e6, 4, eth)))
  assert dp["measured"]["flops_to_target"] == 60e9 and dp["measured"]["flops"] == 100e9
  ens = costs.summary(_results("ensemble", num_workers=8,
                               distill={"build_time_s": 3.0, "build_flops": 5e9}),
                      param_bytes=4e6)
  assert ens["modelled"]["devices"] == 8  # one per worker
  assert ens["modelled"]["critical_path_s"]["eth10g"] == pytest.approx(3.0 + 60 * 0.05)
  assert ens["measured"]["flops_to_target"] == 65e9
  dl = costs.summary(_results("diloco", num_workers=4, sync_every=20), param_bytes=4e6)
  assert dl["modelled"]["critical_path_s"]["eth10g"] == pytest.approx(
      60 * 0.1 + 3 * costs.allreduce_time(4e6, 4, eth))
  # The target reached at 50 (H = 20): outer steps at 20, 40 and the deployable one at 50.
  dl = costs.summary(_results("diloco", num_workers=4, sync_every=20, syncs=[20, 40, 50],
                              target={"reached": True, "reached_step": 50}), param_bytes=4e6)
  assert dl["modelled"]["communication"]["allreduces"] == 3
  assert dl["modelled"]["critical_path_s"]["eth10g"] == pytest.approx(
      50 * 0.1 + 3 * costs.allreduce_time(4e6, 4, eth))
  real = costs.summary(_results("data_parallel", mesh={"data": 4}), param_bytes=4e6,
                       simulated=False)
  # On real devices the measured step is one device's and already holds the all-reduce.
  assert real["modelled"]["critical_path_s"]["eth10g"] == pytest.approx(60 * 0.4)


def test_calibrated_device_step_replaces_the_host_estimate():
  dp = costs.summary(_results("data_parallel"), param_bytes=4e6, devices=4,
                     device_step_time_s=0.08)
  assert dp["modelled"]["device_step_time_s"] == 0.08
  assert dp["modelled"]["device_step_model"].startswith("calibrated")
  assert dp["modelled"]["critical_path_s"]["nvlink"] == pytest.approx(
      60 * (0.08 + costs.allreduce_time(4e6, 4, costs.INTERCONNECTS["nvlink"])))


def test_presets_name_what_they_model():
  # 800 Gb/s InfiniBand is XDR (NDR is 400 Gb/s): the preset says so in its name.
  assert "ib800" not in costs.INTERCONNECTS and costs.RENAMED_PRESETS["ib800"] == "ib_xdr800"
  assert costs.INTERCONNECTS["ib_xdr800"].bandwidth == 800e9 / 8
