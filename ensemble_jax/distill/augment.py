"""Differentiable siamese augmentation (DSA, Zhao & Bilen 2021), in JAX.

Each call picks one transformation family at random (the papers' 'S' mode): colour
(brightness, saturation, contrast), crop (a shift of up to 1/8 of the side, zero-filled),
cutout (a zeroed square of half the side), horizontal flip, scale (x1/1.2 .. x1.2 per
axis) or rotation (+-15 degrees), bilinear with zeros outside. Every operation is
differentiable in the images, so a distiller can push gradients through it.

`siamese`: one draw of the parameters for a whole batch. Distillation draws once per class
and iteration and applies the same draw to the real and the synthetic batch (what makes
their embeddings comparable). `per_example`: the family is drawn once per batch and its
parameters per example, as the literature's evaluation trains on a synthetic set.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

FAMILIES = ("color", "crop", "cutout", "flip", "scale", "rotate")


@dataclasses.dataclass(frozen=True)
class DSA:
  families: tuple[str, ...] = FAMILIES  # drop "flip" for digits, as the papers do
  scale: float = 1.2
  rotate_degrees: float = 15.0
  crop_fraction: float = 0.125
  cutout_fraction: float = 0.5
  flip_probability: float = 0.5
  brightness: float = 1.0
  saturation: float = 2.0
  contrast: float = 0.5

  def __post_init__(self):
    unknown = sorted(set(self.families) - set(FAMILIES))
    if unknown or not self.families:
      raise ValueError(f"DSA families {list(self.families)}: choose among {list(FAMILIES)}")


def draw(key, dsa: DSA, height: int, width: int) -> dict:
  """One draw of every family's parameters and of which family to apply."""
  k = jax.random.split(key, 11)
  u = lambda i: jax.random.uniform(k[i])
  shift_h, shift_w = int(height * dsa.crop_fraction + 0.5), int(width * dsa.crop_fraction + 0.5)
  cut_h, cut_w = _cutout_size(dsa, height, width)
  r = dsa.scale
  return {
      "family": jax.random.randint(k[0], (), 0, len(dsa.families)),
      "brightness": u(1), "saturation": u(2), "contrast": u(3),
      "shift": jnp.stack([jax.random.randint(k[4], (), -shift_h, shift_h + 1),
                          jax.random.randint(k[5], (), -shift_w, shift_w + 1)]),
      "cutout": jnp.stack([jax.random.randint(k[6], (), 0, height + 1 - cut_h % 2),
                           jax.random.randint(k[7], (), 0, width + 1 - cut_w % 2)]),
      "flip": u(8) < dsa.flip_probability,
      "scale": jax.random.uniform(k[9], (2,)) * (r - 1 / r) + 1 / r,
      "angle": (u(10) - 0.5) * 2 * math.radians(dsa.rotate_degrees),
  }


def _cutout_size(dsa: DSA, height: int, width: int) -> tuple[int, int]:
  return int(height * dsa.cutout_fraction + 0.5), int(width * dsa.cutout_fraction + 0.5)


def _color(x_HxWxI, p, dsa):
  x = x_HxWxI + (p["brightness"] - 0.5) * dsa.brightness
  mean_c = x.mean(axis=-1, keepdims=True)
  x = (x - mean_c) * (p["saturation"] * dsa.saturation) + mean_c
  mean = x.mean()
  return (x - mean) * (p["contrast"] + dsa.contrast) + mean


def _crop(x_HxWxI, p, dsa):
  h, w, _ = x_HxWxI.shape
  sh, sw = int(h * dsa.crop_fraction + 0.5), int(w * dsa.crop_fraction + 0.5)
  padded = jnp.pad(x_HxWxI, ((sh, sh), (sw, sw), (0, 0)))
  return jax.lax.dynamic_slice(padded, (sh + p["shift"][0], sw + p["shift"][1], 0),
                               x_HxWxI.shape)


def _cutout(x_HxWxI, p, dsa):
  h, w, _ = x_HxWxI.shape
  ch, cw = _cutout_size(dsa, h, w)
  rows, cols = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
  r0, c0 = p["cutout"][0] - ch // 2, p["cutout"][1] - cw // 2
  inside = (rows >= r0) & (rows < r0 + ch) & (cols >= c0) & (cols < c0 + cw)
  return jnp.where(inside[..., None], 0.0, x_HxWxI)


def _flip(x_HxWxI, p, dsa):
  del dsa
  return jnp.where(p["flip"], x_HxWxI[:, ::-1], x_HxWxI)


def _warp(x_HxWxI, theta_2x2):
  """PyTorch's affine_grid + grid_sample (bilinear, zeros outside, align_corners=False)."""
  h, w, _ = x_HxWxI.shape
  yn = (2 * jnp.arange(h) + 1) / h - 1
  xn = (2 * jnp.arange(w) + 1) / w - 1
  xg, yg = jnp.meshgrid(xn, yn)  # [H, W]
  xs = theta_2x2[0, 0] * xg + theta_2x2[0, 1] * yg
  ys = theta_2x2[1, 0] * xg + theta_2x2[1, 1] * yg
  ix, iy = ((xs + 1) * w - 1) / 2, ((ys + 1) * h - 1) / 2
  x0, y0 = jnp.floor(ix), jnp.floor(iy)
  out = 0.0
  for dy in (0, 1):
    for dx in (0, 1):
      xx, yy = x0 + dx, y0 + dy
      weight = (1 - jnp.abs(ix - xx)) * (1 - jnp.abs(iy - yy))
      valid = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
      tap = x_HxWxI[jnp.clip(yy, 0, h - 1).astype(jnp.int32),
                    jnp.clip(xx, 0, w - 1).astype(jnp.int32)]
      out = out + jnp.where(valid, weight, 0.0)[..., None] * tap
  return out


def _scale(x_HxWxI, p, dsa):
  del dsa
  return _warp(x_HxWxI, jnp.diag(p["scale"]))


def _rotate(x_HxWxI, p, dsa):
  del dsa
  c, s = jnp.cos(p["angle"]), jnp.sin(p["angle"])
  return _warp(x_HxWxI, jnp.array([[c, -s], [s, c]]))


_OPS = {"color": _color, "crop": _crop, "cutout": _cutout, "flip": _flip, "scale": _scale,
        "rotate": _rotate}


def _apply_one(x_HxWxI, p, dsa: DSA):
  branches = [lambda x, p, f=_OPS[name]: f(x, p, dsa) for name in dsa.families]
  return jax.lax.switch(p["family"], branches, x_HxWxI, p)


def siamese(key, dsa: DSA, *batches_BxHxWxI):
  """Every batch through the one transformation drawn from `key`."""
  h, w = batches_BxHxWxI[0].shape[1:3]
  p = draw(key, dsa, h, w)
  apply = jax.vmap(lambda x: _apply_one(x, p, dsa))
  out = tuple(apply(x) for x in batches_BxHxWxI)
  return out if len(out) > 1 else out[0]


def per_example(key, dsa: DSA, x_BxHxWxI):
  """One family for the batch (only its branch runs), its parameters drawn per example."""
  b, h, w = x_BxHxWxI.shape[:3]
  family_key, key = jax.random.split(key)
  p_B = jax.vmap(lambda k: draw(k, dsa, h, w))(jax.random.split(key, b))
  branches = [jax.vmap(lambda x, p, f=_OPS[name]: f(x, p, dsa)) for name in dsa.families]
  family = jax.random.randint(family_key, (), 0, len(dsa.families))
  return jax.lax.switch(family, branches, x_BxHxWxI, p_B)
