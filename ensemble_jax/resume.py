"""The resume policy: what a rerun of the same command does with what the workdir holds.

A finished run is read back, never rewritten. A half-finished one continues from its
latest checkpoint, if the config changes only what `FREE_ON_RESUME` allows or lengthens an
`EXTENSIBLE` duration. Anything else is one line listing the fields, before any data loads.
"""
from __future__ import annotations

import json
import os

import ml_collections
from absl import logging

from ensemble_jax import (config_lib, methods, models, plugins, record, sharding, stored,
                          validation)
from ensemble_jax.methods import METHODS

# What a resumed run may change: fields that alter neither the trained trajectory nor what
# results.json measures ('x.' covers a group). Everything else must match the checkpoints.
FREE_ON_RESUME = ("mesh", "method.fsdp", "method.fsdp_min_size", "method.local_strategy",
                  "model.remat", "data.data_dir", "data.prefetch", "data.num_threads",
                  "train.stop_at_target", "train.stop_at_step", "train.log_every_steps",
                  "train.timing_warmup_steps", "eval.every_steps", "eval.batch_size",
                  "distill.cache_dir", "checkpoint.", "distributed.", "cost.", "tune.")
# Durations a resumed run may lengthen (extending the run). The steps before the extension
# keep the learning-rate schedule of the shorter budget.
EXTENSIBLE = ("train.num_steps", "train.num_epochs", "method.steps_per_worker")
# The durations a run whose budget is method.steps_per_worker does not read
# (`methods.budget_per_worker`).
UNREAD_DURATIONS = ("train.num_steps", "train.num_epochs")


def config_changes(saved: dict, config) -> dict[str, tuple]:
  """{field: (saved, now)} for each field whose value differs between a run's saved config
  (`config.to_dict()` as JSON, read under today's names) and `config`; fields the saved one
  lacks are not compared, nor train.num_steps / num_epochs where both budgets are
  method.steps_per_worker (unread), nor model fields its model does not read
  (`models.unread_fields`)."""
  plugins.load(saved)  # the saved run's method may be a plugin's
  saved = dict(config_lib.flat(stored.migrate_config(saved)))
  current = dict(config_lib.flat(json.loads(json.dumps(config.to_dict()))))
  unread = UNREAD_DURATIONS if _per_worker_budget(saved) and _per_worker_budget(current) else ()
  if _one_device_per_model(saved) and _one_device_per_model(current):
    unread += ("method.batchnorm",)
  if saved.get("model.name") == current["model.name"]:  # fields its model does not read
    unread += models.unread_fields(current["model.name"])
  changes = {}
  for key, now in current.items():
    if key not in saved or key in unread:
      continue
    before = saved[key]
    if key == "mesh":  # the string and the list form of one mesh are the same mesh
      before, now = sharding.mesh_string(before), sharding.mesh_string(now)
    if before != now:
      changes[key] = (before, now)
  return changes


def _one_device_per_model(flat: dict) -> bool:
  """Whether the run stands for one device per model (data-parallel on 1, an ensemble's
  workers on at most one each): its BatchNorm is the same either way (`method.batchnorm`)."""
  devices = flat.get("cost.devices", 0)
  name = flat.get("method.name")
  if name is not None and not METHODS[name].stacked:  # one model over the devices
    return devices == 1
  return 0 < devices <= flat.get("method.num_workers", 0)


def _per_worker_budget(flat: dict) -> bool:
  return methods.budget_per_worker(flat.get("method.name"), flat.get("method.steps_per_worker"))


def may_change_on_resume(field: str, before, now) -> bool:
  """Whether a resumed run may continue with `field` changed from `before` to `now`."""
  if field in EXTENSIBLE:
    numbers = all(isinstance(v, (int, float)) for v in (before, now))
    return numbers and 0 < before < now
  return any(field == f or (f.endswith(".") and field.startswith(f)) for f in FREE_ON_RESUME)


def check_workdir_is_a_path(workdir: str) -> None:
  """results.json and metrics.jsonl are written with plain file I/O: a URL would become a
  local directory named after it (`./gs:/bucket/...`), found out only at the end."""
  if "://" in workdir:
    raise config_lib.ConfigError(
        f"--workdir={workdir!r}: remote workdirs are not supported; use a local path or a "
        "mounted bucket (e.g. gcsfuse's /mnt/bucket/runs).")


def prepare_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise config_lib.ConfigError(f"--workdir={workdir!r} cannot be created ({e}); choose "
                                 "another.") from None
  if not os.access(workdir, os.W_OK):
    raise config_lib.ConfigError(f"--workdir={workdir!r} is not writable; choose another.")


