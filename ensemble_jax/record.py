"""results.json: what a run trained, how long it took and what it cost, how good it is.

`build` assembles it from the loop's progress at the end of `train.fit`; `write` puts it in
the workdir whole or not at all, so a rerun that finds it knows the run finished.
"""
from __future__ import annotations

import json
import math
import os

import jax
import numpy as np
from absl import logging
from clu import parameter_overview

from ensemble_jax import communication, costs, models, sharding, stored

RESULTS_FILE = "results.json"


def build(config, s, pool, state, p, train_batches, eval_batches,
          comm: costs.Communication) -> dict:
  """results.json: what was trained, how long it took and cost, how good it is. `comm`:
  `communication_of`, read before training (a run that cannot be priced does not train)."""
  method = s.method
  results = {
      "method": method.name,
      "config": config.to_dict(),
      # the config.model fields that applied: those its model reads (`models.Model.fields`)
      "model_fields_read": list(models.fields_read(config.model.name)),
      "num_devices": jax.device_count(),
      "host": host_info(),
      "mesh": dict(s.mesh.shape),
      # what runs where, in words: the default mesh fitted to the workers and devices
      # (`methods.fit_workers_to_devices`) or the one the config chose
      "layout": sharding.describe_layout(method.stacked, method.num_workers, dict(s.mesh.shape),
                                         jax.device_count()),
      "data": s.data.info,
      "steps": p.step,  # trained; fewer than step_budget when stopped at the target
      "step_budget": s.num_steps,
      "examples_per_step": method.examples_per_step,
      "wall_time_s": p.chrono.wall_s(),
      "train_time_s": p.chrono.train_s,
      "eval_time_s": p.chrono.paused_s["eval"],
      "compile_time_s": p.chrono.paused_s["compile"],
      # This session's blocking part of checkpoint saves.
      "checkpoint_time_s": p.chrono.paused_s["checkpoint"],
      "flops_per_step": p.flops_per_step,
      "step_time_s": costs.median_step_time(p.durations, config.train.timing_warmup_steps),
      "final": scalars(p.last_eval),
      "target": target_record(p.tracker),
      # every rung of eval.target_values, easiest first (the first is `target`)
      "targets": [target_record(t) for t in p.trackers],
      "history": p.history,
      # Fields a resumed session changed ({"step", "changes": {field: [before, after]}});
      # `config` is the last session's.
      "config_changes": p.config_changes,
      **method.final_results(state, p.last_eval, p.step, train_batches, eval_batches),
  }
  if pool.info is not None:
    results["distill"] = pool.info
  if s.teacher is not None:  # charged in `cost` as its own results price its training
    results["teacher"] = s.teacher.charge(config)
  if p.noise is not None:
    results["noise_scale"] = p.noise.results(p.tracker.reached_step)
  devices = math.prod(method.cluster_mesh(config.cost.devices).values())
  results["cost"] = costs.summary(results, comm, devices, config.cost.overlap,
                                  simulated=jax.devices()[0].platform == "cpu",
                                  device_step_time_s=config.cost.device_step_time_s)
  if config.task == "lm":
    results["tokens_per_step"] = method.examples_per_step * config.data.context
    results["tokens_per_s"] = results["tokens_per_step"] / results["step_time_s"]
  return results


def communication_of(config, s, train_batches, eval_batches) -> costs.Communication:
  """The collectives of the method's programs on the cluster the run stands for."""
  req = communication.request(config, s.method, num_classes=s.data.num_classes,
                              init_input=s.data.init_input, num_steps=s.num_steps,
                              steps_per_epoch=s.steps_per_epoch, train_batches=train_batches,
                              eval_batches=eval_batches)
  return communication.for_cluster(s.method, req)


# XLA:CPU compiles for the host's instruction set, so the same run on another CPU (or
# another jaxlib) can round differently, and a chaotic run can then take other steps to
# its target. Runs on one host and jaxlib are bit-identical.
_CPU_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def target_record(t) -> dict:
  """One target's entry in results.json: when the run first met it, and how finely that is
  known."""
  return {"metric": t.metric, "value": t.value, "reached": t.reached,
          "reached_step": t.reached_step, "reached_time_s": t.reached_time_s,
          "reached_wall_time_s": t.reached_wall_time_s,
          # the crossing is in (reached_step - resolution_steps, reached_step]
          "resolution_steps": t.resolution_steps,
          "resolution": t.resolution_steps / t.reached_step if t.reached else None,
          # a too-coarse crossing replayed finely (`replay.refine`): what it replaced
          "refined_from": t.refined_from}


def host_info() -> dict:
  """What a result's floating point depends on besides the config: jaxlib, the device kind
  and, on CPU, the instruction-set features XLA compiles for."""
  info = {"jax": jax.__version__, "jaxlib": jax.lib.__version__,
          "device_kind": jax.devices()[0].device_kind}
  if jax.devices()[0].platform == "cpu" and os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines()
                    if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    info["cpu"] = fields.get("model name")
    info["cpu_features"] = [f for f in _CPU_FEATURES if f in flags]
  return info


def describe_host(info: dict) -> str:
  """A `host_info` in words: what makes two hosts' timings comparable (the device; on CPU
  its model and the instruction-set features XLA compiles for)."""
  features = ", ".join(info.get("cpu_features", ()))
  return f"{info.get('cpu') or info.get('device_kind')}" + (f" ({features})" if features else "")


def read(workdir: str, steps: int | None = None) -> dict | None:
  """The workdir's results.json under today's names (only if it covers `steps` steps, when
  given), else None."""
  path = os.path.join(workdir, RESULTS_FILE)
  try:
    results = stored.load(path)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:  # unreadable: the checkpoints decide what happens
    logging.warning("%s cannot be read (%s); resuming from the checkpoints", path, e)
    return None
  return results if steps is None or results.get("steps") == steps else None


def write(workdir: str, results: dict) -> None:
  """results.json, written whole or not at all: a rerun reads it to know the run finished."""
  write_json(os.path.join(workdir, RESULTS_FILE), jsonable(results))


def write_json(path: str, value) -> None:
  """`value` as JSON at `path`, replacing the file whole: a reader (a rerun, another process
  of a multi-process study) sees the old file or the new one, never a truncated one."""
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=2)
  os.replace(path + ".tmp", path)


def scalars(metrics: dict) -> dict:
  return {k: v for k, v in metrics.items() if np.ndim(v) == 0}


def as_json(config) -> dict:
  """The config as results.json and the checkpoint record hold it (tuples as lists)."""
  return json.loads(json.dumps(config.to_dict()))


def jsonable(x):
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, (np.floating, float)):
    return None if not math.isfinite(float(x)) else float(x)
  if isinstance(x, np.integer):
    return int(x)
  return x


PARAMETERS_FILE = "parameters.txt"  # the parameter table, in every run's workdir


def write_parameter_table(workdir: str, params) -> None:
  """The per-parameter table goes to the workdir; the log gets the one line with its total."""
  path = os.path.join(workdir, PARAMETERS_FILE)
  table = parameter_overview.get_parameter_overview(params, include_stats=False)
  if not os.path.exists(path):  # a finished run's workdir stays as it was
    with open(path, "w") as f:
      f.write(table + "\n")
  logging.info("parameters: %s (per-parameter table: %s)",
               f"{sum(math.prod(x.shape) for x in jax.tree.leaves(params)):,}", path)
