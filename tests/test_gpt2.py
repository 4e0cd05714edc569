"""Tests for ensemble_jax.models.gpt2 (compile-light; device-count agnostic)."""

import functools
import math

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_jax.models import gpt2

pytestmark = pytest.mark.unit

# Small config shared by the compute tests: cheap to compile on a CPU.
VOCAB, CONTEXT, LAYERS, HEADS, DIM = 97, 16, 2, 2, 32


def _num_params(tree) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree))


def _abstract_init(model, tokens):
  # eval_shape traces only: no FLOPs, no device memory.
  return jax.eval_shape(functools.partial(model.init, train=False),
                        jax.random.PRNGKey(0), tokens)


def _small_model(**kwargs):
  return gpt2.GPT2(vocab_size=VOCAB, context=CONTEXT, num_layers=LAYERS,
                   num_heads=HEADS, embed_dim=DIM, **kwargs)


def _random_tokens(seed, shape=(2, CONTEXT)):
  return jax.random.randint(jax.random.PRNGKey(seed), shape, 0, VOCAB)


def _init(model, tokens):
  # An 'rbg' key keeps init compiles fast on CPU (see test_resnet.py).
  init_key = jax.random.key(0, impl='rbg')
  return jax.jit(functools.partial(model.init, train=False))(init_key, tokens)['params']


# Published (and HF) parameter counts for vocab 50257 and context 1024.
@pytest.mark.parametrize('name, expected', [
    ('small', 124_439_808),
    ('medium', 354_823_168),
    ('large', 774_030_080),
    ('xl', 1_557_611_200),
])
def test_param_count_matches_published(name, expected):
  model = gpt2.create_model(name, vocab_size=50257, context=1024)
  # one token: the parameters' shapes come from the context, not the input's length (the
  # trace of 1,024 tokens cost 2.6x as long for xl)
  variables = _abstract_init(model, jax.ShapeDtypeStruct((1, 1), jnp.int32))
  assert set(variables) == {'params'}
  assert _num_params(variables['params']) == expected


def _to_torch_state_dict(params, num_layers):
  """Our params -> HF GPT2LMHeadModel state dict (Conv1D weights are [in, out] too)."""
  import torch

  t = lambda x: torch.from_numpy(np.array(x, dtype=np.float32))
  sd = {
      'transformer.wte.weight': t(params['wte']['embedding']),
      'transformer.wpe.weight': t(params['wpe']['embedding']),
      'transformer.ln_f.weight': t(params['ln_f']['scale']),
      'transformer.ln_f.bias': t(params['ln_f']['bias']),
  }
  for i in range(num_layers):
    block = params[f'h_{i}']
    prefix = f'transformer.h.{i}'
    for ln in ('ln_1', 'ln_2'):
      sd[f'{prefix}.{ln}.weight'] = t(block[ln]['scale'])
      sd[f'{prefix}.{ln}.bias'] = t(block[ln]['bias'])
    for sub, dense in (('attn', 'c_attn'), ('attn', 'c_proj'), ('mlp', 'c_fc'),
                       ('mlp', 'c_proj')):
      sd[f'{prefix}.{sub}.{dense}.weight'] = t(block[sub][dense]['kernel'])
      sd[f'{prefix}.{sub}.{dense}.bias'] = t(block[sub][dense]['bias'])
  return sd