def finished_results(config: ml_collections.ConfigDict, workdir: str,
                     num_steps: int | None = None) -> dict | None:
  """The workdir's results.json if `config` would train that run no further (the same
  command run again), else None: every entry point asks this, nothing else decides it.
  Never rewrites it; reads no data, so it is quick.

  `num_steps`: the steps `config` trains, once its data is loaded (`train.fit`). A
  lengthened duration field may leave them as they were (the ensemble's budget is
  method.steps_per_worker); before the data, such a run is not finished yet.

  Raises ConfigError if the results are of a run `config` cannot continue (see
  `changed_fields`). A longer duration, or stop_at_target turned off before the budget
  was spent, continues the run from its checkpoints instead.
  """
  check_workdir_is_a_path(workdir)
  validation.validate(config)
  results = record.read(workdir)
  if results is None:
    return None
  changes = changed_fields({"step": results.get("steps"), "config": results.get("config")},
                           config, workdir)
  steps = results.get("steps", 0)
  if any(field in EXTENSIBLE for field in changes):  # extended: train on, if it adds steps
    return results if num_steps is not None and steps >= num_steps else None
  limit = results.get("step_budget", steps)
  if config.train.stop_at_step:  # stopped early on purpose: as far as this config goes
    limit = min(limit, config.train.stop_at_step)
  spent = steps >= limit
  if not (spent or config.train.stop_at_target and results.get("target", {}).get("reached")):
    return None  # stopped at its target, and this config does not stop there: train on
  if changes:
    logging.info("%s is finished; changes that alter nothing trained are ignored: %s",
                 workdir, listed(changes))
  return results


def changed_fields(saved: dict | None, config, workdir: str) -> dict[str, tuple]:
  """{field: (before, now)}: what `config` changes in the run `saved` describes.

  `saved` is a checkpoint's record or results.json; each change is one
  `may_change_on_resume` allows.

  Raises ConfigError listing the others: continuing would make one run of two configs, and
  results.json would claim the new one for all of it.
  """
  if not saved or not isinstance(saved.get("config"), dict):
    return {}  # a fresh workdir, or checkpoints from before configs were kept with them
  changes = config_changes(saved["config"], config)
  if blocked := blocked_changes(changes):
    raise held_elsewhere(
        workdir, f"a run of {described(saved['config'])} trained {saved['step']} steps",
        blocked,
        "Continue it with its own values, or give the new config a new --workdir. (A rerun "
        "may change logging, eval frequency and batch size, stop_at_target, checkpointing, "
        "cost.*, the mesh, sharding and data location, and may lengthen train.num_steps, "
        "train.num_epochs or method.steps_per_worker to extend the run.)",
        asking=described(config.to_dict()))
  return changes


def described(config: dict) -> str:
  """A run's config in a few words, said before the fields that differ: no record keeps
  the config file and variant a run was started with, so its method, model and workers."""
  method, model = config.get("method", {}), config.get("model", {})
  stacked = method.get("name") not in METHODS or METHODS[method["name"]].stacked
  workers = f", {method.get('num_workers')} workers" if stacked else ""  # else one model
  return f"{method.get('name')} ({model.get('name')}{workers})"


def blocked_changes(changes: dict[str, tuple], extend: bool = True) -> dict[str, tuple]:
  """The changes of `changes` ({field: (before, now)}) a resumed run may not make; with
  `extend` False a longer duration is one of them too (a study reads finished runs back:
  it never extends them)."""
  return {k: v for k, v in changes.items()
          if not may_change_on_resume(k, *v) or not extend and k in EXTENSIBLE}


def held_elsewhere(workdir: str, holds: str, changes: dict[str, tuple], ways_out: str,
                   asking: str = "") -> config_lib.ConfigError:
  """The refusal of a workdir that holds `holds` trained with other values: what it holds
  and what asks (`asking`, if said), each changed field (before -> now), then the ways out.
  A run's (main.py) and a study's alike."""
  differs = f"; this config, {asking}, differs in" if asking else " with other values:"
  return config_lib.ConfigError(f"--workdir={workdir!r} holds {holds}{differs} "
                                f"{listed(changes)}. {ways_out}")


def listed(changes: dict[str, tuple]) -> str:
  """'field before -> now, ...' for a message."""
  return ", ".join(f"{field} {before!r} -> {now!r}" for field, (before, now) in changes.items())
