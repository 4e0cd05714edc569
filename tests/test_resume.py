"""Preemption-safe runs: kill -9 and resume, SIGTERM and Ctrl-C checkpoint, periodic saves,
metrics logged once, damaged checkpoints."""
import glob
import json
import os
import random
import re
import shutil
import signal
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from ensemble_jax import checkpoint, config_lib, resume, run
from tests import forked_cli
from tests.conftest import subprocess_env

pytestmark = pytest.mark.e2e

STEPS, EVERY = 12, 3
# A finished checkpoint's directory is its step alone: orbax writes into
# `<step>.orbax-checkpoint-tmp-<n>` and renames when done; damaged ones become `<step>.damaged`.
_STEP_DIR = re.compile(r"\d+")
_RESUMED = re.compile(r"Resumed from step (\d+) in ")


def _args(workdir, variant="tiny"):
  """The arguments of `python -m ensemble_jax.main` for a 12-step run checkpointed every 3,
  on 8 x 8 images: what a step costs is no part of what a resume must get right (the
  ensemble's run took 6.6 s of CPU at 28 x 28, 4.5 s at 8 x 8)."""
  return [f"--config=experiments/configs/fashion_mnist.py:{variant}", f"--workdir={workdir}",
          f"--config.train.num_steps={STEPS}", f"--config.checkpoint.every_steps={EVERY}",
          "--config.eval.every_steps=6", "--config.method.steps_per_worker=0",
          "--config.data.image_size=8"]


# make test runs each file's tests on one xdist worker (--dist loadfile): started once.
@pytest.fixture(scope="module")
def cli():
  """Starts `python -m ensemble_jax.main` runs as forks of one process that imported the
  package once (tests/forked_cli.py): each its own process, killed or signalled by its pid.
  8 devices, one per worker of `ensemble,tiny`: on 2, its 8 workers compile unrolled 4 to
  a device and its programs are priced in a child process with 8 (measured beside other
  jobs: 166 s against 26 s for its 12 steps; the data-parallel run 70 s against 31 s)."""
  with forked_cli.Forks("ensemble_jax.main", subprocess_env(8)) as forks:
    yield forks


