"""Where a study's jobs run: here in this process (`--launcher=local`, the default), or on a
SLURM cluster through submitit (`--launcher=slurm`).

A study is a `Plan`: the quiet phase (calibration, pools) first and alone, then one job per
point, in any order or at once, then the report. On SLURM the quiet phase is one job, the
points one job array per device request (each task the devices its point stands for),
and the report one job that runs when every task has ended, however it ended. Each job
calls the sweep's own `main` with the plan's flags: the same resumable code a local study
runs, so a task that starts again reads its finished runs back and resumes the
half-finished one from its checkpoint.

Preemption and the time limit: SLURM sends USR2 `--slurm_signal_s` ahead (`--signal`); the
point's run checkpoints at the end of its step and stops (`checkpoint.PreemptionWatch`),
then submitit requeues the task (`scontrol requeue`) and the requeued task resumes. A
plain SIGTERM (scancel) is a stop, as for a local run: checkpointed, not requeued.

A task is one process on one node: a point of more GPUs than a node holds is refused by
sbatch (and the jobs submitted before it cancelled); the multi-controller study
(`--distributed`) runs such points. tests/test_slurm.py runs a study on a real SLURM.

submitit is imported only when a study is submitted: `--launcher=local` needs nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shlex
import signal
import subprocess

from absl import flags, logging

from ensemble_jax import checkpoint, logs

LAUNCHERS = ("local", "slurm")
INSTALL_HINT = "pip install -e '.[slurm]' (submitit)"
# A sweep's flags that select part of a study's work, or do other work than train it.
WHOLE_STUDY_ONLY = ("points", "quiet_only", "recost", "distributed")


@dataclasses.dataclass(frozen=True)
class Point:
  """One point's job: its name, the sweep's flags that run it alone, the devices it stands
  for, and the files that exist once it has finished (relative to the workdir)."""
  name: str
  argv: tuple[str, ...]
  devices: int
  outputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
  """A study as scheduler jobs: `module`'s main run with `quiet`, each point's and
  `report`'s flags, on `workdir`."""
  module: str
  workdir: str
  quiet: tuple[str, ...]
  points: tuple[Point, ...]
  report: tuple[str, ...]

  def text(self) -> str:
    """One shell command a line, for any scheduler (`--plan`)."""
    def command(argv):
      return shlex.join(("python", "-m", self.module, *argv))

    lines = ["# 1. the quiet phase, one job before the points: calibration (CPU hosts) and pools",
             command(self.quiet),
             "# 2. one job per point, in any order or at once (line i: a SLURM array's task i)"]
    lines += [f"{command(p.argv)}  # {p.devices} device(s)" for p in self.points]
    lines += ["# 3. when every point has finished: table.md and the figures",
              command(self.report)]
    return "\n".join(lines) + "\n"

  def unfinished(self) -> list[str]:
    """The points some of whose outputs are missing."""
    return [p.name for p in self.points
            if not all(os.path.exists(os.path.join(self.workdir, o)) for o in p.outputs)]


def define_flags(flag_values: flags.FlagValues) -> None:
  """`--launcher` and the SLURM requests (`options` reads them back)."""
  def define(kind, name, default, help_text):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=flag_values)

  flags.DEFINE_enum("launcher", "local", LAUNCHERS, "where the study runs: local (this "
                    "process) or slurm (submitit: the quiet phase as one job, the points as a "
                    f"job array, the report after them; {INSTALL_HINT})",
                    flag_values=flag_values)
  define("string", "slurm_partition", "", "--launcher=slurm: the partition ('': the default)")
  define("string", "slurm_account", "", "--launcher=slurm: the account to charge ('': none)")
  define("integer", "slurm_time_min", 240, "--launcher=slurm: each job's time limit, minutes "
         "(a point that reaches it checkpoints and is requeued)")
  define("string", "slurm_gpus", "point", "--launcher=slurm: GPUs per point's task: 'point' "
         "(the devices it stands for), or a number for every task (0: CPU nodes)")
  define("integer", "slurm_cpus", 0, "--launcher=slurm: CPUs per task (0: the cluster's default)")
  define("integer", "slurm_mem_gb", 0, "--launcher=slurm: memory per job, GB (0: the "
         "cluster's default)")
  define("integer", "slurm_signal_s", 120, "--launcher=slurm: seconds before the time limit "
         "that USR2 asks a point to checkpoint and be requeued")
  define("integer", "slurm_parallel", 0, "--launcher=slurm: tasks of the array running at "
         "once (0: all)")
  define("multi_string", "slurm_option", [], "--launcher=slurm: <name>=<value>, any other "
         "sbatch option, e.g. --slurm_option=qos=high --slurm_option=constraint=a100")
  define("string", "slurm_folder", "", "--launcher=slurm: submitit's scripts, pickles and "
         "logs (default <workdir>/slurm)")
  define("bool", "slurm_wait", False, "--launcher=slurm: wait for the report job and print "
         "it (default: print the job ids and return)")


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
  partition: str = ""
  account: str = ""
  time_min: int = 240
  gpus: str = "point"
  cpus: int = 0
  mem_gb: int = 0
  signal_s: int = 120
  parallel: int = 0
  extra: tuple[tuple[str, str], ...] = ()
  folder: str = ""
  wait: bool = False

  def gpus_for(self, devices: int) -> int:
    return devices if self.gpus == "point" else int(self.gpus)


