"""Training windows over a packed token stream.

Window i = stream[i*context : i*context + context + 1]. The targets, tokens[1:], of
consecutive windows tile the stream exactly once. The tail too short for a full window is
dropped and counted (`dropped_tokens`).
"""
from __future__ import annotations

import numpy as np


def num_windows(num_tokens: int, context: int) -> int:
  """Full windows of context + 1 tokens at stride context."""
  return max(0, (num_tokens - 1) // context)


def dropped_tokens(num_tokens: int, context: int) -> int:
  """Tokens of the ragged tail that no window uses as a target."""
  n = num_windows(num_tokens, context)
  return num_tokens - (n * context + 1) if n else num_tokens


class PackedTokens:
  """A pipeline source over a 1-D token stream, one window per example.

  Example i is window i, of context + 1 tokens."""

  def __init__(self, stream: np.ndarray, context: int, name: str = ""):
    if stream.ndim != 1:
      raise ValueError(f"{name or 'token stream'}: expected a 1-D stream, got {stream.shape}")
    if context < 1:
      raise ValueError(f"context={context} must be >= 1")
    self.stream, self.context, self.name = stream, int(context), name
    self._len = num_windows(len(stream), self.context)

  def __len__(self) -> int:
    return self._len

  def get(self, index: int) -> dict[str, np.ndarray]:
    index = int(index)
    if not 0 <= index < self._len:
      raise IndexError(f"window {index} out of range for {self._len} windows of {self.name}")
    start = index * self.context
    return {"tokens": np.asarray(self.stream[start:start + self.context + 1], dtype=np.int32)}

  def get_range(self, begin: int, end: int) -> dict[str, np.ndarray]:
    """Windows [begin, end) stacked [end - begin, context + 1], as `get` gives them."""
    if not 0 <= begin <= end <= self._len:
      raise IndexError(f"windows [{begin}, {end}) outside [0, {self._len}) of {self.name}")
    c = self.context
    if begin == end:
      return {"tokens": np.zeros((0, c + 1), np.int32)}
    span = np.asarray(self.stream[begin * c:(end - 1) * c + c + 1], dtype=np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(span, c + 1)[::c]
    return {"tokens": np.ascontiguousarray(windows)}
