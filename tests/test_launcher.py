"""The SLURM launcher without a cluster: what it asks of submitit, and a point's USR2 stop
handed to submitit's requeue (tests/test_slurm.py runs both on a real SLURM)."""
import contextlib
import os
import signal
import subprocess
import sys

import pytest

from ensemble_jax import checkpoint
from experiments.sweeps import cost_vs_time, launcher
from tests.conftest import REPO, subprocess_env

CONFIG = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")


class _Job:
  def __init__(self, job_id):
    self.job_id = job_id


class _Executor:
  """submitit's AutoExecutor as the launcher uses it: parameters, submit, batch (an array)."""

  def __init__(self):
    self.params, self.submitted, self._batch, self._next = {}, [], None, 1

  def update_parameters(self, **params):
    self.params = params

  def submit(self, fn):
    if self._batch is not None:
      self._batch.append(fn)
      return _Job(f"{self._next}_{len(self._batch) - 1}")
    self.submitted.append((fn, dict(self.params), False))
    self._next += 1
    return _Job(str(self._next - 1))

  @contextlib.contextmanager
  def batch(self):
    self._batch = []
    yield
    self.submitted += [(fn, dict(self.params), True) for fn in self._batch]
    self._batch = None
    self._next += 1

pytestmark = pytest.mark.unit


def test_the_study_is_a_quiet_job_arrays_per_device_request_and_a_report_after(monkeypatch):
  executor = _Executor()
  monkeypatch.setattr(launcher, "_executor", lambda folder: executor)
  plan = cost_vs_time.jobs(CONFIG, "/w/study", [0, 1], "smoke")
  opts = launcher.SlurmOptions(partition="gpu", account="lab", time_min=90, cpus=4,
                               mem_gb=32, signal_s=300, extra=(("qos", "high"),))
  submitted = launcher.submit(plan, opts)
  (quiet, q), *points, (report, r) = [(fn, p) for fn, p, _ in executor.submitted]
  assert quiet.argv[-1] == "--quiet_only" and q["gpus_per_node"] == 1
  assert "dependency" not in q["slurm_additional_parameters"]
  # One array per device request: D2's task asks for 2 GPUs, N8_L4's for 8.
  assert {p["name"]: (fn.argv[-3:], p["gpus_per_node"]) for fn, p in points} == {
      "study-points-2gpu": (("--curves=data_parallel", "--points=D2", "--noreport"), 2),
      "study-points-8gpu": (("--curves=ensemble", "--points=N8_L4", "--noreport"), 8)}
  assert all(isinstance(fn, launcher.PointJob) for fn, _ in points)
  for _, p in points:
    assert p["slurm_additional_parameters"] == {
        "qos": "high", "dependency": "afterok:1", "kill-on-invalid-dep": "yes"}
    assert (p["slurm_partition"], p["slurm_account"], p["timeout_min"], p["cpus_per_task"],
            p["mem_gb"], p["slurm_signal_delay_s"]) == ("gpu", "lab", 90, 4, 32, 300)
  assert report.argv[-1] == "--report_only" and "gpus_per_node" not in r
  assert r["slurm_additional_parameters"]["dependency"] == "afterany:2:3"
  assert sorted(submitted.arrays) == [2, 8] and submitted.folder == "/w/study/slurm"
  assert report.plan.unfinished() == ["data_parallel/D2", "ensemble/N8_L4"]


STOP_SIGNAL = signal.SIGUSR2


def test_a_job_sbatch_refuses_cancels_those_submitted_before_it(monkeypatch):
  executor, cancelled = _Executor(), []
  refuse = executor.submit

  def submit(fn):
    if executor.params.get("gpus_per_node") == 8:
      raise RuntimeError("sbatch: error: Requested node configuration is not available")
    return refuse(fn)

  monkeypatch.setattr(executor, "submit", submit)
  monkeypatch.setattr(launcher, "_executor", lambda folder: executor)
  monkeypatch.setattr(launcher.subprocess, "call", cancelled.append)
  with pytest.raises(SystemExit, match=r"refused: sbatch: error: Requested node configuration "
                     r"is not available \(the 2 submitted before it: cancelled\)"):
    launcher.submit(cost_vs_time.jobs(CONFIG, "/w/study", [0], "smoke"),
                    launcher.SlurmOptions())
  assert cancelled == [["scancel", "1", "2"]]  # the quiet phase and the 2-GPU array


def main(argv):
  """A sweep whose run gets STOP_SIGNAL mid-run (PointJob calls it: the test below)."""
  del argv
  os.kill(os.getpid(), STOP_SIGNAL)
  watch = checkpoint.PreemptionWatch.active
  assert watch.requested(3)
  raise watch.stop(3, 10, "/w")


def test_a_usr2_stop_is_handed_to_submitits_requeue_and_other_stops_are_not(monkeypatch):
  """The watch stops the run on USR2 (checkpointed at the end of the step), then the
  handler submitit installed is called (it requeues with `checkpoint()` and exits); a
  SIGTERM stop propagates as a local one does. In a process that imported
  ensemble_jax.main (its required --config and --workdir on absl's global flags), as the
  test suite's workers do: parsing the job's argv there failed the job."""
  import ensemble_jax.main  # noqa: F401

  calls = []

  def submitits(signum, frame):
    calls.append(signum)
    raise SystemExit(-1)

  previous = signal.signal(signal.SIGUSR2, submitits)
  try:
    with pytest.raises(SystemExit) as stop:
      launcher.PointJob(__name__, ())()
    assert stop.value.code == -1 and calls == [signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR2) is submitits  # the watch put it back
    monkeypatch.setattr(sys.modules[__name__], "STOP_SIGNAL", signal.SIGTERM)
    with pytest.raises(checkpoint.Preempted) as stop:
      launcher.PointJob(__name__, ())()
    assert stop.value.code == 143 and calls == [signal.SIGUSR2]
  finally:
    signal.signal(signal.SIGUSR2, previous)


@pytest.mark.subprocess
def test_a_local_study_does_not_import_submitit():
  code = ("import sys; from experiments.sweeps import cost_vs_time; "
          "assert 'submitit' not in sys.modules, 'submitit imported'")
  subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(1), check=True)
