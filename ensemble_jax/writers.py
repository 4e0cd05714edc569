"""Metric files in the workdir: TensorBoard events and a JSON-lines log, process 0 only.

clu's `metric_writers` package imports TensorFlow unconditionally (clu 0.0.12), which
this project must not require; tensorboardX writes the same TensorBoard event files.
"""
from __future__ import annotations

import glob
import json
import logging as py_logging
import os
import sys

from absl import logging


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch.

  tensorboardX imports torch whenever it is installed (tensorboardX 2.6: to accept torch
  tensors, which this project never passes), 2.4 s of every process's start on this host
  where torch is a test dependency, and on GPU hosts that have it. Its import is guarded by
  `except ImportError`: for the length of the import, torch reads as absent.
  """
  absent = "torch" not in sys.modules
  if absent:
    sys.modules["torch"] = None  # `import torch` raises ImportError
  try:
    from tensorboardX import SummaryWriter
  finally:
    if absent:
      del sys.modules["torch"]
  return SummaryWriter


def _truncate_after(path: str, step: int) -> None:
  """Keeps the rows of the JSON-lines log `path` up to `step` (replaced whole, atomically)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  kept = []
  for line in lines:
    try:
      if json.loads(line)["step"] <= step:
        kept.append(line if line.endswith("\n") else line + "\n")
    except (ValueError, KeyError, TypeError):  # a line cut short by a kill: dropped
      continue
  if kept != lines:
    with open(path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(path + ".tmp", path)


class MetricWriter:
  """`write_scalars(step, {name: value})` to `events.out.tfevents.*` and `metrics.jsonl`."""

  def __init__(self, workdir: str, enabled: bool = True, start_step: int = 0):
    """`start_step`: where the run (re)starts. What an earlier attempt logged after it (the
    steps since its last checkpoint, about to be trained again) is dropped, so each step is
    logged once: metrics.jsonl is cut there, and TensorBoard purges the events after it."""
    self.enabled = enabled
    self._tb = self._jsonl = None
    if enabled:
      path = os.path.join(workdir, "metrics.jsonl")
      _truncate_after(path, start_step)
      logged_before = glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
      self._tb = _summary_writer_class()(
          workdir, purge_step=start_step + 1 if logged_before else None)
      self._jsonl = open(path, "a")

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    for name, value in scalars.items():
      self._tb.add_scalar(name, value, step)
    self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    logging.info("[%d] %s", step, ", ".join(f"{k}={v:.4g}" for k, v in scalars.items()))

  def write_hparams(self, config: dict, metric_tags: list[str]) -> None:
    """The config's scalar fields as TensorBoard hyper-parameters of this run (the HPARAMS
    tab), against the scalars named `metric_tags` that the run logs."""
    if not self.enabled:
      return
    from tensorboardX.summary import hparams

    flat = {}

    def walk(prefix, value):
      if isinstance(value, dict):
        for k, v in value.items():
          walk(f"{prefix}{k}.", v)
      elif isinstance(value, (bool, int, float, str)):
        flat[prefix[:-1]] = value
      elif isinstance(value, (list, tuple)):
        flat[prefix[:-1]] = str(value)

    walk("", config)
    for summary in hparams(flat, {tag: 0.0 for tag in metric_tags}):
      self._tb.file_writer.add_summary(summary)

  def flush(self) -> None:
    if self.enabled:
      self._tb.flush()
      self._jsonl.flush()

  def close(self) -> None:
    if self.enabled:
      self._tb.close()
      self._jsonl.close()


_TRAIN = "train"  # the bar's name; "train (compiling)" until the first step is done


class _NoProgress:
  def update(self, n): pass
  def set_postfix(self, **kw): pass
  def close(self): pass


class _Stream:
  """A console stream whose writes go above the open progress bars (`tqdm.write`)."""

  def __init__(self, stream, write):
    self.stream, self._write = stream, write

  def write(self, text: str) -> None:
    self._write(text, file=self.stream, end="")

  def flush(self) -> None:
    self.stream.flush()

  def __eq__(self, other) -> bool:  # absl compares its handler's stream with sys.stderr
    return self.stream == getattr(other, "stream", other)

  __hash__ = None


class _Progress:
  """The training bar; while it is open, log lines print above it, not into its line.

  tqdm's `logging_redirect_tqdm` swaps the root logger's console StreamHandlers, but absl
  logs through its own handler (an `ABSLHandler` wrapping a `PythonHandler`), which it
  would leave writing into the bar's line and then log each line twice. So the console
  handlers' streams (absl's included) write through `tqdm.write` until `close`."""

  def __init__(self, bar):
    self._bar, self._compiling = bar, True
    consoles = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    self._swapped = []
    for handler in py_logging.getLogger().handlers:
      handler = getattr(handler, "python_handler", handler)  # absl's
      stream = getattr(handler, "stream", None)
      if isinstance(handler, py_logging.StreamHandler) and id(stream) in consoles:
        self._swapped.append((handler, stream))
        handler.stream = _Stream(stream, type(bar).write)

  def update(self, n):
    if not self._compiling:
      self._bar.update(n)
      return
    # The first step's time is mostly the compile's, minutes on a big model, which as a
    # step's time reads as an ETA of hours: the clock, rate and ETA start after it.
    self._compiling, bar = False, self._bar
    bar.n = bar.initial = bar.last_print_n = bar.n + n  # the rate counts from here
    bar.unpause()  # elapsed too: tqdm's clock restarts now
    bar.set_description(_TRAIN)

  def set_postfix(self, **kw): self._bar.set_postfix(**kw)

  def close(self):
    for handler, stream in self._swapped:
      if isinstance(handler.stream, _Stream):
        handler.stream = stream
    self._swapped = []
    if self._compiling:  # no step was left to take
      self._bar.set_description(_TRAIN, refresh=False)
    self._bar.close()


def progress_bar(start: int, total: int, enabled: bool):
  if not enabled:
    return _NoProgress()
  from tqdm.auto import tqdm

  return _Progress(tqdm(total=total, initial=start, desc=f"{_TRAIN} (compiling)",
                        dynamic_ncols=True, mininterval=2.0))
