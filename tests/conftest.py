"""Eight fake CPU devices, set before JAX is imported anywhere in the test process."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite is compile-bound (a few steps of tiny models): XLA:CPU's cheaper code generation
# cuts a smoke run's CPU time by ~40% (measured: 18.7 s vs 31.3 s user for a 24-step run
# from a cold compile cache). It changes the machine code, not the HLO the tests inspect;
# results move in the 8th digit (the golden values hold at 1e-6). Child processes get the
# same flags through `subprocess_env`. XLA:CPU's older fusion emitters and one codegen
# thread (the two test workers already fill the two cores) compile faster again: measured
# beside other jobs, tests/test_ensemble.py 56.7 -> 39.4 s of CPU, a 4-step tiny run
# 9.8-11.3 -> 5.3-7.0 s from a cold compile cache, the golden values as close as before.
COMPILE_LIGHT_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                       " --xla_cpu_use_fusion_emitters=false"
                       " --xla_cpu_parallel_codegen_split_count=1")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {COMPILE_LIGHT_FLAGS}"
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def tiny_config():
  from experiments.configs import fashion_mnist

  return fashion_mnist.get_config("tiny")


# Identical programs recur across tests (the smoke model in several methods and runs):
# a persistent compilation cache turns their repeat compiles into cache reads, every one
# of them (tests/test_resume.py from a cold cache: 157 s of CPU with programs over 0.5 s
# cached, 145 s with all).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".pytest_cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def subprocess_env(devices: int, **extra: str) -> dict:
  """The environment of a test's child process: this one's, the compile-light flags, and
  `devices` fake CPU devices (the only device-count flag, so a failure message is plain)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags.append(f"--xla_force_host_platform_device_count={devices}")
  return {**os.environ, "XLA_FLAGS": " ".join(flags), **extra}


def tiny_ensemble(**fields):
  """Fashion-MNIST's tiny ensemble, 4 workers on a worker:4,data:2 mesh, with `fields`
  ({dotted name: value}) set."""
  from ensemble_jax import config_lib
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.method.num_workers, c.mesh = 4, "worker:4,data:2"
  for name, value in fields.items():
    config_lib.set_dotted(c, name, value)
  return c


def makefile_recipe(target: str) -> str:
  """The recipe of the Makefile's `target`, as written: the lines after its rule up to the
  next blank line, continuation lines joined."""
  with open(os.path.join(REPO, "Makefile")) as f:
    text = f.read().replace("\\\n", " ")
  rule = text[text.index(f"\n{target}:") + 1:]
  return rule[rule.index("\n") + 1:].split("\n\n", 1)[0]


def untimed(tree):
  """A results tree without its host timings (keys ending in time_s or steps_per_s), which
  differ run to run: what two runs of one config must agree on."""
  if isinstance(tree, dict):
    return {k: untimed(v) for k, v in tree.items()
            if not str(k).endswith(("time_s", "steps_per_s"))}
  return [untimed(v) for v in tree] if isinstance(tree, list) else tree


def documented_results_fields() -> set[str]:
  """The top-level results.json fields docs/results_json.md's table documents (its first
  column)."""
  import re

  with open(os.path.join(REPO, "docs", "results_json.md")) as f:
    text = f.read()
  section = text[text.index("## results.json"):]
  section = section[:section.index("\n## ", 1)]
  rows = [line for line in section.splitlines() if line.strip().startswith("| `")]
  return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def assert_documented(results: dict) -> None:
  missing = set(results) - documented_results_fields()
  assert not missing, f"results.json fields missing from docs/results_json.md's table: {sorted(missing)}"


