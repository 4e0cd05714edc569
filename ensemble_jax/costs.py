"""What a step costs: FLOPs from XLA's cost analysis, time measured after warm-up."""
from __future__ import annotations

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