def _run(cli, workdir, variant="tiny") -> str:
  """Runs to the end; returns the log (stderr)."""
  proc = cli.run(_args(workdir, variant), timeout_s=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stderr


def _steps(workdir) -> list[int]:
  """The finished checkpoints' steps, oldest first."""
  path = os.path.join(workdir, "checkpoints")
  names = os.listdir(path) if os.path.isdir(path) else []
  return sorted(int(p) for p in names if _STEP_DIR.fullmatch(p))


def _resumed_step(log: str) -> int:
  """The step a run restored from, by its own log; 0 when it started afresh."""
  found = _RESUMED.findall(log)
  return int(found[-1]) if found else 0


def _final_state(workdir):
  """The final checkpoint's arrays, read raw (no target structure needed)."""
  step = max(_steps(workdir))
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  return step, ocp.PyTreeCheckpointer().restore(path)


def _metrics(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    r = json.load(f)
  timing = ("train_time_s",)
  return r["final"], [{k: v for k, v in h.items() if k not in timing} for h in r["history"]]


def _assert_identical(a, b):
  assert _metrics(a) == _metrics(b)
  (step_a, tree_a), (step_b, tree_b) = _final_state(a), _final_state(b)
  assert step_a == step_b == STEPS
  leaves_a, leaves_b = _flat(tree_a), _flat(tree_b)
  assert leaves_a.keys() == leaves_b.keys()
  for key in leaves_a:
    np.testing.assert_array_equal(leaves_a[key], leaves_b[key], err_msg=key)  # bit for bit


def _flat(tree, prefix=""):
  out = {}
  for k, v in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
    if isinstance(v, (dict, list, tuple)):
      out.update(_flat(v, f"{prefix}{k}/"))
    elif v is not None:
      out[f"{prefix}{k}"] = np.asarray(v)
  return out


def _wait_for_checkpoint(workdir, proc, step=1, timeout=300):
  """Until a checkpoint at `step` or later is finished (or the run ended)."""
  start = time.time()
  while time.time() - start < timeout and proc.poll() is None:
    if _steps(workdir) and max(_steps(workdir)) >= step:
      return
    time.sleep(0.02)


# Made once, like `cli`.
@pytest.fixture(scope="module")
def reference(cli, tmp_path_factory):
  out = {}
  for variant in ("tiny", "ensemble,tiny"):
    workdir = str(tmp_path_factory.mktemp("reference"))
    _run(cli, workdir, variant)
    out[variant] = workdir
  return out


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["tiny", "ensemble,tiny"])
def test_kill_9_at_random_steps_then_resume_is_bit_identical(cli, reference, tmp_path,
                                                             variant):
  # Killed at a random moment after a random one of the first checkpoints (step 3 or 6 of
  # 12): anywhere in a step, an eval or a checkpoint write, with half the run still to go.
  rng = random.Random(variant)
  workdir = str(tmp_path)
  proc = cli.start(_args(workdir, variant))
  _wait_for_checkpoint(workdir, proc, step=EVERY * rng.randint(1, 2))
  time.sleep(rng.uniform(0.0, 0.1))
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL, "the run ended before the kill; the test proved nothing"
  saved = _steps(workdir)
  log = _run(cli, workdir, variant)  # the same command resumes from the latest complete checkpoint
  # A kill before the first checkpoint was finished would restart from scratch and pass
  # the comparison trivially: the resumed run must say it restored a saved step.
  assert saved and _resumed_step(log) == max(saved) > 0, (saved, log[-2000:])
  _assert_identical(workdir, reference[variant])


def test_damaged_latest_checkpoint_falls_back_to_the_previous(tiny_config, tmp_path):
  tiny_config.train.num_steps = 6
  tiny_config.checkpoint.max_to_keep = 3
  a = run.train_and_evaluate(tiny_config, str(tmp_path / "a"))
  # b: as if killed after step 4 was saved, with step 4's files then truncated
  shutil.copytree(tmp_path / "a", tmp_path / "b")
  shutil.rmtree(tmp_path / "b" / "checkpoints" / "6")
  os.remove(tmp_path / "b" / "results.json")
  for f in glob.glob(str(tmp_path / "b" / "checkpoints" / "4" / "state" / "**" / "d" / "*"),
                     recursive=True):
    with open(f, "r+b") as fh:
      fh.truncate(8)
  b = run.train_and_evaluate(tiny_config, str(tmp_path / "b"))  # resumes from step 2
  assert os.path.isdir(tmp_path / "b" / "checkpoints" / "4.damaged")
  assert a["final"] == b["final"]
  assert [h["step"] for h in b["history"]] == [2, 4, 6]


def _finished_run(tmp_path_factory, **fields):
  """A finished run of the tiny config with `fields` set ({"train.num_steps": 2}) in a
  directory of its own, for tests to copy (`_copy_of`) rather than train again."""
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  for key, value in fields.items():
    config_lib.set_dotted(config, key, value)
  workdir = tmp_path_factory.mktemp("finished")
  run.train_and_evaluate(config, str(workdir))
  return workdir


# Made once, like `cli`: finished runs that several tests start from.
@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
  """The tiny config's 2-step run (five tests)."""
  return _finished_run(tmp_path_factory, **{"train.num_steps": 2})


@pytest.fixture(scope="module")
def stopped_at_target(tmp_path_factory):
  """The tiny config's run stopped at an easy target, at step 2 of 4 (two tests)."""
  return _finished_run(tmp_path_factory, **{"eval.target_metric": "nll",
                                            "eval.target_value": 100.0,
                                            "train.stop_at_target": True})


def _copy_of(finished, tmp_path) -> dict:
  """A finished run copied into `tmp_path`: the files training it there writes (none holds
  its directory); its results."""
  shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
  with open(tmp_path / "results.json") as f:
    return json.load(f)


def test_no_good_checkpoint_says_what_to_delete(tiny_config, two_steps, tmp_path):
  tiny_config.train.num_steps = 2
  _copy_of(two_steps, tmp_path)
  os.remove(tmp_path / "results.json")  # as if killed before the end (else it is finished)
  for f in glob.glob(str(tmp_path / "checkpoints" / "*" / "meta" / "metadata")):
    os.remove(f)
  with pytest.raises(checkpoint.CheckpointError, match="Delete the damaged step directories"):
    run.train_and_evaluate(tiny_config, str(tmp_path))


def test_same_seed_same_results(tiny_config, tmp_path):
  a = run.train_and_evaluate(tiny_config, str(tmp_path / "a"))
  b = run.train_and_evaluate(tiny_config, str(tmp_path / "b"))
  assert a["final"] == b["final"]
  assert [{k: v for k, v in h.items() if k != "train_time_s"} for h in a["history"]] == \
      [{k: v for k, v in h.items() if k != "train_time_s"} for h in b["history"]]


def _files(workdir) -> dict:
  """Every file under `workdir` with its bytes (what a rerun must leave as it was)."""
  out = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.relpath(os.path.join(root, name), workdir)] = f.read()
  return out


