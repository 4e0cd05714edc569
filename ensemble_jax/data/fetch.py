"""Fetch the embedded offline datasets from Debian packages, without root.

Usage:

  python -m ensemble_jax.data.fetch                 # all datasets
  python -m ensemble_jax.data.fetch fashion_mnist   # just one
  python -m ensemble_jax.data.fetch --data_dir /some/dir pydocs

Each dataset ships in a Debian package. `apt-get download` fetches the `.deb` with a
private apt state: package lists and cache in a temporary directory, no locking. `dpkg -x`
unpacks it without installing, and the wanted files move into `<data_dir>/<name>/`
atomically. Nothing on the system is changed and no root is needed.

Data loaders must call `require`, which never downloads; nothing in this
package downloads at import time.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence

PathLike = str | os.PathLike

ENV_VAR = "ENSEMBLE_JAX_DATA_DIR"

# Apt can be slow on a cold mirror; generous but finite.
_APT_TIMEOUT_S = 900
_STDERR_TAIL_LINES = 15


class DatasetUnavailableError(FileNotFoundError):
  """A dataset is not present locally and/or could not be fetched."""


class DataError(ValueError):
  """Data that is present but unreadable, such as a malformed line or truncated file.

  The message names the file, the line if any, and the command or setting that fixes it."""


def fetch_command(name: str, data_dir: PathLike | None = None, force: bool = False) -> str:
  """The command that fetches dataset `name` (again, with `force`)."""
  dd = f" --data_dir {pathlib.Path(data_dir).expanduser()}" if data_dir else ""
  return f"python -m ensemble_jax.data.fetch{' --force' if force else ''}{dd} {name}"


def tfds_source(name: str, split: str, data_dir: str = "", prepare_hint: str = ""):
  """`tfds.data_source` of a TFDS dataset prepared as array_record; never downloads or
  prepares (download=False). Raises DatasetUnavailableError saying how to prepare it."""
  import tensorflow_datasets as tfds  # heavy import, only on this path

  where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # tfds raises several types for "not prepared"
    base = pathlib.Path(where).expanduser() / name.split(":")[0]
    reason = (f"nothing prepared at {base}" if not base.exists() else
              " ".join(str(e).split()[:40]) or type(e).__name__)
    raise DatasetUnavailableError(
        f"TFDS dataset {name!r} (split {split!r}) cannot be read from {where}: {reason}. "
        f"Prepare it once as array_record: `tfds build {name} --data_dir={where} "
        f"--file_format=array_record`{prepare_hint} (the build needs TensorFlow: pip install "
        f"tensorflow), then run with --config.data.data_dir={where}.") from e


_FASHION_FILES = (
  "train-images-idx3-ubyte.gz",
  "train-labels-idx1-ubyte.gz",
  "t10k-images-idx3-ubyte.gz",
  "t10k-labels-idx1-ubyte.gz",
)

DATASETS: dict[str, dict] = {
  "fashion_mnist": {
    "package": "dataset-fashion-mnist",
    # Directory inside the unpacked .deb holding the wanted files.
    "src": "usr/share/datasets/fashion-mnist",
    # Either an explicit list of files (relative to src) ...
    "files": _FASHION_FILES,
    "description": "Fashion-MNIST, 60k train / 10k test 28x28 grayscale (idx .gz)",
    "alternative": (
      "download the four idx .gz files ("
      + ", ".join(_FASHION_FILES)
      + ") from the Fashion-MNIST GitHub repository "
      "(https://github.com/zalandoresearch/fashion-mnist, directory data/fashion) "
      "into {path}, or prepare the TFDS dataset 'fashion_mnist' and set "
      "config.data.source='tfds'"
    ),
  },
  "pydocs": {
    "package": "python3.11-doc",
    "src": "usr/share/doc/python3.11/html/_sources",
    # ... or a glob (relative to src); the relative structure is kept.
    "glob": "**/*.rst.txt",
    "description": "Python 3.11 documentation sources (~500 .rst.txt files, ~11 MB)",
    "alternative": (
      "download the Python 3.11 documentation sources (Debian package "
      "python3.11-doc, directory usr/share/doc/python3.11/html/_sources) "
      "into {path}, or point config.data.path at any directory of .txt files"
    ),
  },
}


# ---------------------------------------------------------------------------
# Paths and presence checks
# ---------------------------------------------------------------------------


def default_cache_dir() -> pathlib.Path:
  """`$ENSEMBLE_JAX_DATA_DIR` if set, else `~/.cache/ensemble_jax`."""
  env = os.environ.get(ENV_VAR)
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path("~/.cache/ensemble_jax").expanduser()


def _spec(name: str) -> dict:
  try:
    return DATASETS[name]
  except KeyError:
    raise KeyError(
      f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}"
    ) from None


def dataset_dir(name: str, data_dir: PathLike | None = None) -> pathlib.Path:
  """Final location of dataset `name` (existence is not checked)."""
  _spec(name)
  base = pathlib.Path(data_dir).expanduser() if data_dir is not None else default_cache_dir()
  return base / name


def _expected_files(name: str, root: pathlib.Path) -> list[pathlib.Path]:
  """Files of dataset `name` found under `root` (sorted)."""
  spec = _spec(name)
  if "files" in spec:
    return [root / f for f in spec["files"] if (root / f).is_file()]
  return sorted(p for p in root.glob(spec["glob"]) if p.is_file())


def _is_complete(name: str, root: pathlib.Path) -> bool:
  if not root.is_dir():
    return False
  spec = _spec(name)
  found = _expected_files(name, root)
  if "files" in spec:
    return len(found) == len(spec["files"])
  return len(found) > 0


def _alternative(name: str, path: pathlib.Path) -> str:
  return _spec(name)["alternative"].format(path=path)


def require(name: str, data_dir: PathLike | None = None) -> pathlib.Path:
  """Return the directory of dataset `name` if present; never downloads.

  Raises `DatasetUnavailableError` explaining how to fetch it.
  """
  path = dataset_dir(name, data_dir)
  if _is_complete(name, path):
    return path
  spec = _spec(name)
  if "files" in spec:
    what = "the files " + ", ".join(spec["files"])
  else:
    what = f"files matching {spec['glob']}"
  if data_dir is None or path.parent == default_cache_dir():
    how = f"Fetch it with `make data` or `{fetch_command(name)}`"
  else:  # `make data` fetches into the default dir, not the one given
    how = (f"Fetch it into {path.parent} with `{fetch_command(name, path.parent)}` "
           f"(`make data` fetches into the default dir, {default_cache_dir()})")
  raise DatasetUnavailableError(
    f"dataset {name!r} not found: looked in {path} for {what}.\n"
    f"{how} (the data dir defaults to ${ENV_VAR} if set, else ~/.cache/ensemble_jax; "
    f"currently {default_cache_dir()}).\n"
    f"Alternatively, {_alternative(name, path)}."
  )


# ---------------------------------------------------------------------------
# Fetching
# ---------------------------------------------------------------------------


def _fail(name: str, path: pathlib.Path, reason: str, stderr: str = "") -> DatasetUnavailableError:
  pkg = _spec(name)["package"]
  msg = (
    f"could not fetch dataset {name!r} (Debian package {pkg!r}) into {path}: {reason}"
  )
  tail = [ln for ln in (stderr or "").strip().splitlines() if ln.strip()][-_STDERR_TAIL_LINES:]
  if tail:
    msg += "\nlast output lines:\n  " + "\n  ".join(tail)
  msg += f"\nAlternatively, {_alternative(name, path)}."
  return DatasetUnavailableError(msg)


def _run(cmd: Sequence[str], cwd: pathlib.Path, name: str, path: pathlib.Path, what: str) -> None:
  try:
    proc = subprocess.run(
      list(cmd),
      cwd=str(cwd),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      timeout=_APT_TIMEOUT_S,
      env={**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"},
    )
  except subprocess.TimeoutExpired as e:
    err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    raise _fail(name, path, f"{what} timed out after {_APT_TIMEOUT_S}s", err) from None
  except OSError as e:
    raise _fail(name, path, f"{what} could not be run: {e}") from None
  if proc.returncode != 0:
    raise _fail(
      name,
      path,
      f"{what} failed with exit code {proc.returncode} ({' '.join(cmd)})",
      proc.stderr if (proc.stderr or "").strip() else (proc.stdout or ""),
    )


def _replace_dir(staging: pathlib.Path, final: pathlib.Path) -> None:
  """Atomically put `staging` at `final` (replacing an incomplete one)."""
  if final.exists() or final.is_symlink():
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if old.exists():
      shutil.rmtree(old)
    os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.rename(staging, final)


def fetch(name: str, data_dir: PathLike | None = None, force: bool = False) -> pathlib.Path:
  """Make dataset `name` available locally and return its directory.

  Idempotent: if the expected files are already there, returns at once
  without touching the network. `force` fetches them again (a truncated or corrupt file),
  replacing the directory only once the new copy is complete.
  """
  _spec(name)  # an unknown name fails here, before any work
  final = dataset_dir(name, data_dir)
  if not force and _is_complete(name, final):
    return final

  missing = [t for t in ("apt-get", "dpkg") if shutil.which(t) is None]
  if missing:
    raise _fail(
      name,
      final,
      f"{' and '.join(missing)} not found on PATH (a Debian/Ubuntu system is "
      "needed to fetch this dataset automatically)",
    )

  final.parent.mkdir(parents=True, exist_ok=True)
  # Work inside the data dir so the final moves are same-filesystem renames.
  with tempfile.TemporaryDirectory(prefix=f".fetch-{name}-", dir=final.parent) as tmp_s:
    src = _download_and_extract(name, final, pathlib.Path(tmp_s))
    _install(_wanted_files(name, final, src), src, final)

  if not _is_complete(name, final):  # pragma: no cover - defensive
    raise _fail(name, final, "files missing after extraction")
  return final


def _download_and_extract(name: str, final: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
  """Downloads `name`'s Debian package into `tmp` and unpacks it; returns its data dir."""
  spec = _spec(name)
  pkg = spec["package"]
  (tmp / "lists" / "partial").mkdir(parents=True)
  (tmp / "cache" / "archives" / "partial").mkdir(parents=True)
  apt_opts = [
    "-o", f"Dir::State::Lists={tmp / 'lists'}",
    "-o", f"Dir::Cache={tmp / 'cache'}",
    "-o", "Debug::NoLocking=1",
  ]
  dl = tmp / "dl"
  dl.mkdir()
  _run(["apt-get", *apt_opts, "update"], tmp, name, final, "apt-get update")
  _run(["apt-get", *apt_opts, "download", pkg], dl, name, final, f"apt-get download {pkg}")
  debs = sorted(dl.glob("*.deb"))
  if not debs:
    raise _fail(name, final, f"apt-get download {pkg} produced no .deb file")
  x = tmp / "x"
  _run(["dpkg", "-x", str(debs[0]), str(x)], tmp, name, final, f"dpkg -x {debs[0].name}")
  src = x / spec["src"]
  if not src.is_dir():
    raise _fail(name, final, f"package {pkg} does not contain {spec['src']}")
  return src


