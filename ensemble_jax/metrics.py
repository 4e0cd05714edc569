"""Eval metrics as sums over batches (so padding and sharding never bias them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

ECE_BINS = 15


def classification_sums(logits_BxC: jax.Array, labels_B: jax.Array, mask_B: jax.Array) -> dict:
  """Masked sums: count, correct, nll, and per-confidence-bin counts for ECE."""
  log_probs_BxC = jax.nn.log_softmax(logits_BxC.astype(jnp.float32))
  nll_B = -jnp.take_along_axis(log_probs_BxC, labels_B[:, None], axis=-1)[:, 0]
  confidence_B = jnp.exp(jnp.max(log_probs_BxC, axis=-1))
  correct_B = (jnp.argmax(log_probs_BxC, axis=-1) == labels_B).astype(jnp.float32)
  bin_B = jnp.clip((confidence_B * ECE_BINS).astype(jnp.int32), 0, ECE_BINS - 1)
  onehot_BxK = jax.nn.one_hot(bin_B, ECE_BINS) * mask_B[:, None]
  return {"count": mask_B.sum(),
          "correct": (correct_B * mask_B).sum(),
          "nll": (nll_B * mask_B).sum(),
          "bin_count": onehot_BxK.sum(0),
          "bin_confidence": (onehot_BxK * confidence_B[:, None]).sum(0),
          "bin_correct": (onehot_BxK * correct_B[:, None]).sum(0)}


def add_sums(total: dict | None, sums: dict) -> dict:
  sums = jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(sums))
  return sums if total is None else jax.tree.map(np.add, total, sums)


def finalize_classification(sums: dict) -> dict[str, float]:
  count = float(sums["count"])
  ece = np.sum(np.abs(sums["bin_correct"] - sums["bin_confidence"])) / count
  return {"accuracy": float(sums["correct"]) / count,
          "nll": float(sums["nll"]) / count,
          "ece": float(ece),
          "num_examples": int(count)}
