"""Every command in the bash blocks of README.md and docs/ runs as written, so none can rot
unnoticed.

Training commands run with tiny overrides appended (later flags win), in a temporary
workdir, each in a fork of one process that imported the package once
(tests/forked_cli.py); commands that need data or hardware a test machine lacks are
skipped with the reason. A command this file does not know fails until it is given its
overrides or a skip reason. Data-parallel commands run on two simulated CPU devices. Every
ensemble and DiLoCo command runs on 8 (an 8-GPU server or a TPU v3-8), with overrides that
leave its workers, its batches' divisibility and so its layout as written (`LAYOUT_FREE`;
checked against the command as written), and has its layout on 1 (a user's laptop) and on
8 checked: the default mesh must fit its N workers to either count. (It once ran them with
num_workers=2 on two devices, and `:smoke,ensemble` failed on every 8-device host unseen.)
Several workers to a device train in the N = 16 command here, in tests/test_ensemble.py
(16 on 8 devices) and in tests/test_diloco.py (4 on 1). The quickest
documented run (`:smoke`) runs at its own size, as written: it must learn
(test_the_smoke_run_learns_and_prints_nothing_it_cannot_act_on); its ensemble and DiLoCo
forms run at their own size too, capped at 2 steps (`STEP_CAP`).
"""
import glob
import json
import os
import re
import shlex
import sys

import pytest

from tests import forked_cli
from tests.conftest import REPO, subprocess_env

pytestmark = pytest.mark.docs

TINY = {  # config file -> overrides that keep its run to seconds on a CPU
    # 8 x 8 images: what a model costs per example grows with their area, and `:sweep`
    # scores the 9,936 test images no evaluation saw at its end (13 s of CPU at 28 x 28,
    # 2.4 s at 8 x 8)
    "experiments/configs/fashion_mnist.py": [
        "--config.data.image_size=8",
        "--config.model.width=4", "--config.model.stage_sizes=(1,1)",
        "--config.train.batch_size=16", "--config.train.num_epochs=0",
        "--config.train.num_steps=2", "--config.method.num_workers=2",
        "--config.method.steps_per_worker=2", "--config.eval.num_examples=64",
        "--config.eval.batch_size=64", "--config.eval.every_steps=2"],
    "experiments/configs/pydocs_gpt2.py": [
        "--config.model.size=micro", "--config.data.context=32", "--config.train.batch_size=8",
        "--config.train.num_steps=2", "--config.optim.warmup_steps=1",
        "--config.method.num_workers=2", "--config.method.steps_per_worker=2",
        "--config.eval.num_examples=16", "--config.eval.batch_size=16",
        "--config.eval.every_steps=2"],
}
# The smoke run, whose seconds are its point, runs as documented (not at TINY's size) with
# one override, the mesh (one of the two devices): test_the_smoke_run_learns_... reads it.
SMOKE = ("python -m ensemble_jax.main --config=experiments/configs/fashion_mnist.py:smoke"
         " --workdir=WORKDIR")
AS_WRITTEN = {SMOKE: ["--config.mesh=data:1"]}
# Ensemble and DiLoCo commands: the device counts each one's layout is checked on, the one
# each trains on, and what of TINY they keep (all but the fields that choose the layout:
# the workers and the mesh).
STACKED_DEVICES = (1, 8)
STACKED_TRAINED = 8
LAYOUT_FIELDS = ("--config.method.num_workers=", "--config.mesh=")
# Smoke-sized stacked commands: at their own size, two steps (an eval every 2 steps: the
# stop comes at the first eval at or past train.stop_at_step).
STEP_CAP = ["--config.train.stop_at_step=2", "--config.eval.every_steps=2"]
SKIP = {  # command prefix -> why it does not run here
    "make demo": "the reduced sweep (minutes); tests/test_sweep.py runs its grid at smoke size",
    "make test": "this test suite itself (make test-fast: its unit tier)",
    "make install data": "sets up the venv and the data this suite runs in",
    "python -m ensemble_jax.data.fetch": "fetches the datasets from Debian's archive; "
                                         "tests/test_fetch.py covers the fetcher",
    "make pile": "needs the Pile shards and a GPT-2 tokenizer (PILE_DIR, TOKENIZER_DIR)",
    "pip install -e '.[slurm]'": "submitit, which the test extra installs here",
    "python -m experiments.sweeps.cost_vs_time --config=experiments/configs/imagenet_resnet50.py":
        "needs ImageNet and a SLURM cluster; tests/test_slurm.py submits the smoke study to "
        "one it starts (make test-slurm)",
    "make study": "a whole cost-vs-time study; tests/test_workload_study.py runs the real "
                  "workloads' smoke grids through it",
    "tfds build imagenet2012": "needs the ImageNet tar files and TensorFlow",
    "python -c 'from experiments.bench import input_pipeline": "writes the mock ImageNet the "
        "next command reads; tests/test_input_pipeline.py writes and reads one",
    "make imagenet DATA_DIR=/tmp/mock_tfds": "the smoke study on a mock ImageNet (minutes); "
        "tests/test_workload_study.py runs it on tfds's mock data",
    "python -m ensemble_jax.main --config=experiments/configs/imagenet_resnet50.py":
        "needs ImageNet prepared as array_record",
    "python -m ensemble_jax.main --config=experiments/configs/fashion_mnist.py "
    "--config.data.source=folder": "needs the user's own image tree; tests/test_data.py builds "
                                   "one and trains on it",
}


