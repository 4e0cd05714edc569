"""How many threads the host's BLAS (OpenBLAS, as numpy and scipy load it) runs on.

On a shared 2-core machine OpenBLAS's second thread waits at every barrier for a core the
other processes hold: one 784 x 784 `eigh` took 0.1 s on one thread and 0.3-8 s on two
under load. Parts of a pool's build whose bits do not depend on the thread count (a
matrix product splits its output over threads, never a sum) run on one thread with
`threads(1)`.

The count is set through OpenBLAS's own `*openblas_set_num_threads*` in every OpenBLAS
library the process has loaded (numpy and scipy each bundle one). With no OpenBLAS loaded
(MKL, Accelerate) `threads` does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_", "openblas_get_num_threads")


@functools.cache
def _libraries() -> tuple[tuple, ...]:
  """(get, set) of every loaded OpenBLAS library; numpy and scipy are imported first."""
  import numpy  # noqa: F401
  import scipy.linalg  # noqa: F401

  try:
    with open("/proc/self/maps") as f:
      paths = sorted({line.split()[-1] for line in f
                      if "openblas" in line.lower() and ".so" in line.split()[-1]})
  except OSError:
    return ()
  out = []
  for path in paths:
    try:
      lib = ctypes.CDLL(path)
    except OSError:
      continue
    get = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
    set_ = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
    if get is not None and set_ is not None:
      get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
      out.append((get, set_))
  return tuple(out)


@contextlib.contextmanager
def threads(n: int):
  """OpenBLAS on at most `n` threads inside the block; the previous counts restored after."""
  libs = _libraries()
  before = [get() for get, _ in libs]
  try:
    for (_, set_), was in zip(libs, before):
      set_(min(n, was))
    yield
  finally:
    for (_, set_), was in zip(libs, before):
      set_(was)
