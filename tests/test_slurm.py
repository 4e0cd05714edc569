"""The study on a real SLURM cluster (tests/slurm_cluster.py: this host as one node):
submitted through `--launcher=slurm`, preempted mid-point, requeued, resumed, and equal to
the local study but for timings; submitted again, it retrains nothing. A user's plugin
named only in the workload's config.plugins is imported by the tasks that need it."""
import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest

from experiments.sweeps import cost_vs_time, launcher
from tests.conftest import REPO, subprocess_env
from tests.slurm_cluster import Cluster, Unavailable
from tests.test_plugins import PLUGIN, USER_WORKLOAD
from tests.test_sweep import _close, _records

pytestmark = pytest.mark.slurm

CONFIG = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
# The smoke grid, its data-parallel point long enough to be signalled mid-run (60 steps,
# a checkpoint every 3; a target it cannot reach, so that it runs them all); the ensemble's
# point stays 4 steps.
SETTINGS = {"train.num_steps": 60, "checkpoint.every_steps": 3, "eval.every_steps": 30,
            "eval.target_value": 0.99}
OPTIONS = launcher.SlurmOptions(gpus="0", cpus=1, time_min=10)  # CPU nodes, 2 tasks at once
DEADLINE_S = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  try:
    c = Cluster.start(str(tmp_path_factory.mktemp("slurm")))
  except Unavailable as e:
    pytest.skip(f"SLURM cannot start here: {e}")
  yield c
  c.stop()


def _logs(folder: str) -> str:
  """The tails of every job's log, to say why a check failed."""
  return "\n".join(f"--- {p}\n" + open(p).read()[-2000:]
                   for p in sorted(glob.glob(os.path.join(folder, "*_log.*"))))


def _wait(what: str, ready, folder: str) -> None:
  deadline = time.monotonic() + DEADLINE_S
  while not ready():
    if time.monotonic() > deadline:
      pytest.fail(f"no {what} within {DEADLINE_S} s:\n{_logs(folder)}")
    time.sleep(0.1)


def _checkpointed(run_dir: str) -> bool:
  steps = glob.glob(os.path.join(run_dir, "checkpoints", "[0-9]*"))
  return any(0 < int(os.path.basename(s)) < SETTINGS["train.num_steps"] for s in steps
             if os.path.basename(s).isdigit())


def _results_times(workdir) -> dict[str, float]:
  return {p: os.path.getmtime(p)
          for p in glob.glob(os.path.join(workdir, "**", "results.json"), recursive=True)}


def test_a_study_preempted_on_slurm_resumes_and_ends_as_the_local_one(cluster, tmp_path,
                                                                       monkeypatch):
  """Quiet phase, array, report; the data-parallel point's task gets SLURM's USR2 in its
  second tuning run (as `--signal` sends it ahead of the time limit): that run checkpoints
  and stops, submitit requeues the task, which reads the first run back (not retrained)
  and resumes the second from its checkpoint. The records equal the local study's."""
  monkeypatch.setenv("SLURM_CONF", cluster.conf)
  local = str(tmp_path / "local")
  cost_vs_time.run(CONFIG, local, seeds=[0], grid="smoke", settings=SETTINGS,
                   write_report=False)
  workdir = str(tmp_path / "slurm")
  plan = cost_vs_time.jobs(CONFIG, workdir, [0], "smoke", settings=SETTINGS)
  submitted = launcher.submit(plan, OPTIONS)
  folder = submitted.folder
  (task,) = [job for point, job in zip(plan.points, submitted.arrays[0])
             if point.name == "data_parallel/D2"]
  tune_dir = os.path.join(workdir, "data_parallel", "D2", "tune")
  first, second = (os.path.join(tune_dir, f"lr{lr}") for lr in ("0.003", "0.006"))
  _wait("second tuning run's checkpoint", lambda: _checkpointed(second), folder)
  finished_at = os.path.getmtime(os.path.join(first, "results.json"))
  cluster.run("scancel", "--signal=USR2", task.job_id)
  _wait("report", submitted.report.done, folder)

  assert submitted.report.result() == {"points": 2, "unfinished": []}, _logs(folder)
  log = task.stderr()
  steps = SETTINGS["train.num_steps"]
  stop = re.search(rf"stopped at step (\d+) of {steps} on a scheduler's notice \(USR2\)", log)
  assert stop, _logs(folder)
  assert "Requeued job" in log, _logs(folder)
  assert f"Resumed from step {stop.group(1)} in {second}" in log, _logs(folder)
  assert os.path.getmtime(os.path.join(first, "results.json")) == finished_at
  assert os.path.exists(os.path.join(workdir, "table.md"))
  got, want = _records(workdir), _records(local)
  assert got.keys() == want.keys() and any("seed0" in k for k in got)
  _close(got, want)

  # Submitted again (the command line, waiting for the report): every run is read back.
  before = _results_times(workdir)
  assert cost_vs_time.main([
      "cost_vs_time", f"--config={CONFIG}", f"--workdir={workdir}", "--grid=smoke",
      "--seeds=0", *(f"--set={k}={v}" for k, v in SETTINGS.items()), "--launcher=slurm",
      "--slurm_gpus=0", "--slurm_cpus=1", "--slurm_time_min=10", "--slurm_wait"]) == 0
  assert _results_times(workdir) == before


def test_a_plugin_named_only_in_the_config_is_imported_by_the_slurm_tasks(cluster, tmp_path):
  """A user's workload file names a plugin file (a mode) in config.plugins; the study,
  submitted from the command line, runs its point as a SLURM task (16 workers on the
  task's 8 devices): the task imports the plugin, evaluates its mode, and the cost model's
  child in the task compiles the 16-device programs with it."""
  plugin, mode = tmp_path / "slurm_user_modes.py", "slurm_plugin_last_worker"
  plugin.write_text(PLUGIN.format(name=mode))
  workload = tmp_path / "my_workload.py"
  workload.write_text(USER_WORKLOAD.format(plugin=str(plugin), mode=mode))
  workdir = tmp_path / "study"
  done = subprocess.run(
      [sys.executable, "-m", "experiments.sweeps.cost_vs_time", f"--config={workload}",
       f"--workdir={workdir}", "--grid=mine", "--seeds=0", "--launcher=slurm",
       "--slurm_gpus=0", "--slurm_cpus=1", "--slurm_time_min=10", "--slurm_wait"],
      cwd=REPO, env=subprocess_env(8, SLURM_CONF=cluster.conf), capture_output=True,
      text=True, timeout=DEADLINE_S)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + _logs(
      str(workdir / "slurm"))
  with open(workdir / "ensemble" / "N16" / "seed0" / "results.json") as f:
    results = json.load(f)
  assert results["config"]["plugins"] == str(plugin)
  assert mode in results["ensemble"]  # the task evaluated the plugin's mode
  modelled = results["cost"]["modelled"]
  assert modelled["devices"] == 16 and modelled["collectives"]
  assert modelled["collectives_source"].startswith("compiled HLO"), modelled
  assert "child process" in modelled["collectives_source"]
  assert (workdir / "table.md").exists()