@pytest.mark.integration
def test_logits_match_hugging_face_reference():
  torch = pytest.importorskip(
      'torch', reason='torch (the HF reference backend) is not installed')
  transformers = pytest.importorskip(
      'transformers', reason='transformers (the HF GPT-2 reference) is not installed')

  model = _small_model()
  tokens_BxT = _random_tokens(1)
  params = _init(model, tokens_BxT)
  # Perturb every leaf (LayerNorm scales/biases and linear biases start at 1/0) and
  # enlarge the weights, so a mismatch anywhere shows up well above the tolerance.
  # NumPy noise: a jax.random draw per leaf shape would be one CPU compile each.
  rng = np.random.default_rng(2)
  params = jax.tree_util.tree_map(
      lambda p: (np.asarray(p) * 3.0
                 + 0.1 * rng.standard_normal(p.shape)).astype(np.float32), params)
  logits_BxTxV = np.asarray(jax.jit(functools.partial(model.apply, train=False))(
      {'params': params}, tokens_BxT))

  config = transformers.GPT2Config(
      vocab_size=VOCAB, n_positions=CONTEXT, n_embd=DIM, n_layer=LAYERS, n_head=HEADS,
      activation_function='gelu_new', resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
      layer_norm_epsilon=1e-5, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
  torch_model = transformers.GPT2LMHeadModel(config).eval()
  state_dict = _to_torch_state_dict(params, LAYERS)
  # Every HF parameter gets one of ours, except lm_head.weight, which is tied to wte.
  reference = dict(torch_model.named_parameters(remove_duplicate=False))
  assert set(reference) - set(state_dict) == {'lm_head.weight'}
  for name, tensor in state_dict.items():
    assert reference[name].shape == tensor.shape, name
  torch_model.load_state_dict(state_dict, strict=False)
  # The head must be tied, so it now holds our wte.
  np.testing.assert_array_equal(torch_model.lm_head.weight.detach().numpy(),
                                np.asarray(params['wte']['embedding']))

  with torch.no_grad():
    ref_BxTxV = torch_model(torch.from_numpy(np.asarray(tokens_BxT, np.int64))).logits
  ref_BxTxV = ref_BxTxV.numpy()
  assert logits_BxTxV.dtype == np.float32 and logits_BxTxV.shape == ref_BxTxV.shape
  assert np.std(ref_BxTxV) > 1.0 # Logits are large enough for the check to bite.
  max_abs_diff = float(np.max(np.abs(logits_BxTxV - ref_BxTxV)))
  print(f'max |logits - HF logits| = {max_abs_diff:.3g} (logit std {np.std(ref_BxTxV):.3g})')
  assert max_abs_diff <= 1e-4


@pytest.mark.integration
def test_remat_gives_same_loss_and_gradients():
  # Dropout on and train=True: remat must also replay the same dropout masks.
  tokens_BxT = _random_tokens(3)
  plain = _small_model(embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1)
  remat = plain.clone(remat=True)
  params = _init(plain, tokens_BxT)
  # remat changes no parameter names or shapes.
  assert (jax.tree_util.tree_structure(_abstract_init(remat, tokens_BxT)['params'])
          == jax.tree_util.tree_structure(params))

  # An 'rbg' key halves the compile time of the dropout draws on CPU.
  dropout_key = jax.random.key(4, impl='rbg')

  def loss_fn(model, params):
    logits_BxTxV = model.apply({'params': params}, tokens_BxT[:, :-1], train=True,
                               rngs={'dropout': dropout_key})
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV)
    targets_BxT = tokens_BxT[:, 1:]
    return -jnp.mean(jnp.take_along_axis(logp_BxTxV, targets_BxT[..., None], -1))

  loss_a, grads_a = jax.jit(jax.value_and_grad(functools.partial(loss_fn, plain)))(params)
  loss_b, grads_b = jax.jit(jax.value_and_grad(functools.partial(loss_fn, remat)))(params)
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
      grads_a, grads_b)
  assert float(jnp.max(jnp.abs(grads_a['h_0']['attn']['c_attn']['kernel']))) > 0


def test_changing_a_token_changes_no_earlier_logits():
  model = _small_model()
  tokens_BxT = _random_tokens(5, (1, CONTEXT))
  t = CONTEXT // 2
  changed_BxT = tokens_BxT.at[:, t].set((tokens_BxT[:, t] + 1) % VOCAB)
  both_BxT = jnp.concatenate([tokens_BxT, changed_BxT])
  params = _init(model, both_BxT)
  logits_BxTxV = jax.jit(functools.partial(model.apply, train=False))(
      {'params': params}, both_BxT)
  np.testing.assert_array_equal(logits_BxTxV[0, :t], logits_BxTxV[1, :t])
  assert not np.allclose(logits_BxTxV[0, t:], logits_BxTxV[1, t:])


