"""A sub-ensemble of a finished ensemble run, scored without training:
`python -m ensemble_jax.evaluate --workdir=RUN --workers=0,1`.

The run's final checkpoint is scored by the loop's own evaluation (`train.evaluate`) on the
run's eval set, the workers not named weighted 0 as a diverged one is (`aggregate.py`): N
workers trained once give every smaller ensemble of them. The record goes beside the run,
`<workdir>/subsets/workers_0_1.json`, its checkpoint named relative to the run's workdir (the
record moves with the run); bad input is one line before anything compiles.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import ml_collections
import numpy as np

from ensemble_jax import aggregate, checkpoint, config_lib, logs, plugins, record, train
from ensemble_jax import run as run_lib
from ensemble_jax.methods import METHODS
from ensemble_jax.methods.base import abstract

SUBSETS = "subsets"  # the run's folder of sub-ensemble records


def parse_workers(text: str) -> list[int]:
  """'0,1' -> [0, 1]; ConfigError on anything else."""
  try:
    workers = [int(w) for w in text.split(",") if w.strip()]
  except ValueError:
    workers = None
  if not workers:
    raise config_lib.ConfigError(f"--workers={text!r}: name the workers to mix as indices, "
                                 "e.g. --workers=0,1.")
  return workers


def subset(workdir: str, workers: list[int]) -> dict:
  """Scores `workers` of the finished ensemble run in `workdir` as one ensemble at its final
  step; writes the record and returns it. ConfigError, before any compile, on a workdir or
  workers that cannot be read so."""
  results = record.read(workdir)
  if results is None:
    raise config_lib.ConfigError(f"--workdir={workdir!r}: no finished run there (no "
                                 f"{record.RESULTS_FILE}); train it first with python -m "
                                 f"ensemble_jax.main --config=<its config> --workdir={workdir}.")
  config = ml_collections.ConfigDict(results["config"])
  plugins.load(config)  # its method or modes may be a plugin's
  name, n, said = config.method.name, config.method.num_workers, ",".join(map(str, workers))
  if not METHODS[name].mixes_workers:
    raise config_lib.ConfigError(f"--workdir={workdir!r} holds a {name} run, whose workers "
                                 "are not mixed by weight; name an ensemble run's workdir.")
  if routed := [m for m in config_lib.aggregation_modes(config) if aggregate.MODES[m].routed]:
    raise config_lib.ConfigError(f"--workdir={workdir!r}: its mode {routed[0]!r} weights the "
                                 "workers by its pool's routing, which a subset cannot read; "
                                 "name a run without routed modes.")
  if bad := [w for w in workers if not 0 <= w < n]:
    raise config_lib.ConfigError(f"--workers={said}: worker {bad[0]} is out of range; the run "
                                 f"has {n} workers: name workers among 0-{n - 1}.")
  if len(set(workers)) < len(workers):
    raise config_lib.ConfigError(f"--workers={said}: a worker is named twice; name each once.")
  directory = os.path.join(workdir, train.CHECKPOINTS)
  saved = checkpoint.latest_record(directory)
  if saved is None or saved["step"] != results["steps"]:
    raise config_lib.ConfigError(
        f"--workdir={workdir!r}: no checkpoint of its final step {results['steps']} in "
        f"{directory}; train the run again with checkpoint.max_to_keep >= 1 to keep it.")
  healthy = np.asarray(saved["method"].get("healthy", [True] * n), bool)
  if diverged := [w for w in workers if not healthy[w]]:
    raise config_lib.ConfigError(f"--workers={said}: worker {diverged[0]} diverged in this run "
                                 "(results.json excluded_workers); leave it out.")
  s = train.set_up(config, workdir)
  checkpointer = checkpoint.Checkpointer(directory, 0, 1)
  try:  # into the method's shardings: the training run's eval program, not another
    state, saved = checkpointer.restore(abstract(
        jax.eval_shape(s.method.init, jax.random.key(0)), s.method.state_sharding))
  finally:
    checkpointer.close()
  step = saved["step"]
  s.method.load_host_state({**saved["method"], "healthy": np.isin(np.arange(n), workers)})
  metrics = train.evaluate(config, s, state, step)
  out = {"workers": workers, "num_workers": n, "step": step,
         "checkpoint": os.path.join(train.CHECKPOINTS, str(step)),
         "num_examples": min(config.eval.num_examples or len(s.data.eval), len(s.data.eval)),
         "metric": config.eval.target_metric,
         "metrics": record.scalars(metrics),
         "per_worker": [metrics["per_worker"][w] for w in workers]}
  if jax.process_index() == 0:
    path = os.path.join(workdir, SUBSETS, f"workers_{'_'.join(map(str, workers))}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record.write_json(path, record.jsonable(out))
    out["path"] = path
  return out


def main(argv=None) -> int:
  """Flags only: one line out, the headline metric and the record's path, or the error
  (exit status 2)."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True, help="a finished ensemble run's workdir")
  p.add_argument("--workers", required=True, help="the workers to mix, e.g. 0,1")
  args = p.parse_args(argv)
  logs.quiet()
  try:
    out = subset(args.workdir, parse_workers(args.workers))
  except run_lib.USAGE_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  metric = out["metric"]
  print(f"workers {','.join(map(str, out['workers']))} of {out['num_workers']} at step "
        f"{out['step']}: {metric} {out['metrics'][metric]:.4f} on {out['num_examples']} "
        f"examples; {out.get('path', '')}", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
