"""End-to-end runs of the one training loop on the tiny config (8 fake devices)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ensemble_jax import optim, run
from tests.conftest import REPO, assert_documented, subprocess_env

pytestmark = pytest.mark.e2e

RESULT_KEYS = {"method", "config", "num_devices", "host", "steps", "wall_time_s", "flops_per_step",
               "step_time_s", "final", "target"}
TARGET_KEYS = {"metric", "value", "reached", "reached_step", "reached_time_s",
               "resolution_steps", "resolution", "refined_from"}


# make test runs each file's tests on one xdist worker (--dist loadfile): trained once.
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """The tiny config's run, as it is: (its workdir, its `run.fit`). Read, never written, by
  the tests that use it (each of them trained it once before)."""
  from experiments.configs import fashion_mnist

  workdir = tmp_path_factory.mktemp("tiny_run")
  return workdir, run.fit(fashion_mnist.get_config("tiny"), str(workdir))


def test_data_parallel_few_steps_writes_results(tiny_config, tiny_run):
  tmp_path, fit = tiny_run
  results = fit.results
  with open(tmp_path / "results.json") as f:
    on_disk = json.load(f)
  assert RESULT_KEYS <= set(on_disk)
  assert TARGET_KEYS <= set(on_disk["target"])
  assert_documented(on_disk)
  assert on_disk["method"] == "data_parallel"
  assert on_disk["num_devices"] == 8 and on_disk["mesh"] == {"data": 8}
  assert on_disk["host"]["jax"] == jax.__version__ and "cpu_features" in on_disk["host"]
  assert on_disk["steps"] == tiny_config.train.num_steps == 4
  assert on_disk["config"]["train"]["batch_size"] == tiny_config.train.batch_size
  assert on_disk["flops_per_step"] > 1e6  # XLA's count for a real conv net step
  assert on_disk["step_time_s"] > 0 and on_disk["wall_time_s"] >= on_disk["train_time_s"]
  final = on_disk["final"]
  assert 0.0 <= final["accuracy"] <= 1.0 and np.isfinite(final["nll"])
  assert final["num_examples"] == tiny_config.eval.num_examples
  assert [h["step"] for h in on_disk["history"]] == [2, 4]
  assert results["final"] == pytest.approx(final)
  cost = on_disk["cost"]
  assert cost["measured"]["flops"] == on_disk["flops_per_step"] * 4
  to_target = on_disk["target"]["reached_step"] or 4  # the smoke target is reached early
  assert cost["measured"]["steps_to_target"] == to_target
  if on_disk["target"]["reached"]:  # the eval before the crossing, or the start
    evals = [0] + [h["step"] for h in on_disk["history"]]
    previous = evals[evals.index(to_target) - 1]
    assert on_disk["target"]["resolution_steps"] == to_target - previous
  assert cost["measured"]["flops_to_target"] == on_disk["flops_per_step"] * to_target
  modelled = cost["modelled"]
  assert modelled["devices"] == 8  # one per data-parallel replica of the mesh
  for preset, seconds in modelled["device_seconds"].items():
    assert seconds == pytest.approx(8 * modelled["critical_path_s"][preset])
  # Communication read off the compiled programs: the step's gradient and BatchNorm
  # all-reduces over the 8 devices, the eval's metric sums.
  assert modelled["collectives_source"].endswith("this run's mesh {'data': 8}")
  assert {c["program"] for c in modelled["collectives"]} == {"train_step", "eval"}
  step = [c for c in modelled["collectives"] if c["program"] == "train_step"]
  assert sum(c["count"] for c in step) > 1 and {c["group_size"] for c in step} == {8}
  assert sum(c["bytes"] * c["count"] for c in step) >= 4 * on_disk["num_params"]
  assert modelled["units_to_target"]["step"] == to_target
  for preset, seconds in modelled["critical_path_s"].items():
    assert modelled["communication_s"][preset] > 0
    assert seconds == pytest.approx(to_target * modelled["device_step_time_s"]
                                    + modelled["communication_s"][preset])
  # metrics files on process 0
  assert any(p.startswith("events.out.tfevents") for p in os.listdir(tmp_path))
  assert (tmp_path / "metrics.jsonl").read_text().count("\n") >= 4
  logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [m for m in logged if "train/loss" in m]
  schedule = optim.create_schedule(tiny_config.optim, tiny_config.train.batch_size, 4, 1)
  for m in train:  # the rate the step used (its step index is the logged count - 1)
    assert m["train/learning_rate"] == pytest.approx(float(schedule(m["step"] - 1)))
    assert m["train/steps_per_s"] > 0
  assert train[-1]["train/learning_rate"] > 0
  # TensorBoard (installed with the package) reads the run: scalars and hyper-parameters.
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  events = EventAccumulator(str(tmp_path))
  events.Reload()
  assert {"train/loss", "train/learning_rate", "train/steps_per_s",
          "eval/accuracy"} <= set(events.Tags()["scalars"])
  hparams = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
  assert b"optim.learning_rate" in hparams and b"train.batch_size" in hparams


def test_one_step_then_resume_from_checkpoint(tiny_config, tmp_path):
  tiny_config.train.num_steps = 1
  first = run.train_and_evaluate(tiny_config, str(tmp_path))
  assert first["steps"] == 1 and first["history"][-1]["step"] == 1
  tiny_config.train.num_steps = 3  # a longer budget extends the finished run
  second = run.train_and_evaluate(tiny_config, str(tmp_path))
  # Restored at step 1 and trained two more steps: the history continues.
  assert [h["step"] for h in second["history"]] == [1, 2, 3]
  assert sorted(int(p) for p in os.listdir(tmp_path / "checkpoints")) == [2, 3]
  # The extension is on the record: where it happened and what changed.
  assert second["config_changes"] == [{"step": 1, "changes": {"train.num_steps": [1, 3]}}]
  assert second["config"]["train"]["num_steps"] == 3


def test_target_tracking(tiny_config, tmp_path):
  tiny_config.eval.target_metric, tiny_config.eval.target_value = "nll", 100.0
  r = run.train_and_evaluate(tiny_config, str(tmp_path / "easy"))
  assert r["target"]["reached"] and r["target"]["reached_step"] == 2
  assert 0 < r["target"]["reached_time_s"] <= r["train_time_s"]
  tiny_config.eval.target_value = 1e-6
  r = run.train_and_evaluate(tiny_config, str(tmp_path / "hard"))
  assert not r["target"]["reached"] and r["target"]["reached_step"] is None


@pytest.mark.subprocess
def test_metric_writer_does_not_import_torch(tmp_path):
  """tensorboardX imports torch when it is installed (2.4 s of every run's start here)."""
  code = ("import sys; from ensemble_jax import writers; "
          f"w = writers.MetricWriter({str(tmp_path)!r}); w.write_scalars(1, {{'loss': 1.0}}); "
          "w.flush(); assert 'torch' not in sys.modules, 'torch was imported'; "
          "import torch")  # and it still imports where it is wanted
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(1),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert os.listdir(tmp_path) and (tmp_path / "metrics.jsonl").read_text().count("loss") == 1


def test_ensemble_few_steps_with_soup(tmp_path):
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("ensemble,tiny")
  config.method.shared_init = True
  config.method.aggregation = "logits,probs,soup"
  config.method.soup_bn_batches = 2
  r = run.train_and_evaluate(config, str(tmp_path))
  with open(tmp_path / "results.json") as f:
    on_disk = json.load(f)
  assert RESULT_KEYS <= set(on_disk)
  assert_documented(on_disk)
  assert on_disk["method"] == "ensemble" and on_disk["mesh"] == {"worker": 8, "data": 1}
  assert on_disk["num_workers"] == 8 and on_disk["steps_per_worker"] == 4 == on_disk["steps"]
  assert len(on_disk["per_worker"]) == 8 and on_disk["excluded_workers"] == []
  assert set(on_disk["ensemble"]) == {"logits", "probs", "soup"}
  for mode in ("logits", "probs", "soup"):
    assert on_disk["ensemble"][mode]["num_examples"] == config.eval.num_examples
  worker_acc = [w["accuracy"] for w in on_disk["per_worker"]]
  assert on_disk["final"]["worker/accuracy_mean"] == pytest.approx(np.mean(worker_acc))
  assert on_disk["final"]["accuracy"] == on_disk["ensemble"]["logits"]["accuracy"]
  assert r["examples_per_step"] == 8 * config.train.batch_size
  # The workers never talk while they train: only the evals and the soup (once) do.
  collectives = on_disk["cost"]["modelled"]["collectives"]
  assert {(c["program"], c["per"]) for c in collectives} == {("eval", "eval"), ("soup", "run")}


def test_diloco_few_steps(tmp_path):
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("diloco,tiny")
  config.method.sync_every = 3  # L = 4 is not a multiple of H: the run still ends synced
  config.eval.target_value = 0.99  # not reached: the communication of all 4 steps
  r = run.train_and_evaluate(config, str(tmp_path))
  assert r["method"] == "diloco" and r["sync_every"] == 3
  assert_documented(r)
  assert r["syncs"] == [3, 4]  # regression: was [3] on b8f7b5c
  assert set(r["ensemble"]) == {"global"} and len(r["per_worker"]) == 8
  assert r["final"]["accuracy"] == r["ensemble"]["global"]["accuracy"]
  modelled = r["cost"]["modelled"]
  # Not reached: every step; the evals at 2 and 4; the outer step at 3 (the one at 4 comes
  # after its eval, which scored the deployable model: an outer step of its own).
  assert modelled["units_to_target"] == {"step": 4, "eval": 2, "unsynced_eval": 2, "sync": 1,
                                         "run": 1}
  assert {(c["program"], c["per"]) for c in modelled["collectives"]} == {
      ("eval", "eval"), ("deployable", "unsynced_eval"), ("sync", "sync")}
  weights = 4 * r["num_params_per_worker"]
  for program in ("sync", "deployable"):
    assert any(c["program"] == program and c["kind"] == "all-reduce" and c["bytes"] >= weights
               and c["group_size"] == 8 for c in modelled["collectives"])


def test_stop_at_target_ends_the_run_at_the_first_eval_that_reaches_it(tiny_config, tmp_path):
  tiny_config.train.stop_at_target = True
  tiny_config.eval.target_metric, tiny_config.eval.target_value = "nll", 100.0
  r = run.train_and_evaluate(tiny_config, str(tmp_path))
  assert r["target"]["reached_step"] == 2 and r["steps"] == 2 and r["step_budget"] == 4
  assert r["cost"]["measured"]["flops"] == r["flops_per_step"] * 2
  again = run.train_and_evaluate(tiny_config, str(tmp_path))  # resumes: nothing left to do
  assert again["steps"] == 2 and again["final"] == r["final"]


def test_stop_at_step_ends_the_run_there_on_the_full_budgets_schedule(tiny_config, tiny_run,
                                                                       tmp_path):
  """A tuning run that can no longer be chosen stops early (tune.stop_losers) at its first
  eval at or past train.stop_at_step: up to there it is the full run (its schedule spans the
  whole budget, its evals are the same), and a rerun of the same config reads it back."""
  full = tiny_run[1].results  # the same config, run in full
  tiny_config.train.stop_at_step = 1  # evals every 2 steps: it stops at step 2's, adding none
  r = run.train_and_evaluate(tiny_config, str(tmp_path / "stopped"))
  assert r["steps"] == 2 and r["step_budget"] == 4
  metrics = lambda h: {k: v for k, v in h.items() if not k.endswith("time_s")}
  assert [h["step"] for h in r["history"]] == [2]
  assert metrics(r["history"][0]) == metrics(full["history"][0])
  assert r["final"]["nll"] == r["history"][-1]["nll"] != full["final"]["nll"]
  again = run.train_and_evaluate(tiny_config, str(tmp_path / "stopped"))
  assert again["steps"] == 2 and again["train_time_s"] == r["train_time_s"]  # read back


def test_init_from_starts_from_another_runs_weights(tmp_path, tiny_config, tiny_run):
  import jax
  import numpy as np
  from ensemble_jax import config_lib

  workdir, first = tiny_run  # the tiny config's run
  warm = tiny_config.copy_and_resolve_references()
  warm.train.init_from = str(workdir)
  warm.optim.learning_rate = 0.0  # nothing moves: the final weights are the loaded ones
  second = run.fit(warm, str(tmp_path / "b"))
  for a, b in zip(jax.tree.leaves(first.state.params), jax.tree.leaves(second.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  warm.train.init_from = str(tmp_path / "nowhere")
  with pytest.raises(config_lib.ConfigError, match="init_from"):
    run.fit(warm, str(tmp_path / "c"))
