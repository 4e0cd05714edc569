"""The cost-vs-time study under JAX's multi-controller runtime: 2 processes x 4 fake CPU
devices, each running the same `--distributed` command on one shared workdir, give the
records of 1 process x 8 devices (the tuning choice, every run's evaluations and target)."""
import glob
import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import REPO, free_port, run_processes, subprocess_env

pytestmark = pytest.mark.slow

CONFIG = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
TIMEOUT_S = 240


def _records(workdir: str) -> dict:
  """{run path: what a study decides from}: tuning records' choices and runs, and each
  run's evaluations, final metrics and target (timings and costs left out)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(workdir, "*", "*", "tuning.json"))):
    with open(path) as f:
      record = json.load(f)
    out[os.path.relpath(path, workdir)] = {
        "chosen": record["chosen"],
        "runs": [{k: r[k] for k in ("run", "value", "reached", "steps_to_target", "final")}
                 for axis in record["axes"] for r in axis["runs"]]}
  for path in sorted(glob.glob(os.path.join(workdir, "*", "*", "*", "*", "results.json"))
                     + glob.glob(os.path.join(workdir, "*", "*", "seed*", "results.json"))):
    with open(path) as f:
      r = json.load(f)
    out[os.path.relpath(path, workdir)] = {
        "history": [{k: v for k, v in h.items() if not k.endswith("time_s")}
                    for h in r["history"]],
        "final": r["final"], "steps": r["steps"],
        "target": {k: r["target"][k] for k in ("reached", "reached_step")}}
  return out


def _close(a, b, path=""):
  if isinstance(a, dict):
    assert a.keys() == b.keys(), path
    for k in a:
      _close(a[k], b[k], f"{path}/{k}")
  elif isinstance(a, list):
    assert len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _close(x, y, f"{path}/{i}")
  elif isinstance(a, float):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=path)
  else:
    assert a == b, path


def test_the_study_on_two_processes_matches_one(tmp_path):
  multi = str(tmp_path / "multi")
  cmd = [sys.executable, "-m", "experiments.sweeps.cost_vs_time", f"--config={CONFIG}",
         f"--workdir={multi}", "--grid=smoke", "--seeds=0", "--compile_cache=",
         "--distributed", f"--coordinator_address=localhost:{free_port()}",
         "--num_processes=2"]
  env = subprocess_env(4, JAX_PLATFORMS="cpu")
  run_processes([cmd + [f"--process_id={i}"] for i in range(2)], env, str(tmp_path / "p"),
                TIMEOUT_S)
  assert os.path.exists(os.path.join(multi, "table.md"))  # process 0's report

  from experiments.sweeps import cost_vs_time

  single = str(tmp_path / "single")
  cost_vs_time.run(CONFIG, single, seeds=[0], grid="smoke")
  got, want = _records(multi), _records(single)
  assert any(k.endswith("tuning.json") for k in want) and any("seed0" in k for k in want)
  _close(got, want)
