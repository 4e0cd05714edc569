"""XLA's FLOP count of a train step against the analytic counts (costs.flops)."""
import functools

import jax
import jax.numpy as jnp
import flax.linen as nn
import optax
import pytest

from ensemble_jax import costs
from ensemble_jax.methods import step as step_lib
from ensemble_jax.models import gpt2, resnet

pytestmark = pytest.mark.integration


def _step_flops(model, batch, cfg, init_input):
  state = step_lib.create_train_state(model, optax.sgd(0.1), jax.random.key(0), init_input)
  step = jax.jit(functools.partial(step_lib.train_step, cfg=cfg))
  return costs.flops(step.lower(state, batch, jax.random.key(1)).compile()), state


def test_gpt2_step_is_six_flops_per_param_per_token():
  batch_size, context = 32, 16
  model = gpt2.create_model("tiny", vocab_size=256, context=context)
  tokens = jnp.zeros((batch_size, context + 1), jnp.int32)
  flops, state = _step_flops(model, {"tokens": tokens}, step_lib.StepConfig(task="lm"),
                             jax.ShapeDtypeStruct((1, context), jnp.int32))
  params = step_lib.num_params(state.params)
  analytic = 6 * params * batch_size * context  # Kaplan et al.: forward 2N, backward 4N
  assert flops == pytest.approx(analytic, rel=0.10), (flops, analytic)
  print(f"gpt2 tiny: XLA {flops:.4g} vs 6NT {analytic:.4g}: {flops / analytic:.3f}")


def test_resnet_step_is_three_forward_passes_of_its_convolutions():
  batch_size = 16
  model = resnet.create_model("resnet18", num_classes=10, width=4, stem="small",
                              stage_sizes=(1, 1))
  images = jnp.zeros((batch_size, 28, 28, 1), jnp.float32)
  cfg = step_lib.StepConfig(mean=(0.5,), std=(0.5,))
  flops, state = _step_flops(model, {"image": images, "label": jnp.zeros(batch_size, jnp.int32)},
                             cfg, jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
  # Analytic: every Conv / Dense costs 2 x (output elements) x (kernel fan-in) forward,
  # read off the layers' actual output shapes; backward is twice the forward.
  _, inter = model.apply({"params": state.params, "batch_stats": state.batch_stats}, images,
                         train=False, capture_intermediates=lambda m, _: isinstance(
                             m, (nn.Conv, nn.Dense)), mutable=["intermediates"])
  forward = 0
  for path, out in jax.tree_util.tree_leaves_with_path(inter["intermediates"]):
    if len(path) < 2 or path[-2].key != "__call__":
      continue  # sown values (the penultimate features), not a layer's output
    kernel = state.params
    for key in path[:-2]:  # .../<layer>/__call__/0
      kernel = kernel[key.key]
    fan_in = kernel["kernel"].size // kernel["kernel"].shape[-1]
    forward += 2 * out.size * fan_in
  assert flops == pytest.approx(3 * forward, rel=0.10), (flops, 3 * forward)
  print(f"resnet18 blocks (1, 1) w4: XLA {flops:.4g} vs 3x conv+dense forward {3 * forward:.4g}: "
        f"{flops / (3 * forward):.3f}")