# Test tiers, the markers pytest.ini lists. `make test-fast` runs `unit and not slow`; `make
# test` every tier but `slurm`, which `make test-slurm` runs (CI: both). Each file declares its tier (`pytestmark = pytest.mark.unit`); a
# test marked with another tier itself belongs to that one alone. A unit test takes a few
# seconds at most; one that compiles whole sharded steps is integration.
TIERS = ("unit", "integration", "e2e", "subprocess", "docs", "slurm")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
  for item in items:
    tiers = [mark.name for mark in item.iter_markers() if mark.name in TIERS]  # closest first
    if not tiers:
      raise pytest.UsageError(
          f"{item.path.name} declares no tier: add `pytestmark = pytest.mark.unit` (or "
          f"{', '.join(TIERS[1:])}: pytest.ini says which) below its imports")
    if len(set(tiers)) > 1:  # the test's own tier replaces its file's
      _only_tier(item, tiers[0])
  # Heaviest files first (a stable sort: each file's tests keep their order).
  items.sort(key=lambda item: HEAVIEST_FIRST.get(item.path.name, len(HEAVIEST_FIRST)))


def _only_tier(item, tier: str) -> None:
  """`item`'s markers without the tiers other than `tier` (what `-m` reads)."""
  markers = item.iter_markers

  def iter_markers(name=None):
    return (mark for mark in markers(name) if mark.name not in TIERS or mark.name == tier)

  item.iter_markers = iter_markers


# `make test` hands whole files to its two workers (--dist loadfile), the next file to the
# first worker nearly done with its own. Longest first, the two end close together; in
# xdist's default order (most tests first) a long file drawn last ran alone for minutes.
# The order: each file's measured time (the heaviest first; --durations=0, summed per file).
HEAVIEST_FIRST = {name: rank for rank, name in enumerate([
    "test_readme_commands.py", "test_synthetic.py", "test_resume.py", "test_sweep.py",
    "test_pools.py", "test_workload_study.py", "test_gpt2.py", "test_readme.py",
    "test_notebooks.py", "test_study_safety.py", "test_train.py", "test_microbatches.py",
    "test_eval_cadence.py", "test_knowledge_distillation.py", "test_critical_batch.py",
    "test_lm.py", "test_multihost.py", "test_samplers_sweep.py", "test_pools_multihost.py",
    "test_communication.py", "test_plugins.py", "test_config.py", "test_ensemble.py", "test_golden.py",
    "test_docs.py"])}


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order above
    config.option.loadscopereorder = False


def free_port() -> int:
  """A localhost port nothing listens on, for a test's JAX coordinator."""
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def run_processes(commands: list[list[str]], env: dict, log_prefix: str,
                  timeout_s: float) -> None:
  """Runs one command per process of a multi-controller job, to its end; fails the test
  with each process's log tail if any fails or the job outlasts `timeout_s`. Logs go to
  files (`<log_prefix>.<i>.log`), not pipes: gloo and XLA log a lot."""
  import subprocess

  logs = [open(f"{log_prefix}.{i}.log", "w") for i in range(len(commands))]
  procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
           for cmd, log in zip(commands, logs)]
  try:
    codes = [p.wait(timeout=timeout_s) for p in procs]
  except subprocess.TimeoutExpired:
    codes = None
  finally:
    for p in procs:  # one dead process leaves the others waiting on the coordinator
      if p.poll() is None:
        p.kill()
        p.wait()
    for log in logs:
      log.close()
  if codes is None or any(codes):
    tails = "\n".join(f"--- process {i} (exit {p.returncode}) ---\n"
                      + open(f"{log_prefix}.{i}.log").read()[-3000:]
                      for i, p in enumerate(procs))
    pytest.fail(f"{' '.join(commands[0])} failed or timed out after {timeout_s}s:\n{tails}")


def pca_routed_config(**distill):
  """Tiny Fashion-MNIST PCA-routed experts (4 workers, 3,000 images), `distill` overrides."""
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.method.num_workers = 4
  c.method.aggregation = "routed,logits"
  c.data.train_examples = 3000
  c.eval.num_examples = 300
  c.distill.builder, c.distill.embedding, c.distill.pca_dim = "kmeans", "pca", 16
  for k, v in distill.items():
    c.distill[k] = v
  return c