def test_rerunning_a_finished_run_leaves_its_results_untouched(tiny_config, two_steps, tmp_path,
                                                               capsys):
  from ensemble_jax import main, train

  tiny_config.train.num_steps = 2
  first = _copy_of(two_steps, tmp_path)
  before = _files(tmp_path)
  capsys.readouterr()
  assert main.run(tiny_config, str(tmp_path)) == 0  # the README's resume command, again
  out = capsys.readouterr().out.strip().splitlines()
  assert "already finished with this config: results.json left as it was" in out
  assert out[-1].startswith(f"results: {tmp_path}/results.json; final accuracy ")
  # The old code rewrote results.json (flops_per_step null, compile_time_s 0, a new wall time).
  assert _files(tmp_path) == before
  # Changes that alter nothing trained leave it finished too; so does the loop itself.
  tiny_config.eval.every_steps, tiny_config.train.log_every_steps = 1, 1
  assert run.train_and_evaluate(tiny_config, str(tmp_path)) == json.loads(
      before["results.json"])
  fit = train.fit(tiny_config, str(tmp_path))
  assert fit.results["flops_per_step"] == first["flops_per_step"] > 0
  assert _files(tmp_path) == before


@pytest.mark.parametrize("killed", [False, True], ids=["finished", "killed"])
def test_resuming_with_another_config_is_one_line_listing_the_fields(tiny_config, two_steps,
                                                                     tmp_path, capsys,
                                                                     monkeypatch, killed):
  from ensemble_jax import main, train

  tiny_config.train.num_steps = 2
  _copy_of(two_steps, tmp_path)
  if killed:  # checkpoints only: the config kept with them is what is compared
    os.remove(tmp_path / "results.json")
  before = _files(tmp_path)
  tiny_config.train.batch_size, tiny_config.optim.learning_rate = 64, 0.01
  tiny_config.model.width = 8  # once reported as damaged checkpoints to delete
  tiny_config.eval.every_steps = 1  # free to change: not listed as a difference
  monkeypatch.setattr(train.data_lib, "load", lambda config: pytest.fail("data was loaded"))
  capsys.readouterr()
  assert main.run(tiny_config, str(tmp_path)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith(f"error: --workdir='{tmp_path}' holds a run of data_parallel "
                           "(resnet18) trained 2 steps; this config, data_parallel (resnet18), "
                           "differs in ")
  for change in ("train.batch_size 32 -> 64", "model.width 4 -> 8",
                 "optim.learning_rate 0.003 -> 0.01"):
    assert change in err[0], err
  assert "eval.every_steps" not in err[0].split("(")[0]
  assert "Continue it with its own values, or give the new config a new --workdir" in err[0]
  assert _files(tmp_path) == before


def _stored_under_the_old_name(workdir, builder: str) -> None:
  """The run's results.json and checkpoint records as a run that read a `builder` pool wrote
  them before `distill.builder` was `distill.method`."""
  for path in [workdir / "results.json",
               *glob.glob(str(workdir / "checkpoints" / "*" / "meta" / "metadata"))]:
    if os.path.exists(path):
      with open(path) as f:
        record = json.load(f)
      record["config"]["distill"].pop("builder")
      record["config"]["distill"]["method"] = builder
      with open(path, "w") as f:
        json.dump(record, f)


@pytest.mark.parametrize("killed", [False, True], ids=["finished", "killed"])
def test_a_run_stored_under_the_old_name_refuses_another_builder(tiny_config, two_steps,
                                                                 tmp_path, capsys, monkeypatch,
                                                                 killed):
  """Read without `stored.migrate_config`, the stored config lacks `distill.builder`, which
  `resume.config_changes` then never compares: the run would go on with another pool."""
  from ensemble_jax import main, train

  tiny_config.train.num_steps = 2
  _copy_of(two_steps, tmp_path)
  if killed:
    os.remove(tmp_path / "results.json")
  _stored_under_the_old_name(tmp_path, "kmeans")
  before = _files(tmp_path)
  tiny_config.distill.builder = "el2n"  # a data-parallel run's pool (kmeans: a worker's)
  monkeypatch.setattr(train.data_lib, "load", lambda config: pytest.fail("data was loaded"))
  capsys.readouterr()
  assert main.run(tiny_config, str(tmp_path)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "distill.builder 'kmeans' -> 'el2n'" in err[0], err
  assert _files(tmp_path) == before


def test_every_entry_point_refuses_a_finished_run_of_another_config_alike(tiny_config, two_steps,
                                                                          tmp_path, capsys):
  """One function decides what a finished run is (`resume.finished_results`). Its results
  alone (as committed, no checkpoints): main.py, the run, the loop and the sweeps' runner
  refuse them in the same words, and leave them as they were. The sweeps' runner once
  decided by results.json's presence alone and read them back as this config's."""
  from ensemble_jax import main, train
  from experiments.sweeps import tuning

  tiny_config.train.num_steps = 2
  _copy_of(two_steps, tmp_path)
  shutil.rmtree(tmp_path / "checkpoints")
  before = _files(tmp_path)
  tiny_config.optim.learning_rate = 0.01
  refusals = []
  for entry in (lambda: run.train_and_evaluate(tiny_config, str(tmp_path)),
                lambda: train.fit(tiny_config, str(tmp_path)),
                lambda: tuning.train_run(tiny_config, str(tmp_path), {"runs": 0}, "runs")):
    with pytest.raises(config_lib.ConfigError) as e:
      entry()
    refusals.append(str(e.value))
  capsys.readouterr()
  assert main.run(tiny_config, str(tmp_path)) == 2
  refusals.append(capsys.readouterr().err.strip().removeprefix("error: "))
  assert len(set(refusals)) == 1, refusals
  assert "optim.learning_rate 0.003 -> 0.01" in refusals[0]
  assert _files(tmp_path) == before


def test_free_changes_and_a_longer_budget_resume_and_are_recorded(tiny_config, two_steps,
                                                                    tmp_path):
  tiny_config.train.num_steps = 2
  _copy_of(two_steps, tmp_path)
  os.remove(tmp_path / "results.json")  # killed after its last checkpoint
  tiny_config.train.num_steps, tiny_config.eval.every_steps = 4, 1
  tiny_config.mesh = "data:4"  # layout, not trajectory
  r = run.train_and_evaluate(tiny_config, str(tmp_path))
  assert [h["step"] for h in r["history"]] == [2, 3, 4] and r["mesh"] == {"data": 4}
  assert r["config_changes"] == [{"step": 2, "changes": {
      "mesh": ["data:-1", "data:4"], "train.num_steps": [2, 4], "eval.every_steps": [2, 1]}}]
  tiny_config.train.num_steps = 3  # shorter than the checkpoints' budget: not an extension
  with pytest.raises(config_lib.ConfigError, match=r"train.num_steps 4 -> 3"):
    run.train_and_evaluate(tiny_config, str(tmp_path))


def test_stopped_at_target_is_finished_unless_the_rerun_goes_on(tiny_config, stopped_at_target,
                                                                 tmp_path):
  tiny_config.eval.target_metric, tiny_config.eval.target_value = "nll", 100.0
  tiny_config.train.stop_at_target = True
  first = _copy_of(stopped_at_target, tmp_path)
  assert first["steps"] == 2 and first["step_budget"] == 4
  with open(tmp_path / "results.json") as f:
    assert run.finished_results(tiny_config, str(tmp_path)) == json.load(f)
  tiny_config.train.stop_at_target = False  # the whole budget now: train on from step 2
  assert run.finished_results(tiny_config, str(tmp_path)) is None
  second = run.train_and_evaluate(tiny_config, str(tmp_path))
  assert second["steps"] == 4 and [h["step"] for h in second["history"]] == [2, 4]


def test_a_run_killed_after_its_last_checkpoint_still_records_its_flops(tiny_config,
                                                                        stopped_at_target,
                                                                        tmp_path):
  """Killed between its last checkpoint and results.json, a run that had stopped at its
  target takes no step when resumed: its FLOPs are still read off its compiled step."""
  tiny_config.eval.target_metric, tiny_config.eval.target_value = "nll", 100.0
  tiny_config.train.stop_at_target = True
  first = _copy_of(stopped_at_target, tmp_path)
  os.remove(tmp_path / "results.json")
  again = run.train_and_evaluate(tiny_config, str(tmp_path))
  assert again["steps"] == first["steps"] == 2 and again["final"] == first["final"]
  assert again["flops_per_step"] == first["flops_per_step"] > 0


def test_a_longer_field_that_leaves_the_budget_as_it_was_leaves_the_results(tmp_path):
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  config.train.num_steps, config.train.num_epochs = 0, 0.001  # 60 examples: 2 steps of 32
  run.train_and_evaluate(config, str(tmp_path))
  before = _files(tmp_path)
  config.train.num_epochs = 0.00105  # grows, but ceil(63 / 32) is still 2 steps
  assert run.finished_results(config, str(tmp_path)) is None  # judged by the loop instead
  assert run.finished_results(config, str(tmp_path), num_steps=2) == json.loads(
      before["results.json"])  # as the loop judges it, with the data's step count
  again = run.train_and_evaluate(config, str(tmp_path))
  assert again["steps"] == 2 and again["flops_per_step"] > 0
  assert _files(tmp_path) == before


def test_durations_a_per_worker_budget_does_not_read_are_no_change(tmp_path):
  # An ensemble's budget is method.steps_per_worker: train.num_steps / num_epochs (a
  # preset's default changed since the run) leave it finished, before any data loads.
  stored = config_lib.base_config()
  stored.method.name, stored.method.steps_per_worker = "ensemble", 200
  now = config_lib.base_config()
  now.method.name, now.method.steps_per_worker = "ensemble", 200
  now.train.num_epochs, now.train.num_steps = 0.0, 1875

  def saved():  # as results.json holds it
    return json.loads(json.dumps(stored.to_dict()))

  assert resume.config_changes(saved(), now) == {}
  stored.method.name = now.method.name = "data_parallel"  # read by data-parallel: a change
  assert set(resume.config_changes(saved(), now)) == {
      "train.num_epochs", "train.num_steps"}


def test_a_refused_workdir_says_which_run_it_holds_and_which_config_asks():
  """`:smoke`, then `:smoke,ensemble` in its workdir: the refusal says what trained it and
  what asks before the fields. Fails on ef8466c2: `holds a run trained 300 steps with other
  values: method.name ...`, naming neither."""
  from experiments.configs import fashion_mnist

  smoke = json.loads(json.dumps(fashion_mnist.get_config("smoke").to_dict()))  # as stored
  saved = {"step": 300, "config": smoke}
  with pytest.raises(config_lib.ConfigError) as e:
    resume.changed_fields(saved, fashion_mnist.get_config("smoke,ensemble"), "/tmp/smoke")
  assert str(e.value).startswith(
      "--workdir='/tmp/smoke' holds a run of data_parallel (resnet18) trained 300 steps; this "
      "config, ensemble (resnet18, 4 workers), differs in method.name 'data_parallel' -> "
      "'ensemble', method.steps_per_worker 0 -> 150. Continue it with its own values")


def test_one_process_saves_each_replicated_array_whole(tmp_path, monkeypatch):
  """Orbax's default (replica-parallel) save sliced each replicated array once per local
  device, a dispatch and a compile per slice shape: 6.1 s of a 19 s smoke run."""
  mesh = jax.make_mesh((8,), ("data",))
  state = {"w": jax.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8),
                               NamedSharding(mesh, P()))}

  def no_slices(*args, **kwargs):
    raise AssertionError("a replicated array was sliced per replica to be saved")

  monkeypatch.setattr(jax.lax, "slice_in_dim", no_slices)
  saver = checkpoint.Checkpointer(str(tmp_path), every_steps=1, max_to_keep=1)
  saver.save(1, state, {"step": 1})
  saver.close()
  monkeypatch.undo()
  reader = checkpoint.Checkpointer(str(tmp_path), 1, 1)
  restored, meta = reader.restore(state)
  reader.close()
  assert meta == {"step": 1}
  np.testing.assert_array_equal(restored["w"], state["w"])
  assert restored["w"].sharding == state["w"].sharding


