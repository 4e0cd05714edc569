"""Registries: the extension points, looked up by the config field that names them.

Each extension point is one `Registry` beside the code it dispatches to: aggregation modes
(`aggregate.MODES`), pool builders (`distill.registry.BUILDERS`), stream samplers
(`data.samplers.SAMPLERS`), methods (`methods.METHODS`) and models (`models.MODELS`).
Validation, `--help` and the docs list the choices from them; a name not registered is a
ConfigError naming the field, the choices and the closest one.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Generic, Iterator, TypeVar

from ensemble_jax.config_lib import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
  """name -> entry for the config field `field` (e.g. 'method.aggregation').

  `builtins`: the module whose import registers the built-in entries. It is imported at the
  first lookup, so a module below it (validation) sees them without importing it."""

  def __init__(self, field: str, builtins: str | None = None):
    self.field = field
    self._entries: dict[str, T] = {}
    self._builtins = builtins

  def register(self, name: str, entry: T) -> T:
    """Adds `entry` under `name`; a name registered twice is an error."""
    if name in self._entries:
      raise ValueError(f"{self.field}: {name!r} is registered already")
    self._entries[name] = entry
    return entry

  def unregister(self, name: str) -> None:
    """Removes `name` (tests that register a dummy entry clean up with it)."""
    del self._entries[name]

  def _loaded(self) -> dict[str, T]:
    if self._builtins is not None:
      module, self._builtins = self._builtins, None
      importlib.import_module(module)
    return self._entries

  def __getitem__(self, name: str) -> T:
    entries = self._loaded()
    if name not in entries:
      close = difflib.get_close_matches(name, list(entries), n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise ConfigError(f"config.{self.field}={name!r}: choose one of {self.names()} (the "
                        f"registered names).{hint}")
    return entries[name]

  def __contains__(self, name: str) -> bool:
    return name in self._loaded()

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._loaded()))

  def names(self) -> tuple[str, ...]:
    return tuple(self._loaded())

  def items(self):
    return list(self._loaded().items())
