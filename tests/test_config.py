"""Bad configs fail before compilation with one message naming field, value and fix."""
import importlib
import logging
import os
import shutil

import ml_collections
import pytest

from ensemble_jax import config_lib, methods, run, sharding, validation
from ensemble_jax.config_lib import ConfigError
from tests import forked_cli
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def _set(config, dotted, value):
  """A copy of `config` with one field changed, type-safety off (as a hand-built dict)."""
  config = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  *parents, leaf = dotted.split(".")
  node = config
  for p in parents:
    node = node[p]
  node[leaf] = value
  return config


@pytest.mark.parametrize("field,value,message", [
    ("train.batch_size", 0, r"config.train.batch_size=0: must be > 0"),
    ("train.batch_size", "128", r"config.train.batch_size='128': must be a number"),
    ("method.name", "allreduce", r"config.method.name='allreduce': choose one of"),
    ("optim.name", "lamb", r"config.optim.name='lamb'"),
    ("eval.target_value", 1.5, r"config.eval.target_value=1.5: accuracy lies in \[0.0, 1.0\]"),
    ("eval.target_metric", "top5", r"config.eval.target_metric='top5'"),
    ("train.num_epochs", 3.0, r"set exactly one of train.num_steps and train.num_epochs"),
    ("mesh", [("data", -1), ("worker", -1)], r"at most one axis may be -1"),
    ("mesh", [("model", 2)], r"axis names must be 'data' or 'worker'"),
    ("mesh", "data:-1,worker:-1", r"config.mesh='data:-1,worker:-1': at most one axis"),
    ("mesh", "data", r"config.mesh='data': write it as 'axis:size,...'"),
    ("mesh", "data:all", r"config.mesh='data:all': write it as"),
    ("mesh", [("data",)], r"write it as 'axis:size,...'"),
    ("method.fsdp", "yes", r"config.method.fsdp='yes': must be True or False"),
    ("data.train_augment", "mixup", r"config.data.train_augment='mixup'"),
    ("data.val_fraction", 0.0, r"config.data.val_fraction=0.0: must lie in \(0, 1\)"),
    ("data.context", 0, r"config.data.context=0: must be > 0"),
    ("data.source", "folder", r"config.data.data_dir='': data.source='folder' reads data_dir"),
    ("model.stage_sizes", (2, 0), r"config.model.stage_sizes=\(2, 0\): give ResNet blocks"),
    ("model.stage_sizes", (1.5,), r"config.model.stage_sizes=\(1.5,\): give ResNet blocks"),
    ("train.schedule_fraction", 1.5, r"config.train.schedule_fraction=1.5: is the fraction"),
    ("tune.schedule_fractions", (1.0, 2.0), r"config.tune.schedule_fractions=\(1.0, 2.0\)"),
    ("method.batchnorm", "sync", r"config.method.batchnorm='sync': choose one of"),
])
def test_bad_values_are_named(tiny_config, field, value, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    validation.validate(_set(tiny_config, field, value))


def test_mesh_string_and_list_forms_are_one_mesh():
  for string, pairs in [("data:-1", [("data", -1)]),
                        ("worker:8,data:1", [("worker", 8), ("data", 1)]),
                        (" worker : 2 , data:-1 ", [("worker", 2), ("data", -1)])]:
    assert sharding.mesh_axes(string) == pairs
    assert sharding.mesh_axes(pairs) == pairs
    assert sharding.mesh_string(pairs) == string.replace(" ", "")


def test_ensemble_without_a_worker_axis_is_named(tiny_config):
  config = _set(_set(tiny_config, "method.name", "ensemble"), "mesh", "data:-1")
  with pytest.raises(ConfigError, match=r"config.mesh='data:-1': ensemble steps its workers "
                     r"over a 'worker' axis"):
    validation.validate(config)


def test_unknown_key_suggests_the_known_one(tiny_config):
  with tiny_config.unlocked():
    tiny_config.train.batchsize = 64
  with pytest.raises(config_lib.ConfigError, match=r"config.train.batchsize: unknown key. "
                     r"Did you mean config.train.batch_size\?"):
    validation.validate(tiny_config)


@pytest.mark.parametrize("field,value,message", [
    ("train.batch_size", 36, r"config.train.batch_size=36 is not divisible by the mesh's "
                             r"data axis=8"),
    ("mesh", [("data", 16)], r"needs 16 devices but only 8 are present"),
    ("mesh", [("data", 3), ("worker", -1)], r"does not divide the 8 devices"),
])
def test_shape_errors_before_compilation(tiny_config, tmp_path, field, value, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    run.train_and_evaluate(_set(tiny_config, field, value), str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists() or not os.listdir(tmp_path / "wd")


def _ensemble(config, **method):
  config = _set(config, "method.name", "ensemble")
  config = _set(config, "mesh", [("worker", -1), ("data", 1)])
  for key, value in method.items():
    config = _set(config, key, value)
  return config


MALFORMED = [  # (what, config edit, message)
    ("zero batch", lambda c: _set(c, "train.batch_size", 0), "train.batch_size=0"),
    ("negative steps", lambda c: _set(c, "train.num_steps", -5), "train.num_steps"),
    ("wrong type", lambda c: _set(c, "optim.learning_rate", "fast"), "optim.learning_rate"),
    ("unknown key", lambda c: _set(c, "optim.lr", 0.1), "config.optim.lr: unknown key"),
    ("renamed field", lambda c: _set(c, "distill.method", "kmeans"),  # a config file's
     "config.distill.method was renamed config.distill.builder; set that instead."),
    ("unknown method", lambda c: _set(c, "method.name", "diloko"), "method.name='diloko'"),
    ("mesh too large", lambda c: _set(c, "mesh", [("data", 64)]), "needs 64 devices"),
    ("batch vs data axis", lambda c: _set(c, "train.batch_size", 12), "not divisible by"),
    ("eval batch vs data axis", lambda c: _set(c, "eval.batch_size", 60), "eval.batch_size=60"),
    ("N vs worker axis",  # a mesh the user chose: kept, and the one that fits is named
     lambda c: _set(_ensemble(c, **{"method.num_workers": 12}), "mesh", "worker:8,data:1"),
     "num_workers=12 is not a multiple of the mesh's worker axis=8 (config.mesh="
     "'worker:8,data:1' on 8 devices); use --config.mesh=worker:4,data:2"),
    ("soup without shared init",
     lambda c: _ensemble(c, **{"method.aggregation": "logits,soup"}), "shared_init=True"),
    ("diloco with ensemble modes",  # DiLoCo once silently replaced them with 'global'
     lambda c: _set(_ensemble(c, **{"method.sync_every": 2}), "method.name", "diloco"),
     "method.aggregation='global'"),
    ("ensemble with diloco's mode", lambda c: _ensemble(c, **{"method.aggregation": "global"}),
     "method.aggregation='global'"),
    ("target out of range", lambda c: _set(c, "eval.target_value", -0.5), "target_value=-0.5"),
    ("ppl target for accuracy", lambda c: _set(c, "eval.target_metric", "bleu"),
     "target_metric='bleu'"),
    ("missing dataset", lambda c: _set(c, "data.data_dir", "/nonexistent/data"),
     "`python -m ensemble_jax.data.fetch --data_dir /nonexistent/data fashion_mnist`"),
    ("missing tokenizer", lambda c: _lm(c, "data.tokenizer_dir", "/nonexistent/tok"),
     "/nonexistent/tok"),
    ("lm with a resnet", lambda c: _set(c, "task", "lm"), "model.name='resnet18'"),
    ("bad augment", lambda c: _set(c, "data.train_augment", "mixup"), "train_augment"),
    ("bad local strategy", lambda c: _ensemble(c, **{"method.local_strategy": "pmap"}),
     "local_strategy='pmap'"),
    ("both durations", lambda c: _set(c, "train.num_epochs", 1.0), "exactly one of"),
]


def _lm(config, key, value):
  """The LM smoke config with the GPT-2 tokenizer and one field changed."""
  del config
  from experiments.configs import pydocs_gpt2

  return _set(_set(pydocs_gpt2.get_config("tiny"), "data.tokenizer", "gpt2"), key, value)


@pytest.mark.parametrize("what,edit,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_config_exits_2_with_one_line_and_no_trace(tiny_config, tmp_path, capsys,
                                                            what, edit, message):
  from ensemble_jax import main

  workdir = tmp_path / "wd"
  assert main.run(edit(tiny_config), str(workdir)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err and err[0].startswith("error: ") and message in "\n".join(err), (what, err)
  if not what.startswith("missing"):  # data errors carry a how-to-get-it block
    assert len(err) == 1, err
  assert not workdir.exists() or not os.listdir(workdir)


OVERRIDES = [
    ("--config.train.batchsize=3", "error: --config.train.batchsize=3: config.train has no "
     "field 'batchsize'; did you mean --config.train.batch_size? Known fields: "),
    ("--config.train.batch_size=0", "config.train.batch_size=0: must be > 0."),
    ("--config.distill.method=kmeans", "error: --config.distill.method=kmeans: "
     "config.distill.method was renamed config.distill.builder; use "
     "--config.distill.builder=kmeans."),
    ("--config.mesh=model:2", "config.mesh='model:2': axis names must be 'data' or 'worker'"),
    ("--config.mesh=data:16", "config.mesh='data:16' needs 16 devices but only 8 are present"),
    ("surplus_positional", "unexpected arguments ['surplus_positional']"),
    ("--config=experiments/configs/fashon_mnist.py",
     "no such config file. Did you mean experiments/configs/fashion_mnist.py?"),
]


@pytest.mark.subprocess
@pytest.mark.parametrize("override,message", OVERRIDES)
def test_cli_exits_2_on_bad_override(cli, override, message):
  workdir, proc = cli[("override", override)]
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
  assert message in proc.stderr
  assert not os.listdir(workdir)


def test_an_unknown_field_is_one_clean_line_with_the_override_to_type():
  """config_flags' KeyError, as it raises it, read into one line. Fails on 75ab1a7, which
  printed `learning_rat Did you mean "learning_rate" instead of "learning_rat"?.`"""
  from ensemble_jax import main

  raised = KeyError("\\'learning_rat\\'\\nDid you mean \"learning_rate\" instead of "
                    "\"learning_rat\"?")
  overrides = ["--config.seed=1", "--config.optim.learning_rat=0.1"]
  assert main.unknown_field_error(raised, overrides) == (
      "error: --config.optim.learning_rat=0.1: config.optim has no field 'learning_rat'; did "
      "you mean --config.optim.learning_rate? Known fields: "
      "ensemble_jax/config_lib.py:base_config().")
  assert main.unknown_field_error(KeyError("'zzz'"), ["--config.optim.zzz=1"]) == (
      "error: --config.optim.zzz=1: config.optim has no field 'zzz'. Known fields: "
      "ensemble_jax/config_lib.py:base_config().")


def test_the_unknown_field_is_matched_to_the_override_that_names_it():
  """A renamed field after an override whose path holds the same word: the error names the
  renamed one. Fails on ab915d1b: `error: --config.method.steps_per_worker=48: config has
  no field 'method'`."""
  from ensemble_jax import main

  overrides = ["--config.method.steps_per_worker=48", "--config.distill.method=el2n"]
  assert main.unknown_field_error(KeyError("'method'"), overrides) == (
      "error: --config.distill.method=el2n: config.distill.method was renamed "
      "config.distill.builder; use --config.distill.builder=el2n.")


def test_a_misspelled_variant_is_one_line_naming_the_closest(capsys):
  """Through main's flag parser, as `python -m ensemble_jax.main` parses. Fails on ef8466c2:
  13 lines of config_flags' traceback, ending `ValueError: unknown variant(s) ['ensembel']`
  with no suggestion."""
  from absl import flags

  from ensemble_jax import main

  config = os.path.join(REPO, "experiments", "configs", "fashion_mnist.py")
  # parsing applies absl's --verbosity to the loggers: put them back for the tests after
  levels = {name: logging.getLogger(name).level for name in ("", "absl")}
  try:
    with pytest.raises(SystemExit) as exited:
      main.parse_flags(["main", f"--config={config}:smoke,ensembel", "--workdir=/nonexistent"])
  finally:
    flags.FLAGS.unparse_flags()
    for name, level in levels.items():
      logging.getLogger(name).setLevel(level)
  assert exited.value.code == 2
  assert capsys.readouterr().err.splitlines() == [
      "error: --config: unknown variant(s) 'ensembel' (did you mean 'ensemble'?) of "
      "fashion_mnist.py; choose from ['diloco', 'ensemble', 'smoke', 'sweep', 'tiny']"]


@pytest.mark.parametrize("workers,devices,batches,mesh", [
    (4, 8, (64, 1000), "worker:4,data:2"),  # :smoke,ensemble on 8 devices
    (2, 8, (64, 1000), "worker:2,data:4"),
    (8, 8, (64,), "worker:-1,data:1"), (16, 8, (64,), "worker:-1,data:1"),
    (4, 1, (64,), "worker:-1,data:1"),
    (12, 8, (32, 64), "worker:4,data:2"),  # 3 workers on each pair of devices
    (3, 8, (64, 100), "worker:1,data:4"),  # 100 splits 4 ways, not 8: 4 devices idle
    (4, 8, (63,), "worker:4,data:1")])
def test_the_default_mesh_fits_the_workers_to_the_devices(workers, devices, batches, mesh):
  assert sharding.fitted_mesh(workers, devices, batches) == mesh


def test_fitting_changes_only_the_default_mesh_of_stacked_methods(tiny_config):
  """Every entry point fits the same way (`methods.fit_workers_to_devices`: main, the run
  API, the sweeps); the cluster the run stands for stays N devices, one worker each. Fails
  on 75ab1a7, where only the sweeps fitted (`cost_vs_time._fit_workers_to_devices`) and
  `:smoke,ensemble` on 8 devices stopped at "num_workers=4 is not a multiple of the
  mesh's worker axis=8"."""
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("smoke,ensemble")
  line = methods.fit_workers_to_devices(c, 8)
  assert c.mesh == "worker:4,data:2" and c.cost.devices == 4
  assert line.startswith("layout: 4 workers on 8 devices, mesh worker:4,data:2 (the default "
                         "worker:-1,data:1 fitted")
  assert methods.fit_workers_to_devices(c, 8) is None  # fitted once: nothing to change
  validation.validate(c)
  mine = fashion_mnist.get_config("smoke,ensemble")
  mine.mesh = "worker:2,data:1"  # a mesh the user chose is theirs
  assert methods.fit_workers_to_devices(mine, 8) is None and mine.mesh == "worker:2,data:1"
  assert methods.fit_workers_to_devices(tiny_config, 8) is None  # data-parallel
  assert sharding.describe_layout(True, 4, {"worker": 4, "data": 2}, 8) == (
      "4 workers on 8 of 8 device(s): 4 group(s) of 1 worker(s), each worker's batches split "
      "over 2 devices")


def test_choice_lists_are_the_registries():
  """No second list of names: config_lib holds none, validation reads the registries."""
  from ensemble_jax import aggregate, methods
  from ensemble_jax.data import samplers
  from ensemble_jax.distill.registry import BUILDERS

  for gone in ("METHODS", "SAMPLERS", "DISTILL_METHODS", "AGGREGATION_MODES", "RESNETS",
               "GPT2_SIZES"):
    assert not hasattr(config_lib, gone), gone
  assert not hasattr(__import__("ensemble_jax.methods.ensemble").methods.ensemble, "MIXTURES")
  assert methods.METHODS.names() == ("data_parallel", "ensemble", "diloco")
  assert samplers.SAMPLERS.names() == ("random", "disjoint")
  assert set(aggregate.MODES) == {"logits", "probs", "routed", "soup"}
  assert set(BUILDERS) == {"none", "el2n", "grand", "loss", "kmeans", "craig", "gradmatch",
                           "distribution_matching", "gradient_matching"}
  assert config_lib.aggregation_modes({"method": {"aggregation": "routed,,probs"}}) == (
      "routed", "probs")


@pytest.mark.parametrize("field,value,close", [
    ("method.name", "ensembel", "ensemble"), ("method.sampler", "disjont", "disjoint"),
    ("method.aggregation", "logits,prob", "probs"), ("distill.builder", "kmean", "kmeans"),
    ("model.name", "resnet19", "resnet18")])
def test_a_name_not_registered_is_one_line_naming_the_closest(tiny_config, field, value,
                                                               close):
  with pytest.raises(ConfigError, match=rf"config.{field}=.*choose one of .*Did you mean "
                                        rf"'{close}'\?") as e:
    validation.validate(_set(tiny_config, field, value))
  assert "\n" not in str(e.value)


def test_a_remote_workdir_is_refused_before_any_work(tiny_config, tmp_path, monkeypatch):
  """It once trained ~30 s, wrote a local ./gs:/bucket/... tree, then failed."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError, match="remote workdirs are not supported"):
    run.train_and_evaluate(tiny_config, "gs://bucket/runs/x")
  assert os.listdir(tmp_path) == []


def test_model_choice_lists_agree_with_the_model_zoo():
  from ensemble_jax.models import gpt2, resnet

  from ensemble_jax import models

  assert {n for n, m in models.MODELS.items() if m.task == "classification"} == set(
      resnet.PRESETS)
  assert {n for n, m in models.MODELS.items() if m.task == "lm"} == {"gpt2"}
  assert set(gpt2.SIZES) >= {"tiny", "small"}


@pytest.mark.parametrize("field, value, message", [
    ("model.name", "resnet19", "choose one of"),
    ("data.dataset", "mnist", "serves only 'fashion_mnist'"),
    ("eval.target_metric", "perplexity", "reports"),
])
def test_bad_image_choices_are_one_line_errors_before_any_data(tiny_config, field, value,
                                                               message):
  config_lib.set_dotted(tiny_config, field, value)
  with pytest.raises(ConfigError, match=message):
    validation.validate(tiny_config)


@pytest.mark.parametrize("overrides, message", [
    ({"model.size": "huge"}, "GPT-2 size"),
    ({"model.attention": "flash"}, r"model.attention='flash'.*einsum"),
    ({"model.attention": "fused", "model.dropout": 0.1}, "no attention dropout"),
])
def test_bad_gpt2_choices_are_refused_by_validate(overrides, message):
  from experiments.configs import pydocs_gpt2

  config = pydocs_gpt2.get_config("tiny")
  for field, value in overrides.items():
    config_lib.set_dotted(config, field, value)
  with pytest.raises(ConfigError, match=message):
    validation.validate(config)


@pytest.mark.subprocess
def test_cli_reports_a_config_files_syntax_error_as_file_and_line(cli):
  bad, proc = cli["syntax error"]
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [f"error: --config: {bad}:1: invalid syntax"]
  assert not (bad.parent / "run").exists()


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
  """Files a newcomer's command can point at: each broken the way a real one breaks."""
  from experiments.configs import pydocs_gpt2
  from ensemble_jax.data import fetch, text

  root = tmp_path_factory.mktemp("bad_inputs")
  (root / "bad.jsonl").write_text('{"text": "fine"}\n{"text": "cut off\n')
  shutil.copytree(fetch.require("fashion_mnist"), root / "idx" / "fashion_mnist")
  labels = root / "idx" / "fashion_mnist" / "t10k-labels-idx1-ubyte.gz"
  labels.write_bytes(labels.read_bytes()[:100])
  (root / "corpus").mkdir()
  for i in range(100):  # both splits get documents at val_fraction 0.05
    (root / "corpus" / f"{i}.txt").write_text(f"document {i}, " * 10)
  config = pydocs_gpt2.get_config("tiny")
  config.data.path, config.data.data_dir = str(root / "corpus"), str(root / "tokens")
  cache_dir = text.load(config.data).stats["cache_dir"]
  with open(os.path.join(cache_dir, "train.npy"), "r+b") as f:
    f.truncate(300)
  (root / "tfds").mkdir()
  return root


LM = "--config=experiments/configs/pydocs_gpt2.py:tiny"
BAD_INPUTS = [  # (what, arguments ({root}: the fixture's files), what the one line says)
    ("mesh not axis:size", ["--config.mesh=data:all"], "config.mesh='data:all': write it as"),
    ("ensemble without a worker axis",
     ["--config=experiments/configs/fashion_mnist.py:ensemble,tiny", "--config.mesh=data:-1"],
     "config.mesh='data:-1': ensemble steps its workers over a 'worker' axis"),
    ("malformed jsonl line", [LM, "--config.data.path={root}/bad.jsonl",
                              "--config.data.data_dir={root}/tokens"],
     "{root}/bad.jsonl:2 is not valid JSON"),
    ("truncated idx file", ["--config.data.data_dir={root}/idx"],
     "{root}/idx/fashion_mnist/t10k-labels-idx1-ubyte.gz is truncated or corrupt"),
    ("truncated token cache", [LM, "--config.data.path={root}/corpus",
                               "--config.data.data_dir={root}/tokens"],
     "train.npy is truncated or corrupt"),
    ("unprepared tfds dataset", ["--config.data.source=tfds", "--config.data.data_dir={root}/tfds"],
     "`tfds build fashion_mnist --data_dir={root}/tfds --file_format=array_record`"),
]


@pytest.mark.subprocess
@pytest.mark.parametrize("what,args,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_on_the_command_line_is_one_line_exit_2_and_no_workdir(bad_inputs, cli,
                                                                         what, args, message):
  workdir, proc = cli[("bad input", what)]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert proc.returncode == 2 and len(errors) == 1, (what, proc.stderr[-3000:])
  assert proc.stderr.strip().splitlines()[-1] == errors[0] and "Traceback" not in proc.stderr
  assert message.format(root=bad_inputs) in errors[0], (what, errors[0])
  assert not workdir.exists()


@pytest.mark.subprocess
def test_help_names_the_config_files_their_variants_the_schema_and_every_registered_choice(
    cli):
  """And each registry's line lists every name registered in it (once a test of
  tests/test_extending.py that started `--help` in a process of its own)."""
  import re

  from ensemble_jax import aggregate, models
  from ensemble_jax.data import samplers
  from ensemble_jax.distill.registry import BUILDERS

  _, result = cli["help"]
  assert result.returncode == 0
  for line in ("experiments/configs/fashion_mnist.py[:smoke,tiny,ensemble,diloco,sweep]",
               "experiments/configs/pydocs_gpt2.py[:smoke,tiny,ensemble,diloco,sweep]",
               "experiments/configs/imagenet_resnet50.py",
               "ensemble_jax/config_lib.py:base_config()"):
    assert line in result.stdout
  for registry in (methods.METHODS, samplers.SAMPLERS, aggregate.MODES, BUILDERS,
                   models.MODELS):
    line = next(l for l in result.stdout.splitlines()
                if l.strip().startswith(f"{registry.field}:"))
    assert all(re.search(rf"\b{name}\b", line) for name in registry), (registry.field, line)


# Every command above is `python -m ensemble_jax.main` in a process of its own: the forks of
# one process that imported the package once (tests/forked_cli.py), not 14 fresh starts.
@pytest.fixture(scope="module")
def cli(bad_inputs, tmp_path_factory):
  """{case: (its workdir or config file, its CompletedProcess)} for the cases above."""
  root = tmp_path_factory.mktemp("cli")
  cases = {}  # case -> (path, arguments)
  for i, (override, _) in enumerate(OVERRIDES):
    workdir = root / f"override{i}"  # exists, and must stay empty
    workdir.mkdir()
    cases[("override", override)] = (workdir, [
        "--config=experiments/configs/fashion_mnist.py:tiny", f"--workdir={workdir}", override])
  bad = root / "syntax" / "bad.py"
  bad.parent.mkdir()
  bad.write_text("def get_config(:\n  pass\n")
  cases["syntax error"] = (bad, [f"--config={bad}", f"--workdir={bad.parent / 'run'}"])
  for i, (what, args, _) in enumerate(BAD_INPUTS):
    workdir = root / f"bad_input{i}" / "wd"
    args = [a.format(root=bad_inputs) for a in args]
    config = [a for a in args if a.startswith("--config=")] or [
        "--config=experiments/configs/fashion_mnist.py:tiny"]
    cases[("bad input", what)] = (workdir, [
        *config, f"--workdir={workdir}", *[a for a in args if not a.startswith("--config=")]])
  cases["help"] = (None, ["--help"])
  procs = forked_cli.run_commands("ensemble_jax.main", [a for _, a in cases.values()],
                                  dict(os.environ), timeout_s=300, cwd=REPO)
  return {case: (path, proc) for (case, (path, _)), proc in zip(cases.items(), procs)}


def test_a_batch_larger_than_the_training_set_names_the_fix(tiny_config, tmp_path):
  """60 images and a batch of 128 once trained one step toward a 0.91 target."""
  tiny_config.data.train_examples, tiny_config.train.batch_size = 60, 128
  with pytest.raises(config_lib.ConfigError, match=r"config.train.batch_size=128 is larger "
                     r"than the training set \(60 examples\).*--config.train.batch_size=8"):
    run.train_and_evaluate(tiny_config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


def test_steps_and_epochs_both_set_names_the_flag_that_fixes_it(tiny_config):
  tiny_config.train.num_steps, tiny_config.train.num_epochs = 30, 2.0
  with pytest.raises(config_lib.ConfigError, match="--config.train.num_epochs=0 to train 30"):
    validation.validate(tiny_config)


@pytest.mark.parametrize("config_file", ["fashion_mnist", "pydocs_gpt2"])
def test_the_sweep_variant_stops_at_its_target_when_run_by_hand(config_file):
  """The docs say steps-to-target runs stop at the target; `:sweep` run by hand once did not
  (only the sweep driver turned it on). Fails on 1e4c37a."""
  module = importlib.import_module(f"experiments.configs.{config_file}")
  assert module.get_config("sweep").train.stop_at_target
  assert module.get_config("ensemble,sweep").train.stop_at_target


def test_per_device_batchnorm_with_gradient_accumulation_is_refused(tiny_config):
  """Microbatches under per-device BatchNorm are not built: one line naming both fixes."""
  tiny_config.method.batchnorm = "per_device"
  tiny_config.train.microbatches = 2
  with pytest.raises(config_lib.ConfigError, match=r"config.method.batchnorm='per_device': "
                     r"per-device BatchNorm with gradient accumulation .*microbatches=1"):
    validation.validate(tiny_config)
