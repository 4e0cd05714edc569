"""The cost-vs-time sweep: calibration by compiled program, tuning, seeds, the report,
finished points skipped, and the same study under JAX's multi-controller runtime."""
import copy
import glob
import importlib
import json
import os
import shutil
import sys

import numpy as np
import pytest

from ensemble_jax import costs, run, train, validation
from experiments.sweeps import cost_vs_time
from tests.conftest import REPO, free_port, run_processes, subprocess_env, untimed

pytestmark = pytest.mark.e2e

CONFIG = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
SMOKE_POINTS = (("data_parallel", "D2"), ("ensemble", "N8_L4"))
MULTIHOST_TIMEOUT_S = 240


# make test runs each file's tests on one xdist worker (--dist loadfile): made once.
@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory):
  """The smoke grid swept once on seeds 0 and 1: (workdir, the run counts)."""
  workdir = tmp_path_factory.mktemp("smoke_sweep")
  return workdir, cost_vs_time.run(CONFIG, str(workdir), seeds=[0, 1], grid="smoke")


def _records(workdir: str) -> dict:
  """{run path: what a study decides from}: tuning records' choices and runs, and each
  run's evaluations, final metrics, target, the ensemble's per-worker and ensemble blocks
  and its logged metric lines (timings and costs left out)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(workdir, "*", "*", "tuning.json"))):
    with open(path) as f:
      record = json.load(f)
    out[os.path.relpath(path, workdir)] = {
        "chosen": record["chosen"],
        "runs": [{k: r[k] for k in ("run", "value", "reached", "steps_to_target", "final")}
                 for axis in record["axes"] for r in axis["runs"]]}
  for path in sorted(glob.glob(os.path.join(workdir, "*", "*", "*", "*", "results.json"))
                     + glob.glob(os.path.join(workdir, "*", "*", "seed*", "results.json"))):
    with open(path) as f:
      r = json.load(f)
    metrics, lines = os.path.join(os.path.dirname(path), "metrics.jsonl"), None
    if os.path.exists(metrics):  # a seed run taken from tuning has none of its own
      with open(metrics) as f:
        lines = [json.loads(line) for line in f]
    out[os.path.relpath(path, workdir)] = untimed({
        "history": r["history"], "final": r["final"], "steps": r["steps"],
        "target": {k: r["target"][k] for k in ("reached", "reached_step")},
        "metrics_lines": lines, "method": r["method"], "mesh": r["mesh"],
        "num_devices": r["num_devices"],
        **{k: r[k] for k in ("num_params_per_worker", "per_worker", "ensemble") if k in r}})
  return out


def _close(a, b, path=""):
  if isinstance(a, dict):
    assert a.keys() == b.keys(), path
    for k in a:
      _close(a[k], b[k], f"{path}/{k}")
  elif isinstance(a, list):
    assert len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _close(x, y, f"{path}/{i}")
  elif isinstance(a, float):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=path)
  else:
    assert a == b, path


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_study_on_two_processes_matches_one(smoke_sweep, tmp_path):
  """2 processes x 4 fake CPU devices, each running the same `--distributed` command on one
  shared workdir, make the records of the module's 1 process x 8 devices: the tuning
  choice, every run's evaluations, target, per-worker and ensemble results and metric
  lines (timings and costs left out). The ensemble's curve only, its 8 workers split
  across the processes: the test of one ensemble run on two processes (data-parallel's:
  tests/test_multihost.py). First in the module: later tests rewrite cost blocks only,
  which the records leave out."""
  single, _ = smoke_sweep
  multi = str(tmp_path / "multi")
  cmd = [sys.executable, "-m", "experiments.sweeps.cost_vs_time", f"--config={CONFIG}",
         f"--workdir={multi}", "--grid=smoke", "--curves=ensemble", "--seeds=0",
         "--compile_cache=",
         "--distributed", f"--coordinator_address=localhost:{free_port()}",
         "--num_processes=2"]
  env = subprocess_env(4, JAX_PLATFORMS="cpu")
  run_processes([cmd + [f"--process_id={i}"] for i in range(2)], env, str(tmp_path / "p"),
                MULTIHOST_TIMEOUT_S)
  assert os.path.exists(os.path.join(multi, "table.md"))  # process 0's report
  got, want = _records(multi), _records(str(single))
  assert any(k.endswith("tuning.json") for k in got) and any("seed0" in k for k in got)
  assert {k.split(os.sep)[0] for k in got} == {"ensemble"}
  for record in (v for k, v in got.items() if k.endswith("results.json")):
    assert record["method"] == "ensemble" and record["num_devices"] == 8
    assert record["mesh"] == {"worker": 8, "data": 1}
  _close(got, {k: want[k] for k in got})


def test_smoke_sweep_tunes_runs_seeds_then_skips_finished_points(smoke_sweep):
  tmp_path, first = smoke_sweep
  # Two rates per point on seed 0; seed 0 is the chosen tuning run, seed 1 trains.
  assert first == {"tuning_runs": 4, "trained": 2, "resumed": 0, "from_tuning": 2,
                   "skipped": 0, "read_back": 0, "diverged": 0}
  for curve, point in SMOKE_POINTS:
    point_dir = tmp_path / curve / point
    record = json.loads((point_dir / "tuning.json").read_text())
    assert sorted(os.listdir(point_dir / "tune")) == sorted(r["run"].split(os.sep)[1]
                                                             for r in record["axes"][0]["runs"])
    assert record["compute"]["runs"] == 2 and record["compute"]["flops"] > 0
    chosen = json.loads((point_dir / record["chosen_run"] / "results.json").read_text())
    for seed in (0, 1):
      results = json.loads((point_dir / f"seed{seed}" / "results.json").read_text())
      assert results["tuning"] == record and results["config"]["seed"] == seed
      assert results["config"]["optim"]["learning_rate"] == record["chosen"][
          "optim.learning_rate"]
      assert results["step_budget"] == 4 and "resolution_steps" in results["target"]
      if seed == 0:  # the tuning run itself, not trained twice
        assert results["history"] == chosen["history"]
  # The two points compile to one per-device program (one model at batch 32): one timing.
  calibrations = [d for d in (tmp_path / "calibration").iterdir() if d.is_dir()]
  assert len(calibrations) == 1
  assert (tmp_path / "table.md").exists() and (tmp_path / "cost_vs_time_ib_xdr800.png").exists()
  # Its report would be the one above (~1.2 s of CPU for three figures; a re-run's report is
  # tests/test_workload_study.py's check, `_run_twice`); the next run's, beside a run set
  # aside, is written.
  again = cost_vs_time.run(CONFIG, str(tmp_path), seeds=[0, 1], grid="smoke",
                           write_report=False)
  assert again == {"tuning_runs": 0, "trained": 0, "resumed": 0, "from_tuning": 0,
                   "skipped": 4, "read_back": 4, "diverged": 0}
  # A finished seed run at another rate than the point's choice (the point was tuned again)
  # is set aside, kept, and trained again at the choice.
  point = tmp_path / "data_parallel" / "D2"
  results = json.loads((point / "seed1" / "results.json").read_text())
  rate = results["config"]["optim"]["learning_rate"]
  results["config"]["optim"]["learning_rate"] = 3 * rate
  (point / "seed1" / "results.json").write_text(json.dumps(results))
  third = cost_vs_time.run(CONFIG, str(tmp_path), seeds=[0, 1], grid="smoke")
  assert third == {"tuning_runs": 0, "trained": 1, "resumed": 0, "from_tuning": 0,
                   "skipped": 3, "read_back": 4, "diverged": 0}
  aside = point / "superseded" / f"seed1-lr{3 * rate:.4g}"
  assert json.loads((aside / "results.json").read_text()) == results
  retrained = json.loads((point / "seed1" / "results.json").read_text())
  assert retrained["config"]["optim"]["learning_rate"] == rate
  def evals(r):
    return [{k: v for k, v in h.items() if not k.endswith("time_s")} for h in r["history"]]

  assert evals(retrained) == evals(results)  # the same run as before it was set aside
  shutil.rmtree(point / "superseded")  # the shared sweep as it was


def test_methods_with_the_same_per_device_program_share_one_calibration(tmp_path):
  """DP at D = 2 (batch 64) and an ensemble worker (batch 32), tuned to other learning
  rates, warm-ups and schedule lengths, time one program once (the calibration's own
  schedule); the config-keyed cache timed them apart."""
  from experiments.configs import fashion_mnist

  dp = fashion_mnist.get_config("tiny")
  dp.train.batch_size, dp.cost.devices = 64, 2
  worker = fashion_mnist.get_config("ensemble,tiny")
  worker.optim.learning_rate *= 4
  worker.optim.warmup_fraction = 0.5
  worker.train.schedule_fraction = 0.25
  calibration = str(tmp_path / "calibration")
  assert cost_vs_time.calibrate(dp, calibration) == cost_vs_time.calibrate(worker, calibration)
  assert len([d for d in (tmp_path / "calibration").iterdir() if d.is_dir()]) == 1
  wider = fashion_mnist.get_config("tiny")
  wider.model.width = 8  # another program: another fingerprint
  keys = {cost_vs_time._program_key(cost_vs_time.device_config(c), calibration)
          for c in (dp, worker, wider)}
  assert len(keys) == 2


@pytest.mark.unit
def test_a_point_priced_like_another_takes_its_seed_runs_step(tmp_path, monkeypatch):
  """A curve added to a committed study (`cost.price_like`) is priced at the step its
  namesake's seed runs were priced at, not at a new calibration of a program whose
  fingerprint moved since; before they have run it is calibrated; seed runs priced
  apart are refused."""
  from experiments.configs import fashion_mnist

  calibrated = []
  monkeypatch.setattr(cost_vs_time, "calibrate", lambda c, d: calibrated.append(d) or 0.05)
  config = fashion_mnist.get_config("ensemble,sweep")
  config.cost.price_like = "ensemble/N8_L235"
  assert cost_vs_time.device_step_time(config, "cal", str(tmp_path)) == 0.05
  assert calibrated == ["cal"]

  def seed_run(seed, step):
    path = tmp_path / "ensemble" / "N8_L235" / f"seed{seed}" / run.RESULTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cost": {"modelled": {"device_step_time_s": step}}}))

  seed_run(1, 0.166)
  seed_run(2, 0.166)
  assert cost_vs_time.device_step_time(config, "cal", str(tmp_path)) == 0.166
  assert calibrated == ["cal"]
  seed_run(3, 0.09)
  with pytest.raises(SystemExit, match="recost them at one calibration"):
    cost_vs_time.device_step_time(config, "cal", str(tmp_path))
  config.cost.device_step_time_s = 0.2  # given outright
  assert cost_vs_time.device_step_time(config, "cal", str(tmp_path)) == 0.2


@pytest.mark.unit
def test_a_point_re_run_keeps_the_step_its_seed_runs_were_priced_at(tmp_path, monkeypatch):
  """A committed study's point tuned again (a changed rule) keeps the device step its seed
  runs were priced at: a program that moved since would otherwise be timed on whatever
  host re-runs it, beside points timed on another. Before any seed has run it is
  calibrated."""
  from experiments.configs import fashion_mnist

  calibrated = []
  monkeypatch.setattr(cost_vs_time, "calibrate", lambda c, d: calibrated.append(d) or 0.05)
  config = fashion_mnist.get_config("ensemble,sweep")
  point_dir = tmp_path / "ensemble" / "N8_L235"
  assert cost_vs_time.device_step_time(config, "cal", str(tmp_path), str(point_dir)) == 0.05
  for seed in (1, 2, 3):
    path = point_dir / f"seed{seed}" / run.RESULTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cost": {"modelled": {"device_step_time_s": 0.166}}}))
  assert cost_vs_time.device_step_time(config, "cal", str(tmp_path), str(point_dir)) == 0.166
  assert calibrated == ["cal"]


@pytest.mark.unit
def test_pools_are_re_timed_only_on_the_host_that_timed_the_calibrations(tmp_path):
  """--retime_pools beside a calibration timed on another machine would charge pool builds
  from one host beside device steps from another: refused, naming both and the fix."""
  from ensemble_jax import record

  here = record.host_info()
  cal = tmp_path / "calibration" / "abc" / run.RESULTS_FILE
  cal.parent.mkdir(parents=True)
  cal.write_text(json.dumps({"host": here}))
  cost_vs_time._check_calibrated_here(str(tmp_path / "calibration"))  # one host: fine
  cal.write_text(json.dumps({"host": {**here, "cpu": "Another CPU", "cpu_features": ["avx"]}}))
  with pytest.raises(SystemExit, match=r"Another CPU \(avx\).*--recalibrate --retime_pools"):
    cost_vs_time._check_calibrated_here(str(tmp_path / "calibration"))


@pytest.mark.unit
def test_a_pools_re_timed_build_prices_every_run_that_read_it(tmp_path, monkeypatch):
  """A point re-run after its pools were re-timed builds each pool again itself, on its
  own host; the re-timed build of the same pool (kept in the superseded runs) prices it."""
  retimed = {"builder": "kmeans", "build_time_s": 1.9, "retimed": "bit for bit",
             "cached": "study/pools/abc.npz"}
  own = {"builder": "kmeans", "build_time_s": 0.7, "cached": "study/pools/abc.npz"}
  for where, distill in (("p/N8/superseded/seed1-lr0.1", retimed), ("p/N8/seed1", own),
                         ("p/N8/seed2", {**own, "cached": "study/pools/xyz.npz"})):
    path = tmp_path / where / run.RESULTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"distill": distill}))
  before = cost_vs_time._retimed_pools(str(tmp_path))
  assert before == {
      "abc.npz": {"builder": "kmeans", "build_time_s": 1.9, "retimed": "bit for bit"}}
  monkeypatch.setattr(cost_vs_time.costs, "summary", lambda results, *a, **k: "priced")
  for where, expected in (("p/N8/seed1", 1.9), ("p/N8/seed2", 0.7)):
    path = tmp_path / where / run.RESULTS_FILE
    results = json.loads(path.read_text())
    path.write_text(json.dumps({**results, "config": {"cost": {"devices": 8}},
                                "cost": {"modelled": {"device_step_time_s": 0.1}}}))
    cost_vs_time._recost_file(str(path), None, None, {}, before)
    assert json.loads(path.read_text())["distill"]["build_time_s"] == expected


@pytest.mark.unit
def test_a_taught_point_is_priced_like_its_untaught_twin_plus_the_teachers_forward(
    tmp_path, monkeypatch):
  from experiments.configs import fashion_mnist

  # XLA's FLOPs of a device program, faked: 4 with the teacher's forward, 3 without
  monkeypatch.setattr(cost_vs_time.train, "compile_step", lambda c: bool(c.distill.teacher))
  monkeypatch.setattr(cost_vs_time.costs, "flops", lambda taught: 4.0 if taught else 3.0)
  monkeypatch.setattr(cost_vs_time, "calibrate", lambda c, d: pytest.fail("calibrated"))
  config = fashion_mnist.get_config("ensemble,sweep")
  config.cost.price_like = "../full/ensemble/N8_L235"  # another study's, beside this one's
  for seed in (1, 2):
    path = tmp_path / "full" / "ensemble" / "N8_L235" / f"seed{seed}" / run.RESULTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cost": {"modelled": {"device_step_time_s": 0.15}}}))
  workdir = str(tmp_path / "kd")  # not made yet: '..' resolves lexically
  assert cost_vs_time.device_step_time(config, "cal", workdir) == 0.15
  config.distill.teacher, config.distill.kd_weight = "/a/teacher", 0.5
  assert cost_vs_time.device_step_time(config, "cal", workdir) == pytest.approx(0.2)


@pytest.mark.unit
def test_a_distilled_point_is_priced_like_its_ensemble_times_its_augmentation(
    tmp_path, monkeypatch):
  """A distilled set's examples are augmented in every step (`distill.synthetic_augment`):
  its point is priced at its ensemble's step times the augmented step over the plain one
  (`augment_factor`, read from the calibration's record); without the augmentation, or on
  real examples, at the ensemble's step."""
  from experiments.configs import fashion_mnist

  monkeypatch.setattr(cost_vs_time, "_program_key", lambda c, d: "f00d")
  monkeypatch.setattr(cost_vs_time, "calibrate", lambda c, d: pytest.fail("calibrated"))
  (tmp_path / "cal").mkdir()
  (tmp_path / "cal" / cost_vs_time.AUGMENT_FACTORS).write_text(json.dumps(
      {"f00d/dsa": {"factor": 1.25, "plain_step_s": 0.04, "augmented_step_s": 0.05}}))
  for seed in (1, 2):
    path = tmp_path / "ensemble" / "N8_L235" / f"seed{seed}" / run.RESULTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cost": {"modelled": {"device_step_time_s": 0.15}}}))
  config = fashion_mnist.get_config("ensemble,sweep")
  config.cost.price_like = "ensemble/N8_L235"
  priced = lambda: cost_vs_time.device_step_time(config, str(tmp_path / "cal"), str(tmp_path))
  assert priced() == 0.15
  config.distill.builder = "distribution_matching"
  assert priced() == pytest.approx(0.15 * 1.25)
  config.distill.synthetic_augment = "none"
  assert priced() == 0.15


def test_the_augmentation_factor_times_the_augmented_program_beside_the_plain_one(
    tmp_path, monkeypatch):
  """`augment_factor` times the device program on synthetic-marked batches (the step
  augments them: more work) beside the plain one, records both medians, and reads the
  record back without timing again."""
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  config.distill.builder, config.cost.calibration_steps = "distribution_matching", 6
  device = cost_vs_time.device_config(config).to_dict()
  built, step_runner = {}, train.step_runner  # {synthetic: the runner augment_factor timed}

  def recorded(c, synthetic=False):
    assert c.to_dict() == device  # the device program
    built[synthetic] = step_runner(c, synthetic=synthetic)
    return built[synthetic]

  monkeypatch.setattr(cost_vs_time.train, "step_runner", recorded)
  factor = cost_vs_time.augment_factor(config, str(tmp_path))
  assert costs.flops(built[True][0]) > costs.flops(built[False][0])  # the timed programs
  [(key, entry)] = json.loads((tmp_path / cost_vs_time.AUGMENT_FACTORS).read_text()).items()
  assert key.endswith("/dsa") and entry["plain_step_s"] > 0
  assert factor == entry["augmented_step_s"] / entry["plain_step_s"] == entry["factor"]
  monkeypatch.setattr(cost_vs_time.train, "step_runner", lambda *a, **k: pytest.fail("timed"))
  assert cost_vs_time.augment_factor(config, str(tmp_path)) == factor


@pytest.mark.unit
def test_the_full_grids_distilled_curves_are_priced_like_their_ensembles():
  from experiments import sweeps

  module = sweeps.load_config_module(CONFIG)
  grid = module.sweep_grid("full")
  for curve in ("ensemble_distilled", "ensemble_distilled_warm"):
    for point, (variant, overrides) in grid[curve].items():
      assert overrides["cost.price_like"] == f"ensemble/{point}"
      assert point in grid["ensemble"]


def test_the_calibrated_step_is_one_devices_program_on_one_device():
  """The calibration times one model at the per-device batch on one of the host's eight
  simulated devices; its mesh once took them all (`data: -1`), so the "device step" was
  the per-device batch split eight ways over the host's shared cores."""
  import jax

  from ensemble_jax import sharding
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("sweep")
  config.train.batch_size, config.cost.devices = 512, 8
  c = cost_vs_time.device_config(config)
  assert jax.device_count() == 8 and c.train.batch_size == 64
  assert sharding.mesh_shape(c.mesh, jax.device_count()) == [("data", 1)]


@pytest.mark.unit
def test_program_fingerprint_ignores_source_locations_and_scalar_constants():
  text = """HloModule jit_train_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

FileNames
1 "/a/train.py"

StackFrames
1 {file_location_id=1 parent_frame_id=1}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %constant.1 = f32[] constant(0.003)
  %broadcast = f32[8]{0} broadcast(%constant.1), metadata={op_name="lr" stack_frame_id=1}
  ROOT %multiply = f32[8]{0} multiply(%p, %broadcast)
}
"""
  same = (text.replace("0.003", "0.012").replace('"/a/train.py"', '"/b/other.py"')
          .replace("stack_frame_id=1}", "stack_frame_id=7}"))
  wider = text.replace("f32[8]", "f32[16]")
  fingerprint = cost_vs_time.program_fingerprint
  assert fingerprint(text) == fingerprint(same)
  assert fingerprint(text) != fingerprint(wider)
  assert fingerprint(text) != fingerprint(text.replace("multiply(", "add("))


def test_recost_rewrites_cost_blocks_from_calibration(smoke_sweep):
  tmp_path, _ = smoke_sweep
  path = tmp_path / "data_parallel" / "D2" / "seed0" / "results.json"
  before = json.loads(path.read_text())
  calibration = next((tmp_path / "calibration").glob("*/results.json"))
  timed = calibration.read_text()
  record = json.loads(timed)
  record["step_time_s"] = 1.5  # as if re-timed
  calibration.write_text(json.dumps(record))
  assert cost_vs_time.recost(CONFIG, str(tmp_path), "smoke") == 4  # 2 points x 2 seeds
  after = json.loads(path.read_text())
  assert after["cost"]["modelled"]["device_step_time_s"] == 1.5
  assert after["cost"]["measured"] == before["cost"]["measured"]
  # The collectives the run read off its programs (D2: compiled on 2 of the 8 devices) stay.
  assert after["cost"]["modelled"]["collectives"] == before["cost"]["modelled"]["collectives"]
  assert "{'data': 2} mesh" in after["cost"]["modelled"]["collectives_source"]
  steps = after["cost"]["measured"]["steps_to_target"]
  assert after["cost"]["modelled"]["critical_path_s"]["nvlink"] >= steps * 1.5
  # The tuning runs are recosted too, and the tuning compute with them.
  tuning = after["tuning"]["compute"]
  assert tuning["time_s"]["nvlink"] >= 1.5 * sum(
      r["steps_to_target"] or 4 for r in after["tuning"]["axes"][0]["runs"])
  # One curve only: the other's runs keep their cost blocks.
  calibration.write_text(json.dumps({**record, "step_time_s": 2.5}))
  assert cost_vs_time.recost(CONFIG, str(tmp_path), "smoke", curves=["ensemble"]) == 2
  assert json.loads(path.read_text())["cost"] == after["cost"]
  ensemble = tmp_path / "ensemble" / "N8_L4" / "seed0" / "results.json"
  assert json.loads(ensemble.read_text())["cost"]["modelled"]["device_step_time_s"] == 2.5
  calibration.write_text(timed)  # the shared sweep as it was
  cost_vs_time.recost(CONFIG, str(tmp_path), "smoke")
  # keep_device_step re-applies the cost model to the device step each run records,
  # whatever the calibration now says (nothing re-timed on a busy machine).
  kept = json.loads(path.read_text())["cost"]["modelled"]["device_step_time_s"]
  calibration.write_text(json.dumps({**record, "step_time_s": 9.0}))
  assert cost_vs_time.recost(CONFIG, str(tmp_path), "smoke", keep_device_step=True) == 4
  assert json.loads(path.read_text())["cost"]["modelled"]["device_step_time_s"] == kept
  calibration.write_text(timed)


def test_recost_reads_the_collectives_of_a_run_whose_own_reading_failed(smoke_sweep):
  """Regression: a run whose end-of-run reading failed (a child process that could not
  build its programs) keeps the legacy model, which the projection refuses; recost reads
  the run's compiled programs instead of carrying the legacy model over."""
  tmp_path, _ = smoke_sweep
  path = tmp_path / "ensemble" / "N8_L4" / "seed1" / "results.json"
  good = path.read_text()
  results = json.loads(good)
  results["cost"]["modelled"]["collectives"] = []
  results["cost"]["modelled"]["collectives_source"] = "legacy, not read from HLO (failed)"
  path.write_text(json.dumps(results))
  try:
    cost_vs_time.recost(CONFIG, str(tmp_path), "smoke")
    after, want = (json.loads(t)["cost"]["modelled"] for t in (path.read_text(), good))
    assert after["collectives"] == want["collectives"] and after["collectives"]
    assert after["collectives_source"] == want["collectives_source"]
  finally:
    path.write_text(good)


@pytest.mark.unit
@pytest.mark.parametrize("workload,n8_point", [("fashion_mnist", "N8_L235"),
                                               ("pydocs_gpt2", "N8_L300")])
def test_the_many_worker_grid_uses_what_the_committed_grid_tuned_at_n8(workload, n8_point):
  """make many-workers holds each curve at the full grid's tuned N = 8 choice (rate and
  schedule length) and L (its config says why); the two must not drift apart when the grid
  is re-tuned, and its N = 8 point is the full grid's, measured again."""
  configs = importlib.import_module(f"experiments.configs.{workload}")
  grid = configs.sweep_grid("many_workers")
  for curve, points in grid.items():
    with open(os.path.join(REPO, "experiments", "results", workload, curve, n8_point,
                           "tuning.json")) as f:
      chosen = json.load(f)["chosen"]
    _, n8 = points[n8_point]
    for name, (variant, overrides) in points.items():
      assert {k: overrides[k] for k in chosen} == chosen, (curve, name)
      assert overrides["tune.factors"] == (1.0,)
      assert overrides["method.steps_per_worker"] == n8["method.steps_per_worker"], name
      # every point is a valid config
      validation.validate(cost_vs_time._point_config(configs, variant, overrides, 0, "w"))
    _, full = configs.sweep_grid("full")[curve][n8_point]
    def trained(overrides):  # what the point trains, apart from its tuned values
      return {k: v for k, v in overrides.items()
              if k not in chosen and not k.startswith(("optim.", "tune."))}

    assert trained(n8) == trained(full)


@pytest.mark.unit
def test_sweeps_keep_compiled_programs_unless_the_environment_names_a_cache(monkeypatch,
                                                                             tmp_path):
  import jax

  from experiments import sweeps

  before = jax.config.jax_compilation_cache_dir
  try:
    sweeps.use_compile_cache(str(tmp_path / "a"))  # conftest names the suite's cache
    assert jax.config.jax_compilation_cache_dir == before
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    sweeps.use_compile_cache("")  # off
    assert jax.config.jax_compilation_cache_dir == before
    sweeps.use_compile_cache(str(tmp_path / "b"))
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "b")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def test_points_select_a_subset_of_the_grid_and_unknown_names_fail_before_training(
    smoke_sweep, tmp_path):
  finished, _ = smoke_sweep
  only_d2 = cost_vs_time.run(CONFIG, str(finished), seeds=[0, 1], grid="smoke",
                             point_names=["D2"], write_report=False)  # the sweep's, as was
  assert only_d2 == {"tuning_runs": 0, "trained": 0, "resumed": 0, "from_tuning": 0,
                     "skipped": 2, "read_back": 2, "diverged": 0}
  with pytest.raises(SystemExit, match=r"--points \['N3_L4'\] not in the curves.*N8_L4"):
    cost_vs_time.run(CONFIG, str(tmp_path), seeds=[0], grid="smoke", point_names=["N3_L4"])
  assert not any(tmp_path.iterdir())  # nothing calibrated or trained