def documented_pages() -> list[str]:
  """README.md and every Markdown page under docs/."""
  return [os.path.join(REPO, "README.md")] + sorted(
      glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def _commands() -> list[str]:
  """The bash-block commands of every documented page, continuation lines joined,
  comments dropped."""
  blocks = []
  for page in documented_pages():
    with open(page) as f:
      blocks += re.findall(r"^```bash\n(.*?)^```", f.read(), flags=re.M | re.S)
  commands = []
  for block in blocks:
    for line in block.replace("\\\n", " ").splitlines():
      words = shlex.split(line, comments=True)
      if words:  # where it writes is not what it runs: commands differing only there are one
        commands.append(re.sub(r"--workdir=\S+", "--workdir=WORKDIR", shlex.join(words)))
  return commands


def _config_arg(command: str) -> tuple[str, set[str]]:
  """The command's config file and its variants."""
  arg = next(a for a in shlex.split(command) if a.startswith("--config=")).split("=", 1)[1]
  path, _, variants = arg.partition(":")
  return path, {v for v in variants.split(",") if v}


def stacked(command: str) -> bool:
  """Whether the command trains an ensemble or DiLoCo (its variants or its overrides)."""
  return bool(_config_arg(command)[1] & {"ensemble", "diloco"}) or any(
      f"--config.method.name={m}" in command for m in ("ensemble", "diloco"))


LAYOUT_FREE = {config: [o for o in tiny if not o.startswith(LAYOUT_FIELDS)]
               for config, tiny in TINY.items()}


def _overrides(command: str, config: str) -> list[str]:
  if command in AS_WRITTEN:
    return AS_WRITTEN[command]
  if stacked(command):
    return STEP_CAP if "smoke" in _config_arg(command)[1] else LAYOUT_FREE[config]
  return TINY[config]


def _plan(command: str):
  """(argv with the tiny overrides and workdir '{workdir}', None) or (None, skip reason)."""
  for prefix, reason in SKIP.items():
    if command.startswith(prefix):
      return None, reason
  argv = shlex.split(command)
  if argv[:3] != ["python", "-m", "ensemble_jax.main"]:
    return None, None
  config = _config_arg(command)[0]
  if config not in TINY:
    return None, None
  argv = [a if not a.startswith("--workdir=") else "--workdir={workdir}" for a in argv[3:]]
  return [sys.executable, "-m", "ensemble_jax.main", *argv, *_overrides(command, config)], None


def _config_of(argv: list[str]):
  """The config an argv of ensemble_jax.main trains: its file's get_config(variants) with
  its --config.* overrides (later ones win), without JAX."""
  import ast

  from ensemble_jax import config_lib
  from experiments import sweeps

  path, variants = _config_arg(shlex.join(argv))
  config = sweeps.load_config_module(os.path.join(REPO, path)).get_config(",".join(
      sorted(variants)))
  for arg in argv:
    if arg.startswith("--config."):
      key, value = arg[len("--config."):].split("=", 1)
      try:
        value = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        pass
      config_lib.set_dotted(config, key, value)
  return config


def layout(argv: list[str], devices: int) -> dict:
  """The mesh {axis: size} an argv's run takes on `devices` (the default mesh fitted)."""
  from ensemble_jax import methods, sharding

  config = _config_of(argv)
  methods.fit_workers_to_devices(config, devices)
  return dict(sharding.mesh_shape(config.mesh, devices))


COMMANDS = sorted(set(_commands()))


def test_the_docs_have_commands_and_each_has_a_plan():
  assert len(COMMANDS) >= 10, COMMANDS  # the parser found the blocks
  unknown = [c for c in COMMANDS if _plan(c) == (None, None)]
  assert not unknown, f"documented commands without tiny overrides (TINY) or a SKIP reason: {unknown}"


def test_the_smoke_command_is_documented_and_runs_as_written():
  assert SMOKE in RUNS, RUNS  # else the smoke test below reads no run


def test_commands_in_docs_pages_are_collected():
  """The pages under docs/ count, not only the README: a command only usage.md shows is
  among the commands."""
  assert any(":sweep,ensemble" in c for c in COMMANDS), COMMANDS


RUNS = [c for c in COMMANDS if _plan(c)[0] and not stacked(c)]
STACKED = [c for c in COMMANDS if _plan(c)[0] and stacked(c)]
# Every stacked command trains on 8 devices (several workers to a device where N > 8); the
# layout of every one on 1 and 8 is checked without training (the test below). Training
# them on 1 device too (a laptop: every worker on one device) cost about a minute of the
# suite's compiles for the full-size ones and 20 s of CPU for the two smoke-sized ones;
# tests/test_diloco.py trains DiLoCo's 4 workers on one device in about 2 s.
STACKED_RUNS = [(c, STACKED_TRAINED) for c in STACKED]


def test_ensemble_and_diloco_commands_are_documented_and_run_at_their_layout():
  """The stacked commands include both smoke forms and one of N = 16; the overrides they
  run with leave their layout on 1 and 8 devices as written (workers, mesh, batches)."""
  variants = [_config_arg(c)[1] for c in STACKED]
  assert {"smoke", "ensemble"} in variants and {"smoke", "diloco"} in variants, STACKED
  assert any("num_workers=16" in c for c in STACKED), STACKED
  for command in STACKED:
    written = shlex.split(command)
    for devices in STACKED_DEVICES:
      assert layout(_plan(command)[0], devices) == layout(written, devices), (command, devices)
  smoke_ensemble = STACKED[variants.index({"smoke", "ensemble"})]
  assert layout(shlex.split(smoke_ensemble), 8) == {"worker": 4, "data": 2}


# The smoke run is the one command here whose time is its steps (300), not its compiles: it
# runs on XLA:CPU's optimization level 1, not the suite's 0 (tests/conftest.py), which runs
# its steps twice as fast for a few seconds more of compile (measured from a cold compile
# cache: 58 -> 39 s of CPU). The machine code changes, not the program: its final accuracy
# is 0.739 at either level.
SMOKE_OPTIMIZATION_LEVEL = "--xla_backend_optimization_level=1"


def command_env(command: str, devices: int) -> dict:
  """The environment `command` runs in on `devices` (the smoke run's optimization level)."""
  env = subprocess_env(devices)
  if command == SMOKE:
    env["XLA_FLAGS"] = " ".join(
        [f for f in env["XLA_FLAGS"].split()
         if not f.startswith("--xla_backend_optimization_level=")] + [SMOKE_OPTIMIZATION_LEVEL])
  return env


# One child process imports the package once; each command runs to its end in a fork of it,
# as `python -m ensemble_jax.main` (tests/forked_cli.py), on its own workdir, with the
# environment of its device count (the fork starts its backend: one import serves both
# counts). Data-parallel commands on 2 devices; ensemble and DiLoCo commands on 8.
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{(command, devices): (its workdir, its CompletedProcess)} for every command that
  runs here (data-parallel: 2 devices)."""
  root = tmp_path_factory.mktemp("readme_commands")
  out = {}
  with forked_cli.Forks("ensemble_jax.main", subprocess_env(2), cwd=REPO) as forks:
    for devices, commands in ((2, RUNS), (STACKED_TRAINED, STACKED)):
      workdirs = [root / f"{devices}dev" / str(i) / "wd" for i in range(len(commands))]
      argvs = [[a.format(workdir=workdir) for a in _plan(command)[0]]
               for command, workdir in zip(commands, workdirs)]
      assert all(argv[:3] == [sys.executable, "-m", "ensemble_jax.main"] for argv in argvs)
      procs = [forks.run(argv[3:], timeout_s=600, env=command_env(command, devices))
               for command, argv in zip(commands, argvs)]
      out.update({(c, devices): run for c, run in zip(commands, zip(workdirs, procs))})
  return out


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in COMMANDS if (_plan(c)[0] and not stacked(c))
                                     or _plan(c)[1]])
def test_readme_command_runs(command, request):
  argv, reason = _plan(command)
  if reason:
    pytest.skip(reason)
  workdir, proc = request.getfixturevalue("runs")[(command, 2)]
  assert proc.returncode == 0, (command, proc.stderr[-3000:])
  assert proc.stdout.strip().splitlines()[-1].startswith(f"results: {workdir}/results.json; ")


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("command,devices", STACKED_RUNS)
def test_ensemble_and_diloco_commands_run_on_8_devices(command, devices, runs):
  """As written (the layout's fields untouched): the default mesh fits the workers to the
  devices, the first lines say the layout chosen and results.json records it. Fails on
  75ab1a7 with `num_workers=4 is not a multiple of the mesh's worker axis=8` for
  `:smoke,ensemble` and `:smoke,diloco` on 8 devices."""
  workdir, proc = runs[(command, devices)]
  assert proc.returncode == 0, (command, devices, proc.stderr[-3000:])
  lines = proc.stdout.strip().splitlines()
  assert lines[-1].startswith(f"results: {workdir}/results.json; ")
  results = json.loads((workdir / "results.json").read_text())
  mesh = layout(_plan(command)[0], devices)
  assert results["num_devices"] == devices and results["mesh"] == mesh
  shown = ",".join(f"{k}:{v}" for k, v in mesh.items())
  assert f"{devices} device(s); mesh {shown};" in lines[0]
  workers = results["num_workers"]
  assert results["layout"].startswith(f"{workers} workers on ")
  fitted = mesh != {"worker": devices, "data": 1}  # the default mesh, one worker per device
  assert lines[1].startswith(f"layout: {workers} workers on {devices} devices, mesh "
                             f"{shown} ") == fitted, lines[:2]


@pytest.mark.slow
def test_the_smoke_run_learns_and_prints_nothing_it_cannot_act_on(runs):
  """The quickest documented run, `python -m ensemble_jax.main` in a process of its own (a
  fork, `runs`), reaches a target above chance (10 classes: 0.1), and its output carries
  neither jax's TPU probe nor orbax's handler notice. Fails on 1e4c37a, whose smoke target
  was 0.05, below chance. Its one override (the mesh: one of the two devices) reaches the
  run, and its output says what runs where, what each long phase did, and where the
  results are. (Moved from tests/test_train.py, which ran the same command again.)"""
  workdir, proc = runs[(SMOKE, 2)]
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((workdir / "results.json").read_text())
  assert results["target"]["value"] > 0.1 and results["target"]["reached"]
  for noise in ("Unable to initialize backend", "Type handler registry"):
    assert noise not in proc.stderr
  assert results["steps"] == 300 and results["num_devices"] == 2
  assert results["mesh"] == {"data": 1} and results["config"]["mesh"] == "data:1"
  lines = proc.stdout.strip().splitlines()  # what runs where; where the results are
  assert lines[0].startswith("ensemble_jax: jax ") and "2 device(s); mesh data:1;" in lines[0]
  # Long phases say what they did and how long it took; the parameter table is a file.
  assert "data: fashion_mnist, 60000 train / 10000 eval examples, loaded in " in proc.stderr
  assert f"parameters: 5,122 (per-parameter table: {workdir}/parameters.txt)" in proc.stderr
  table = (workdir / "parameters.txt").read_text()
  assert "| head/kernel " in table and "head/kernel" not in proc.stderr
  assert lines[-1].startswith(f"results: {workdir}/results.json; final accuracy ")
