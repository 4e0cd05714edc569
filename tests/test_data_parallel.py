"""The pjit baseline: FSDP equals replication, and the compiled step all-reduces."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ensemble_jax import costs, hlo, optim
from ensemble_jax.methods import step as step_lib
from ensemble_jax.methods.data_parallel import DataParallel
from ensemble_jax.models import resnet
from ensemble_jax.sharding import make_mesh

pytestmark = pytest.mark.integration


def _method(config, fsdp: bool):
  config.method.fsdp = fsdp
  config.method.fsdp_min_size = 256
  model = resnet.create_model("resnet18", num_classes=10, width=8, stem="small",
                              stage_sizes=(1, 1))  # light to compile
  # lr > 0 at step 0: the first step trains
  config.optim.warmup_fraction = config.optim.warmup_epochs = 0.0
  tx = optim.create_optimizer(config.optim, config.train.batch_size, 10, 10)
  return DataParallel(config, model, tx, make_mesh(config.mesh),
                      jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))


def _batch(method, config, seed=0):
  rng = np.random.default_rng(seed)
  b = config.train.batch_size
  local = {"image": rng.integers(0, 255, (b, 28, 28, 1), dtype=np.uint8),
           "label": rng.integers(0, 10, (b,), dtype=np.int32)}
  return {k: jax.device_put(v, method.train_layout.sharding) for k, v in local.items()}


@pytest.fixture(scope="module")
def two_methods():
  from experiments.configs import fashion_mnist

  out = {}
  for fsdp in (False, True):
    config = fashion_mnist.get_config("tiny")
    out[fsdp] = (_method(config, fsdp), config)
  return out


def test_fsdp_matches_replicated_after_steps(two_methods):
  losses, params = {}, {}
  for fsdp, (method, config) in two_methods.items():
    state = method.init(jax.random.key(0))
    for k in range(2):
      state, m = method.train_step(state, _batch(method, config, k), jax.random.key(1))
      losses.setdefault(fsdp, []).append(float(m["loss"]))
    params[fsdp] = jax.device_get(state.params)
  np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(params[True]), jax.tree.leaves(params[False])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  # FSDP really splits the large kernels over `data`; replicated really replicates
  kernels = [s.spec for s in jax.tree.leaves(two_methods[True][0].state_sharding.params)]
  assert P(None, None, None, "data") in kernels
  assert {s.spec for s in jax.tree.leaves(two_methods[False][0].state_sharding.params)} == {P()}


def test_compiled_dp_step_all_reduces_gradients(two_methods):
  method, config = two_methods[False]
  state = method.init(jax.random.key(0))
  text = method.train_step.lower(state, _batch(method, config), jax.random.key(1)
                                 ).compile().as_text()
  ops = hlo.collectives(text)
  reduces = [c for c in ops if c.op == "all-reduce"]
  assert reduces, "the data-parallel step must all-reduce its gradients"
  # the gradient all-reduce spans all 8 data-parallel devices
  assert any(sorted(g) == list(range(8)) for c in reduces for g in (c.groups or [range(8)]))


def test_dp_step_communicates_more_than_one_gradient_allreduce(two_methods):
  """Regression (issue 13): the data-parallel step was priced as one gradient all-reduce;
  with BatchNorm on 8 devices it compiles to many more, each paying its latency."""
  method, config = two_methods[False]
  batch = _batch(method, config)
  eval_batch = {"image": batch["image"], "label": batch["label"], "mask": batch["label"] * 0.0}
  step, evaluate = method.programs(batch, eval_batch, eval_batches=3)
  assert (step.name, step.per, step.calls, evaluate.name, evaluate.per, evaluate.calls) == (
      "train_step", "step", 1, "eval", "eval", 3)
  found = costs.program_collectives(step.name, step.per, step.calls,
                                    step.lowered.compile().as_text(), 8)
  reduces = [c for c in found if c.kind == "all-reduce"]
  assert sum(c.count for c in reduces) > 1
  assert all(c.group_size == 8 for c in reduces)
  params = jax.eval_shape(method._init_fn, jax.random.key(0)).params
  gradient_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  assert sum(c.bytes * c.count for c in reduces) >= gradient_bytes


def test_the_compiled_dp_step_is_already_combined_as_xla_gpu_would(two_methods):
  """The CPU compiler emits independent all-reduces combined (tuple all-reduces), so the
  combiner model (`hlo.combined`, XLA's GPU/TPU threshold) finds nothing left to merge: the
  BatchNorm statistics' reductions that remain depend on each other, layer after layer.
  The grids' recorded collectives are thus priced as a GPU or TPU would run them."""
  method, config = two_methods[False]
  state = method.init(jax.random.key(0))
  text = method.train_step.lower(state, _batch(method, config), jax.random.key(1)
                                 ).compile().as_text()
  read = hlo.collectives(text)
  assert any(line.count("f32[") > 2 for line in (c.line.split(" all-reduce(")[0]
                                                 for c in read))  # a tuple all-reduce
  combined = hlo.combined(text, costs.ALL_REDUCE_COMBINE_THRESHOLD_BYTES)
  assert [c.operand_bytes for c in combined] == [c.operand_bytes for c in read]
  assert len(read) > 2


def test_per_device_batchnorm_normalises_each_device_alone_in_one_all_reduce():
  """method.batchnorm='per_device' at cost.devices = 4 on this host's 8 devices: the step's
  model normalises each of the 4 devices' rows alone (what each would compute), and its
  step on those 4 devices (the cluster's program) all-reduces once: gradients, statistics
  and metrics together, no BatchNorm chain (the synchronised step holds one per layer)."""
  from experiments.configs import fashion_mnist

  config = fashion_mnist.get_config("tiny")
  config.method.batchnorm, config.cost.devices = "per_device", 4
  method = _method(config, fsdp=False)
  batch = _batch(method, config)
  state = method.init(jax.random.key(0))
  x = step_lib.model_inputs(batch, method.step_config)
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  y, _ = method.model.apply(variables, x, train=True, mutable=["batch_stats"])
  plain = method.model.clone(bn_groups=1)
  rows = config.train.batch_size // 4
  each = [plain.apply(variables, x[i * rows:(i + 1) * rows], train=True,
                      mutable=["batch_stats"])[0] for i in range(4)]
  np.testing.assert_allclose(y, jnp.concatenate(each), rtol=1e-5, atol=1e-5)

  cluster = fashion_mnist.get_config("tiny")
  cluster.mesh = "data:4"
  counts = {}
  for how in ("per_device", "synchronised"):
    cluster.method.batchnorm = how
    one = _method(cluster, fsdp=False)
    b = _batch(one, cluster)
    text = one.train_step.lower(one.init(jax.random.key(0)), b, jax.random.key(1)
                                ).compile().as_text()
    counts[how] = len([c for c in hlo.collectives(text) if c.op == "all-reduce"])
  assert counts["per_device"] == 1 and counts["synchronised"] > 4
