"""`config.plugins`: a user's module outside the package, imported by every process.

Written as a user would: the plugin is a file in a directory of its own, named in the
config. With more workers than this host's 8 devices, the cost model compiles the
cluster's programs in a child process (`python -m ensemble_jax.communication`), which must
import the plugin too. The run, stop and --help tests fail on 01e37c00: the config had no
`plugins`, the child never imported a plugin, `record.py` priced such a run with the
legacy model (`collectives: []`) after training, exit 0, and --help listed no plugin's.
The sweep's test passes on e158d51a, which has them; it fails where the cost model's child
does not import config.plugins (checked with `plugins.load` dropped from
`communication.build`). tests/test_slurm.py submits the same workload to SLURM.
"""
import subprocess
import sys
import textwrap

import pytest

from ensemble_jax import aggregate, config_lib, plugins
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # the cost model's child compiles 16 devices' programs
# A new aggregation mode, as docs/design.md's "Adding a mode" writes one.
PLUGIN = textwrap.dedent('''
    import jax.numpy as jnp
    from ensemble_jax import aggregate

    @aggregate.register_mode("{name}")
    def last_worker(logits_Nx, weights_N):
      """Worker N-1's scores alone."""
      del weights_N
      return logits_Nx[-1].astype(jnp.float32)
    ''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  """(the plugin's directory, its module name, its mode): a module a user wrote, put on
  this process's path as a user's PYTHONPATH would, removed after the test."""
  directory = tmp_path / "user_code"
  directory.mkdir()
  module, mode = f"user_modes_{tmp_path.name.replace('-', '_')}", "plugin_last_worker"
  (directory / f"{module}.py").write_text(PLUGIN.format(name=mode))
  monkeypatch.syspath_prepend(str(directory))
  yield directory, module, mode
  if mode in aggregate.MODES:
    aggregate.MODES.unregister(mode)
  sys.modules.pop(module, None)


def _sixteen_workers(tmp_path, **fields):
  """16 workers on this host's 8 devices: a 16-device cluster, compiled in a child."""
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.method.num_workers, c.mesh, c.method.steps_per_worker = 16, "worker:8,data:1", 2
  c.train.log_every_steps = c.eval.every_steps = 2
  c.distill.cache_dir = str(tmp_path / "pools")
  for name, value in fields.items():
    config_lib.set_dotted(c, name, value)
  return c


def test_a_plugin_mode_is_priced_from_the_cluster_programs_a_child_compiled(plugin, tmp_path):
  from ensemble_jax import run

  _, module, mode = plugin
  config = _sixteen_workers(tmp_path, **{"plugins": module,
                                         "method.aggregation": f"logits,{mode}"})
  results = run.train_and_evaluate(config, str(tmp_path / "run"))
  modelled = results["cost"]["modelled"]
  assert modelled["devices"] == 16
  assert modelled["collectives_source"].startswith("compiled HLO"), modelled["collectives_source"]
  assert "child process" in modelled["collectives_source"]
  assert modelled["collectives"]  # the ensemble's mixture over the 16 workers' devices
  assert mode in results["ensemble"]  # and the plugin's mode was evaluated


def test_a_run_the_child_cannot_price_stops_before_training(plugin, tmp_path):
  """A mode registered in this process alone (not in config.plugins): the child fails, and
  the run stops before its first step with the child's one line, not legacy costs."""
  from ensemble_jax import run

  _, module, mode = plugin
  __import__(module)
  config = _sixteen_workers(tmp_path, **{"method.aggregation": f"logits,{mode}"})
  workdir = tmp_path / "run"
  with pytest.raises(config_lib.ConfigError, match=(
      rf"child process .*failed: error: config.method.aggregation=.*{mode}.*choose one of")) as e:
    run.train_and_evaluate(config, str(workdir))
  assert "\n" not in str(e.value)
  assert not (workdir / run.RESULTS_FILE).exists()
  checkpoints = workdir / "checkpoints"  # not a step trained
  assert not checkpoints.exists() or not any(checkpoints.iterdir())


# A user's workload file beside the plugin: config.plugins names the plugin's file, and its
# one sweep point trains 16 workers on this host's 8 devices (a given device step: no
# calibration run; one learning rate: one tuning run, which is seed 0's).
USER_WORKLOAD = textwrap.dedent('''
    from experiments.configs import fashion_mnist

    def get_config(arg=""):
      c = fashion_mnist.get_config(arg)
      c.plugins = {plugin!r}
      return c

    def sweep_grid(name):
      del name  # one grid
      return {{"ensemble": {{"N16": ("ensemble,tiny", {{
          "method.num_workers": 16, "mesh": "worker:8,data:1", "method.steps_per_worker": 2,
          "train.log_every_steps": 2, "eval.every_steps": 2,
          "method.aggregation": "logits,{mode}", "tune.factors": (1.0,),
          "cost.device_step_time_s": 0.01}})}}}}
    ''')


def test_a_sweep_point_with_more_workers_than_devices_prices_a_plugin_mode_compiled(
    plugin, tmp_path, monkeypatch):
  """The sweep reads the workload file, which names the plugin's file alone; the sweep's
  own process and the cost model's child both import it from config.plugins."""
  from ensemble_jax import communication, run, stored
  from experiments.sweeps import cost_vs_time

  directory, module, mode = plugin
  monkeypatch.setattr(communication, "_READ", {})  # no reading of another test's cluster
  workload = tmp_path / "my_workload.py"
  workload.write_text(USER_WORKLOAD.format(plugin=str(directory / f"{module}.py"), mode=mode))
  workdir = tmp_path / "sweep"
  counts = cost_vs_time.run(str(workload), str(workdir), seeds=[0], grid="mine",
                            write_report=False)
  assert counts["tuning_runs"] == 1 and counts["from_tuning"] == 1, counts
  results = stored.load(str(workdir / "ensemble" / "N16" / "seed0" / run.RESULTS_FILE))
  assert results["config"]["plugins"] == str(directory / f"{module}.py")
  modelled = results["cost"]["modelled"]
  assert modelled["devices"] == 16
  assert modelled["collectives_source"].startswith("compiled HLO"), modelled["collectives_source"]
  assert "child process" in modelled["collectives_source"]
  assert modelled["collectives"]
  assert mode in results["ensemble"]


@pytest.mark.unit
def test_plugins_by_name_or_file_load_once_and_bad_ones_are_one_line(plugin, tmp_path):
  directory, module, mode = plugin
  path = str(directory / f"{module}.py")
  assert plugins.load({"plugins": f"{path}, {module}"}) == (path, module)
  assert plugins.load({"plugins": [path]}) == (path,)  # once: no second registration
  assert mode in aggregate.MODES
  assert plugins.load({}) == () and plugins.load({"plugins": ""}) == ()
  with pytest.raises(config_lib.ConfigError, match=r"no module named 'no_such_plugin'.*"
                     "PYTHONPATH"):
    plugins.load({"plugins": "no_such_plugin"})
  with pytest.raises(config_lib.ConfigError, match=r"no such file .*missing\.py"):
    plugins.load({"plugins": str(tmp_path / "missing.py")})
  with pytest.raises(config_lib.ConfigError, match=r"config.plugins=3"):
    plugins.load({"plugins": 3})


@pytest.mark.subprocess
def test_help_after_the_config_lists_its_plugins_entries(plugin):
  directory, module, mode = plugin
  out = subprocess.run(
      [sys.executable, "-m", "ensemble_jax.main",
       "--config=experiments/configs/fashion_mnist.py:tiny",
       f"--config.plugins={directory / f'{module}.py'}", "--help"],
      cwd=REPO, capture_output=True, text=True, check=True).stdout
  line = next(l for l in out.splitlines() if l.strip().startswith("method.aggregation:"))
  assert mode in line
