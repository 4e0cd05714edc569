"""What training costs: FLOPs from XLA, step time measured, communication modelled.

One CPU host simulating many devices cannot show interconnect time, so the collective a
method needs is modelled (ring all-reduce) from its bytes and a named interconnect
preset; everything else is measured. Reports label each number `measured` or `modelled`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics


def flops(compiled) -> float:
  """FLOPs of one call of a compiled (SPMD) executable, as XLA's cost analysis counts them.

  Matches the analytic count on CPU. On GPU it misses the GEMMs and convolutions XLA
  hands to cuBLAS / cuDNN: on an H100 it read 0.11 of ResNet-50's 6.28 TFLOP per step and
  2.6-5.1 of GPT-2 small's 14.0 (`experiments/bench/throughput.py`), so GPU runs' FLOPs
  axes are not to be trusted until they are counted another way.
  """
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax returned one dict per program
    analysis = analysis[0] if analysis else {}
  return float((analysis or {}).get("flops", float("nan")))


def median_step_time(durations: list[float], warmup: int) -> float:
  steady = durations[warmup:] or durations
  return statistics.median(steady) if steady else float("nan")


@dataclasses.dataclass(frozen=True)
class Interconnect:
  """Per-link bandwidth (bytes/s) and per-hop latency (s) of a ring all-reduce."""
  name: str
  bandwidth: float
  latency: float


# Assumed, order-of-magnitude figures; a report names the preset it used.
INTERCONNECTS = {
    # NVLink 3 (A100): 300 GB/s each way per GPU; 2 us per message
    "nvlink": Interconnect("nvlink", 300e9, 2e-6),
    # XDR InfiniBand, 800 Gb/s = 100 GB/s per port (NDR is 400 Gb/s = 50 GB/s); 5 us
    "ib_xdr800": Interconnect("ib_xdr800", 100e9, 5e-6),
    # 10 Gb/s Ethernet = 1.25 GB/s; 50 us per message
    "eth10g": Interconnect("eth10g", 1.25e9, 50e-6),
}
# Preset keys that results.json files written before a rename carry, and their names now.
RENAMED_PRESETS = {"ib800": "ib_xdr800"}  # the same numbers: 800 Gb/s is XDR, not NDR


def allreduce_time(num_bytes: float, num_devices: int, link: Interconnect,
                   overlap: float = 0.0) -> float:
  """Ring all-reduce: 2(D-1)/D * bytes / bandwidth + 2(D-1) * latency, times the part
  not hidden behind compute (`overlap` in [0, 1])."""
  if num_devices <= 1:
    return 0.0
  d = num_devices
  t = 2 * (d - 1) / d * num_bytes / link.bandwidth + 2 * (d - 1) * link.latency
  return (1.0 - overlap) * t


def critical_path_data_parallel(steps: int, step_time: float, allreduce: float) -> float:
  """K synchronized steps, each waiting on its gradient all-reduce."""
  return steps * (step_time + allreduce)


def critical_path_ensemble(steps_per_worker: int, step_time: float, pool_time: float = 0.0,
                           aggregation_time: float = 0.0) -> float:
  """Pool building + L independent steps (workers in parallel) + the one final reduction."""
  return pool_time + steps_per_worker * step_time + aggregation_time


def critical_path_diloco(steps: int, step_time: float, num_syncs: int,
                         allreduce: float) -> float:
  """Inner steps plus one weight all-reduce per outer step."""
  return steps * step_time + num_syncs * allreduce


def diloco_syncs_to(steps: int, results: dict) -> int:
  """Outer steps a DiLoCo model at `steps` needs: those before it, plus the one at `steps`
  that makes the deployable model (every run ends with one). Results written before
  `syncs` was recorded: every H steps."""
  if "syncs" not in results:
    return steps // max(results.get("sync_every", 0), 1)
  return sum(1 for s in results["syncs"] if s < steps) + 1


def communication(method: str, *, param_bytes: int, steps: int, mesh_shape: dict,
                  num_workers: int = 1, num_syncs: int = 0, overlap: float = 0.0) -> dict:
  """The collectives a run needs during training, and their modelled time per preset.

  data_parallel: a gradient all-reduce every step over the `data` axis; ensemble: none
  (its one reduction is at evaluation); diloco: a weight all-reduce over the workers per
  outer step (`num_syncs`). Bytes are float32 parameters, as the gradients and weights
  are exchanged.
  """
  if method == "data_parallel":
    count, devices = steps, mesh_shape.get("data", 1)
  elif method == "diloco":
    count, devices = num_syncs, num_workers
  else:
    count, devices = 0, 1
  per_preset = {}
  for name, link in INTERCONNECTS.items():
    t = allreduce_time(param_bytes, devices, link, overlap) if count else 0.0
    per_preset[name] = {"allreduce_s": t, "total_s": count * t}
  return {"allreduces": count, "devices": devices, "bytes_each": param_bytes,
          "per_preset": per_preset}


def param_bytes(results: dict) -> int:
  """Bytes of one model's float32 parameters (what an all-reduce or a sync exchanges)."""
  return 4 * results.get("num_params", results.get("num_params_per_worker", 0))