def _wanted_files(name: str, final: pathlib.Path, src: pathlib.Path) -> list[pathlib.Path]:
  """The files of `name` under the unpacked `src`; fails naming any that are absent."""
  spec = _spec(name)
  pkg = spec["package"]
  if "files" in spec:
    wanted = [src / f for f in spec["files"]]
    absent = [str(p.relative_to(src)) for p in wanted if not p.is_file()]
    if absent:
      raise _fail(name, final, f"package {pkg} lacks {', '.join(absent)} in {spec['src']}")
  else:
    wanted = sorted(p for p in src.glob(spec["glob"]) if p.is_file())
    if not wanted:
      raise _fail(name, final, f"package {pkg} has no {spec['glob']} under {spec['src']}")
  return wanted


def _install(wanted: list[pathlib.Path], src: pathlib.Path, final: pathlib.Path) -> None:
  """Moves `wanted` into a staging dir beside `final`, then swaps it in whole."""
  staging = final.with_name(final.name + ".tmp")
  if staging.exists() or staging.is_symlink():
    if staging.is_dir() and not staging.is_symlink():
      shutil.rmtree(staging)
    else:
      staging.unlink()
  staging.mkdir()
  try:
    for p in wanted:
      dst = staging / p.relative_to(src)
      dst.parent.mkdir(parents=True, exist_ok=True)
      if p.is_symlink():  # e.g. dh_link'ed files: copy the content
        shutil.copyfile(p, dst)
      else:
        shutil.move(str(p), str(dst))
    _replace_dir(staging, final)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _summary(name: str, path: pathlib.Path) -> str:
  files = _expected_files(name, path)
  size = sum(p.stat().st_size for p in files)
  return f"{name}: {path} ({len(files)} files, {size / 1e6:.1f} MB)"


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(
    prog="python -m ensemble_jax.data.fetch",
    description="Fetch the offline datasets (from Debian packages, no root needed).",
  )
  ap.add_argument("names", nargs="*", metavar="name",
          help=f"datasets to fetch (default: all of {', '.join(DATASETS)})")
  ap.add_argument("--data_dir", default=None,
          help=f"cache directory (default: ${ENV_VAR} or ~/.cache/ensemble_jax)")
  ap.add_argument("--force", action="store_true",
          help="fetch again even if the files are there (a truncated or corrupt file)")
  args = ap.parse_args(argv)
  names = args.names or list(DATASETS)
  unknown = [n for n in names if n not in DATASETS]
  if unknown:
    ap.error(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
  for name in names:
    t0 = time.monotonic()
    try:
      path = fetch(name, args.data_dir, force=args.force)
    except DatasetUnavailableError as e:
      print(f"error: {e}", file=sys.stderr)
      return 1
    print(f"{_summary(name, path)} [{time.monotonic() - t0:.1f}s]")
  return 0


if __name__ == "__main__":
  sys.exit(main())