def test_workers_widened_over_spare_devices_are_priced_on_one_device_each(tmp_path):
  """N = 2 workers on 8 fake devices run as worker:2,data:4 (a layout), yet the point stands
  for 2 devices, one worker each: the cost block prices 2 devices and no collective inside
  a worker (it priced 8 and the workers' own gradient all-reduces)."""
  from experiments.configs import fashion_mnist

  # The tiny ResNet in one stage of one block, not two: the layout and its pricing are under
  # test, not the network, and its programs compile quicker (this test after the module's
  # smoke sweep, from a cold compile cache: 6.4 -> 4.5 s of CPU).
  config = cost_vs_time._point_config(fashion_mnist, "ensemble,tiny",
                                      {"method.num_workers": 2, "model.stage_sizes": (1,)},
                                      0, str(tmp_path))
  assert config.mesh == "worker:2,data:4" and config.cost.devices == 2
  results = run.train_and_evaluate(config, str(tmp_path / "run"))
  assert results["mesh"] == {"worker": 2, "data": 4}

  def priced(results):
    modelled = results["cost"]["modelled"]
    return modelled["devices"], len({round(t, 9) for t in modelled["critical_path_s"].values()})

  assert priced(results) == (2, 1)  # 2 devices, no network on the critical path
  # A run priced before on all 8 devices is read again on the point's 2 by --recost.
  old = copy.deepcopy(config)
  old.cost.devices = 0
  stale = run.train_and_evaluate(old, str(tmp_path / "stale"))
  assert priced(stale) == (8, 3)
  path = str(tmp_path / "stale" / "results.json")
  cost_vs_time._recost_file(path, None, config)
  with open(path) as f:
    assert priced(json.load(f)) == (2, 1)
