"""`config.plugins`: the code a config needs, imported by every process that reads it.

A plugin is a module that registers entries (a mode, a builder, a model, a method) when
imported. `config.plugins` names them: module names on the Python path or `.py` files,
comma-separated or a list. `load(config)` imports them: `validation.validate` and
`methods.fit_workers_to_devices` (every entry point's first reading of a config) call it,
and so do the cost model's child, `--help` and resume on a saved config, so a plugin
behaves the same in the main run, a child process, a sweep's or SLURM task and a notebook.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from ensemble_jax.config_lib import ConfigError


def names(config) -> tuple[str, ...]:
  """The plugins a config (a ConfigDict or a stored dict) names, in order."""
  value = config.get("plugins", "") if hasattr(config, "get") else ""
  if isinstance(value, str):
    value = value.split(",")
  if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
    raise ConfigError(f"config.plugins={value!r}: name module names or .py files, "
                      "comma-separated or a list of strings.")
  return tuple(v.strip() for v in value if v.strip())


def load(config) -> tuple[str, ...]:
  """Imports the plugins `config` names (each once per process); their names."""
  found = names(config)
  for name in found:
    _import(name)
  return found


def _import(name: str) -> None:
  if name.endswith(".py"):
    _import_file(name)
    return
  try:
    importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
      raise  # the plugin's own import of something missing: its traceback says what
    raise ConfigError(f"config.plugins: no module named {name!r} on the Python path; put "
                      "its directory on PYTHONPATH or name its .py file.") from None


def _import_file(path: str) -> None:
  """A plugin given as a file: imported as its file name's module, once."""
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise ConfigError(f"config.plugins: no such file {path!r}; name an existing .py file or "
                      "a module on the Python path.")
  name = os.path.splitext(os.path.basename(path))[0]
  module = sys.modules.get(name)
  if module is not None:
    if os.path.abspath(getattr(module, "__file__", "") or "") != path:
      raise ConfigError(f"config.plugins: {path!r} would be module {name!r}, which is "
                        f"{getattr(module, '__file__', 'built in')} already; rename the file.")
    return
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]  # a half-run plugin must not count as loaded
    raise
