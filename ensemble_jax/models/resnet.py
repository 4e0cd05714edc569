"""ResNet v1.5 in flax.linen, matching torchvision's layout and parameter counts.

Used as the ensemble member network. Parameters are always float32; `dtype`
only sets the compute dtype so members can run in bfloat16 on accelerators.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from ensemble_jax.models.conv import canonical_conv

ModuleDef = Any

BLOCKS = ("basic", "bottleneck")
STEMS = ("imagenet", "small")

# He init over fan_out, as in torchvision: keeps activations well scaled at init.
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class BasicBlock(nn.Module):
  """Two 3x3 convs; used by ResNet-18/34. Output channels = filters."""

  filters: int
  conv: ModuleDef
  norm: ModuleDef
  strides: int = 1
  zero_init_residual: bool = True
  expansion = 1

  @nn.compact
  def __call__(self, x_BxHxWxI):
    out_channels = self.filters * self.expansion
    y_BxhxwxF = self.conv(self.filters, (3, 3), strides=(self.strides, self.strides),
                          padding=((1, 1), (1, 1)), name="conv1")(x_BxHxWxI)
    y_BxhxwxF = nn.relu(self.norm(name="bn1")(y_BxhxwxF))
    y_BxhxwxF = self.conv(self.filters, (3, 3), padding=((1, 1), (1, 1)),
                          name="conv2")(y_BxhxwxF)
    # Zero scale on the last BN makes each block start as identity (Goyal et al.).
    last_scale_init = (nn.initializers.zeros if self.zero_init_residual
                       else nn.initializers.ones)
    y_BxhxwxF = self.norm(scale_init=last_scale_init, name="bn2")(y_BxhxwxF)
    residual = _shortcut(x_BxHxWxI, out_channels, self.strides, self.conv, self.norm)
    return nn.relu(residual + y_BxhxwxF)


class BottleneckBlock(nn.Module):
  """1x1 -> 3x3 (strided, v1.5) -> 1x1 x4 expansion; used by ResNet-50."""

  filters: int
  conv: ModuleDef
  norm: ModuleDef
  strides: int = 1
  zero_init_residual: bool = True
  expansion = 4

  @nn.compact
  def __call__(self, x_BxHxWxI):
    out_channels = self.filters * self.expansion
    y_BxHxWxF = self.conv(self.filters, (1, 1), name="conv1")(x_BxHxWxI)
    y_BxHxWxF = nn.relu(self.norm(name="bn1")(y_BxHxWxF))
    # v1.5: stride sits on the 3x3 conv, not the first 1x1 (better accuracy).
    y_BxhxwxF = self.conv(self.filters, (3, 3), strides=(self.strides, self.strides),
                          padding=((1, 1), (1, 1)), name="conv2")(y_BxHxWxF)
    y_BxhxwxF = nn.relu(self.norm(name="bn2")(y_BxhxwxF))
    y_BxhxwxO = self.conv(out_channels, (1, 1), name="conv3")(y_BxhxwxF)
    last_scale_init = (nn.initializers.zeros if self.zero_init_residual
                       else nn.initializers.ones)
    y_BxhxwxO = self.norm(scale_init=last_scale_init, name="bn3")(y_BxhxwxO)
    residual = _shortcut(x_BxHxWxI, out_channels, self.strides, self.conv, self.norm)
    return nn.relu(residual + y_BxhxwxO)


def _shortcut(x_BxHxWxI, out_channels: int, strides: int, conv: ModuleDef,
              norm: ModuleDef):
  """Identity when shapes match, else 1x1 conv + BN projection (option B)."""
  if x_BxHxWxI.shape[-1] == out_channels and strides == 1:
    return x_BxHxWxI
  # Called inside the parent's compact __call__, so these bind to that block.
  x_BxhxwxO = conv(out_channels, (1, 1), strides=(strides, strides),
                   name="proj_conv")(x_BxHxWxI)
  return norm(name="proj_bn")(x_BxhxwxO)


_BLOCK_CLASSES = {"basic": BasicBlock, "bottleneck": BottleneckBlock}


class GhostBatchNorm(nn.Module):
  """BatchNorm that normalises each of `groups` equal contiguous slices of the batch by its
  own statistics (ghost batch norm, Hoffer et al. 2017): what D data-parallel devices with
  per-device BatchNorm compute, each on its own rows, whatever devices the program runs on.

  Its variables are nn.BatchNorm's (params scale, bias; batch_stats mean, var) and so is its
  math on each slice; the running averages take the slices' mean statistics, and
  evaluation (`use_running_average`) is nn.BatchNorm's."""

  groups: int
  use_running_average: bool
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Any = None
  param_dtype: Any = jnp.float32
  scale_init: Callable = nn.initializers.ones
  bias_init: Callable = nn.initializers.zeros

  @nn.compact
  def __call__(self, x):
    features = x.shape[-1]
    mean_stat = self.variable("batch_stats", "mean", jnp.zeros, (features,), jnp.float32)
    var_stat = self.variable("batch_stats", "var", jnp.ones, (features,), jnp.float32)
    scale = self.param("scale", self.scale_init, (features,), self.param_dtype)
    bias = self.param("bias", self.bias_init, (features,), self.param_dtype)
    if self.use_running_average:
      mean, var, x_g = mean_stat.value, var_stat.value, x
    else:
      if x.shape[0] % self.groups:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {self.groups} "
                         "BatchNorm groups")
      x_g = x.reshape(self.groups, x.shape[0] // self.groups, *x.shape[1:])
      axes = tuple(range(1, x_g.ndim - 1))
      x32 = x_g.astype(jnp.float32)
      mean = x32.mean(axes, keepdims=True)
      var = jnp.maximum((x32 * x32).mean(axes, keepdims=True) - mean * mean, 0.0)
      if not self.is_initializing():
        m = self.momentum
        mean_stat.value = m * mean_stat.value + (1 - m) * mean.mean(0).reshape(features)
        var_stat.value = m * var_stat.value + (1 - m) * var.mean(0).reshape(features)
    y = (x_g - mean) * (jax.lax.rsqrt(var + self.epsilon) * scale) + bias
    return jnp.asarray(y.reshape(x.shape), self.dtype or x.dtype)


class ResNet(nn.Module):
  """ResNet v1.5 classifier returning float32 logits [B, num_classes].

  stem='imagenet' is the 224x224 stem: a 7x7/2 conv, then a 3x3/2 max pool.
  stem='small' is a 3x3/1 conv with no pool, so 28x28 and 32x32 inputs keep enough
  spatial resolution through the four stages.
  """

  stage_sizes: Sequence[int]
  block: str
  num_classes: int
  width: int = 64
  stem: str = "imagenet"
  dtype: Any = jnp.float32
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  zero_init_residual: bool = True
  # Mesh axis over which one model's batch is split inside shard_map: BatchNorm then
  # normalises with the statistics of the model's whole batch, as a single device would.
  bn_axis_name: str | None = None
  # > 1: each of this many equal slices of the batch normalised alone (GhostBatchNorm): the
  # per-device BatchNorm of that many data-parallel devices (config.method.batchnorm).
  bn_groups: int = 1
  # Convolutions whose gradients are canonical (models/conv.py): for XLA:CPU, whose fast
  # convolutions need it inside a loop (gradient accumulation). Same parameters, same math.
  canonical_conv_grads: bool = False

  def __post_init__(self):
    # Fail at construction, not deep inside init, on a bad config.
    if self.block not in BLOCKS:
      raise ValueError(f"Unknown ResNet block {self.block!r}; valid choices: {list(BLOCKS)}")
    if self.stem not in STEMS:
      raise ValueError(f"Unknown ResNet stem {self.stem!r}; valid choices: {list(STEMS)}")
    if len(self.stage_sizes) == 0 or any(n < 1 for n in self.stage_sizes):
      raise ValueError(f"stage_sizes must be non-empty positive ints, got {self.stage_sizes!r}")
    if self.width < 1:
      raise ValueError(f"width must be positive, got {self.width!r}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxHxWxI, train: bool):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype,
                             param_dtype=jnp.float32, kernel_init=_conv_init,
                             conv_general_dilated=canonical_conv if self.canonical_conv_grads
                             else None)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                             dtype=self.dtype, param_dtype=jnp.float32,
                             axis_name=self.bn_axis_name)
    if self.bn_groups > 1:
      if self.bn_axis_name is not None:
        raise ValueError("bn_groups > 1 sets the statistics' groups itself; it takes no "
                         f"bn_axis_name (got {self.bn_axis_name!r})")
      norm = functools.partial(GhostBatchNorm, self.bn_groups, not train,
                               momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                               dtype=self.dtype, param_dtype=jnp.float32)
    block_cls = _BLOCK_CLASSES[self.block]

    x_BxHxWxI = jnp.asarray(x_BxHxWxI, self.dtype)
    if self.stem == "imagenet":
      x_BxHxWxF = conv(self.width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)),
                       name="stem_conv")(x_BxHxWxI)
      x_BxHxWxF = nn.relu(norm(name="stem_bn")(x_BxHxWxF))
      x_BxHxWxF = nn.max_pool(x_BxHxWxF, (3, 3), strides=(2, 2),
                              padding=((1, 1), (1, 1)))
    else:
      x_BxHxWxF = conv(self.width, (3, 3), padding=((1, 1), (1, 1)),
                       name="stem_conv")(x_BxHxWxI)
      x_BxHxWxF = nn.relu(norm(name="stem_bn")(x_BxHxWxF))

    for i, num_blocks in enumerate(self.stage_sizes):
      for j in range(num_blocks):
        # First block of every stage but the first halves the resolution.
        strides = 2 if i > 0 and j == 0 else 1
        x_BxHxWxF = block_cls(filters=self.width * 2**i, conv=conv, norm=norm,
                              strides=strides,
                              zero_init_residual=self.zero_init_residual,
                              name=f"stage{i + 1}_block{j + 1}")(x_BxHxWxF)

    # Pool and classify in float32 for stable logits under bf16 compute.
    x_BxF = jnp.mean(x_BxHxWxF.astype(jnp.float32), axis=(1, 2))
    # The public embedding: methods/step.py:predict_with_features reads it (distill pools).
    self.sow("intermediates", "features", x_BxF)
    logits_BxK = nn.Dense(self.num_classes, dtype=jnp.float32,
                          param_dtype=jnp.float32, name="head")(x_BxF)
    return logits_BxK


ResNet18 = functools.partial(ResNet, stage_sizes=(2, 2, 2, 2), block="basic")
ResNet34 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block="basic")
ResNet50 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block="bottleneck")

# The presets, by config.model.name (the registry is `models.MODELS`).
PRESETS: dict[str, Callable[..., ResNet]] = {
    "resnet18": ResNet18,
    "resnet34": ResNet34,
    "resnet50": ResNet50,
}


def create_model(name: str, *, num_classes: int, width: int = 64,
                 stem: str = "imagenet", dtype=jnp.float32,
                 canonical_conv_grads: bool = False,
                 stage_sizes: Sequence[int] = ()) -> nn.Module:
  """Builds a ResNet preset by the name configs and flags use.

  A non-empty `stage_sizes` replaces the preset's blocks per stage; the block type stays."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model name {name!r}; valid choices: {sorted(PRESETS)}")
  extra = {"stage_sizes": tuple(stage_sizes)} if stage_sizes else {}
  return PRESETS[name](num_classes=num_classes, width=width, stem=stem, dtype=dtype,
                      canonical_conv_grads=canonical_conv_grads, **extra)
