"""A study is as safe as a run: it refuses a workdir of another study, checks every point
before anything trains, and stops and resumes cleanly (issue 57, items 1-3)."""
import copy
import hashlib
import json
import os
import shutil
import signal
import time

import pytest

from ensemble_jax import config_lib
from experiments.sweeps import cost_vs_time, study
from tests import forked_cli
from tests.conftest import REPO, subprocess_env

pytestmark = pytest.mark.e2e

CONFIG = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
PYDOCS = os.path.join(REPO, "experiments", "configs", "pydocs_gpt2.py")


def _digest(workdir) -> str:
  """Every file under `workdir`, by path and content."""
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(workdir)):
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, workdir).encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def _cli(*args) -> list[str]:
  return ["cost_vs_time", "--compile_cache=", *args]


@pytest.fixture(scope="module")
def one_point_study(tmp_path_factory):
  """The smoke grid's D2 point, tuned and run on seed 0: the first study's workdir."""
  workdir = tmp_path_factory.mktemp("study")
  cost_vs_time.run(CONFIG, str(workdir), seeds=[0], grid="smoke", point_names=["D2"])
  return workdir


@pytest.mark.parametrize("other", [
    ["--set=model.width=8"],  # another --set
    ["--grid=demo"],  # another grid of the same config
    [f"--config={PYDOCS}"],  # another config's grid
])
def test_a_second_study_into_a_workdir_of_another_is_refused_its_records_untouched(
    one_point_study, other, capsys):
  before = _digest(one_point_study)
  config = [a for a in other if a.startswith("--config=")] or [f"--config={CONFIG}"]
  grid = [a for a in other if a.startswith("--grid=")] or ["--grid=smoke"]
  rest = [a for a in other if not a.startswith(("--config=", "--grid="))]
  code = cost_vs_time.main(_cli(*config, *grid, *rest, f"--workdir={one_point_study}",
                                "--seeds=0"))
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2
  assert len(err) == 1 and err[0].startswith(
      f"error: --workdir='{one_point_study}' holds the study of {CONFIG} --grid=smoke with "
      "other values: "), err
  assert "another --workdir, or rerun with --start_over" in err[0]
  if rest:  # what changed, old -> new; only the points' fields: they alone would move
    assert "model.width (at 2 points) 4 -> 8" in err[0] or "model.width 4 -> 8" in err[0]
    assert "those points' records to <point>/superseded/start-over" in err[0]
  else:
    assert f"{one_point_study}.previous (nothing is deleted)" in err[0]
  assert _digest(one_point_study) == before


def test_a_part_of_the_same_study_goes_on(one_point_study):
  """--curves (or --points) runs a part of the study recorded for the whole grid."""
  before = _digest(one_point_study)
  counts = cost_vs_time.run(CONFIG, str(one_point_study), seeds=[0], grid="smoke",
                            curves=["data_parallel"])
  assert counts["read_back"] == 2 and counts["tuning_runs"] == counts["trained"] == 0
  assert _digest(one_point_study) == before


def test_start_over_moves_the_old_study_aside_whole(one_point_study, tmp_path):
  workdir = tmp_path / "w"
  shutil.copytree(one_point_study, workdir)
  before = _digest(workdir)
  held = study.read(str(workdir))
  other = {**held, "grid": "other"}
  study.check_workdir(str(workdir), other, start_over=True)
  assert _digest(tmp_path / "w.previous") == before  # moved, not deleted
  assert sorted(os.listdir(workdir)) == [study.STUDY_FILE]
  assert study.read(str(workdir))["grid"] == "other"


def test_start_over_moves_only_the_points_another_config_trained(one_point_study, tmp_path):
  """A point whose config changed (the grid's data-parallel BatchNorm) starts over alone:
  its records move to <point>/superseded/start-over, kept; the other points, calibrations
  and pools stay; the same command again moves nothing (it resumes)."""
  workdir = tmp_path / "w"
  shutil.copytree(one_point_study, workdir)
  held = study.read(str(workdir))
  point = "data_parallel/D2"
  other = copy.deepcopy(held)
  other["points"][point]["method"]["batchnorm"] = "per_device"
  before = {p: _digest(p) for p in [*workdir.iterdir(), workdir / point] if p.is_dir()}
  with pytest.raises(config_lib.ConfigError, match=r"superseded/start-over"):
    study.check_workdir(str(workdir), other)
  study.check_workdir(str(workdir), other, start_over=True)
  assert sorted(os.listdir(workdir / point)) == ["superseded"]
  assert _digest(workdir / point / "superseded" / "start-over") == before[workdir / point]
  assert all(_digest(p) == d for p, d in before.items() if p.name not in ("data_parallel", "D2"))
  assert study.read(str(workdir))["points"][point]["method"]["batchnorm"] == "per_device"
  study.check_workdir(str(workdir), other, start_over=True)  # nothing more to move
  assert sorted(os.listdir(workdir / point / "superseded")) == ["start-over"]