def summary(results: dict, param_bytes: int, devices: int = 0, overlap: float = 0.0,
            simulated: bool = True, device_step_time_s: float = 0.0) -> dict:
  """The `cost` block of results.json: what was measured here and what is modelled.

  `devices` (D) is the cluster the run stands for: 0 means one device per model replica
  of the mesh (data_parallel: the mesh's `data` axis) or one per worker (ensemble,
  diloco). When the mesh is `simulated` on one host (CPU), the host did the work of all D
  devices one after another, so one device's step is modelled as host step / D; on real
  accelerators the measured step is already one device's (times mesh size / D). A
  `device_step_time_s` > 0, measured apart (one model at the per-device batch, on a quiet
  host: the sweep's calibration), replaces that estimate: it is immune to whatever else
  shared the host during this run.
  Communication is modelled only when simulated; on real devices it is in the step.
  Critical paths count the steps to the target (all steps when it was not reached) plus
  the pool-building time of a distilled sequence (results['distill']).
  """
  method = results["method"]
  mesh_devices = math.prod(results["mesh"].values())
  workers = results.get("num_workers", 1)
  if devices <= 0:
    devices = results["mesh"].get("data", mesh_devices) if method == "data_parallel" else workers
  target = results["target"]
  steps = target["reached_step"] if target["reached"] else results["steps"]
  distill = results.get("distill") or {}
  pool_time, pool_flops = distill.get("build_time_s", 0.0), distill.get("build_flops", 0.0)
  measured = {
      "train_time_s": results["train_time_s"],
      "step_time_s": results["step_time_s"],
      "steps_to_target": steps,  # all steps trained when the target was not reached
      "flops": results["flops_per_step"] * results["steps"] + pool_flops,
      "flops_to_target": results["flops_per_step"] * steps + pool_flops,
      "pool_build_time_s": pool_time,
      "host_devices": mesh_devices,
      "where": ("one host: the simulated devices share its cores" if simulated else
                "real devices"),
  }
  parallel = 1 if simulated else mesh_devices
  if device_step_time_s > 0:
    device_step = device_step_time_s
    how = "calibrated: median step of one model at the per-device batch, timed apart"
  else:
    device_step = results["step_time_s"] * parallel / devices
    how = f"measured host step x {parallel} / {devices} devices"
  comm = communication(method, param_bytes=param_bytes, steps=steps,
                       mesh_shape={"data": devices} if method == "data_parallel" else {},
                       num_workers=devices,
                       num_syncs=diloco_syncs_to(steps, results) if method == "diloco" else 0,
                       overlap=overlap)
  critical = {}
  for name, preset in comm["per_preset"].items():
    allreduce = preset["allreduce_s"] if simulated else 0.0
    if method == "data_parallel":
      t = critical_path_data_parallel(steps, device_step, allreduce)
    elif method == "diloco":
      t = critical_path_diloco(steps, device_step, comm["allreduces"], allreduce)
    else:
      t = critical_path_ensemble(steps, device_step)
    critical[name] = pool_time + t
  comm["model"] = ("ring all-reduce: (1 - overlap) * (2(D-1)/D * bytes / bandwidth "
                   "+ 2(D-1) * latency)")
  modelled = {
      "devices": devices,
      "device_step_time_s": device_step,
      "device_step_model": how,
      "communication": comm,
      "overlap": overlap,
      "critical_path_s": critical,  # to the target, per interconnect preset
      "device_seconds": {k: devices * v for k, v in critical.items()},
  }
  return {"measured": measured, "modelled": modelled}
