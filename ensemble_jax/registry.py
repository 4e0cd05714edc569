"""Registries: the extension points, looked up by the config field that names them.

Each extension point is one `Registry` beside the code it dispatches to: aggregation modes
(`aggregate.MODES`), pool builders (`distill.registry.BUILDERS`), stream samplers
(`data.samplers.SAMPLERS`), methods (`methods.METHODS`) and models (`models.MODELS`).
Validation, `--help` and the docs list the choices from them; a name not registered is a
ConfigError naming the field, the choices and the closest one.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib
from typing import Callable, Generic, Iterator, TypeVar

from ensemble_jax import config_lib
from ensemble_jax.config_lib import ConfigError

T = TypeVar("T")
_DECORATOR = object()  # `register(name)` without an entry: a decorator


class Registry(Generic[T]):
  """name -> entry for the config field `field` (e.g. 'method.aggregation').

  One registration style for every registry: `@REGISTRY.register("name", **declaration)`
  above the function or class (or `REGISTRY.register("name", obj, **declaration)`), and
  `with REGISTRY.registered("name", obj, **declaration):` for the length of a test.

  `builtins`: the module whose import registers the built-in entries. It is imported at the
  first lookup, so a module below it (validation) sees them without importing it.
  `entry`: (name, obj, **declaration) -> the entry registered for `obj` (default: `obj`).
  `check`: entry -> whether it is checked in full; it raises on an entry that cannot work.
    An entry it could not check yet (False) is checked again at each lookup until it is.
  """

  def __init__(self, field: str, builtins: str | None = None, entry: Callable | None = None,
               check: Callable | None = None):
    self.field = field
    self._entries: dict[str, T] = {}
    self._builtins = builtins
    self._entry = entry
    self._check = check
    self._unchecked: set[str] = set()
    self._declared: dict[str, tuple[str, ...]] = {}

  def register(self, name: str, obj=_DECORATOR, /, *, own_fields: dict | None = None,
               **declaration):
    """Registers `obj` under `name`, or, without `obj`, is a decorator that does; returns
    `obj`. A name registered twice is an error.

    own_fields: {name: config_lib.Field or a default}, config fields of the entry's own in
    the group of `field` (a builder's under `distill.`): they join the schema (so
    `--config.distill.<name>=` works) and, for a builder, the fields it reads."""
    if obj is _DECORATOR:
      return lambda o: self.register(name, o, own_fields=own_fields, **declaration)
    if name in self._entries:
      raise ValueError(f"{self.field}: {name!r} is registered already")
    group = self.field.split(".")[0]
    declared = config_lib.declare(group, own_fields or {}, self.field, name)
    try:
      if declared:
        declaration["own_fields"] = declared
      if self._entry is None and declaration:
        raise TypeError(f"{self.field}: an entry declares nothing here ({sorted(declaration)})")
      entry = self._entry(name, obj, **declaration) if self._entry else obj
      checked = self._check(entry) if self._check else True
    except BaseException:
      config_lib.undeclare(declared)
      raise
    self._entries[name] = entry
    self._declared[name] = declared
    if not checked:
      self._unchecked.add(name)
    return obj

  def unregister(self, name: str) -> None:
    """Removes `name` and the fields it declared."""
    del self._entries[name]
    self._unchecked.discard(name)
    config_lib.undeclare(self._declared.pop(name, ()))

  @contextlib.contextmanager
  def registered(self, name: str, obj, **declaration):
    """`obj` registered under `name` inside the `with` block, unregistered after it."""
    self.register(name, obj, **declaration)
    try:
      yield self._entries[name]
    finally:
      self.unregister(name)

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
    if name in self._unchecked and self._check(entries[name]):
      self._unchecked.discard(name)
    return entries[name]

  def __contains__(self, name: str) -> bool:
    return name in self._loaded()

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._loaded()))

  def names(self) -> tuple[str, ...]:
    return tuple(self._loaded())

  def own_fields(self, name: str) -> tuple[str, ...]:
    """The fields `name` declared as its own (dotted, `config_lib.DECLARED`'s keys)."""
    self._loaded()
    return self._declared.get(name, ())

  def items(self):
    return list(self._loaded().items())
