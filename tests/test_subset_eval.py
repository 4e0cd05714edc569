"""A finished ensemble run's sub-ensembles, scored without training (ensemble_jax/evaluate.py).

One tiny 4-worker run is trained once; its own final evaluation is the reference: the
same jitted evaluation, on the same restored state and eval set, must give it back.
"""
import json
import os

import pytest

from ensemble_jax import checkpoint, evaluate, run, train
from tests.conftest import tiny_ensemble

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """(workdir, results.json) of a finished tiny ensemble run (4 workers, 4 steps)."""
  workdir = str(tmp_path_factory.mktemp("ensemble"))
  run.train_and_evaluate(tiny_ensemble(), workdir)
  with open(os.path.join(workdir, run.RESULTS_FILE)) as f:
    return workdir, json.load(f)


def test_all_workers_give_back_the_runs_own_final_metrics(finished, capsys):
  workdir, results = finished
  before = _files(workdir)
  assert evaluate.main([f"--workdir={workdir}", "--workers=0,1,2,3"]) == 0
  path = os.path.join(workdir, "subsets", "workers_0_1_2_3.json")
  out = capsys.readouterr().out.strip()
  assert out == f"workers 0,1,2,3 of 4 at step 4: accuracy {results['final']['accuracy']:.4f} " \
                f"on 128 examples; {path}"
  with open(path) as f:
    record = json.load(f)
  assert record["metrics"] == results["final"]  # bit for bit: one program, one state
  assert record["per_worker"] == results["per_worker"]
  assert (record["workers"], record["step"], record["num_examples"]) == ([0, 1, 2, 3], 4, 128)
  # named from the run's workdir, so the record moves with the run
  assert record["checkpoint"] == os.path.join(train.CHECKPOINTS, "4") and "workdir" not in record
  assert os.path.isdir(os.path.join(workdir, record["checkpoint"]))
  assert _files(workdir) == before  # the run read back, never rewritten


def _files(workdir: str) -> dict[str, float]:
  """{path: modification time} of the run's files, its subsets apart."""
  return {os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
          for d, _, files in os.walk(workdir) if "subsets" not in d for f in files}


def test_one_worker_alone_scores_as_that_worker(finished):
  workdir, results = finished
  alone = evaluate.subset(workdir, [2])
  own = results["per_worker"][2]  # the run's last evaluation of worker 2 on its own
  assert alone["per_worker"] == [own]
  for mode in ("logits", "probs"):  # a mixture of one: the worker's own prediction
    assert alone["metrics"][f"{mode}/accuracy"] == own["accuracy"]
    assert alone["metrics"][f"{mode}/nll"] == pytest.approx(own["nll"], rel=1e-6)
  assert alone["metrics"]["worker/accuracy_mean"] == own["accuracy"]
  assert alone["metrics"]["accuracy"] != results["final"]["accuracy"]  # not the whole ensemble


def _copy_results(workdir: str, dest, **fields) -> str:
  """A workdir holding `workdir`'s results.json alone, with `fields` of its config set."""
  with open(os.path.join(workdir, run.RESULTS_FILE)) as f:
    results = json.load(f)
  for dotted, value in fields.items():
    group, name = dotted.split(".")
    results["config"][group][name] = value
  dest.mkdir()
  with open(dest / run.RESULTS_FILE, "w") as f:
    json.dump(results, f)
  return str(dest)


def test_bad_input_is_one_line_before_anything_compiles(finished, tmp_path, monkeypatch,
                                                        capsys):
  workdir, _ = finished
  monkeypatch.setattr(train, "set_up", lambda *a: pytest.fail("set up a bad request"))
  data_parallel = _copy_results(workdir, tmp_path / "dp", **{"method.name": "data_parallel"})
  cases = {
      (workdir, ""): "--workers='': name the workers to mix as indices, e.g. --workers=0,1.",
      (workdir, "0,a"): "--workers='0,a': name the workers to mix as indices",
      (workdir, "0,4"): "--workers=0,4: worker 4 is out of range; the run has 4 workers: "
                        "name workers among 0-3.",
      (workdir, "1,1"): "--workers=1,1: a worker is named twice",
      (str(tmp_path), "0"): f"--workdir={str(tmp_path)!r}: no finished run there",
      (data_parallel, "0"): f"--workdir={data_parallel!r} holds a data_parallel run",
      (_copy_results(workdir, tmp_path / "bare"), "0"): "no checkpoint of its final step 4",
  }
  for (where, workers), expected in cases.items():
    assert evaluate.main([f"--workdir={where}", f"--workers={workers}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, (where, workers, err)
  # A worker the run excluded (diverged) cannot be mixed back in: its record says so.
  saved = checkpoint.latest_record(os.path.join(workdir, train.CHECKPOINTS))
  monkeypatch.setattr(checkpoint, "latest_record", lambda directory: {
      **saved, "method": {"healthy": [True, False, True, True], "excluded": []}})
  assert evaluate.main([f"--workdir={workdir}", "--workers=0,1"]) == 2
  assert capsys.readouterr().err == ("error: --workers=0,1: worker 1 diverged in this run "
                                     "(results.json excluded_workers); leave it out.\n")
  assert not os.path.exists(os.path.join(workdir, "subsets", "workers_0_4.json"))
