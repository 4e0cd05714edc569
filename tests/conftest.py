"""Eight fake CPU devices, set before JAX is imported anywhere in the test process."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite is compile-bound (a few steps of tiny models): XLA:CPU's cheaper code generation
# cuts a smoke run's CPU time by ~40% (measured: 18.7 s vs 31.3 s user for a 24-step run
# from a cold compile cache). It changes the machine code, not the HLO the tests inspect;
# results move in the 8th digit (the golden values hold at 1e-6). Child processes get the
# same flags through `subprocess_env`.
COMPILE_LIGHT_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {COMPILE_LIGHT_FLAGS}"
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def tiny_config():
  from experiments.configs import fashion_mnist

  return fashion_mnist.get_config("tiny")


# Identical programs recur across tests (the smoke model in several methods and runs):
# a persistent compilation cache turns their repeat compiles into cache reads.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".pytest_cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def subprocess_env(devices: int, **extra: str) -> dict:
  """The environment of a test's child process: this one's, the compile-light flags, and
  `devices` fake CPU devices (the only device-count flag, so a failure message is plain)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags.append(f"--xla_force_host_platform_device_count={devices}")
  return {**os.environ, "XLA_FLAGS": " ".join(flags), **extra}


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
