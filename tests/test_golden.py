"""Golden values: a few steps of each method through the real loop give stored numbers.

A guard for refactors that must not change any result (issue 15: the loop split into
phases, the method interface written down). Each run is fashion_mnist.py's smoke
variant: 4 steps, a log, an eval and a checkpoint every 2 steps, DiLoCo syncing every 2,
so every phase of the loop runs (compile, step, step-metric check, log, eval of the
deployable model, target tracking, after_step, checkpoint, final results).

History: the first values, made on 3c6ac85 (ResNet-18 at width 4) before the issue-15
refactor, held at 1e-6 through it and up to the change that gave the smoke variant two
one-block stages (lighter to compile); they were then made again on that model, which is
a change of what the test runs, not of any result.

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

pytestmark = pytest.mark.e2e

VARIANTS = {"data_parallel": "tiny", "ensemble": "ensemble,tiny", "diloco": "diloco,tiny"}

REL = float(os.environ.get("GOLDEN_REL", "1e-6"))
GOLDEN = {  # made on the two-stage smoke model (see the docstring)
    "data_parallel": {
        "steps": 4, "train_loss": [2.401285171508789, 2.317126750946045],
        "eval_history": [(2, 0.1171875, 2.334484100341797), (4, 0.109375, 2.328661561012268)],
        "final_accuracy": 0.109375, "final_nll": 2.328661561012268,
        "state_checksum": 284.7960507175094},
    "ensemble": {
        "steps": 4, "train_loss": [2.39390230178833, 2.4137096405029297],
        "eval_history": [(2, 0.078125, 2.3194268941879272), (4, 0.0859375, 2.3189046382904053)],
        "final_accuracy": 0.0859375, "final_nll": 2.3189046382904053,
        "state_checksum": 2246.7883540184994},
    "diloco": {
        "steps": 4, "train_loss": [2.3732235431671143, 2.3343849182128906],
        "eval_history": [(2, 0.078125, 2.385700821876526), (4, 0.0859375, 2.3829846382141113)],
        "final_accuracy": 0.0859375, "final_nll": 2.3829846382141113,
        "state_checksum": 2492.699469451926, "syncs": [2, 4]},
}


def _checksum(tree) -> float:
  """Sum of |x| over every array leaf of the final state (params, optimizer, statistics)."""
  return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(tree)
                   if isinstance(x, (jax.Array, np.ndarray))))


def _measure(variant: str, workdir: str) -> dict:
  from experiments.configs import fashion_mnist

  fit = train.fit(fashion_mnist.get_config(variant), workdir)
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
