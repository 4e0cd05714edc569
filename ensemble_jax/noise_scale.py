"""The gradient noise scale B_simple = tr(Sigma) / |G|^2.

It is the batch size beyond which a larger batch stops buying proportionally fewer steps
(McCandlish et al., 2018, "An Empirical Model of Large-Batch Training", Appendix A).

A mean gradient over B examples has E|G_B|^2 = |G|^2 + tr(Sigma) / B, so its norms at two
batch sizes give unbiased estimates of both terms:

  |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
  tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

With gradient accumulation both norms come free: the small batch is a microbatch, the big
one the step's batch (`methods/step.py`). One step's estimates are noisy, and the |G|^2 one
is often negative. So, as in the paper, each is averaged over steps by an exponential
moving average, and B_simple is the ratio of the two averages, never an average of ratios.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np


def step_estimates(small_sq, big_sq, b_small, b_big) -> dict:
  """One step's unbiased estimates of |G|^2 and tr(Sigma).

  |G_small|^2 is the mean over microbatches of b_small examples; |G_big|^2 is the step's,
  of b_big examples. Works on floats, NumPy or traced JAX values alike.
  """
  if not 0 < b_small < b_big:
    raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
  grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
  trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
  return {"noise_grad_sq": grad_sq, "noise_trace": trace}


@dataclasses.dataclass
class NoiseScaleEMA:
  """Bias-corrected exponential moving averages of the two per-step estimates."""
  decay: float
  grad_sq: float = 0.0  # uncorrected averages; `estimates` divides by `norm`
  trace: float = 0.0
  norm: float = 0.0  # 1 - decay^steps: the weight the averages have accumulated
  steps: int = 0

  def update(self, grad_sq: float, trace: float) -> None:
    d = self.decay
    self.grad_sq = d * self.grad_sq + (1 - d) * float(grad_sq)
    self.trace = d * self.trace + (1 - d) * float(trace)
    self.norm = d * self.norm + (1 - d)
    self.steps += 1

  def estimates(self) -> dict:
    """The averages and their ratio: {'grad_sq', 'trace', 'b_simple'}.

    All are NaN before the first step. B_simple is NaN while the averaged |G|^2 is not
    positive, when noise dominates and it is not measurable yet."""
    if self.steps == 0:
      return {"grad_sq": math.nan, "trace": math.nan, "b_simple": math.nan}
    grad_sq, trace = self.grad_sq / self.norm, self.trace / self.norm
    return {"grad_sq": grad_sq, "trace": trace,
            "b_simple": trace / grad_sq if grad_sq > 0 else math.nan}

  def to_dict(self) -> dict:
    """What a checkpoint record carries; `NoiseScaleEMA(**d)` restores it."""
    return dataclasses.asdict(self)


@dataclasses.dataclass
class NoiseScaleTracker:
  """The gradient noise scale over training, read at every eval step.

  Each step's estimates, its metrics `noise_grad_sq` and `noise_trace` averaged over
  workers, go into moving averages. B_simple is read into `history` at every eval step."""
  ema: NoiseScaleEMA
  history: list[dict] = dataclasses.field(default_factory=list)

  @classmethod
  def from_record(cls, record: dict | None, decay: float) -> "NoiseScaleTracker":
    if not record:
      return cls(NoiseScaleEMA(decay))
    return cls(NoiseScaleEMA(**record["ema"]), list(record["history"]))

  def record(self) -> dict:
    return {"ema": self.ema.to_dict(), "history": self.history}

  def update(self, step_metrics: dict) -> None:
    self.ema.update(np.mean(step_metrics["noise_grad_sq"]),
                    np.mean(step_metrics["noise_trace"]))

  def read(self, step: int) -> None:
    self.history.append({"step": step, **self.ema.estimates()})

  def results(self, reached_step: int | None) -> dict:
    """results.json's `noise_scale`: the final averages, B_simple's history and its value
    at the step the target was reached, or None if it was not."""
    at = [h for h in self.history if h["step"] == reached_step]
    return {**self.ema.estimates(), "ema_decay": self.ema.decay, "steps": self.ema.steps,
            "b_simple_at_target": at[0]["b_simple"] if at else None,
            "history": self.history}
