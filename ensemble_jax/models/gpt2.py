"""GPT-2 in flax.linen, matching the published model and Hugging Face's layout.

The language-model counterpart of resnet.py: parameter names and shapes follow
HF `GPT2LMHeadModel` (`wte`, `wpe`, `h_{i}/{ln_1,attn/c_attn,attn/c_proj,ln_2,
mlp/c_fc,mlp/c_proj}`, `ln_f`; HF's Conv1D weights are [in, out] like Flax Dense
kernels) so weights map one-to-one. Parameters are always float32; `dtype` only
sets the compute dtype. Logits are float32.

Shape suffixes follow the package's legend (ensemble_jax/__init__.py): A heads, Z one
head's width, and attention scores TxT (queries, then keys).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# Presets: (num_layers, num_heads, embed_dim). The four published GPT-2 sizes plus
# small ones that train on a CPU in tests, smoke runs and sweeps.
SIZES: dict[str, dict[str, int]] = {
    "micro": dict(num_layers=1, num_heads=2, embed_dim=64),
    "tiny": dict(num_layers=2, num_heads=2, embed_dim=64),
    "mini": dict(num_layers=4, num_heads=4, embed_dim=128),
    "small": dict(num_layers=12, num_heads=12, embed_dim=768),
    "medium": dict(num_layers=24, num_heads=16, embed_dim=1024),
    "large": dict(num_layers=36, num_heads=20, embed_dim=1280),
    "xl": dict(num_layers=48, num_heads=25, embed_dim=1600),
}

_INIT_STD = 0.02
# OpenAI's GPT-2 code initialises the position table with a smaller std than wte.
_POS_INIT_STD = 0.01


def _dense(features: int, dtype: Any, std: float, name: str) -> nn.Dense:
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32,
                  kernel_init=nn.initializers.normal(std),
                  bias_init=nn.initializers.zeros, name=name)


def _tokens(x_BxTxD):
  """[B, T, D] -> [B*T, D]: dense layers over flattened tokens.

  XLA:CPU's gradient of a dense layer over 3-D inputs contracts two axes (B and T)
  and runs far slower than the one plain [B*T, D] x [D, F] GEMM it is; the reshape
  is free and the numbers are the same."""
  return x_BxTxD.reshape(-1, x_BxTxD.shape[-1])


def _einsum_attention(q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ, dtype, dropout):
  """Causal attention with the [B, A, T, T] scores materialised.

  It keeps HF's numerics and applies `dropout` to the probabilities, which the fused
  kernel cannot do. Heads lead their tokens ([B, A, T, Z]) so both products and their
  gradients are batched GEMMs with no transposes inside."""
  T, head_dim = q_BxAxTxZ.shape[2], q_BxAxTxZ.shape[-1]
  # Scores and softmax in float32: bf16 logits lose too much precision for softmax.
  scores_BxAxTxT = jnp.einsum("batz,basz->bats", q_BxAxTxZ, k_BxAxTxZ,
                              preferred_element_type=jnp.float32)
  scores_BxAxTxT = scores_BxAxTxT / math.sqrt(head_dim)
  causal_TxT = jnp.tril(jnp.ones((T, T), dtype=bool))
  scores_BxAxTxT = jnp.where(causal_TxT, scores_BxAxTxT, jnp.finfo(jnp.float32).min)
  probs_BxAxTxT = dropout(nn.softmax(scores_BxAxTxT, axis=-1).astype(dtype))
  return jnp.einsum("bats,basz->batz", probs_BxAxTxT, v_BxAxTxZ)


# Query rows per block of `_blocked_attention`: T = 256 in 4 blocks, T = 128 in 2.
_QUERY_BLOCK = 64


def _query_blocks(T: int) -> list[tuple[int, int]]:
  """[start, end) of each query block: at most 8 blocks of at least _QUERY_BLOCK rows."""
  n = max(1, min(8, T // _QUERY_BLOCK))
  bounds = [round(i * T / n) for i in range(n + 1)]
  return list(zip(bounds[:-1], bounds[1:]))


def _block_causal_TxT(start: int, end: int) -> jax.Array:
  """Which of keys [0, end) each query in [start, end) sees."""
  return jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None]


@jax.custom_vjp
def _blocked_attention(q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ):
  """Causal attention without attention dropout, `_einsum_attention`'s numbers up to
  float rounding, skipping the masked half of the scores. A block's scores are TxT: its
  queries, then keys [0, end).

  Query block [start, end) attends keys [0, end) only: a causal mask zeroes every later
  key, so its scores, softmax and gradients need not be computed (at 4 blocks 10/16 of
  the [T, T] work). The backward pass is hand-written: it reuses the saved probabilities
  and takes the softmax's row term from the outputs (sum_z dy * y, flash attention's
  identity), not from a pass over [T, T]; its masked entries are exact zeros."""
  return _blocked_attention_fwd(q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ)[0]


def _blocked_attention_fwd(q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ):
  T, head_dim = q_BxAxTxZ.shape[2], q_BxAxTxZ.shape[-1]
  dtype = q_BxAxTxZ.dtype
  probs, ys = [], []
  for start, end in _query_blocks(T):
    # Scores and softmax in float32, as in _einsum_attention.
    scores_BxAxTxT = jnp.einsum("batz,basz->bats", q_BxAxTxZ[:, :, start:end],
                                k_BxAxTxZ[:, :, :end], preferred_element_type=jnp.float32)
    scores_BxAxTxT = jnp.where(_block_causal_TxT(start, end),
                               scores_BxAxTxT / math.sqrt(head_dim),
                               jnp.finfo(jnp.float32).min)
    probs_BxAxTxT = jax.nn.softmax(scores_BxAxTxT, axis=-1).astype(dtype)
    probs.append(probs_BxAxTxT)
    ys.append(jnp.einsum("bats,basz->batz", probs_BxAxTxT, v_BxAxTxZ[:, :, :end]))
  y_BxAxTxZ = jnp.concatenate(ys, axis=2)
  return y_BxAxTxZ, (q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ, y_BxAxTxZ, probs)


def _blocked_attention_bwd(residuals, dy_BxAxTxZ):
  q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ, y_BxAxTxZ, probs = residuals
  T, head_dim = q_BxAxTxZ.shape[2], q_BxAxTxZ.shape[-1]
  f32 = jnp.float32
  # softmax's backward: dscores = p * (dp - sum_k p dp), and sum_k p dp = sum_z dy * y.
  row_BxAxTx1 = jnp.sum(dy_BxAxTxZ.astype(f32) * y_BxAxTxZ.astype(f32), -1, keepdims=True)
  dqs = []
  dk_BxAxTxZ, dv_BxAxTxZ = jnp.zeros(k_BxAxTxZ.shape, f32), jnp.zeros(v_BxAxTxZ.shape, f32)
  for (start, end), probs_BxAxTxT in zip(_query_blocks(T), probs):
    dyb_BxAxTxZ = dy_BxAxTxZ[:, :, start:end]
    dprobs_BxAxTxT = jnp.einsum("batz,basz->bats", dyb_BxAxTxZ, v_BxAxTxZ[:, :, :end],
                                preferred_element_type=f32)
    dprobs_BxAxTxT = dprobs_BxAxTxT - row_BxAxTx1[:, :, start:end]
    dscores_BxAxTxT = (probs_BxAxTxT.astype(f32) * dprobs_BxAxTxT
                       / math.sqrt(head_dim)).astype(q_BxAxTxZ.dtype)
    dqs.append(jnp.einsum("bats,basz->batz", dscores_BxAxTxT, k_BxAxTxZ[:, :, :end],
                          preferred_element_type=f32))
    dk_BxAxTxZ = dk_BxAxTxZ.at[:, :, :end].add(
        jnp.einsum("bats,batz->basz", dscores_BxAxTxT, q_BxAxTxZ[:, :, start:end],
                   preferred_element_type=f32))
    dv_BxAxTxZ = dv_BxAxTxZ.at[:, :, :end].add(
        jnp.einsum("bats,batz->basz", probs_BxAxTxT, dyb_BxAxTxZ, preferred_element_type=f32))
  dq_BxAxTxZ = jnp.concatenate(dqs, axis=2)
  return (dq_BxAxTxZ.astype(q_BxAxTxZ.dtype), dk_BxAxTxZ.astype(k_BxAxTxZ.dtype),
          dv_BxAxTxZ.astype(v_BxAxTxZ.dtype))


_blocked_attention.defvjp(_blocked_attention_fwd, _blocked_attention_bwd)


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention with a fused qkv projection (HF `attn`)."""

  num_heads: int
  dtype: Any
  attn_dropout: float
  resid_dropout: float
  out_init_std: float
  attention: str = "einsum"

  @nn.compact
  def __call__(self, x_BxTxD, train: bool):
    B, T, D = x_BxTxD.shape
    A, head_dim = self.num_heads, D // self.num_heads
    qkv_Nx3D = _dense(3 * D, self.dtype, _INIT_STD, "c_attn")(_tokens(x_BxTxD))
    # HF splits the fused projection as [q | k | v], each D wide, heads contiguous.
    qkv_BxTx3xAxZ = qkv_Nx3D.reshape(B, T, 3, A, head_dim)
    if self.attention == "fused":  # cuDNN flash attention on GPU in bf16; XLA's elsewhere
      q_BxTxAxZ, k_BxTxAxZ, v_BxTxAxZ = (qkv_BxTx3xAxZ[:, :, i] for i in range(3))
      cudnn = jax.default_backend() == "gpu" and q_BxTxAxZ.dtype in (jnp.bfloat16, jnp.float16)
      y_BxTxAxZ = jax.nn.dot_product_attention(q_BxTxAxZ, k_BxTxAxZ, v_BxTxAxZ,
                                               is_causal=True,
                                               implementation="cudnn" if cudnn else None)
    else:
      # One transpose to heads-first for q, k and v together (and one back below).
      q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ = jnp.transpose(qkv_BxTx3xAxZ, (2, 0, 3, 1, 4))
      dropout = nn.Dropout(self.attn_dropout, name="attn_dropout")
      if (train and self.attn_dropout > 0) or jax.default_backend() != "cpu":
        y_BxAxTxZ = _einsum_attention(q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ, self.dtype,
                                      lambda p: dropout(p, deterministic=not train))
      else:  # measured on XLA:CPU only (docs/benchmarks.md); GPUs keep the plain path
        y_BxAxTxZ = _blocked_attention(q_BxAxTxZ, k_BxAxTxZ, v_BxAxTxZ)
      y_BxTxAxZ = jnp.transpose(y_BxAxTxZ, (0, 2, 1, 3))
    y_NxD = _dense(D, self.dtype, self.out_init_std, "c_proj")(y_BxTxAxZ.reshape(B * T, D))
    y_BxTxD = y_NxD.reshape(B, T, D)
    return nn.Dropout(self.resid_dropout, name="resid_dropout")(
        y_BxTxD, deterministic=not train)


