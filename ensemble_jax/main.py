"""Flags only: `python -m ensemble_jax.main --config=experiments/configs/X.py --workdir=DIR`.

Override any field: `--config.train.batch_size=256 --config.method.fsdp=True`.
"""
import ast
import contextlib
import difflib
import glob
import importlib.util
import os
import re
import sys

import jax
from absl import app, flags
import ml_collections
from ml_collections import config_flags

from ensemble_jax import aggregate, checkpoint, config_lib, distributed, logs, methods, models
from ensemble_jax import run as run_lib
from ensemble_jax import plugins, sharding, stored, validation
from ensemble_jax.data import samplers
from ensemble_jax.distill.registry import BUILDERS

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "experiments", "configs")


def config_files_help(config_dir: str = CONFIG_DIR) -> str:
  """The config files beside the package, each with its variants and its docstring's first
  line, read from the source (nothing is imported)."""
  lines = []
  for path in sorted(glob.glob(os.path.join(config_dir, "*.py"))):
    if os.path.basename(path).startswith("_"):
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    variants = [elt.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "parse_variants" and len(node.args) > 1
                and isinstance(node.args[1], ast.Tuple) for elt in node.args[1].elts
                if isinstance(elt, ast.Constant)]
    name = os.path.relpath(path, os.path.dirname(os.path.dirname(config_dir)))
    spec = f"{name}[:{','.join(variants)}]" if variants else name
    lines.append(f"  {spec}\n      {(ast.get_docstring(tree) or '').splitlines()[0]}")
  return "\n".join(lines)


def registered_choices_help() -> str:
  """Each registry's config field and its registered names (docs/design.md, "Extension
  points"): what `--config.<field>=` accepts; under it, each entry's own fields
  (`own_fields`) at their defaults."""
  lines = []
  for r in (methods.METHODS, aggregate.MODES, samplers.SAMPLERS, BUILDERS, models.MODELS):
    lines.append(f"  {r.field}: {', '.join(r.names())}")
    for name in r.names():
      if own := r.own_fields(name):
        lines.append(f"      {name}: " + ", ".join(
            f"--config.{f}={config_lib.DECLARED[f][0].default!r}" for f in own))
  return "\n".join(lines)


HELP_TAIL = """
Config files (variants combine with commas: `fashion_mnist.py:smoke,ensemble`):
{}

Registered choices (method.aggregation takes a comma-separated list, the headline first),
each entry's own fields under it at their defaults:
{}

Every field, its default and what it means: ensemble_jax/config_lib.py:base_config(); the
fields of results.json: docs/results_json.md.
"""

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and results go.")
flags.mark_flags_as_required(["config", "workdir"])


USAGE_ERRORS = run_lib.USAGE_ERRORS


def run(config, workdir: str) -> int:
  """Trains; a config, dataset or checkpoint that cannot work is one line and status 2.
  The first line says what runs where, the last where the results are and what they say."""
  try:
    validation.validate(config)
    # Before anything asks JAX about devices: the runtime must exist when backends start.
    distributed.maybe_initialize(config.distributed)
    layout = methods.fit_workers_to_devices(config, jax.device_count())
    mesh = sharding.mesh_shape(config.mesh, jax.device_count())
    print(f"ensemble_jax: jax {jax.__version__} on {jax.default_backend()}, "
          f"{jax.process_count()} process(es), {jax.device_count()} device(s); mesh "
          f"{sharding.mesh_string(mesh)}; method {config.method.name}; workdir {workdir}",
          flush=True)
    if layout:
      print(layout, flush=True)
    results = run_lib.finished_results(config, workdir)
    if results is None:
      with contextlib.closing(checkpoint.PreemptionWatch()):  # Ctrl-C from here on: a clean stop
        results = run_lib.train_and_evaluate(config, workdir)
    else:
      print("already finished with this config: results.json left as it was", flush=True)
  except USAGE_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # a second Ctrl-C, or one before training started
    print(f"interrupted: what trained since the last checkpoint in {workdir}/checkpoints is "
          "lost; rerun the same command to resume from it.", file=sys.stderr)
    return 130
  targets = results.get("targets", [results["target"]])
  metric = targets[0]["metric"]
  reached = "; ".join(f"target {metric} {t['value']} " + (
      f"reached at step {t['reached_step']}" if t["reached"] else "not reached")
      for t in targets)
  print(f"results: {os.path.join(workdir, run_lib.RESULTS_FILE)}; final {metric} "
        f"{results['final'].get(metric)}; {reached}", flush=True)
  return 0