def test_a_workdir_from_before_the_record_is_adopted_only_if_its_runs_are_this_studys(
    one_point_study, tmp_path):
  legacy = tmp_path / "legacy"
  shutil.copytree(one_point_study, legacy)
  record = (legacy / study.STUDY_FILE).read_text()
  (legacy / study.STUDY_FILE).unlink()
  counts = cost_vs_time.run(CONFIG, str(legacy), seeds=[0], grid="smoke", point_names=["D2"])
  assert counts["read_back"] == 2 and counts["tuning_runs"] == counts["trained"] == 0
  adopted = json.loads((legacy / study.STUDY_FILE).read_text())
  assert adopted.keys() == json.loads(record).keys()
  assert study.differences(json.loads(record), adopted) == {}
  # A run trained with another config than its point's: not adopted, named.
  (legacy / study.STUDY_FILE).unlink()
  run = next((legacy / "data_parallel" / "D2" / "tune").iterdir()) / "results.json"
  results = json.loads(run.read_text())
  results["config"]["model"]["width"] = 16
  run.write_text(json.dumps(results))
  before = _digest(legacy)
  with pytest.raises(cost_vs_time.config_lib.ConfigError,
                     match=r"runs of another study .*D2/tune/lr[0-9.]+: model.width 16 -> 4"):
    cost_vs_time.run(CONFIG, str(legacy), seeds=[0], grid="smoke", point_names=["D2"])
  assert _digest(legacy) == before


BAD_GRID = """
from experiments.configs import fashion_mnist

get_config = fashion_mnist.get_config


def sweep_grid(name):
  tune = {"tune.factors": (1.0, 2.0), "tune.max_extensions": 0}
  return {"data_parallel": {"D2": ("tiny", {"train.batch_size": 64, "cost.devices": 2, **tune}),
                            "D8": ("tiny", {"train.batch_size": 64, "eval.batch_size": 100,
                                            **tune})},
          "ensemble": {"N8_L4": ("ensemble,smok", tune)}}
"""


def test_a_grid_with_bad_points_fails_before_anything_one_line_each(tmp_path, capsys):
  config = tmp_path / "bad.py"
  config.write_text(BAD_GRID)
  workdir = tmp_path / "w"
  start = time.monotonic()
  assert cost_vs_time.main(_cli(f"--config={config}", "--grid=smoke", f"--workdir={workdir}",
                                "--seeds=1")) == 2
  assert time.monotonic() - start < 30
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
      "error: data_parallel/D8: config.eval.batch_size=100 is not divisible by the mesh's data "
      "axis=8; choose a multiple of 8.",
      "error: ensemble/N8_L4: unknown variant(s) 'smok' (did you mean 'smoke'?) of "
      "fashion_mnist.py; choose from "
      "['diloco', 'ensemble', 'smoke', 'sweep', 'tiny']"], err
  assert not workdir.exists()  # nothing calibrated, trained or recorded
  # Data that is not there: one line for the points that share the message.
  assert cost_vs_time.main(_cli(f"--config={CONFIG}", "--grid=smoke", f"--workdir={workdir}",
                                "--seeds=1", f"--set=data.data_dir={tmp_path / 'none'}")) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(
      "error: data_parallel/D2, ensemble/N8_L4: dataset 'fashion_mnist' not found"), err
  assert not workdir.exists()


LONG_GRID = """
from experiments.configs import fashion_mnist

get_config = fashion_mnist.get_config


def sweep_grid(name):  # one point, one rate, 40 steps that never reach the target
  return {"data_parallel": {"D1": ("tiny", {
      "train.num_steps": 40, "train.log_every_steps": 1, "eval.every_steps": 20,
      "eval.target_value": 0.99, "checkpoint.every_steps": 0, "tune.factors": (1.0,),
      "tune.max_extensions": 0})}}
"""


