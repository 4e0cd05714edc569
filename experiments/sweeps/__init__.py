"""The sweeps (cost-vs-time, samplers, critical batch) and what their command lines share."""
import argparse
import os

import jax

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
  """
  if path and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", path)


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
  """A sweep's arguments, with `--compile_cache` added and applied (`use_compile_cache`)."""
  parser.add_argument("--compile_cache", default=COMPILE_CACHE,
                      help="keep compiled programs here for the next run and session "
                      "('': off)")
  args = parser.parse_args(argv)
  use_compile_cache(args.compile_cache)
  return args
