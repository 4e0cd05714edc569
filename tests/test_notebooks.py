"""Executes every notebooks/*.ipynb in smoke mode, so the notebooks cannot rot.

Each notebook runs top to bottom in a fresh kernel of this interpreter (a kernel spec written
on the fly, so a `python3` kernel registered elsewhere on the machine cannot stand in), with
ENSEMBLE_JAX_NOTEBOOK_SMOKE=1, its own workdir, cwd = the repository root and the root on
PYTHONPATH. The kernel inherits this process's environment, including conftest's 8 fake CPU
devices and the persistent compilation cache.
"""
import json
import os
import pathlib
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

pytestmark = pytest.mark.docs

REPO = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300

# What each notebook must leave in its workdir (relative paths).
ARTEFACTS = {
    "quickstart": ["data_parallel/results.json", "ensemble/results.json",
                   "accuracy_vs_time.png"],
    "imagenet_tpu": ["data_parallel/results.json", "ensemble_8/results.json",
                     "cost_vs_time.png"],
    "pile_tpu": ["pile_shards/00.jsonl.zst", "data_parallel/results.json",
                 "ensemble_8/results.json", "cost_vs_time.png"],
}


def _kernel_manager(tmp_path: pathlib.Path) -> KernelManager:
  """A `python3` kernel that is this interpreter's ipykernel, whatever else is installed."""
  spec_dir = tmp_path / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "Python 3 (ensemble_jax tests)", "language": "python"}))
  specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
  return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


def _kernel_env(workdir: pathlib.Path) -> dict:
  env = dict(os.environ)
  env["ENSEMBLE_JAX_NOTEBOOK_SMOKE"] = "1"
  env["ENSEMBLE_JAX_NOTEBOOK_WORKDIR"] = str(workdir)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # plots show as outputs
  return env


def _code_cells(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_notebooks():
  assert {p.stem for p in NOTEBOOKS} >= set(ARTEFACTS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_with_one_parameters_cell(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  for cell in _code_cells(nb):
    assert cell.outputs == [] and cell.execution_count is None, (
        f"{path.name}: outputs are stored; clear them before committing")
  params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(params) == 1, f"{path.name}: {len(params)} cells tagged 'parameters', want 1"
  assert "ENSEMBLE_JAX_NOTEBOOK_SMOKE" in params[0].source
  assert "ENSEMBLE_JAX_NOTEBOOK_WORKDIR" in params[0].source


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path, tmp_path):
  workdir = tmp_path / "workdir"
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=CELL_TIMEOUT_S,
                          startup_timeout=120, resources={"metadata": {"path": str(REPO)}})
  try:
    client.execute(env=_kernel_env(workdir))  # raises CellExecutionError on a failing cell
  finally:
    nbformat.write(nb, tmp_path / path.name)  # the executed copy, for a look after a failure

  errors = [o for c in _code_cells(nb) for o in c.outputs if o.output_type == "error"]
  assert not errors, errors
  assert all(c.execution_count for c in _code_cells(nb)), "a code cell did not run"
  missing = [a for a in ARTEFACTS.get(path.stem, []) if not (workdir / a).is_file()]
  assert not missing, f"{path.name} did not write {missing} under {workdir}"
  for results_path in workdir.glob("*/results.json"):
    results = json.loads(results_path.read_text())
    assert results["steps"] > 0 and results["history"], results_path
  # The plot is shown inline as well as saved.
  assert any("image/png" in o.get("data", {}) for c in _code_cells(nb) for o in c.outputs)