# What `python -m experiments.sweeps.cost_vs_time` imports before it parses a flag (its
# own imports): the test's three commands run in forks of one process that imported them
# (tests/forked_cli.py), each its own process, signalled by its pid.
STUDY_PRELOAD = ("jax", "absl.flags", "absl.logging", "ml_collections",
                 "ensemble_jax.checkpoint", "ensemble_jax.config_lib", "ensemble_jax.costs",
                 "ensemble_jax.distributed", "ensemble_jax.methods", "ensemble_jax.record",
                 "ensemble_jax.report", "ensemble_jax.resume", "ensemble_jax.sharding",
                 "ensemble_jax.stored", "ensemble_jax.train", "ensemble_jax.run",
                 "ensemble_jax.distill.pools", "ensemble_jax.distill.registry",
                 "experiments.cli", "experiments.sweeps", "experiments.sweeps.launcher",
                 "experiments.sweeps.study", "experiments.sweeps.tuning")


def _stop_when(forks, args, path_glob, signum, timeout_s=240):
  """Runs `args` (a fork of `forks`) until `path_glob` matches (a run's directory: the
  run is setting up, its first step to come), then sends `signum`; (exit status, stdout,
  stderr)."""
  import glob

  proc = forks.start(args)
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline and proc.poll() is None:
    if glob.glob(path_glob):
      proc.send_signal(signum)
      break
    time.sleep(0.05)
  out, err = proc.communicate(timeout=timeout_s)
  return proc.returncode, out, err


def _line(text: str, prefix: str) -> str:
  return next(line for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.subprocess
def test_a_study_stopped_by_ctrl_c_or_sigterm_says_where_and_resumes_with_true_counts(
    tmp_path):
  config = tmp_path / "long.py"
  config.write_text(LONG_GRID)
  workdir = tmp_path / "w"
  args = [f"--config={config}", "--grid=smoke", f"--workdir={workdir}", "--seeds=1",
          "--compile_cache="]
  point = workdir / "data_parallel" / "D1"
  with forked_cli.Forks("experiments.sweeps.cost_vs_time", subprocess_env(1, PYTHONPATH=REPO),
                        preload=STUDY_PRELOAD) as forks:
    # Ctrl-C as the tuning run sets up: it checkpoints after its first step, and says so.
    code, out, err = _stop_when(forks, args, str(point / "tune" / "*"), signal.SIGINT)
    assert code == 130, err[-3000:]
    stop = _line(err, "study: stopped at step ")
    assert "on Ctrl-C; checkpoint saved in" in stop and "/tune/lr" in stop, stop
    assert f"Kept in {workdir}: 0 finished runs and 1 checkpointed part-way" in stop
    assert "Traceback" not in err
    # SIGTERM in the seed run: the rerun resumed the tuning run and said so.
    code, out, err = _stop_when(forks, args, str(point / "seed1"), signal.SIGTERM)
    assert code == 143, err[-3000:]
    first = _line(out, "study: 1 points in")
    assert ("it holds 0 finished runs and 1 checkpointed part-way (data_parallel/D1/tune/lr"
            in first)
    stop = _line(err, "study: stopped at step ")
    assert "on a preemption notice (SIGTERM)" in stop and "/seed1/checkpoints" in stop, stop
    # 2 finished: the tuning run and seed 0 (the tuning run, copied); seed 1 part-way.
    assert f"Kept in {workdir}: 2 finished runs and 1 checkpointed part-way" in stop, stop
    # The rerun finishes: it reads back what it kept and resumes seed 1, counted as such.
    done = forks.run(args, timeout_s=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "it holds 2 finished runs and 1 checkpointed part-way (data_parallel/D1/seed1 at " \
        "step" in _line(done.stdout, "study: 1 points in")
    assert _line(done.stdout, "study: 0 tuning runs") == (
        "study: 0 tuning runs and 1 seed runs trained (1 of them resumed from a checkpoint, 0 "
        "diverged), 0 seed runs taken from tuning; read back: 1 finished tuning runs and 1 "
        "finished seed runs")
  seed1 = json.loads((point / "seed1" / "results.json").read_text())
  assert seed1["steps"] == 40