def options(flag_values: flags.FlagValues) -> SlurmOptions:
  """The `--slurm_*` flags, checked: a bad value is one line, exit status 2."""
  f = flag_values
  alone = [f"--{name}" for name in WHOLE_STUDY_ONLY if name in f and f[name].present]
  if alone:
    raise SystemExit(f"error: --launcher=slurm submits the whole study (--curves may narrow "
                     f"it), not with {', '.join(alone)}")
  if f.slurm_gpus != "point" and not f.slurm_gpus.isdigit():
    raise SystemExit(f"error: --slurm_gpus={f.slurm_gpus}: 'point' or a number of GPUs")
  extra = []
  for item in f.slurm_option:
    name, sep, value = item.partition("=")
    if not sep or not name:
      raise SystemExit(f"error: --slurm_option={item}: expected <sbatch option>=<value>")
    extra.append((name, value))
  return SlurmOptions(f.slurm_partition, f.slurm_account, f.slurm_time_min, f.slurm_gpus,
                      f.slurm_cpus, f.slurm_mem_gb, f.slurm_signal_s, f.slurm_parallel,
                      tuple(extra), f.slurm_folder, f.slurm_wait)


class SweepJob:
  """One scheduler job of a plan: `module`'s main with `argv`, in the job's process.

  One stop watch for all its runs (a notice between two runs stops the next after its
  first step, checkpointed). A USR2 stop is handed to the handler submitit installed,
  which requeues the job (`scontrol requeue`) with what `checkpoint` returns: this job
  again, whose runs resume from their checkpoints. Any other stop ends the job."""

  def __init__(self, module: str, argv: tuple[str, ...]):
    self.module, self.argv = module, tuple(argv)

  def _main(self):
    logs.quiet()  # the job's log as a local sweep's: absl's flags at their defaults, INFO
    if not flags.FLAGS.is_parsed():  # absl's flags at their defaults; required ones that a
      flags.FLAGS.mark_as_parsed()  # module imported here declares are not the job's
    logging.use_absl_handler()
    logging.set_verbosity(logging.INFO)
    code = importlib.import_module(self.module).main([self.module, *self.argv])
    if code:
      raise RuntimeError(f"{self.module} {' '.join(self.argv)} exited with status {code}")
    return code

  def __call__(self):
    with contextlib.closing(checkpoint.PreemptionWatch()) as watch:
      try:
        return self._main()
      except checkpoint.Preempted:
        if watch.received != signal.SIGUSR2:
          raise
    requeue = signal.getsignal(signal.SIGUSR2)  # the watch put submitit's back
    if callable(requeue):  # under submitit: checkpoint() below, scontrol requeue, exit
      requeue(signal.SIGUSR2, None)
    raise SystemExit(140)  # not under submitit, or it said why it did not requeue

  def checkpoint(self):
    """What the requeued job runs: this job again."""
    import submitit

    return submitit.helpers.DelayedSubmission(self)


class PointJob(SweepJob):
  """A point's task of the array."""


class ReportJob(SweepJob):
  """The report: table.md and the figures from what finished, and the points that did not
  (printed, and returned)."""

  def __init__(self, module: str, argv: tuple[str, ...], plan: Plan):
    super().__init__(module, argv)
    self.plan = plan

  def _main(self) -> dict:
    try:
      super()._main()
    finally:  # also when nothing finished to report on
      unfinished = self.plan.unfinished()
      if unfinished:
        print(f"not finished ({len(unfinished)} of {len(self.plan.points)} points): "
              + ", ".join(unfinished), flush=True)
    return {"points": len(self.plan.points), "unfinished": unfinished}


