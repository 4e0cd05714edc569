"""Runs `python -m <module> ARGS...` commands as forks of one child process of a test: the
module's imports are paid once, then each command runs in a fork of that process, as the
module's `__main__`, with its own pid, stdout, stderr and exit status.

A CLI test that starts one `python -m ensemble_jax.main` per case pays JAX's and the
package's imports each time (~5 s of CPU, most of a failing command's run). A fork of a
process that has only imported (no JAX backend, no thread) is a fresh interpreter in all
that a command sees: its flags are defined and parsed in the fork, its backend starts
there (with the environment the process was started with: device count, XLA flags, compile
cache), signals sent to its pid reach it alone, and it exits through the interpreter as
`python -m` would (atexit handlers, a non-int exit code printed, an uncaught exception's
traceback on stderr and status 1).

From a test:
  with Forks(module, env) as forks:
    proc = forks.run(args, timeout_s)  # a subprocess.CompletedProcess
    fork = forks.start(args)           # like subprocess.Popen: pid, poll, wait,
                                       # send_signal, communicate, returncode
or run_commands(module, [args, ...], env, timeout_s) -> [CompletedProcess, ...].

`start` and `run` take an `env` of the command's own: the fork's environment, set before
the command runs. What the preload read at import stays as the process was started (JAX's
JAX_* options), so pass one that differs in what a command reads later alone, e.g.
XLA_FLAGS' device count (read when the fork starts its backend): one process then serves
commands on 1, 2 and 8 devices.
"""
import importlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# What `python -m ensemble_jax.main` imports before it parses a flag (its own imports).
PRELOAD = ("jax", "absl.app", "absl.flags", "ml_collections.config_flags",
           "ensemble_jax.checkpoint", "ensemble_jax.config_lib", "ensemble_jax.distributed",
           "ensemble_jax.logs", "ensemble_jax.sharding", "ensemble_jax.validation",
           "ensemble_jax.run", "ensemble_jax.data.fetch")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Fork:
  """One command running in a fork (the subset of subprocess.Popen the tests use)."""

  def __init__(self, forks: "Forks", args: list[str], pid: int, out: str, err: str):
    self.args, self.pid, self.returncode = args, pid, None
    self._forks, self._out, self._err = forks, out, err

  def poll(self):
    if self.returncode is None:
      self.returncode = self._forks._ask({"op": "poll", "pid": self.pid})["returncode"]
    return self.returncode

  def wait(self, timeout=None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() > deadline:
        self.send_signal(signal.SIGKILL)
        while self.poll() is None:
          time.sleep(0.01)
        raise subprocess.TimeoutExpired(self.args, timeout)
      time.sleep(0.02)
    return self.returncode

  def send_signal(self, signum):
    if self.returncode is None:
      os.kill(self.pid, signum)

  def communicate(self, timeout=None):
    self.wait(timeout)
    return self.output()

  def output(self) -> tuple[str, str]:
    """(stdout, stderr) as written so far."""
    texts = []
    for path in (self._out, self._err):
      with open(path, "rb") as f:
        texts.append(f.read().decode(errors="replace"))
    return texts[0], texts[1]


class Forks:
  """A child process that imported `preload` with `env`; `start` and `run` fork it."""

  def __init__(self, module: str, env: dict, cwd: str = REPO,
               preload: tuple[str, ...] = PRELOAD):
    self.module = module
    self._dir = tempfile.mkdtemp(prefix="forked_cli_")
    self._count = 0
    with open(os.path.join(self._dir, "server.log"), "w") as log:
      self._proc = subprocess.Popen([sys.executable, "-m", "tests.forked_cli"], cwd=cwd,
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, text=True)
    self._ask({"module": module, "preload": list(preload)})

  def _ask(self, request: dict) -> dict:
    self._proc.stdin.write(json.dumps(request) + "\n")
    self._proc.stdin.flush()
    line = self._proc.stdout.readline()
    if not line:
      with open(os.path.join(self._dir, "server.log")) as f:
        raise AssertionError(f"tests/forked_cli.py exited: {f.read()[-3000:]}")
    return json.loads(line)

  def start(self, args: list[str], env: dict | None = None) -> Fork:
    self._count += 1
    out, err = (os.path.join(self._dir, f"{self._count}.{name}") for name in ("out", "err"))
    pid = self._ask({"op": "start", "args": list(args), "stdout": out, "stderr": err,
                     "env": None if env is None else dict(env)})["pid"]
    return Fork(self, [sys.executable, "-m", self.module, *args], pid, out, err)

  def run(self, args: list[str], timeout_s: float,
          env: dict | None = None) -> subprocess.CompletedProcess:
    fork = self.start(args, env)
    out, err = fork.communicate(timeout_s)
    return subprocess.CompletedProcess(fork.args, fork.returncode, out, err)

  def close(self) -> None:
    self._proc.stdin.close()  # the server kills what still runs, then exits
    self._proc.wait(timeout=60)
    self._proc.stdout.close()
    shutil.rmtree(self._dir, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def run_commands(module: str, commands: list[list[str]], env: dict, timeout_s: float,
                 cwd: str = REPO) -> list[subprocess.CompletedProcess]:
  """Each of `commands` (the arguments after `python -m module`) run to its end, one after
  another, in forks of one process."""
  with Forks(module, env, cwd) as forks:
    return [forks.run(args, timeout_s) for args in commands]


# The server: this module run as `python -m tests.forked_cli`, spoken to in JSON lines.

def _reply(message: dict) -> None:
  sys.stdout.write(json.dumps(message) + "\n")
  sys.stdout.flush()


def _start(module: str, args: list[str], out: str, err: str, env: dict | None) -> int:
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid:
    return pid
  # The fork: the command, which never returns here: it exits as `python -m` would.
  if env is not None:
    os.environ.clear()
    os.environ.update(env)
  for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                          (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                          (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)
  sys.argv = [module, *args]  # run_module sets argv[0] to the module's file
  runpy.run_module(module, run_name="__main__", alter_sys=True)
  sys.exit(0)


def _serve() -> None:
  spec = json.loads(sys.stdin.readline())
  for name in spec["preload"]:
    importlib.import_module(name)
  _reply({"ready": True})
  running = set()
  for line in iter(sys.stdin.readline, ""):
    request = json.loads(line)
    if request["op"] == "start":
      pid = _start(spec["module"], request["args"], request["stdout"], request["stderr"],
                   request.get("env"))
      running.add(pid)
      _reply({"pid": pid})
    elif request["op"] == "poll":
      pid, status = os.waitpid(request["pid"], os.WNOHANG)
      code = os.waitstatus_to_exitcode(status) if pid else None
      if pid:
        running.discard(pid)
      _reply({"returncode": code})
  for pid in running:  # the test is done with them
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


if __name__ == "__main__":
  _serve()
