"""What a run prints while it trains: log lines and the progress bar apart."""
import io
import logging
import re
import sys

import pytest
from absl import flags
from absl import logging as absl_logging

from ensemble_jax import writers

pytestmark = pytest.mark.unit


def test_log_lines_print_above_the_progress_bar_not_into_its_line(monkeypatch):
  """absl's handler writes through tqdm while the training bar is open, and its own stream
  again once the bar closes. Fails on 75ab1a7, where a log line went into the bar's line:
  `train:  33%|███▎      | 50/150 [00:13<00:24, 4.16it/s]I1128 05:23:55 ... [50] eval/...`"""
  out = io.StringIO()
  monkeypatch.setattr(sys, "stderr", out)  # the bar's stream (tqdm's default)
  absl = absl_logging.get_absl_handler()
  monkeypatch.setattr(absl.python_handler, "stream", out)
  monkeypatch.setattr(logging.getLogger(), "handlers", [absl])
  # as in a run, whose flags are parsed: absl logs to its handler's stream, not to stderr
  monkeypatch.setitem(flags.FLAGS.__dict__, "__flags_parsed", True)
  bar = writers.progress_bar(0, 10, enabled=True)
  bar.update(3)
  absl_logging.warning("[3] eval/accuracy=0.5")
  bar.update(3)
  bar.close()
  assert absl.python_handler.stream is out
  segments = re.split(r"[\r\n]", out.getvalue())
  logged = [s for s in segments if "[3] eval/accuracy=0.5" in s]
  assert len(logged) == 1 and logged[0].startswith("W"), segments  # its own line, once
  bars = [s for s in segments if "train:" in s]
  assert all(re.fullmatch(r"train: .*\]\s*", s) for s in bars), bars  # nothing after a bar
  assert any("6/10" in s for s in bars)  # the bar goes on below the line


def test_the_bars_clock_starts_after_the_first_step_not_before_the_compile(monkeypatch):
  """A 70 s compile before 1 s steps: after 10 steps the bar reads 9 s elapsed and 190 s to
  go, "train (compiling)" until the first step. Fails on ef8466c2, where the compile was
  timed as a step: `10/200 [01:20<13:11,  4.17s/it]`."""
  import tqdm.std

  now = [1000.0]
  monkeypatch.setattr(tqdm.std, "time", lambda: now[0])  # the bar's clock
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  bar = writers.progress_bar(0, 200, enabled=True)
  assert str(bar._bar).startswith("train (compiling):   0%")
  now[0] += 71.0  # the compile, then the first step
  bar.update(1)
  for _ in range(9):
    now[0] += 1.0
    bar.update(1)
  assert bar._bar.format_dict["elapsed"] == 9.0
  assert "10/200 [00:09<03:10,  1.00it/s]" in str(bar._bar)
  assert str(bar._bar).startswith("train:   5%")
  bar.close()