class MLP(nn.Module):
  """c_fc (D -> F) -> GELU (tanh approximation, HF 'gelu_new') -> c_proj (F -> D)."""

  hidden_dim: int
  dtype: Any
  resid_dropout: float
  out_init_std: float

  @nn.compact
  def __call__(self, x_BxTxD, train: bool):
    h_NxF = _dense(self.hidden_dim, self.dtype, _INIT_STD, "c_fc")(_tokens(x_BxTxD))
    h_NxF = nn.gelu(h_NxF, approximate=True)
    y_NxD = _dense(x_BxTxD.shape[-1], self.dtype, self.out_init_std, "c_proj")(h_NxF)
    y_BxTxD = y_NxD.reshape(x_BxTxD.shape)
    return nn.Dropout(self.resid_dropout, name="resid_dropout")(
        y_BxTxD, deterministic=not train)


class Block(nn.Module):
  """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

  num_heads: int
  mlp_ratio: int
  dtype: Any
  attn_dropout: float
  resid_dropout: float
  layer_norm_epsilon: float
  out_init_std: float
  attention: str = "einsum"

  @nn.compact
  def __call__(self, x_BxTxD, train: bool):
    D = x_BxTxD.shape[-1]
    norm = lambda name: nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                                     param_dtype=jnp.float32, use_fast_variance=False,
                                     name=name)
    x_BxTxD = x_BxTxD + CausalSelfAttention(
        num_heads=self.num_heads, dtype=self.dtype, attn_dropout=self.attn_dropout,
        resid_dropout=self.resid_dropout, out_init_std=self.out_init_std,
        attention=self.attention, name="attn")(norm("ln_1")(x_BxTxD), train)
    x_BxTxD = x_BxTxD + MLP(
        hidden_dim=self.mlp_ratio * D, dtype=self.dtype,
        resid_dropout=self.resid_dropout, out_init_std=self.out_init_std,
        name="mlp")(norm("ln_2")(x_BxTxD), train)
    return x_BxTxD


class GPT2(nn.Module):
  """GPT-2 decoder returning float32 next-token logits [B, T, vocab_size].

  The output layer is tied to the token embedding `wte` (no separate head), as in
  the published model. Dropout draws from the 'dropout' rng stream and is active
  only when train=True.
  """

  vocab_size: int
  context: int
  num_layers: int
  num_heads: int
  embed_dim: int
  mlp_ratio: int = 4
  embd_dropout: float = 0.0
  attn_dropout: float = 0.0
  resid_dropout: float = 0.0
  layer_norm_epsilon: float = 1e-5
  dtype: Any = jnp.float32
  # Recompute each block's activations in the backward pass: O(1) blocks of
  # activations in memory instead of num_layers, for ~1/3 more compute.
  remat: bool = False
  # "einsum": scores materialised, HF's exact numerics, attention dropout (on CPU without
  # dropout, `_blocked_attention`: the same numbers, the masked blocks skipped). "fused":
  # `jax.nn.dot_product_attention` (cuDNN flash attention on GPU in bf16), no attention
  # dropout; `experiments/bench/throughput.py` measures the difference.
  attention: str = "einsum"
  # Accepted only because the training code passes them to every model; GPT-2 has no
  # BatchNorm.
  bn_axis_name: str | None = None
  bn_groups: int = 1

  def __post_init__(self):
    # Fail at construction, not deep inside init, on a bad config.
    for field in ("vocab_size", "context", "num_layers", "num_heads", "embed_dim",
                  "mlp_ratio"):
      value = getattr(self, field)
      if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"GPT2 {field} must be a positive int, got {value!r}")
    if self.embed_dim % self.num_heads != 0:
      raise ValueError(f"GPT2 embed_dim={self.embed_dim} must be divisible by "
                       f"num_heads={self.num_heads}")
    for field in ("embd_dropout", "attn_dropout", "resid_dropout"):
      rate = getattr(self, field)
      if not 0.0 <= rate < 1.0:
        raise ValueError(f"GPT2 {field} must be in [0, 1), got {rate!r}")
    super().__post_init__()

  @nn.compact
  def __call__(self, tokens_BxT, train: bool):
    if tokens_BxT.ndim != 2:
      raise ValueError(f"GPT2 expects tokens of shape [B, T], got shape {tokens_BxT.shape}")
    T = tokens_BxT.shape[1]
    if T > self.context:
      raise ValueError(f"Sequence length T={T} exceeds the model context={self.context}")

    wte = nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype,
                   param_dtype=jnp.float32,
                   embedding_init=nn.initializers.normal(_INIT_STD), name="wte")
    wpe = nn.Embed(self.context, self.embed_dim, dtype=self.dtype,
                   param_dtype=jnp.float32,
                   embedding_init=nn.initializers.normal(_POS_INIT_STD), name="wpe")
    x_BxTxD = wte(tokens_BxT) + wpe(jnp.arange(T))[None]
    x_BxTxD = nn.Dropout(self.embd_dropout, name="embd_dropout")(
        x_BxTxD, deterministic=not train)

    # `train` (argument 2, counting self) is a Python bool: static under remat.
    block_cls = nn.remat(Block, static_argnums=(2,)) if self.remat else Block
    # GPT-2's scaled init: each block adds two residual branches, so the output
    # projections get std / sqrt(2 * num_layers) to keep the stream's variance flat.
    out_init_std = _INIT_STD / math.sqrt(2 * self.num_layers)
    for i in range(self.num_layers):
      x_BxTxD = block_cls(num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
                          dtype=self.dtype, attn_dropout=self.attn_dropout,
                          resid_dropout=self.resid_dropout,
                          layer_norm_epsilon=self.layer_norm_epsilon,
                          out_init_std=out_init_std, attention=self.attention,
                          name=f"h_{i}")(x_BxTxD, train)

    x_BxTxD = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                           param_dtype=jnp.float32, use_fast_variance=False,
                           name="ln_f")(x_BxTxD)
    logits_NxV = tied_logits(_tokens(x_BxTxD), wte.embedding)
    return logits_NxV.reshape(*x_BxTxD.shape[:-1], -1)


def tied_logits(x_NxD: jax.Array, embedding_VxD: jax.Array) -> jax.Array:
  """The tied output layer (what `wte.attend` computes) in x's compute dtype, accumulated
  and returned in float32 so bf16 compute does not round the logits to bf16.

  In bf16 its backward is bf16 too: the logits' gradient [N, V] is rounded to bf16 before
  the two GEMMs that consume it (accumulating in float32), as mixed-precision training
  does everywhere else in the model; autodiff would run both in float32 (TF32 on GPU), the
  largest GEMMs of GPT-2 small's step. In float32 it is the plain product."""
  if x_NxD.dtype == jnp.float32:
    return jnp.einsum("nd,vd->nv", x_NxD, embedding_VxD.astype(jnp.float32),
                      preferred_element_type=jnp.float32)
  return _low_precision_logits(x_NxD, embedding_VxD)


