"""Eight fake CPU devices, set before JAX is imported anywhere in the test process."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def smoke_config():
  from experiments.configs import fashion_mnist

  return fashion_mnist.get_config("smoke")


# Identical programs recur across tests (the smoke model in several methods and runs):
# a persistent compilation cache turns their repeat compiles into cache reads.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".pytest_cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def documented_results_fields() -> set[str]:
  """The top-level results.json fields README.md's table documents (its first column)."""
  import re

  with open(os.path.join(REPO, "README.md")) as f:
    text = f.read()
  section = text[text.index("## What a run leaves in its workdir"):]
  section = section[:section.index("\n## ", 1)]
  rows = [line for line in section.splitlines() if line.strip().startswith("| `")]
  return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def assert_documented(results: dict) -> None:
  missing = set(results) - documented_results_fields()
  assert not missing, f"results.json fields missing from README's table: {sorted(missing)}"