def test_bad_configs_raise():
  with pytest.raises(ValueError, match="'nope'.*small"):
    gpt2.create_model('nope', vocab_size=VOCAB, context=CONTEXT)
  with pytest.raises(ValueError, match='embed_dim=30.*num_heads=4'):
    gpt2.GPT2(vocab_size=VOCAB, context=CONTEXT, num_layers=1, num_heads=4, embed_dim=30)
  model = _small_model()
  too_long = jax.ShapeDtypeStruct((1, CONTEXT + 1), jnp.int32)
  with pytest.raises(ValueError, match=f'T={CONTEXT + 1}.*context={CONTEXT}'):
    _abstract_init(model, too_long)


def test_bf16_compute_keeps_float32_params_and_logits():
  model = gpt2.create_model('tiny', vocab_size=VOCAB, context=CONTEXT, dtype=jnp.bfloat16)
  tokens = jax.ShapeDtypeStruct((2, CONTEXT), jnp.int32)
  variables = _abstract_init(model, tokens)
  dtypes = {leaf.dtype for leaf in jax.tree_util.tree_leaves(variables)}
  assert dtypes == {jnp.dtype(jnp.float32)}
  logits = jax.eval_shape(functools.partial(model.apply, train=False), variables, tokens)
  assert logits.shape == (2, CONTEXT, VOCAB) and logits.dtype == jnp.float32


@pytest.mark.integration
def test_fused_attention_matches_einsum_attention():
  # Same parameters, same loss and gradients: the fused kernel (XLA's on CPU, cuDNN's on
  # GPU) is a drop-in for the materialised scores.
  tokens_BxT = _random_tokens(6)
  einsum = _small_model()
  fused = einsum.clone(attention='fused')
  params = _init(einsum, tokens_BxT)
  assert (jax.tree_util.tree_structure(_abstract_init(fused, tokens_BxT)['params'])
          == jax.tree_util.tree_structure(params))

  def loss_fn(model, params):
    logits_BxTxV = model.apply({'params': params}, tokens_BxT[:, :-1], train=True)
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV)
    return -jnp.mean(jnp.take_along_axis(logp_BxTxV, tokens_BxT[:, 1:, None], -1))

  loss_a, grads_a = jax.jit(jax.value_and_grad(functools.partial(loss_fn, einsum)))(params)
  loss_b, grads_b = jax.jit(jax.value_and_grad(functools.partial(loss_fn, fused)))(params)
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5, atol=1e-6)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_a, grads_b)


