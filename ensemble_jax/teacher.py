"""A frozen teacher for knowledge distillation (`config.distill.teacher`).

The teacher is a finished data-parallel run of the student's model: its final checkpoint's
params (and BatchNorm statistics) are read once, replicated on every device and handed to
every train step as an input (`Method.step_args`), never stacked, trained or checkpointed
with the students. Training it cost time and compute, which the run that learns from it is
charged (`Teacher.charge`: results.json's `teacher`, added by `costs.summary` to the run's
FLOPs and critical path, as a pool's build).
"""
from __future__ import annotations

import dataclasses
import os

import orbax.checkpoint as ocp

from ensemble_jax import config_lib, costs, models, record
from ensemble_jax.config_lib import ConfigError

# What must match between the teacher's run and the student's: the model the student's
# step runs the teacher's variables through, and its inputs.
SAME_FIELDS = ("task", "model.name", "model.size", "model.width", "model.stage_sizes",
               "model.stem", "data.dataset", "data.context", "data.tokenizer", "data.image_size")


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A finished teacher run: where its final weights are and what it recorded."""
  workdir: str
  checkpoints: str  # its orbax directory
  results: dict  # its results.json

  @property
  def step(self) -> int:
    return int(self.results["steps"])

  def charge(self, config) -> dict:
    """results.json's `teacher`: the run it was and the cost of training it, all its steps
    (the final weights are the ones taught), as its own results price them on its cluster:
    FLOPs, critical-path time per interconnect preset and device-seconds. `costs.summary`
    adds them to this run's, as a pool's build; reports charge the teacher's record's price
    at the time they read it (`report.read_run`), not this copy."""
    whole = costs.whole_run(self.results)
    return {"workdir": self.workdir, "method": self.results["method"],
            "steps": self.step, "kd_weight": config.distill.kd_weight,
            "kd_temperature": config.distill.kd_temperature, **whole}


def find(config, checkpoints: str) -> Teacher:
  """The finished run `config.distill.teacher` names, checked against `config` without
  reading its weights; `checkpoints` is a run's orbax directory name (train.CHECKPOINTS).

  Raises ConfigError naming the path and how to make it."""
  workdir = config.distill.teacher
  results = record.read(workdir)
  if results is None:
    raise ConfigError(f"config.distill.teacher={workdir!r}: no finished run there (no "
                      f"{record.RESULTS_FILE}); train the teacher first: python -m "
                      f"ensemble_jax.main --config=<its config> --workdir={workdir}")
  if "num_workers" in results:  # a stacked method's record: its workers, not one model
    raise ConfigError(f"config.distill.teacher={workdir!r} holds a {results.get('method')} "
                      "run; a teacher is one model: name a finished data_parallel run.")
  theirs = dict(config_lib.flat(results.get("config") or {}))
  mine = dict(config_lib.flat(record.as_json(config)))
  unread = models.unread_fields(config.model.name)  # they do not apply to the model
  for name in (f for f in SAME_FIELDS if f not in unread):  # nor those its record lacks
    if name in theirs and mine.get(name) != theirs[name]:
      raise ConfigError(f"config.distill.teacher={workdir!r} was trained with "
                        f"{name}={theirs[name]!r}, this run has {mine.get(name)!r}; the teacher "
                        "must be this run's model: name a teacher with "
                        f"{name}={mine.get(name)!r}.")
  teacher = Teacher(workdir, os.path.join(workdir, checkpoints), results)
  manager = ocp.CheckpointManager(os.path.abspath(teacher.checkpoints),
                                  options=ocp.CheckpointManagerOptions(create=False)) \
      if os.path.isdir(teacher.checkpoints) else None
  saved = [] if manager is None else manager.all_steps()
  if manager is not None:
    manager.close()
  if teacher.step not in saved:
    raise ConfigError(f"config.distill.teacher={workdir!r}: no checkpoint of its final step "
                      f"{teacher.step} in {teacher.checkpoints} (steps {sorted(saved)}); "
                      "train the teacher again with checkpoint.max_to_keep >= 1 to keep it.")
  return teacher


def load(teacher: Teacher, like) -> dict:
  """The teacher's final variables, restored into `like`'s shapes and (replicated)
  shardings: {"params"[, "batch_stats"]} of its checkpoint, its optimizer state left
  unread."""
  manager = ocp.CheckpointManager(os.path.abspath(teacher.checkpoints),
                                  options=ocp.CheckpointManagerOptions(create=False))
  try:
    restored = manager.restore(teacher.step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            like, restore_args=ocp.checkpoint_utils.construct_restore_args(like),
            partial_restore=True)))
  except (ValueError, KeyError) as e:
    raise ConfigError(f"config.distill.teacher={teacher.workdir!r}: its weights do not fit "
                      f"this run's model ({str(e).splitlines()[0][:200]}); name a teacher "
                      "of the same model.") from None
  finally:
    manager.close()
  return dict(restored["state"])

