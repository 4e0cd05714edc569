import gzip
import os
import shutil
import stat
import struct
import subprocess

import pytest

from ensemble_jax.data import fetch as F

pytestmark = pytest.mark.unit

FASHION_FILES = F.DATASETS["fashion_mnist"]["files"]


def _no_subprocess(*args, **kwargs):  # pragma: no cover - must not be called
    raise AssertionError(f"subprocess.run called unexpectedly: {args!r}")


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ENSEMBLE_JAX_DATA_DIR", str(tmp_path))
    assert F.default_cache_dir() == tmp_path
    assert F.dataset_dir("pydocs") == tmp_path / "pydocs"
    monkeypatch.delenv("ENSEMBLE_JAX_DATA_DIR")
    assert F.default_cache_dir() == F.pathlib.Path.home() / ".cache" / "ensemble_jax"
    assert F.dataset_dir("fashion_mnist", tmp_path / "x") == tmp_path / "x" / "fashion_mnist"
    with pytest.raises(KeyError, match="unknown dataset"):
        F.dataset_dir("nope")


@pytest.mark.parametrize("name", sorted(F.DATASETS))
def test_require_missing(tmp_path, monkeypatch, name):
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    with pytest.raises(F.DatasetUnavailableError) as ei:
        F.require(name, tmp_path)
    msg = str(ei.value)
    assert str(tmp_path / name) in msg
    # the data dir given: the command that fetches into it, not `make data` (which fetches
    # into the default dir; fails on 75ab1a7, which said "Fetch it with `make data`")
    command = f"python -m ensemble_jax.data.fetch --data_dir {tmp_path} {name}"
    assert f"Fetch it into {tmp_path} with `{command}`" in msg
    assert "Fetch it with `make data`" not in msg
    assert "ENSEMBLE_JAX_DATA_DIR" in msg
    assert isinstance(ei.value, FileNotFoundError)
    # the default dir: `make data` fetches there
    monkeypatch.setenv("ENSEMBLE_JAX_DATA_DIR", str(tmp_path / "default"))
    with pytest.raises(F.DatasetUnavailableError) as ei:
        F.require(name)
    default = f"Fetch it with `make data` or `python -m ensemble_jax.data.fetch {name}`"
    assert default in str(ei.value)


def test_fetch_idempotent_no_network(tmp_path, monkeypatch):
    d = tmp_path / "fashion_mnist"
    d.mkdir()
    for f in FASHION_FILES:
        (d / f).write_bytes(b"dummy")
    p = tmp_path / "pydocs" / "library"
    p.mkdir(parents=True)
    (p / "os.rst.txt").write_text("os\n==\n")
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    monkeypatch.setattr(F.shutil, "which", lambda *_: None)  # apt not even needed
    assert F.fetch("fashion_mnist", tmp_path) == d
    assert F.fetch("pydocs", tmp_path) == tmp_path / "pydocs"
    assert F.require("fashion_mnist", tmp_path) == d
    assert F.main(["--data_dir", str(tmp_path)]) == 0


def test_partial_dataset_is_not_complete(tmp_path):
    d = tmp_path / "fashion_mnist"
    d.mkdir()
    (d / FASHION_FILES[0]).write_bytes(b"dummy")
    with pytest.raises(F.DatasetUnavailableError):
        F.require("fashion_mnist", tmp_path)


def test_missing_apt_get(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    monkeypatch.setattr(F.shutil, "which", lambda *_: None)
    with pytest.raises(F.DatasetUnavailableError) as ei:
        F.fetch("fashion_mnist", tmp_path)
    msg = str(ei.value)
    assert "apt-get" in msg and "not found on PATH" in msg
    assert "dataset-fashion-mnist" in msg
    assert str(tmp_path / "fashion_mnist") in msg
    assert "zalandoresearch/fashion-mnist" in msg and "tfds" in msg

    with pytest.raises(F.DatasetUnavailableError, match="config.data.path"):
        F.fetch("pydocs", tmp_path)

    # CLI: exit code 1, message on stderr, no traceback.
    assert F.main(["--data_dir", str(tmp_path), "pydocs"]) == 1
    err = capsys.readouterr().err
    assert "python3.11-doc" in err and "Traceback" not in err


def test_apt_failure_reports_stderr(tmp_path, monkeypatch):
    """A failing apt-get (fake one on PATH) gives its stderr tail in the error."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "apt-get"
    fake.write_text("#!/bin/sh\necho 'E: fake apt failure for test' >&2\nexit 100\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (bindir / "dpkg").symlink_to(fake)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    data = tmp_path / "data"
    with pytest.raises(F.DatasetUnavailableError) as ei:
        F.fetch("fashion_mnist", data)
    msg = str(ei.value)
    assert "E: fake apt failure for test" in msg
    assert "apt-get update failed" in msg
    assert str(data / "fashion_mnist") in msg
    # Nothing half-written is left behind.
    assert list(data.iterdir()) == []


@pytest.mark.subprocess
@pytest.mark.skipif(
    shutil.which("apt-get") is None or shutil.which("dpkg") is None,
    reason="apt-get/dpkg not available (not a Debian-like system); real fetch not possible",
)
def test_real_fetch_fashion_mnist(tmp_path):
    path = F.fetch("fashion_mnist", tmp_path)
    assert path == tmp_path / "fashion_mnist"
    assert sorted(os.listdir(path)) == sorted(FASHION_FILES)
    assert sorted(os.listdir(tmp_path)) == ["fashion_mnist"]  # no leftovers
    with gzip.open(path / "train-images-idx3-ubyte.gz", "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
    assert (magic, n, rows, cols) == (2051, 60000, 28, 28)
    assert F.require("fashion_mnist", tmp_path) == path


def test_force_fetches_a_complete_dataset_again(tmp_path, monkeypatch):
    d = tmp_path / "fashion_mnist"
    d.mkdir()
    for f in FASHION_FILES:
        (d / f).write_bytes(b"dummy")
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    monkeypatch.setattr(F.shutil, "which", lambda *_: None)
    assert F.fetch("fashion_mnist", tmp_path) == d  # complete: nothing to do
    with pytest.raises(F.DatasetUnavailableError, match="apt-get and dpkg not found on PATH"):
        F.fetch("fashion_mnist", tmp_path, force=True)  # forced: fetched again
    assert all((d / f).read_bytes() == b"dummy" for f in FASHION_FILES)  # kept until replaced
    assert F.main(["--force", "--data_dir", str(tmp_path), "fashion_mnist"]) == 1
    assert F.fetch_command("fashion_mnist", tmp_path, force=True) == (
        f"python -m ensemble_jax.data.fetch --force --data_dir {tmp_path} fashion_mnist")