@pytest.mark.parametrize('T, query_block', [(20, 8), (100, 8), (15, 64)])
def test_blocked_attention_matches_einsum_attention(monkeypatch, T, query_block):
  # The dropout-free path skips the masked blocks of the scores and writes its own
  # backward: same outputs and gradients as the materialised scores, up to rounding, with
  # uneven blocks (T not a multiple of the block), several blocks and one.
  monkeypatch.setattr(gpt2, '_QUERY_BLOCK', query_block)
  rng = np.random.default_rng(T)
  q, k, v, dy = (jnp.asarray(rng.standard_normal((2, 3, T, 8)), jnp.float32) * 2
                 for _ in range(4))
  einsum = lambda q, k, v: gpt2._einsum_attention(q, k, v, jnp.float32, lambda p: p)
  y_a, vjp_a = jax.vjp(jax.jit(einsum), q, k, v)
  y_b, vjp_b = jax.vjp(jax.jit(gpt2._blocked_attention), q, k, v)
  np.testing.assert_allclose(y_b, y_a, rtol=1e-5, atol=1e-5)
  for a, b in zip(vjp_a(dy), vjp_b(dy)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


def _dot_operand_dtypes(jaxpr, shape) -> set:
  """The dtypes of every dot_general operand of `shape` in `jaxpr`, sub-jaxprs included."""
  found = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      found |= {v.aval.dtype for v in eqn.invars if v.aval.shape == shape}
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found |= _dot_operand_dtypes(sub, shape)
  return found


def test_bf16_head_backward_runs_in_bf16_and_matches_float32():
  # The logits' gradient [N, V] feeds the step's two largest GEMMs: in bf16 compute they
  # take it in bf16 (autodiff would keep it float32: TF32 GEMMs on GPU); in float32 the
  # head is the plain product. Both backwards agree with float32 to bf16's precision.
  tokens_BxT = _random_tokens(6)
  model = _small_model()
  params = _init(model, tokens_BxT)

  def loss_fn(model, params):
    logits_BxTxV = model.apply({'params': params}, tokens_BxT[:, :-1], train=True)
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV)
    return -jnp.mean(jnp.take_along_axis(logp_BxTxV, tokens_BxT[:, 1:, None], -1))

  bf16 = model.clone(dtype=jnp.bfloat16)
  n = tokens_BxT.shape[0] * (tokens_BxT.shape[1] - 1)
  jaxpr = jax.make_jaxpr(jax.grad(functools.partial(loss_fn, bf16)))(params).jaxpr
  assert _dot_operand_dtypes(jaxpr, (n, VOCAB)) == {jnp.dtype(jnp.bfloat16)}
  grads_32 = jax.jit(jax.grad(functools.partial(loss_fn, model)))(params)
  grads_16 = jax.jit(jax.grad(functools.partial(loss_fn, bf16)))(params)
  wte_32, wte_16 = grads_32['wte']['embedding'], grads_16['wte']['embedding']
  assert wte_16.dtype == jnp.float32
  np.testing.assert_allclose(wte_16, wte_32, atol=0.05 * float(jnp.abs(wte_32).max()))


@pytest.mark.parametrize('shape', [(8, 10), (3, 5, 300)])  # [B, C] and [B, T, V]
def test_loss_is_optaxs_and_its_gradient_one_expression(shape):
  # The step's integer-label loss: optax's value bit for bit, the argmax as its prediction,
  # optax's gradient up to float rounding; the gradient compiles without the gather's
  # transpose (a scatter into [..., V]) that autodiff gives and XLA does not fuse.
  import optax

  from ensemble_jax.methods import step

  logits = 4 * jax.random.normal(jax.random.key(0), shape)
  labels = jax.random.randint(jax.random.key(1), shape[:-1], 0, shape[-1])
  weights = jax.random.normal(jax.random.key(2), shape[:-1])
  loss, predicted = step.loss_and_predictions(logits, labels)
  reference = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  np.testing.assert_array_equal(loss, reference)
  np.testing.assert_array_equal(predicted, jnp.argmax(logits, -1))
  grad = jax.grad(lambda l: jnp.sum(weights * step.cross_entropy(l, labels)))
  expected = jax.grad(lambda l: jnp.sum(
      weights * optax.softmax_cross_entropy_with_integer_labels(l, labels)))(logits)
  np.testing.assert_allclose(grad(logits), expected, rtol=1e-6, atol=1e-6)
  assert 'scatter' not in jax.jit(grad).lower(logits).compile().as_text()
  # byte-sized labels index more classes than their dtype counts (V = 300 > 256)
  small = jnp.minimum(labels, 255).astype(jnp.uint8)
  np.testing.assert_array_equal(
      jax.grad(lambda l: jnp.sum(step.cross_entropy(l, small)))(logits),
      jax.grad(lambda l: jnp.sum(step.cross_entropy(l, small.astype(jnp.int32))))(logits))
  bad = logits.at[(0,) * len(shape)].set(jnp.nan).at[(1,) * len(shape)].set(jnp.inf)
  np.testing.assert_array_equal(
      step.cross_entropy(bad, labels),
      optax.softmax_cross_entropy_with_integer_labels(bad, labels))
