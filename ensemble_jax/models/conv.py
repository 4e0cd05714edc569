"""A 2-D convolution (NHWC input, HWIO kernel) whose gradients are canonical convolutions.

XLA:CPU runs a convolution fast (Eigen) only in canonical form, NHWC input and HWIO
kernel. Its ConvCanonicalization pass rewrites the others, but only in a program's entry
computation. JAX's gradients of an NHWC convolution are not canonical, since the kernel's
gradient contracts the batch. Inside a loop body, such as gradient accumulation's
`lax.scan`, they stay on XLA:CPU's generic path: a ResNet-18 step of 4 microbatches takes
12.5 s against 2.2 s unsplit (jax-ml/jax#12868). This convolution's backward pass writes
the same transposes and canonical convolutions the pass would have, so they are fast in a
loop too. Its results are bit-identical to JAX's.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

NHWC = ("NHWC", "HWIO", "NHWC")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(x_BxHxWxI, w_RxRxIxO, strides, padding):
  return lax.conv_general_dilated(x_BxHxWxI, w_RxRxIxO, strides, padding,
                                  dimension_numbers=NHWC)


def _conv_fwd(x_BxHxWxI, w_RxRxIxO, strides, padding):
  return _conv(x_BxHxWxI, w_RxRxIxO, strides, padding), (x_BxHxWxI, w_RxRxIxO)


def _conv_bwd(strides, padding, residuals, dy_BxhxwxO):
  x_BxHxWxI, w_RxRxIxO = residuals
  sizes = list(zip(w_RxRxIxO.shape[:2], x_BxHxWxI.shape[1:3], dy_BxhxwxO.shape[1:3],
                   strides, (lo for lo, _ in padding)))
  # Input gradient: dy dilated by the strides against the flipped kernel, I and O swapped.
  pad_x = [(k - 1 - lo, n + lo - 1 - (m - 1) * s) for k, n, m, s, lo in sizes]
  w_RxRxOxI = jnp.transpose(jnp.flip(w_RxRxIxO, (0, 1)), (0, 1, 3, 2))
  dx = lax.conv_general_dilated(dy_BxhxwxO, w_RxRxOxI, (1, 1), pad_x, lhs_dilation=strides,
                                dimension_numbers=NHWC)
  # Kernel gradient: input channels as the batch, the batch as the features, dy the kernel.
  pad_w = [(lo, k - n - lo + (m - 1) * s) for k, n, m, s, lo in sizes]
  dw_IxRxRxO = lax.conv_general_dilated(
      jnp.transpose(x_BxHxWxI, (3, 1, 2, 0)), jnp.transpose(dy_BxhxwxO, (1, 2, 0, 3)),
      (1, 1), pad_w, rhs_dilation=strides, dimension_numbers=NHWC)
  return dx, jnp.transpose(dw_IxRxRxO, (1, 2, 0, 3))


_conv.defvjp(_conv_fwd, _conv_bwd)


def canonical_conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                   dimension_numbers=None, feature_group_count=1, precision=None):
  """`lax.conv_general_dilated` with canonical gradients, for `flax.linen.Conv`.

  Plain 2-D NHWC / HWIO convolutions only, the kind ResNets use; Flax calls it through
  its `conv_general_dilated` field."""
  dilated = any(d != 1 for d in (lhs_dilation or ()) + (rhs_dilation or ()))
  if dilated or feature_group_count != 1 or lhs.ndim != 4 or precision is not None:
    raise NotImplementedError("canonical_conv: plain 2-D convolutions only (no dilation, "
                              "groups or precision)")
  if dimension_numbers is not None and tuple(dimension_numbers) != NHWC:
    dimension_numbers = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    if dimension_numbers != lax.conv_dimension_numbers(lhs.shape, rhs.shape, NHWC):
      raise NotImplementedError(f"canonical_conv: NHWC / HWIO only, got {dimension_numbers}")
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
  return _conv(lhs, rhs, tuple(window_strides), tuple(tuple(p) for p in padding))
