"""The dataset-distillation literature's evaluation model: a small ConvNet.

Depth 3, width 128, each block conv 3x3 -> instance norm -> ReLU -> 2x2 average pooling,
then one linear layer (Zhao et al. 2021; Zhao & Bilen 2021, 2023; Cazenavette et al.
2022). As in those papers' code: a 28x28 one-channel input is padded by 3 in the first
convolution (feature maps 32, 16, 8, 4 wide, an embedding of 4 x 4 x 128 = 2,048), and
weights and biases start uniform in +-1/sqrt(fan_in) (PyTorch's default initialisation).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from ensemble_jax.models.conv import canonical_conv


def _torch_uniform(fan_in: int):
  def init(key, shape, dtype=jnp.float32):
    bound = 1.0 / fan_in**0.5
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


class ConvNet(nn.Module):
  num_classes: int
  in_channels: int = 1
  width: int = 128
  depth: int = 3
  # Convolutions whose gradients are canonical (models/conv.py; bit-identical): XLA:CPU
  # runs the others slowly inside a loop body, as distillation and evaluation are. None:
  # on the CPU backend only.
  canonical_conv_grads: bool | None = None

  def setup(self):
    fan_ins = [9 * (self.in_channels if d == 0 else self.width) for d in range(self.depth)]
    canonical = self.canonical_conv_grads
    if canonical is None:
      canonical = jax.default_backend() == "cpu"
    conv = canonical_conv if canonical else lax.conv_general_dilated
    self.convs = [nn.Conv(self.width, (3, 3), padding=1, kernel_init=_torch_uniform(f),
                          bias_init=_torch_uniform(f), conv_general_dilated=conv)
                  for f in fan_ins]
    # Instance norm: statistics per image and channel, a learned scale and bias
    # (PyTorch's GroupNorm(width, width), eps 1e-5).
    self.norms = [nn.GroupNorm(num_groups=None, group_size=1, epsilon=1e-5)
                  for _ in range(self.depth)]
    self.head = nn.Dense(self.num_classes,
                         kernel_init=_torch_uniform(self.embed_dim),
                         bias_init=_torch_uniform(self.embed_dim))

  @property
  def embed_dim(self) -> int:
    return embed_dim(28 if self.in_channels == 1 else 32, self.in_channels, self.width,
                     self.depth)

  def embed(self, x_BxHxWxI):
    x = x_BxHxWxI
    if x.shape[1] == 28 and x.shape[-1] == 1:  # the first conv's padding of 3: 1 + 2 here
      x = jnp.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))
    for conv, norm in zip(self.convs, self.norms):
      x = nn.avg_pool(nn.relu(norm(conv(x))), (2, 2), strides=(2, 2))
    return x.reshape(x.shape[0], -1)

  def __call__(self, x_BxHxWxI, train: bool = False):
    del train  # no dropout, no running statistics: one function for training and eval
    return self.head(self.embed(x_BxHxWxI))


def embed_dim(height: int, channels: int, width: int = 128, depth: int = 3) -> int:
  size = 32 if height == 28 and channels == 1 else height
  return width * (size // 2**depth) ** 2
