"""A one-node SLURM cluster on this host for the tests: Debian's slurm-wlm and munge.

`Cluster.start(root)` installs the packages if missing (as root, apt-get), writes a
slurm.conf for localhost under `root`, starts munged, slurmctld and slurmd in the
foreground as child processes on their own state, spool and socket (free ports, nothing
under /etc or /run is used), and `stop()` cancels the cluster's jobs and ends exactly
those three processes. It raises `Unavailable` with one line where it cannot start.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT_S = 60


class Unavailable(Exception):
  """SLURM cannot start here; the message says why, in one line."""


def install() -> None:
  """Debian's slurm-wlm and munge, with apt-get, where a daemon is missing (root only)."""
  if all(shutil.which(d) for d in DAEMONS):
    return
  if os.geteuid() != 0:
    raise Unavailable(f"{', '.join(PACKAGES)} not installed and not root to install them")
  if not shutil.which("apt-get"):
    raise Unavailable(f"{', '.join(PACKAGES)} not installed and no apt-get to install them")
  env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
  for command in (["apt-get", "update", "-qq"],
                  ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
      tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
      raise Unavailable(f"{' '.join(command[:2])} failed: {tail[0]}")
  if not all(shutil.which(d) for d in DAEMONS):
    raise Unavailable(f"{', '.join(PACKAGES)} installed but {DAEMONS} not all on PATH")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


class Cluster:
  """A running one-node cluster; `env` (SLURM_CONF) is what its clients need."""

  def __init__(self, root: str):
    self.root = root
    self.conf = os.path.join(root, "slurm.conf")
    self.node = socket.gethostname().split(".")[0]
    self.env = {**os.environ, "SLURM_CONF": self.conf}
    self.procs: dict[str, subprocess.Popen] = {}

  @classmethod
  def start(cls, root: str, cpus: int = 2) -> "Cluster":
    if os.geteuid() != 0:
      raise Unavailable("not root: slurmd and munged must run as root here")
    install()
    cluster = cls(root)
    try:
      cluster._start(cpus)
    except BaseException:
      cluster.stop()
      raise
    return cluster

  def _start(self, cpus: int) -> None:
    for name in ("state", "spool", "munge"):
      os.makedirs(os.path.join(self.root, name), exist_ok=True)
    os.chmod(os.path.join(self.root, "munge"), 0o700)
    key = os.path.join(self.root, "munge", "munge.key")
    with open(key, "wb") as f:
      f.write(os.urandom(128))
    os.chmod(key, 0o600)
    munge_socket = os.path.join(self.root, "munge", "munge.socket")
    with open(self.conf, "w") as f:
      f.write(self._conf_text(cpus, munge_socket))
    self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={munge_socket}",
                           f"--key-file={key}",
                           f"--pid-file={self.root}/munge/munged.pid",
                           f"--log-file={self.root}/munge/munged.log",
                           f"--seed-file={self.root}/munge/munged.seed"])
    self._wait(lambda: os.path.exists(munge_socket), "munged's socket")
    self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
    self._spawn("slurmd", ["slurmd", "-D", "-f", self.conf, "-N", self.node])
    self._wait(self._node_idle, f"node {self.node} idle")

  def _conf_text(self, cpus: int, munge_socket: str) -> str:
    r = self.root
    return "\n".join([
        "ClusterName=ejtest", f"SlurmctldHost={self.node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", # A requeued job waits cred_expire seconds (120 by default) before it may start
        # again, and a pending job the next scheduling pass (every 60 s by default).
        f"AuthInfo=socket={munge_socket},cred_expire=5", "SchedulerParameters=sched_interval=1",
        f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool",
        f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.pid",
        f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "MinJobAge=300", "KillWait=30",
        f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ""])

  def _spawn(self, name: str, command: list[str]) -> None:
    log = open(os.path.join(self.root, f"{name}.out"), "w")
    self.procs[name] = subprocess.Popen(command, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
    log.close()

  def _wait(self, ready, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
      dead = [n for n, p in self.procs.items() if p.poll() is not None]
      if dead:
        raise Unavailable(f"{dead[0]} exited at start ({self._tail(dead[0])})")
      if ready():
        return
      time.sleep(0.2)
    raise Unavailable(f"SLURM did not start within {START_TIMEOUT_S} s: no {what}")

  def _tail(self, name: str) -> str:
    for path in (os.path.join(self.root, f"{name}.log"), os.path.join(self.root, f"{name}.out"),
                 os.path.join(self.root, "munge", f"{name}.log")):
      if os.path.exists(path):
        with open(path) as f:
          lines = f.read().strip().splitlines()
        if lines:
          return lines[-1]
    return "no log"

  def _node_idle(self) -> bool:
    out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False)
    return out.strip() == "idle"

  def run(self, *command: str, check: bool = True) -> str:
    """A SLURM client command against this cluster: its stdout."""
    done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
    if check and done.returncode:
      raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout

  def jobs(self) -> list[str]:
    """The cluster's jobs not yet ended, as squeue lists them ('<id> <state>')."""
    return self.run("squeue", "-h", "-o", "%i %T", check=False).strip().splitlines()

  def stop(self) -> None:
    """Cancels every job, waits for their steps to end, then ends the three daemons."""
    if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
      self.run("scancel", "--full", "-u", "root", check=False)
      deadline = time.monotonic() + 60
      while self.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in reversed(DAEMONS):
      proc = self.procs.get(name)
      if proc is None or proc.poll() is not None:
        continue
      proc.terminate()
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
