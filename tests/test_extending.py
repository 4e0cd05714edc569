"""Extension points: a mode and a builder added from this file alone, used and reported.

`test_a_mode_and_a_builder_added_from_a_test_file_alone` follows docs/design.md's "Adding
a mode" and "Adding a builder" literally. The trap tests fail on 75ab1a7 (before the
registries), where a new mode was reduced as `probs`, or never evaluated, and every distill
field, read or not, was in every pool's cache key.
"""
import json
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax import aggregate, config_lib, metrics, validation
from ensemble_jax.distill import pools
from ensemble_jax.distill.registry import BUILDERS, BuildInputs, Built, pool_info, register_builder
from ensemble_jax.methods import ensemble, step as step_lib
from tests import pool_keys_lib
from tests.conftest import REPO, tiny_ensemble


# -- docs/design.md, "Adding a mode": one function and one registration --------------------
def first_worker(logits_Nx, weights_N):
  """A mode whose score is worker 0's alone: easy to tell from `logits` and `probs`."""
  del weights_N
  return logits_Nx[0].astype(jnp.float32)


# -- docs/design.md, "Adding a builder": one function and one registration -------------------
def build_head(inputs: BuildInputs) -> Built:
  """Each worker draws from its own disjoint share of the first `fraction` of the data."""
  n = max(inputs.num_consumers, int(inputs.config.distill.fraction * len(inputs.data.train)))
  pools_ = np.array_split(np.arange(n), inputs.num_consumers)
  return Built(pools_, pool_info(inputs, pools_, pool_size=n, split="disjoint",
                                 build_flops=0.0, features="the first examples"))


@pytest.fixture
def registered():
  """The dummy mode and builder, registered for one test and removed after it."""
  aggregate.register_mode("first_worker")(first_worker)
  register_builder("head", fields=("distill.fraction", "seed"))(build_head)
  yield
  aggregate.MODES.unregister("first_worker")
  BUILDERS.unregister("head")




@pytest.mark.e2e
def test_a_mode_and_a_builder_added_from_a_test_file_alone(registered, tmp_path):
  from ensemble_jax import run

  config = tiny_ensemble(**{"method.aggregation": "logits,first_worker,probs",
                             "distill.builder": "head", "distill.fraction": 0.01})
  results = run.train_and_evaluate(config, str(tmp_path))
  with open(tmp_path / run.RESULTS_FILE) as f:
    on_disk = json.load(f)
  assert on_disk["distill"]["builder"] == "head"  # the builder's info, reported
  assert on_disk["distill"]["features"] == "the first examples"
  assert on_disk["distill"]["pool_sizes"] == [150] * 4 and not on_disk["distill"]["cached"]
  # The mode, evaluated with its own reduction: worker 0's scores, not a mixture's.
  mode, worker0 = on_disk["ensemble"]["first_worker"], on_disk["per_worker"][0]
  assert mode["accuracy"] == worker0["accuracy"] and mode["nll"] == pytest.approx(
      worker0["nll"], rel=1e-6)
  assert mode["nll"] != on_disk["ensemble"]["probs"]["nll"]
  assert results["ensemble"] == on_disk["ensemble"]
  # The vocabulary HLO check (tests/test_lm.py) covers every registered LM mode, this one too.
  from tests import test_lm

  assert any("first_worker" in case.split(",") for case in test_lm.vocabulary_cases())


# -- the traps of issue 59 -----------------------------------------------------------------
@pytest.mark.unit
def test_a_registered_mode_is_reduced_by_its_own_combine_not_as_probs(registered):
  """Fails on 75ab1a7: `mixture_sums` reduced every mode but `logits` as `probs`."""
  logits_NxBxC = jnp.asarray(np.random.default_rng(0).normal(size=(3, 5, 4)), jnp.float32)
  batch = {"label": jnp.asarray([0, 1, 2, 3, 0]), "mask": jnp.ones(5)}
  cfg = step_lib.StepConfig(task="classification")
  sums = ensemble.mixture_sums(logits_NxBxC, batch, jnp.ones(3), {"first_worker": "full"}, cfg,
                               per_worker=False)
  want = metrics.prediction_sums(logits_NxBxC[0], batch["label"], batch["mask"])
  np.testing.assert_allclose(sums["first_worker"]["nll"], want["nll"], rtol=1e-6)


@pytest.mark.unit
def test_a_registered_mode_is_evaluated(registered):
  """Fails on 75ab1a7: a mode missing from `ensemble.MIXTURES` was never evaluated."""
  assert ensemble.eval_plan("classification", ("logits", "first_worker")) == (
      {"logits": "full", "first_worker": "full"}, ())
  # A language model reduces it in full once, at the end: it has no target-only form.
  assert ensemble.eval_plan("lm", ("probs", "first_worker")) == (
      {"probs": "targets"}, ("probs", "first_worker"))
  assert ensemble.eval_plan("lm", ("first_worker",)) == ({"first_worker": "full"}, ())


