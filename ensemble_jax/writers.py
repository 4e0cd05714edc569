"""Metric files in the workdir: TensorBoard events and a JSON-lines log, process 0 only.

clu's `metric_writers` package imports TensorFlow unconditionally (clu 0.0.12), which
this project must not require; tensorboardX writes the same TensorBoard event files.
"""
from __future__ import annotations

import json
import os

from absl import logging


class MetricWriter:
  """`write_scalars(step, {name: value})` to `events.out.tfevents.*` and `metrics.jsonl`."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._tb = self._jsonl = None
    if enabled:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(workdir)
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    for name, value in scalars.items():
      self._tb.add_scalar(name, value, step)
    self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    logging.info("[%d] %s", step, ", ".join(f"{k}={v:.4g}" for k, v in scalars.items()))

  def flush(self) -> None:
    if self.enabled:
      self._tb.flush()
      self._jsonl.flush()

  def close(self) -> None:
    if self.enabled:
      self._tb.close()
      self._jsonl.close()
