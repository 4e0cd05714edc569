"""Routed pools built sharded over processes: 2 processes x 4 fake CPU devices, each reading
only its share of the training chunks, build the pool of 1 process x 8 devices bit for bit.

Each process is a fresh `python -m tests.pools_child` (JAX's runtime is joined before its
backend starts); the one-process reference is built in this test process.
"""
import json
import sys

import numpy as np
import pytest

from tests import pools_child
from tests.conftest import free_port, run_processes, subprocess_env

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

TIMEOUT_S = 300


def test_two_processes_build_the_one_process_pool_reading_their_shares(tmp_path):
  outs = [str(tmp_path / f"process{i}.npz") for i in range(2)]
  port = free_port()
  run_processes([[sys.executable, "-m", "tests.pools_child", str(i), "2", str(port), outs[i]]
                 for i in range(2)], subprocess_env(4, JAX_PLATFORMS="cpu"),
                str(tmp_path / "build"), TIMEOUT_S)
  n, chunk = pools_child.TRAIN_EXAMPLES, 4096
  # Chunks [0] and [1, 2]; for the float32 covariance process 1 also reads the first chunk,
  # whose mean is the shift. The old build read all 9,000 rows in each process.
  expected_reads = {"pca_float64": [chunk, n - chunk], "pca_float32": [chunk, n],
                    "tfidf": [chunk, n - chunk]}
  for case in pools_child.CASES:
    single = pools_child.build(case)
    assert single["rows_read"] == n
    assert len(single["route"]) == 300 and single["route"].shape[-1] == pools_child.WORKERS
    assert np.bincount(single["indices"]).max() == 1 and len(single["indices"]) == n
    reads = []
    for out in outs:
      with np.load(out) as f:
        assert int(f["process_count"]) == 2 and int(f["device_count"]) == 8
        for key in ("indices", "offsets", "route"):
          got, want = f[f"{case}_{key}"], single[key]
          assert got.dtype == want.dtype and np.array_equal(got, want), (case, key)
        assert json.loads(str(f[f"{case}_info"])) == json.loads(single["info"])
        reads.append(int(f[f"{case}_rows_read"]))
    assert reads == expected_reads[case], case
