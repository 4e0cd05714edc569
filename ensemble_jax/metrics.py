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


def nll_sums(log_probs_B: jax.Array, mask_B: jax.Array) -> dict:
  """Masked sums of the likelihood alone, from the log-probabilities of the targets.

  Takes [B], or [B, T] with a mask [B]: then every token counts. `finalize` reads them as
  `prediction_sums`' count and nll."""
  mask_B = jnp.broadcast_to(mask_B.reshape(mask_B.shape + (1,) * (log_probs_B.ndim - 1)),
                            log_probs_B.shape)
  return {"count": mask_B.sum(), "nll": -(log_probs_B * mask_B).sum()}


def add_sums(total: dict | None, sums: dict) -> dict:
  sums = jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(sums))
  return sums if total is None else jax.tree.map(np.add, total, sums)


def finalize(sums: dict, task: str = "classification") -> dict[str, float]:
  """Means from sums; for language models also perplexity and bits per token.

  Sums of the likelihood alone (`count` and `nll`, as `nll_sums` gives them) give the
  likelihood's metrics alone: no accuracy or ECE."""
  count = float(sums["count"])
  nll = float(sums["nll"]) / count
  if "correct" in sums:
    ece = np.sum(np.abs(sums["bin_correct"] - sums["bin_confidence"])) / count
    out = {"accuracy": float(sums["correct"]) / count, "nll": nll, "ece": float(ece)}
  else:
    out = {"nll": nll}
  if task == "lm":
    # With the byte tokenizer a token is a byte: bits per token = bits per byte.
    out.update(perplexity=float(np.exp(nll)), bits_per_token=nll / np.log(2.0),
               num_tokens=int(count))
  else:
    out["num_examples"] = int(count)
  return out
