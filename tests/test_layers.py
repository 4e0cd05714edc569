"""Imports run one way: main -> run -> distill -> train -> methods -> data/models -> leaves.

Every import under ensemble_jax/ is read with `ast`, those inside functions too (a
function-level import that goes back up is a circle in disguise). Regression test: fails
on 3c6ac85, where train imported distill.pools (which imported train back, inside
`build`), and data/pipeline.py and methods/ imported distill.samplers.
"""
import ast
import os

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

PACKAGE = "ensemble_jax"
# Higher stands above: a module may import its own layer and the layers below it.
LAYERS = {
    "main": 7,  # flags only
    "run": 6,  # composes a run: the distilled pool, then the loop
    "evaluate": 6,  # a finished run's sub-ensemble: its flags, its set-up, the loop's eval
    "distill": 5,  # proxies, scores, coresets, clusters -> pools
    "train": 4,  # the one loop
    "resume": 4, "record": 4,  # the loop's resume policy and its results.json
    "teacher": 4,  # a finished run read back as a frozen teacher (knowledge distillation)
    "replay": 4,  # the loop's replay of a too-coarse target crossing (reads methods)
    "progress": 1,  # what the loop accumulates
    "methods": 3,  # the Method interface and its implementations
    "communication": 3,  # what the methods' compiled programs communicate (reads methods)
    "data": 2, "models": 2,
    # The config's checks: they read the registries of methods, models, samplers and modes.
    "validation": 3,
    # What validation reads of the pool builders: their declarations, not their code.
    "distill.registry": 1,
    # A built pool as the loop reads it: its samplers (data.samplers' Sampler) and `Pool`.
    "distill.pool": 2,
    # The siamese augmentation (DSA), in JAX alone: the distillers' and the step's, which
    # augments a distilled pool's examples as they were matched.
    "distill.augment": 1,
    # Leaves: import nothing above them.
    "aggregate": 1, "checkpoint": 1, "config_lib": 1, "costs": 1, "distributed": 1,
    "eval_schedule": 1, "hlo": 1, "logs": 1, "metrics": 1, "noise_scale": 1, "optim": 1,
    "plugins": 1, "registry": 1, "report": 1, "sharding": 1, "stored": 1, "writers": 1,
}


def _layer(module: str) -> int:
  """The layer of `ensemble_jax.<top>...` (a name imported from a package counts as it);
  a submodule listed on its own (`distill.registry`) has its own."""
  parts = module.split(".")[1:]
  for n in range(len(parts), 1, -1):
    if ".".join(parts[:n]) in LAYERS:
      return LAYERS[".".join(parts[:n])]
  top = parts[0]
  if top not in LAYERS:
    raise AssertionError(f"{PACKAGE}.{top} has no layer: add it to LAYERS in {__file__}")
  return LAYERS[top]


def _module_name(path: str, root: str) -> str:
  rel = os.path.relpath(path, root)[:-len(".py")].replace(os.sep, ".")
  return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def imports(source: str, module: str) -> list[tuple[int, str]]:
  """(line, imported ensemble_jax name) of every import in `source`, at any depth."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      assert not node.level, f"{module}:{node.lineno}: a relative import; write ensemble_jax.*"
      found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
  return [(line, name) for line, name in found
          if name == PACKAGE or name.startswith(PACKAGE + ".")]


def upward_imports(root: str) -> list[str]:
  """'module:line imports name (layer a -> b)' for every import of a higher layer."""
  bad = []
  for dirpath, _, files in os.walk(os.path.join(root, PACKAGE)):
    for f in sorted(files):
      if not f.endswith(".py"):
        continue
      path = os.path.join(dirpath, f)
      module = _module_name(path, root)
      if module == PACKAGE:
        continue
      with open(path) as fh:
        found = imports(fh.read(), module)
      for line, name in found:
        if name != PACKAGE and _layer(name) > _layer(module):
          bad.append(f"{module}:{line} imports {name} "
                     f"(layer {_layer(module)} -> {_layer(name)})")
  return bad


def import_graph(root: str) -> dict[str, set[str]]:
  """module -> the package's modules it imports (at any depth; a name imported from a
  module counts as that module, one from a package as the package)."""
  paths = {}
  for dirpath, _, files in os.walk(os.path.join(root, PACKAGE)):
    paths.update({_module_name(os.path.join(dirpath, f), root): os.path.join(dirpath, f)
                  for f in files if f.endswith(".py")})
  graph = {}
  for module, path in paths.items():
    with open(path) as fh:
      found = imports(fh.read(), module)
    graph[module] = set()
    for _, name in found:
      parts = name.split(".")
      target = next(".".join(parts[:n]) for n in range(len(parts), 0, -1)
                    if ".".join(parts[:n]) in paths)
      if target != module:
        graph[module].add(target)
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Each import circle once, as the path that closes it ('a', 'b', 'a')."""
  found, done = [], set()

  def visit(module, path):
    if module in path:
      circle = path[path.index(module):] + [module]
      if set(circle) not in [set(c) for c in found]:
        found.append(circle)
      return
    if module in done:
      return
    for target in sorted(graph.get(module, ())):
      visit(target, path + [module])
    done.add(module)

  for module in sorted(graph):
    visit(module, [])
  return found


def test_imports_run_one_way():
  assert upward_imports(REPO) == []


def test_no_import_circles():
  """Same-layer imports are allowed, a circle is not (record.py <-> teacher.py was one)."""
  assert circles(import_graph(REPO)) == []
  assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_function_level_imports_count():
  source = "def build():\n  from ensemble_jax import train\n"
  assert imports(source, "ensemble_jax.distill.pools") == [(2, "ensemble_jax.train")]
  assert _layer("ensemble_jax.train") > _layer("ensemble_jax.methods.step")
