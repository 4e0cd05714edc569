"""Golden values: a few steps of each method through the real loop give stored numbers.

A guard for refactors that must not change any result (issue 15: the loop split into
phases, the method interface written down). Each run is fashion_mnist.py's smoke
variant: 4 steps, a log, an eval and a checkpoint every 2 steps, DiLoCo syncing every 2,
so every phase of the loop runs (compile, step, step-metric check, log, eval of the
deployable model, target tracking, after_step, checkpoint, final results). The model is
the whole ResNet-18 at width 4 (`model.stage_sizes=()`), as when the values were made: the
smoke variant itself now trains two one-block stages, lighter to compile.

Regenerate (prints the dict to paste into GOLDEN):
  GOLDEN_REGENERATE=1 python -m pytest -q -s tests/test_golden.py
Updating them is legitimate only for a change meant to change results (a new default, a
fixed numerical defect, a new jax/XLA), never for a refactor; say which in the commit.
They were generated on CPU with 8 fake devices (jax 0.10.2); another XLA or CPU may
round differently, hence the 1e-6 relative tolerance. On the machine that generated
them a refactor reproduces them exactly: check with GOLDEN_REL=0 (bit for bit).
"""
import json
import os

import jax
import numpy as np
import pytest

from ensemble_jax import train

VARIANTS = {"data_parallel": "smoke", "ensemble": "ensemble,smoke", "diloco": "diloco,smoke"}

REL = float(os.environ.get("GOLDEN_REL", "1e-6"))
GOLDEN = {  # generated on 3c6ac85 (before the issue-15 refactor)
    "data_parallel": {
        "steps": 4, "train_loss": [2.2677667140960693, 2.3573269844055176],
        "eval_history": [(2, 0.0546875, 2.300119996070862), (4, 0.0390625, 2.301143765449524)],
        "final_accuracy": 0.0390625, "final_nll": 2.301143765449524,
        "state_checksum": 3964.8685497540723},
    "ensemble": {
        "steps": 4, "train_loss": [2.389932870864868, 2.3763179779052734],
        "eval_history": [(2, 0.0859375, 2.303118109703064), (4, 0.09375, 2.3020198345184326)],
        "final_accuracy": 0.09375, "final_nll": 2.3020198345184326,
        "state_checksum": 31601.952193495476},
    "diloco": {
        "steps": 4, "train_loss": [2.2835187911987305, 2.3266868591308594],
        "eval_history": [(2, 0.1328125, 2.289041757583618), (4, 0.140625, 2.279868721961975)],
        "final_accuracy": 0.140625, "final_nll": 2.279868721961975,
        "state_checksum": 35353.49714367711, "syncs": [2, 4]},
}


def _checksum(tree) -> float:
  """Sum of |x| over every array leaf of the final state (params, optimizer, statistics)."""
  return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(tree)
                   if isinstance(x, (jax.Array, np.ndarray))))


def _measure(variant: str, workdir: str) -> dict:
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config(variant)
  config.model.stage_sizes = ()  # ResNet-18's own (2, 2, 2, 2), as the values were made
  fit = train.fit(config, workdir)
  r = fit.results
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = [json.loads(line) for line in f]
  out = {
      "steps": r["steps"],
      "train_loss": [row["train/loss"] for row in logged if "train/loss" in row],
      "eval_history": [(h["step"], h["accuracy"], h["nll"]) for h in r["history"]],
      "final_accuracy": r["final"]["accuracy"],
      "final_nll": r["final"]["nll"],
      "state_checksum": _checksum(fit.state),
  }
  if "syncs" in r:
    out["syncs"] = r["syncs"]
  return out


@pytest.mark.parametrize("method", list(VARIANTS))
def test_golden_values(method, tmp_path):
  got = _measure(VARIANTS[method], str(tmp_path))
  if os.environ.get("GOLDEN_REGENERATE"):
    print(f"\n{method!r}: {got!r},")
    return
  want = GOLDEN[method]
  assert got.keys() == want.keys()
  for key, value in want.items():
    if key in ("steps", "syncs"):
      assert got[key] == value, key
    else:
      assert np.asarray(got[key], np.float64) == pytest.approx(
          np.asarray(value, np.float64), rel=REL, abs=0), key