def _check_config_file(argv) -> None:
  """config_flags reports a missing file as an error object that raises on first use."""
  for arg in argv[1:]:
    if arg.startswith("--config="):
      path = arg.split("=", 1)[1].split(":")[0]
      if not os.path.isfile(path):
        known = glob.glob(os.path.join(os.path.dirname(path) or ".", "*.py"))
        close = difflib.get_close_matches(path, known, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        print(f"error: --config={path}: no such config file.{hint}", file=sys.stderr)
        sys.exit(2)


HELP_FLAGS = ("-h", "--help", "--helpshort", "-?")


def _load_plugins(argv) -> bool:
  """Imports the config file's `config.plugins` (or a `--config.plugins=` override's): the
  file's get_config is called apart from config_flags, which applies every override while
  it reads the file, so that an override of a field a plugin declares
  (`--config.distill.first_k=10`) can be parsed after. Whether any plugin was named; a
  config that cannot be read is left to the parse that follows, which says why."""
  files = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  named = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config.plugins=")]
  if not files:
    return False
  _check_config_file(argv)
  path, _, variants = files[-1].partition(":")
  try:
    if named:
      config = ml_collections.ConfigDict({"plugins": ast.literal_eval(named[-1])
                                          if named[-1][:1] in "[(" else named[-1]})
    else:
      spec = importlib.util.spec_from_file_location("config_plugins_probe", path)
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      config = module.get_config(variants) if variants else module.get_config()
    return bool(plugins.load(config))
  except (SyntaxError, ValueError, AttributeError, KeyError, config_lib.ConfigError):
    return False


def parse_flags(argv):
  """absl's parser, but a bad flag, config file or override is one line and exit status 2,
  and --help exits 0."""
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    _load_plugins([a for a in argv if a not in HELP_FLAGS])  # --help lists their entries
    # the listing reads the config files: only when asked for, not at every start
    sys.modules["__main__"].__doc__ = __doc__ + HELP_TAIL.format(config_files_help(),
                                                                registered_choices_help())
    app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
  _check_config_file(argv)
  _load_plugins(argv)  # their own fields join the schema before the overrides are parsed
  try:
    return flags.FLAGS(argv)
  except SyntaxError as e:  # raised while config_flags imports the file
    print(f"error: --config: {e.filename}:{e.lineno}: {e.msg}", file=sys.stderr)
  except flags.Error as e:
    config_error = _config_error(e)
    print(f"error: --config: {config_error}" if config_error else f"error: {e}",
          file=sys.stderr)
  except (AttributeError, KeyError) as e:  # config_flags: an override of an unknown field
    print(unknown_field_error(e, [a for a in argv[1:] if a.startswith("--config.")]),
          file=sys.stderr)
  sys.exit(2)


def _config_error(e: BaseException | None) -> config_lib.ConfigError | None:
  """The ConfigError a config file's get_config raised (a misspelled variant): the
  innermost, under what config_flags and absl wrap it in (config_flags' wrapper is of its
  type, and its text is the traceback)."""
  found = None
  while e is not None:
    found = e if isinstance(e, config_lib.ConfigError) else found
    e = e.__cause__ or e.__context__
  return found


def _in_schema(dotted: str, known: list[str]) -> bool:
  """Whether `dotted` is a field or a group of base_config()'s."""
  return any(k == dotted or k.startswith(dotted + ".") for k in known)


def unknown_field_error(e: Exception, overrides: list[str]) -> str:
  """One line for config_flags' error on an override of an unknown field: the override, the
  group that lacks the field, and ml_collections' suggestion as an override to type.

  config_flags raises KeyError("'learning_rat'\\nDid you mean \"learning_rate\" instead of
  \"learning_rat\"?"), whose text once went out half-joined: 'learning_rat Did you mean
  "learning_rate" instead of "learning_rat"?.'"""
  text = str(e.args[0] if e.args else e).replace("\\'", "'").replace("\\n", "\n")
  names = re.findall(r"[\"']([A-Za-z_]\w*)[\"']", text)
  unknown = names[0] if names else text.strip("'\" ")
  suggestion = re.search(r'Did you mean "(\w+)"', text)
  known = [k for k, _ in config_lib.flat(config_lib.base_config())]
  for override in overrides:
    path = override.split("=", 1)[0].split(".")[1:]  # --config.optim.x -> ["optim", "x"]
    # the override whose path stops being the schema's at the unknown name (`method` is a
    # field of distill.method's, not of method.steps_per_worker's)
    at = [i for i, name in enumerate(path) if name == unknown
          and not _in_schema(".".join(path[:i + 1]), known)]
    if at:
      i = at[0]
      if (field := ".".join(path[:i + 1])) in stored.RENAMED:
        new = stored.RENAMED[field]
        fixed = f"--config.{new}{override[len(f'--config.{field}'):]}"
        return f"error: {override}: config.{field} was renamed config.{new}; use {fixed}."
      group = ".".join(["config", *path[:i]])
      hint = ""
      if suggestion:
        fixed = ".".join(["--config", *path[:i], suggestion.group(1), *path[i + 1:]])
        hint = f"; did you mean {fixed}?"
      return (f"error: {override}: {group} has no field {unknown!r}{hint or '.'} Known fields: "
              "ensemble_jax/config_lib.py:base_config().")
  return (f"error: unknown config field {unknown!r} in {' '.join(overrides)}. Known fields: "
          "ensemble_jax/config_lib.py:base_config().")


def main(argv):
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]}: the command takes --config=FILE[:variant], "
          "--workdir=DIR and --config.<field>=<value> overrides only.", file=sys.stderr)
    sys.exit(2)
  logs.quiet()
  code = run(_CONFIG.value, _WORKDIR.value)
  if code == 130:  # aborted mid-step: skip the interpreter's teardown of XLA's threads
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  sys.exit(code)



if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