@pytest.mark.unit
def test_a_builders_cache_key_holds_only_the_fields_it_reads(registered):
  """Fails on 75ab1a7: every distill field was in every pool's key, so changing the proxy's
  steps rebuilt a pool that trains no proxy; and validation required them > 0."""
  config = tiny_ensemble(**{"distill.builder": "head"})
  data = pool_keys_lib.StubData({"dataset": "fashion_mnist"})
  key = pools.cache_key(config, data, 4)
  for field, value in [("distill.proxy_steps", 0), ("distill.keep", "easiest"),
                       ("optim.learning_rate", 0.5), ("distill.cache_dir", "/elsewhere")]:
    other = tiny_ensemble(**{"distill.builder": "head", field: value})
    validation.validate(other)  # a field the builder does not read is not checked either
    assert pools.cache_key(other, data, 4) == key, field
  for field, value in [("distill.fraction", 0.5), ("seed", 3)]:
    assert pools.cache_key(tiny_ensemble(**{"distill.builder": "head", field: value}),
                           data, 4) != key, field
  assert pools.cache_key(config, data, 2) != key
  # A built-in proxy-free builder: its proxy fields are not checked (nor ever trained).
  validation.validate(tiny_ensemble(**{"distill.builder": "kmeans", "distill.embedding": "pca",
                                        "distill.proxy_steps": 0}))


@pytest.mark.unit
def test_the_committed_pools_keep_their_cache_keys():
  """Every committed run that read a pool: its config's key as 75ab1a7 computed it
  (tests/data/pool_keys.json, `tests/pool_keys_lib.py`), so its cached pool is read back."""
  with open(os.path.join(REPO, "tests", "data", "pool_keys.json")) as f:
    want = json.load(f)
  assert set(want) == set(pool_keys_lib.committed_pool_runs())
  assert len(want) > 300
  changed = {path: key for path, key in want.items() if pool_keys_lib.key_of(path) != key}
  assert not changed


# Keys of the built-in builders' pools for tiny configs over `StubData`, as ae27db4 computed
# them: the proxy-trained, PCA, coreset, LiPT, synthetic and text pools a config names keep
# their caches. Regenerate only when a key is meant to change (its cached pools then rebuilt).
PINNED_KEYS = {
    "el2n": ("fashion_mnist", {"distill.builder": "el2n"}, "783f0a6e32a8e7e8"),
    "kmeans_pca_routed": ("fashion_mnist", {"distill.builder": "kmeans",
                                            "distill.embedding": "pca",
                                            "method.aggregation": "routed,logits,probs"},
                          "81967a170c7989af"),
    "craig": ("fashion_mnist", {"distill.builder": "craig"}, "942bb68b6545cc3c"),
    "gradmatch_lipt": ("fashion_mnist", {"distill.builder": "gradmatch", "distill.proxy": "lipt"},
                       "a2128036fca66617"),
    "distribution_matching": ("fashion_mnist", {"distill.builder": "distribution_matching"},
                              "87443ffb9ddb4ea3"),
    "gradient_matching": ("fashion_mnist", {"distill.builder": "gradient_matching",
                                            "distill.images_per_class": 1}, "176b06b04f0016d6"),
    "lm_kmeans_routed": ("pydocs_gpt2", {"distill.builder": "kmeans",
                                         "method.aggregation": "routed,probs,logits"},
                         "da3b0f770b1c2ba1"),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", list(PINNED_KEYS))
def test_a_configs_pool_keeps_its_cache_key(name):
  import importlib

  workload, fields, key = PINNED_KEYS[name]
  config = importlib.import_module(f"experiments.configs.{workload}").get_config("ensemble,tiny")
  config.method.num_workers = 4
  for field, value in fields.items():
    config_lib.set_dotted(config, field, value)
  data = pool_keys_lib.StubData({"dataset": config.data.dataset})
  assert pools.cache_key(config, data, 4) == key


@pytest.mark.unit
def test_an_unregistered_mode_or_builder_is_a_config_error_with_the_closest_name(registered):
  with pytest.raises(config_lib.ConfigError, match=r"Did you mean 'first_worker'\?"):
    validation.validate(tiny_ensemble(**{"method.aggregation": "logits,first_wroker"}))
  with pytest.raises(config_lib.ConfigError, match=r"config.distill.builder='haed'.*'head'\?"):
    validation.validate(tiny_ensemble(**{"distill.builder": "haed"}))


@pytest.mark.docs
def test_design_md_lists_every_module_and_every_extension_point():
  with open(os.path.join(REPO, "docs", "design.md")) as f:
    text = f.read()
  layout = text[text.index("## Layers and layout"):]
  layout = layout[:layout.index("\n```\n", layout.index("```") + 3)]
  package = os.path.join(REPO, "ensemble_jax")
  missing = []
  for dirpath, _, files in os.walk(package):
    for name in files:
      if name.endswith(".py") and name != "__init__.py" and not re.search(
          rf"\b{re.escape(name)}|\b{re.escape(name[:-3])}\b", layout):
        missing.append(os.path.relpath(os.path.join(dirpath, name), package))
  assert not missing
  for section in ("### Adding a mode", "### Adding a builder", "### Adding a method"):
    assert section in text
  for registry in ("aggregate.MODES", "distill.registry.BUILDERS", "data.samplers.SAMPLERS",
                   "methods.METHODS", "models.MODELS"):
    assert registry in text, registry

