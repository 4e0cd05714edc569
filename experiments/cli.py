"""The command line of every script under experiments/: absl flags, as ensemble_jax.main's.

Each script declares its flags at module level on its own `flags.FlagValues()` rather than
absl's global FLAGS: the tests import several scripts into one process, and two of them
declaring `--workdir` globally would fail at import. A script's `main(argv)` parses argv
(program name first, as `app.run` passes it) with `parse`, so tests call `main` directly.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from ensemble_jax import logs


def parse(flag_values: flags.FlagValues, argv: list[str], doc: str = "") -> None:
  """Parses `argv` into `flag_values`, every flag not given back at its default.

  `--help` prints `doc` and the flags, exit status 0; a bad flag or a positional argument
  is one line on stderr, exit status 2.
  """
  if any(arg in ("-h", "--help", "--helpshort", "-?") for arg in argv[1:]):
    print(doc.rstrip() + "\n\nflags:" + flag_values.get_help())
    sys.exit(0)
  if flag_values.is_parsed():  # a test's second call starts from the defaults too
    flag_values.unparse_flags()
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if len(rest) > 1:
    print(f"error: unexpected arguments {rest[1:]}: flags only (--name=value)",
          file=sys.stderr)
    sys.exit(2)


def _global_defaults(argv: list[str]) -> list[str]:
  """app.run's flag parser: absl's global flags at their defaults, all of argv to main."""
  flags.FLAGS(argv[:1])
  return argv


def run(main) -> None:
  """`app.run(main)` for a script whose `main(argv)` parses its own flags (`parse`), with
  the library chatter (jax's TPU probe, orbax's notices) filtered from its output."""
  logs.quiet()
  app.run(main, flags_parser=_global_defaults)


def write_json(path: str, value, indent: int = 1) -> None:
  """`value` as JSON at `path` (a benchmark's --out), its folder made if missing."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=indent)