@dataclasses.dataclass
class Submitted:
  """The study's jobs: the quiet phase's, the arrays' (one per device request), the
  report's, and where submitit keeps their logs."""
  quiet: object
  arrays: dict[int, list]
  report: object
  folder: str

  def summary(self) -> str:
    arrays = ", ".join(f"{_array_id(jobs)} ({len(jobs)} point(s), {gpus} GPU(s) each)"
                       for gpus, jobs in self.arrays.items())
    return (f"submitted: quiet phase {self.quiet.job_id}; points {arrays}; report "
            f"{self.report.job_id} (after them); logs in {self.folder}")


def _array_id(jobs: list) -> str:
  return jobs[0].job_id.split("_")[0]


def _executor(folder: str):
  try:
    import submitit
  except ImportError:
    raise SystemExit(f"error: --launcher=slurm needs submitit: {INSTALL_HINT}") from None
  try:
    return submitit.AutoExecutor(folder=folder, cluster="slurm")
  except RuntimeError as e:  # no srun: not on a SLURM cluster's login node
    raise SystemExit(f"error: --launcher=slurm: {e}") from None


def submit(plan: Plan, opts: SlurmOptions) -> Submitted:
  """Submits `plan` to SLURM: the quiet phase, the points as arrays after it (afterok;
  a failed quiet phase cancels them), the report after every array (afterany)."""
  folder = os.path.abspath(opts.folder or os.path.join(plan.workdir, "slurm"))
  executor = _executor(folder)
  study = os.path.basename(os.path.normpath(plan.workdir))

  def request(name: str, gpus: int, after: str = "") -> None:
    extra = dict(opts.extra)
    if after:
      extra.update({"dependency": after, "kill-on-invalid-dep": "yes"})
    params = {"name": f"{study}-{name}", "timeout_min": opts.time_min,
              "slurm_signal_delay_s": opts.signal_s, "slurm_additional_parameters": extra,
              "slurm_array_parallelism": opts.parallel or max(len(plan.points), 1)}
    for key, value in (("slurm_partition", opts.partition), ("slurm_account", opts.account),
                       ("cpus_per_task", opts.cpus), ("mem_gb", opts.mem_gb),
                       ("gpus_per_node", gpus)):
      if value:
        params[key] = value
    executor.update_parameters(**params)

  submitted = []  # job ids, cancelled if sbatch refuses a later job (a request no node meets)
  try:
    # The quiet phase builds pools (their proxies train on a device): one of the points' GPUs.
    request("quiet", min(opts.gpus_for(1), 1))
    quiet = executor.submit(SweepJob(plan.module, plan.quiet))
    submitted.append(quiet.job_id)
    arrays = {}
    for gpus in sorted({opts.gpus_for(p.devices) for p in plan.points}):
      points = [p for p in plan.points if opts.gpus_for(p.devices) == gpus]
      request(f"points-{gpus}gpu", gpus, f"afterok:{quiet.job_id}")
      with executor.batch():
        jobs = [executor.submit(PointJob(plan.module, p.argv)) for p in points]
      arrays[gpus] = jobs
      submitted.append(_array_id(jobs))  # the array's id: all its tasks
    after = ":".join(_array_id(jobs) for jobs in arrays.values())
    request("report", 0, f"afterany:{after}" if after else f"afterany:{quiet.job_id}")
    report = executor.submit(ReportJob(plan.module, plan.report, plan))
  except Exception as e:  # submitit's FailedJobError carries sbatch's stderr
    if submitted:
      subprocess.call(["scancel", *submitted])
    said = (str(e).strip().splitlines() or [type(e).__name__])[-1]
    before = f" (the {len(submitted)} submitted before it: cancelled)" if submitted else ""
    raise SystemExit(f"error: --launcher=slurm: a job was refused: {said}{before}") from None
  return Submitted(quiet, arrays, report, folder)


def run_slurm(plan: Plan, opts: SlurmOptions) -> int:
  """`submit`, then (with `opts.wait`) the report job's outcome: its log, exit status 1 if
  some point did not finish."""
  submitted = submit(plan, opts)
  print(submitted.summary(), flush=True)
  if not opts.wait:
    return 0
  result = submitted.report.result()
  print(submitted.report.stdout() or "", end="")
  return 1 if result["unfinished"] else 0

