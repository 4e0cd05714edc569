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