def _logged_twice(workdir) -> list[tuple[int, str]]:
  """(step, metric) pairs that metrics.jsonl holds more than once."""
  seen, twice = set(), []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      for key in row.keys() - {"step"}:
        twice += [(row["step"], key)] if (row["step"], key) in seen else []
        seen.add((row["step"], key))
  return twice


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("signum, code, said", [
    (signal.SIGTERM, 143, "a preemption notice (SIGTERM)"), (signal.SIGINT, 130, "Ctrl-C"),
    (signal.SIGUSR2, 140, "a scheduler's notice (USR2)")])
def test_a_stop_request_checkpoints_exits_then_resumes_identically(cli, reference, tmp_path,
                                                                     signum, code, said):
  """SIGTERM (a preemption notice), Ctrl-C (a person's) and USR2 (SLURM's notice ahead of
  the time limit): the step ends, a checkpoint is saved, one line says so (no traceback),
  and the rerun resumes and ends identical to an uninterrupted run, each step logged once.
  The Ctrl-C case fails on 1e4c37a, where SIGINT raised KeyboardInterrupt from inside JAX
  and saved nothing; the USR2 case on 75ab1a7, where USR2 killed the run unsaved."""
  workdir = str(tmp_path)
  proc = cli.start(_args(workdir))
  _wait_for_checkpoint(workdir, proc)
  proc.send_signal(signum)
  _, err = proc.communicate(timeout=300)
  if proc.returncode == 0:
    pytest.skip("the run finished before the signal arrived")  # too fast to catch, not wrong
  assert proc.returncode == code, err[-2000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
  stopped = _steps(workdir)
  assert max(stopped) < STEPS
  assert f"stopped at step {max(stopped)} of {STEPS} on {said}" in err
  log = _run(cli, workdir)
  assert _resumed_step(log) == max(stopped) > 0, log[-2000:]
  _assert_identical(workdir, reference["tiny"])
  assert _logged_twice(workdir) == []


def test_after_a_resume_each_step_is_logged_once(tiny_config, tmp_path):
  """A run killed after a checkpoint had logged steps past it; the resumed run logs them
  again. metrics.jsonl is cut at the checkpoint and TensorBoard purges the events after
  it. Fails on 1e4c37a (steps 4-6 twice in both)."""
  from tensorboard.backend.event_processing import event_accumulator

  tiny_config.train.num_steps, tiny_config.checkpoint.every_steps = 6, 3
  tiny_config.train.log_every_steps = tiny_config.eval.every_steps = 1
  run.train_and_evaluate(tiny_config, str(tmp_path))
  # as if killed right after step 6's logs, before its checkpoint and results were written
  shutil.rmtree(tmp_path / "checkpoints" / "6")
  os.remove(tmp_path / "results.json")
  time.sleep(1.1)  # tensorboardX names event files by the second
  run.train_and_evaluate(tiny_config, str(tmp_path))
  assert _logged_twice(str(tmp_path)) == []
  with open(tmp_path / "metrics.jsonl") as f:
    steps = sorted({json.loads(line)["step"] for line in f})
  assert steps == [1, 2, 3, 4, 5, 6]
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  for tag in ("train/loss", "eval/accuracy"):
    assert [e.step for e in events.Scalars(tag)] == [1, 2, 3, 4, 5, 6], tag


def test_a_rerun_without_a_checkpoint_says_it_starts_from_step_0(tiny_config, tmp_path,
                                                                  caplog):
  tiny_config.train.num_steps = 1
  with caplog.at_level("INFO"):
    run.train_and_evaluate(tiny_config, str(tmp_path))
  assert f"no checkpoint in {tmp_path}: starting from step 0" in caplog.text


def test_the_default_config_checkpoints_every_few_minutes(monkeypatch, tmp_path):
  """By default a kill at any moment loses at most checkpoint.every_minutes of the run."""
  assert config_lib.base_config().checkpoint.every_minutes == 5.0
  now = [1000.0]
  monkeypatch.setattr(checkpoint.time, "monotonic", lambda: now[0])
  saver = checkpoint.Checkpointer(str(tmp_path / "ckpt"), every_steps=0, max_to_keep=10,
                                  every_minutes=5.0)
  due = []
  for step in range(1, 31):
    now[0] += 30.0  # a step every 30 s: a save every 10 steps
    saver.save(step, {"w": np.zeros(2)}, {"step": step})
    due.append(saver.latest_step())
  saver.close()
  assert sorted(set(due) - {None}) == [10, 20, 30]
