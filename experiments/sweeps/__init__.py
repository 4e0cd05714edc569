"""The sweeps (cost-vs-time, samplers, critical batch) and what their command lines share."""
import importlib.util
import os
import types

import jax
from absl import flags

# Where the sweeps keep compiled programs (`use_compile_cache`), beside the embedded data.
COMPILE_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "ensemble_jax", "xla")


def use_compile_cache(path: str = COMPILE_CACHE) -> None:
  """Keeps this process's compiled programs on disk at `path` ('' : off), unless
  JAX_COMPILATION_CACHE_DIR already names a cache; call it before the first compile.

  A sweep compiles the same programs again in every seed's run and every resumed session,
  and on 2 CPU cores the ensemble's N = 64 step alone takes ~12 minutes to compile. A
  program read back is the executable that was written: no trained number changes, and
  the sweeps' program fingerprints (which drop source metadata) are the same. Only
  results.json's `compile_time_s` changes: it then times the read.

  Every program is kept, however quick to compile (JAX's default keeps those over 1 s): a
  routed pool's build compiles 12 small ones, 0.6-0.9 s in all on 2 cores, in each process
  that builds or re-times a pool (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS overrides).
  """
  if path and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", path)
    if not os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def load_config_module(path: str) -> types.ModuleType:
  """A workload config file as a module: its get_config() and grid functions."""
  spec = importlib.util.spec_from_file_location("sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def is_writer() -> bool:
  """Whether this process writes the sweep's shared files: process 0 of a multi-controller
  run (`jax.distributed`), every process walking the same plan on a shared workdir."""
  return jax.process_index() == 0


def sync(tag: str) -> None:
  """Waits until every process of a multi-controller sweep reaches `tag` (the same tags in
  the same order), so that what process 0 wrote before it is there for all to read."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(tag)


def define_flags(flag_values: flags.FlagValues) -> None:
  """The flags every sweep shares: `--compile_cache` (apply it with `use_compile_cache`)."""
  flags.DEFINE_string("compile_cache", COMPILE_CACHE, "keep compiled programs here for the "
                      "next run and session ('': off)", flag_values=flag_values)
