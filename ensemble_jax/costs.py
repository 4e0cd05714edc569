"""What training costs: FLOPs from XLA, step time measured, communication modelled.

One CPU host simulating many devices cannot show interconnect time, so the collective a
method needs is modelled (ring all-reduce) from its bytes and a named interconnect
preset; everything else is measured. Reports label each number `measured` or `modelled`.
"""
from __future__ import annotations

import dataclasses
import statistics


def flops(compiled) -> float:
  """FLOPs of one call of a compiled (SPMD) executable, as XLA's cost analysis counts them."""
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


# Assumed, order-of-magnitude figures (NVLink 3/4 per GPU; 800 Gb/s InfiniBand NDR;
# commodity 10 Gb/s Ethernet); a report names the preset it used.
INTERCONNECTS = {
    "nvlink": Interconnect("nvlink", 300e9, 2e-6),
    "ib800": Interconnect("ib800", 100e9, 5e-6),
    "eth10g": Interconnect("eth10g", 1.25e9, 50e-6),
}


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


def critical_path_diloco(steps: int, step_time: float, sync_every: int,
                         allreduce: float) -> float:
  """Inner steps plus one weight all-reduce every H steps."""
  return steps * step_time + (steps // sync_every) * allreduce
