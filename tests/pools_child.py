"""One process of tests/test_pools_multihost.py's multi-process pool build.

  python -m tests.pools_child PROCESS_ID NUM_PROCESSES PORT OUT.npz

Joins JAX's runtime (before JAX starts its backend), builds the routed pools of `CASES`
(Fashion-MNIST's PCA, both covariances; the Python docs' tf-idf) through `pools.build`, and
writes their pools, routing, info and the training rows this process read to OUT.npz. The test builds the one-process reference
with `build` in its own process.
"""
import json
import sys
import tempfile

import numpy as np

TRAIN_EXAMPLES = 9000  # 3 chunks of 4096: shares of 1 and 2 chunks on 2 processes
WORKERS = 4
CASES = ("pca_float64", "pca_float32", "tfidf")


def config(case: str):
  from experiments.configs import fashion_mnist, pydocs_gpt2

  if case == "tfidf":
    c = pydocs_gpt2.get_config("ensemble,tiny")
    c.distill.tfidf_dim = 8
  else:
    c = fashion_mnist.get_config("ensemble,tiny")
    c.distill.embedding, c.distill.pca_dim = "pca", 8
    c.distill.pca_covariance = case.split("_")[1]
  c.method.num_workers = WORKERS
  c.data.train_examples = TRAIN_EXAMPLES
  c.distill.builder = "kmeans"
  c.method.aggregation = "routed,probs"
  c.eval.num_examples = 300
  return c


class _Counted:
  """A source that counts the examples read from it."""

  def __init__(self, source):
    self.source, self.rows = source, 0

  def __len__(self):
    return len(self.source)

  def get(self, i):
    self.rows += 1
    return self.source.get(i)

  def get_range(self, begin, end):
    self.rows += end - begin
    return self.source.get_range(begin, end)


def build(case: str) -> dict:
  """The pool `pools.build` makes of `config(case)` in this process (of however many)."""
  from ensemble_jax import data as data_lib
  from ensemble_jax.distill import pools

  c = config(case)
  data = data_lib.load(c)
  data.train = _Counted(data.train)
  with tempfile.TemporaryDirectory() as proxy_dir:
    built = pools.build(c, data, WORKERS, proxy_dir)
  built_pools, route, info = built.pools, built.route, built.info
  assert built.weights is None
  untimed = {k: v for k, v in info.items() if not k.endswith("time_s")}
  return {"indices": np.concatenate(built_pools),
          "offsets": np.cumsum([0] + [len(p) for p in built_pools]), "route": route,
          "info": json.dumps(untimed, sort_keys=True), "rows_read": data.train.rows}


def main(process_id: int, num_processes: int, port: int, out: str) -> None:
  import jax

  jax.distributed.initialize(f"localhost:{port}", num_processes, process_id)
  results = {case: build(case) for case in CASES}
  np.savez(out, **{f"{case}_{k}": v for case, r in results.items() for k, v in r.items()},
           process_count=jax.process_count(), device_count=jax.device_count())


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