_NxD_VxD = (((1,), (1,)), ((), ()))  # dot_general: contract D of [N, D] and [V, D]


@jax.custom_vjp
def _low_precision_logits(x_NxD, embedding_VxD):
  return _low_precision_logits_fwd(x_NxD, embedding_VxD)[0]


def _low_precision_logits_fwd(x_NxD, embedding_VxD):
  e_VxD = embedding_VxD.astype(x_NxD.dtype)
  logits_NxV = jax.lax.dot_general(x_NxD, e_VxD, _NxD_VxD, preferred_element_type=jnp.float32)
  return logits_NxV, (x_NxD, embedding_VxD)  # the parameter: alive anyway


def _low_precision_logits_bwd(residuals, g_NxV):
  x_NxD, embedding_VxD = residuals
  e_VxD = embedding_VxD.astype(x_NxD.dtype)
  g_NxV = g_NxV.astype(x_NxD.dtype)
  dx_NxD = jax.lax.dot_general(g_NxV, e_VxD, (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)
  de_VxD = jax.lax.dot_general(g_NxV, x_NxD, (((0,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)
  return dx_NxD.astype(x_NxD.dtype), de_VxD.astype(embedding_VxD.dtype)


_low_precision_logits.defvjp(_low_precision_logits_fwd, _low_precision_logits_bwd)


def create_model(name: str, *, vocab_size: int, context: int, dtype=jnp.float32,
                 remat: bool = False, dropout: float = 0.0, attention: str = "einsum"
                 ) -> GPT2:
  """Builds a GPT-2 preset by size name; `dropout` sets all three dropout rates."""
  if name not in SIZES:
    raise ValueError(f"Unknown GPT-2 size {name!r}; valid choices: {list(SIZES)}")
  return GPT2(vocab_size=vocab_size, context=context, dtype=dtype, remat=remat,
              attention=attention,
              embd_dropout=dropout, attn_dropout=dropout, resid_dropout=dropout,
              **SIZES[name])
