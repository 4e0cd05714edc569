"""Eval metrics as sums over batches (so padding and sharding never bias them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

ECE_BINS = 15


def prediction_sums(logits: jax.Array, labels: jax.Array, mask_B: jax.Array) -> dict:
  """Masked sums over examples or tokens: count, correct, nll, ECE bin counts.

  Takes logits [B, C] with labels [B], or [B, T, V] with labels [B, T]; then every token
  counts.
  """
  if logits.ndim == 3:
    mask_B = jnp.broadcast_to(mask_B[:, None], labels.shape).reshape(-1)
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
  logits_BxC, labels_B = logits, labels
  log_probs_BxC = jax.nn.log_softmax(logits_BxC.astype(jnp.float32))
  nll_B = -jnp.take_along_axis(log_probs_BxC, labels_B[:, None], axis=-1)[:, 0]
  confidence_B = jnp.exp(jnp.max(log_probs_BxC, axis=-1))
  correct_B = (jnp.argmax(log_probs_BxC, axis=-1) == labels_B).astype(jnp.float32)
  bin_B = jnp.clip((confidence_B * ECE_BINS).astype(jnp.int32), 0, ECE_BINS - 1)
  onehot_BxQ = jax.nn.one_hot(bin_B, ECE_BINS) * mask_B[:, None]
  return {"count": mask_B.sum(),
          "correct": (correct_B * mask_B).sum(),
          "nll": (nll_B * mask_B).sum(),
          "bin_count": onehot_BxQ.sum(0),
          "bin_confidence": (onehot_BxQ * confidence_B[:, None]).sum(0),
          "bin_correct": (onehot_BxQ * correct_B[:, None]).sum(0)}


def add_sums(total: dict | None, sums: dict) -> dict:
  sums = jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(sums))
  return sums if total is None else jax.tree.map(np.add, total, sums)


def finalize(sums: dict, task: str = "classification") -> dict[str, float]:
  """Means from sums; for language models also perplexity and bits per token."""
  count = float(sums["count"])
  ece = np.sum(np.abs(sums["bin_correct"] - sums["bin_confidence"])) / count
  nll = float(sums["nll"]) / count
  out = {"accuracy": float(sums["correct"]) / count, "nll": nll, "ece": float(ece)}
  if task == "lm":
    # With the byte tokenizer a token is a byte: bits per token = bits per byte.
    out.update(perplexity=float(np.exp(nll)), bits_per_token=nll / np.log(2.0),
               num_tokens=int(count))
  else:
    out["num_examples"] = int(count)
  return out
