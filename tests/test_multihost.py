"""Multi-host through JAX's own runtime: 2 local processes x 4 fake CPU devices must give
the results of 1 process x 8 devices (same mesh, same global batches, gloo collectives).

Each two-process run is a real `python -m ensemble_jax.main` in fresh processes: the
runtime must be joined before JAX builds its backend, which this test process has long done.
The one-process reference runs in this test process (the same 8 devices and XLA flags).
The ensemble on two processes (its 8 workers split across them) is compared the same way,
field for field, in tests/test_sweep.py's study on two processes.
"""
import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import free_port, run_processes, subprocess_env, untimed

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

TIMEOUT_S = 300
RTOL, ATOL = 1e-4, 1e-6


def _env(devices_per_process: int) -> dict:
  return subprocess_env(devices_per_process, JAX_PLATFORMS="cpu")


def _run(variant: str, workdir, num_processes: int) -> dict:
  """Runs `variant` on 8 devices split over `num_processes` (> 1) joined by JAX's runtime;
  -> process 0's results."""
  cmd = [sys.executable, "-m", "ensemble_jax.main",
         f"--config=experiments/configs/fashion_mnist.py:{variant}", f"--workdir={workdir}",
         "--config.distributed.initialize=True",
         f"--config.distributed.coordinator_address=localhost:{free_port()}",
         f"--config.distributed.num_processes={num_processes}"]
  env = _env(8 // num_processes)
  run_processes([cmd + [f"--config.distributed.process_id={i}"] for i in range(num_processes)],
                env, str(workdir), TIMEOUT_S)
  return _read(workdir)


def _run_here(variant: str, workdir: str) -> dict:
  """The one-process reference, in this test process: its 8 devices, its XLA flags."""
  from experiments.configs import fashion_mnist
  from ensemble_jax import run

  run.train_and_evaluate(fashion_mnist.get_config(variant), workdir)
  return _read(workdir)


def _read(workdir: str) -> dict:
  """results.json with the metric lines the run logged."""
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    results["metrics_lines"] = [json.loads(line) for line in f]
  return results


def _numbers(tree, prefix=""):
  """Flattens nested dicts/lists to {path: number}."""
  if isinstance(tree, dict):
    items = tree.items()
  elif isinstance(tree, list):
    items = enumerate(tree)
  else:
    return {prefix: float(tree)} if isinstance(tree, (int, float)) else {}
  out = {}
  for k, v in items:
    out.update(_numbers(v, f"{prefix}/{k}"))
  return out


def _assert_match(multi: dict, single: dict, keys: tuple[str, ...]):
  for key in keys:
    got, want = _numbers(untimed(multi[key])), _numbers(untimed(single[key]))
    assert got.keys() == want.keys(), key
    assert want, key
    np.testing.assert_allclose([got[k] for k in want], list(want.values()),
                               rtol=RTOL, atol=ATOL, err_msg=f"{key}: {sorted(want)}")


def test_two_processes_match_one(tmp_path):
  multi = _run("tiny", str(tmp_path / "multi"), num_processes=2)
  single = _run_here("tiny", str(tmp_path / "single"))
  for r in (multi, single):
    assert r["method"] == "data_parallel" and r["num_devices"] == 8 and r["mesh"] == {"data": 8}
  assert [h["step"] for h in multi["history"]] == [2, 4]
  # Eval after steps 2 and 4, the final eval, and the train metrics logged at steps 2 and 4.
  _assert_match(multi, single, ("final", "history", "metrics_lines", "num_params"))
