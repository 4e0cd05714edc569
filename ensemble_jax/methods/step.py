"""One model's train state and its pure update step, shared by every method and task.

`data_parallel` jits `train_step` over a sharded global batch; the stacked engine applies
the same function to each worker inside `shard_map`. Nothing here knows about meshes.
Two tasks share the code. `classification` reads batches {"image", "label"} and gives
logits [B, C]. `lm` reads batches {"tokens"} of T + 1 tokens and gives logits [B, T, V]
predicting tokens[:, 1:].
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from ensemble_jax import costs, noise_scale
from ensemble_jax.data.images import normalize
from ensemble_jax.distill import augment


class TrainState(train_state.TrainState):
  batch_stats: Any = None
  # Sparse models: which parameters exist (True) and which SNIP pruned (False), decided
  # once by `snip_prune` and carried (and checkpointed) with the state; never re-derived
  # from values, so zero-initialised biases and BatchNorm scales still train. None: dense.
  prune_mask: Any = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static inputs of the step: hashable, so jit treats them as constants."""
  task: str = "classification"
  mean: tuple[float, ...] = ()
  std: tuple[float, ...] = ()
  label_smoothing: float = 0.0
  # Inside shard_map, the mesh axis one model's batch is split over (per-worker data
  # parallelism): gradients and metrics are averaged over it (BatchNorm syncs its batch
  # statistics itself, through the model's `bn_axis_name`).
  data_axis: str | None = None
  # With data_axis, BatchNorm normalising each device's rows alone (method.batchnorm
  # per_device): the running statistics are averaged over it with the gradients.
  mean_batch_stats: bool = False
  # Gradient accumulation: the batch is split into this many microbatches whose gradients
  # are summed in a `lax.scan` before one update (BatchNorm normalises per microbatch).
  microbatches: int = 1
  # With microbatches > 1: per-step unbiased estimates of |G|^2 and tr(Sigma) from the
  # microbatch and whole-batch gradient norms (`ensemble_jax/noise_scale.py`).
  noise_scale: bool = False
  # Knowledge distillation (`distill.teacher`): the loss mixes in the teacher's soft
  # targets with this weight w, at this temperature T (`loss_and_predictions`). w = 0: no
  # teacher, the step without it.
  kd_weight: float = 0.0
  kd_temperature: float = 1.0
  # A batch's examples marked `synthetic` (a distilled pool's own) are augmented so:
  # "dsa" (siamese augmentation's families, one per batch) or "none".
  synthetic_augment: str = "none"

  @classmethod
  def from_config(cls, config, data_axis: str | None = None) -> "StepConfig":
    return cls(config.task, tuple(config.data.mean), tuple(config.data.std),
               config.optim.label_smoothing, data_axis,
               data_axis is not None and config.method.batchnorm == "per_device",
               config.train.microbatches,
               config.train.noise_scale, config.distill.kd_weight,
               config.distill.kd_temperature, config.distill.synthetic_augment)


def model_inputs(batch: dict, cfg: StepConfig) -> jax.Array:
  if cfg.task == "lm":
    return batch["tokens"][:, :-1]
  return normalize(batch["image"], cfg.mean, cfg.std)


AUGMENT_STREAM = 0x5A  # the step rng's stream for the synthetic examples' augmentation


def augmented(inputs: jax.Array, batch: dict, rng: jax.Array, cfg: StepConfig) -> jax.Array:
  """The batch's examples its pool marks `synthetic`, augmented as `cfg.synthetic_augment`
  says (the others as they are); a batch without the mark, unchanged (the same program)."""
  if "synthetic" not in batch or cfg.synthetic_augment == "none":
    return inputs
  out = augment.per_example(jax.random.fold_in(rng, AUGMENT_STREAM), augment.DSA(), inputs)
  mark = batch["synthetic"].reshape((-1,) + (1,) * (inputs.ndim - 1)) > 0
  return jnp.where(mark, out, inputs)


def targets(batch: dict, cfg: StepConfig) -> jax.Array:
  """[B] class labels, or [B, T] next tokens."""
  return batch["tokens"][:, 1:] if cfg.task == "lm" else batch["label"]


def create_train_state(model, tx: optax.GradientTransformation, rng: jax.Array,
                       init_input: jax.ShapeDtypeStruct, sparse: bool = False) -> TrainState:
  """`sparse`: the state carries a prune mask (all True until `snip_prune` decides it)."""
  variables = model.init(rng, jnp.zeros(init_input.shape, init_input.dtype), train=False)
  params = variables["params"]
  mask = jax.tree.map(lambda p: jnp.ones(p.shape, bool), params) if sparse else None
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx,
                           batch_stats=variables.get("batch_stats"), prune_mask=mask)


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0
                  ) -> jax.Array:
  """Per-example (or per-token) loss with optional label smoothing; classes on the last axis."""
  return loss_and_predictions(logits, labels, label_smoothing)[0]


def loss_and_predictions(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0,
                         teacher_logits: jax.Array | None = None, kd_weight: float = 0.0,
                         kd_temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """(per-example or per-token loss, argmax prediction); classes on the last axis.

  With `teacher_logits` (same shape as `logits`) and `kd_weight` w > 0, the loss takes the
  teacher's soft targets too (Hinton et al., 2015): (1 - w) CE(labels) + w T^2
  KL(softmax(teacher / T) || softmax(logits / T)), T = `kd_temperature`; T^2 keeps the
  soft part's gradient on the scale of the hard part's whatever T. w = 0 is the plain
  loss, the same program. Soft targets replace label smoothing (validation refuses both).

  Without smoothing the target's log-probability is gathered, not dotted with a one-hot
  [..., V] that a 50k vocabulary makes as large as the logits: the same value (the one-hot
  sum adds exact zeros). The passes over the logits are the fewest the loss needs
  (`_integer_label_cross_entropy`): the argmax, which the accuracy needs anyway, gives the
  logsumexp's shift, and the gradient is one elementwise expression."""
  logits = logits.astype(jnp.float32)
  if teacher_logits is not None and kd_weight > 0:
    return _integer_label_cross_entropy(logits, labels, teacher_logits.astype(jnp.float32),
                                        SoftTargets(kd_weight, kd_temperature))
  if not label_smoothing:
    return _integer_label_cross_entropy(logits, labels)
  num_classes = logits.shape[-1]
  targets_onehot = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits, targets_onehot), jnp.argmax(logits, -1)


@dataclasses.dataclass(frozen=True)
class SoftTargets:
  """The weight w and temperature T of a teacher's soft targets in the loss (static)."""
  weight: float
  temperature: float


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _integer_label_cross_entropy(logits: jax.Array, labels: jax.Array,
                                 teacher_logits: jax.Array | None = None,
                                 soft: SoftTargets | None = None
                                 ) -> tuple[jax.Array, jax.Array]:
  """(logsumexp(logits) - logits[label], argmax(logits)) in two passes over the logits,
  with the gradient g (softmax(logits) - onehot(label)) as one elementwise expression.

  Forward: the argmax pass also gives the maximum (the logit it points at, gathered), the
  logsumexp's shift, so `jax.nn.logsumexp`'s own max pass is not needed; the loss is
  bitwise its value. Backward: autodiff gives the same values as a softmax pass, a
  scatter of -g into the label's entries (the gather's transpose) and an add, three passes
  over [..., V], a 50k vocabulary's largest arrays of the step, that XLA does not fuse with
  the cast to bf16 the tied LM head's backward applies next (`gpt2.tied_logits`). As one
  expression the chain is one fusion: read the float32 logits once, write the gradient
  once. The same gradient up to float rounding (softmax - onehot is rounded once before
  the product by g instead of each term separately).

  With `teacher_logits` and `soft` (w, T): the loss (1 - w) CE + w T^2 KL(p_t || p_s),
  p = softmax(. / T), and its gradient g ((1 - w)(softmax(logits) - onehot) + w T (p_s -
  p_t)), still one elementwise expression; the teacher gets no gradient."""
  return _integer_label_cross_entropy_fwd(logits, labels, teacher_logits, soft)[0]


def _logsumexp(logits: jax.Array) -> jax.Array:
  """logsumexp over the last axis, shifted by the maximum (as jax.nn.logsumexp)."""
  top = jnp.max(logits, axis=-1)
  shift = jnp.where(jnp.isfinite(top), top, 0.0)
  return jnp.log(jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1)) + shift


def _integer_label_cross_entropy_fwd(logits, labels, teacher_logits=None, soft=None):
  predicted = jnp.argmax(logits, axis=-1)
  top = jnp.take_along_axis(logits, predicted[..., None], axis=-1)[..., 0]
  shift = jnp.where(jnp.isfinite(top), top, 0.0)  # as jax.nn.logsumexp: inf and nan pass
  lse = jnp.log(jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1)) + shift
  loss = lse - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  if teacher_logits is None:
    return (loss, predicted), (logits, lse, labels, None)
  t = soft.temperature
  student_lse_T, teacher_lse_T = (_logsumexp(logits / t),
                                  _logsumexp(teacher_logits / t))
  teacher_log_probs = teacher_logits / t - teacher_lse_T[..., None]
  kl = jnp.sum(jnp.exp(teacher_log_probs)
               * (teacher_log_probs - (logits / t - student_lse_T[..., None])), axis=-1)
  loss = (1.0 - soft.weight) * loss + soft.weight * t * t * kl
  return (loss, predicted), (logits, lse, labels, (teacher_logits, student_lse_T,
                                                    teacher_lse_T))


def _integer_label_cross_entropy_bwd(soft, residuals, cotangents):
  logits, lse, labels, teacher = residuals
  g = cotangents[0]  # the prediction's cotangent is float0: it has no gradient
  classes = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  onehot = (classes == labels[..., None].astype(jnp.int32)).astype(logits.dtype)
  if teacher is None:
    return g[..., None] * (jnp.exp(logits - lse[..., None]) - onehot), None, None
  teacher_logits, student_lse_T, teacher_lse_T = teacher
  w, t = soft.weight, soft.temperature
  grad = g[..., None] * ((1.0 - w) * (jnp.exp(logits - lse[..., None]) - onehot)
                         + w * t * (jnp.exp(logits / t - student_lse_T[..., None])
                                    - jnp.exp(teacher_logits / t - teacher_lse_T[..., None])))
  return grad, None, None  # the teacher is frozen


_integer_label_cross_entropy.defvjp(_integer_label_cross_entropy_fwd,
                                    _integer_label_cross_entropy_bwd)


def _variables(state: TrainState, params) -> dict:
  if state.batch_stats is None:
    return {"params": params}
  return {"params": params, "batch_stats": state.batch_stats}


def model_variables(state: TrainState) -> dict:
  """What evaluating the model needs of its state: {"params"[, "batch_stats"]} (a
  teacher's frozen variables)."""
  return _variables(state, state.params)


def teacher_logits(state: TrainState, teacher: dict | None, inputs: jax.Array
                   ) -> jax.Array | None:
  """The frozen teacher's eval-mode logits on the step's inputs, or None without one.

  `teacher` holds its variables ({"params"[, "batch_stats"]}, `ensemble_jax/teacher.py`);
  it is the student's model, so the student's `apply_fn` runs it. Computed inside the
  step, so XLA counts its forward in the step's FLOPs: the teacher's share is charged."""
  if teacher is None:
    return None
  return jax.lax.stop_gradient(state.apply_fn(teacher, inputs, train=False))


def _loss(logits, labels, teacher_logits_, cfg: StepConfig):
  return loss_and_predictions(logits, labels, cfg.label_smoothing, teacher_logits_,
                              cfg.kd_weight, cfg.kd_temperature)


def train_step(state: TrainState, batch: dict, rng: jax.Array, cfg: StepConfig,
               teacher: dict | None = None) -> tuple[TrainState, dict]:
  """(state, batch, rng) -> (state, metrics); the rng is folded with the step inside.

  `teacher`: a frozen teacher's variables whose soft targets the loss takes in
  (`cfg.kd_weight`); None: the plain loss."""
  rng = jax.random.fold_in(rng, state.step)
  if cfg.microbatches > 1:
    return _accumulated_step(state, batch, rng, cfg, teacher)
  inputs, labels = augmented(model_inputs(batch, cfg), batch, rng, cfg), targets(batch, cfg)
  mutable = ["batch_stats"] if state.batch_stats is not None else False
  soft_targets = teacher_logits(state, teacher, inputs)

  def loss_fn(params):
    out = state.apply_fn(_variables(state, params), inputs, train=True, mutable=mutable,
                         rngs={"dropout": rng})
    logits, updates = out if mutable else (out, {})
    loss, predicted = _loss(logits, labels, soft_targets, cfg)
    if "weight" in batch:  # a weighted coreset: sum_i w_i l_i / sum_i w_i
      per_example = loss.reshape(loss.shape[0], -1).mean(-1)
      loss = jnp.sum(batch["weight"] * per_example) / jnp.maximum(jnp.sum(batch["weight"]), 1e-12)
    else:
      loss = loss.mean()
    return loss, (predicted, updates.get("batch_stats"))

  (loss, (predicted, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.params)
  accuracy = jnp.mean(predicted == labels)
  return _update(state, grads, batch_stats, loss, accuracy, cfg)


def _update(state: TrainState, grads, batch_stats, loss, accuracy, cfg: StepConfig
            ) -> tuple[TrainState, dict]:
  """The step's one optimizer update from the batch's gradients, and its metrics."""
  if cfg.data_axis is not None:  # (None: an empty tree, nothing reduced)
    grads, loss, accuracy, stats = jax.lax.pmean(
        (grads, loss, accuracy, batch_stats if cfg.mean_batch_stats else None), cfg.data_axis)
    batch_stats = stats if cfg.mean_batch_stats else batch_stats
  if state.prune_mask is not None:  # pruned entries get no gradient and stay exactly 0
    grads = _masked(grads, state.prune_mask)
  state = state.apply_gradients(grads=grads, batch_stats=batch_stats)
  if state.prune_mask is not None:
    state = state.replace(params=_masked(state.params, state.prune_mask))
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
  return state, metrics


def split_microbatches(batch: dict, k: int) -> dict:
  """[B, ...] -> [k, B / k, ...]; microbatch j holds rows j, j + k, j + 2k, ...

  Strided, not contiguous: a batch sharded over devices on its rows keeps the sharding on
  the B / k axis, so each device splits its own rows and nothing moves between devices.
  """
  def split(x):
    return x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1)

  return jax.tree.map(split, batch)


def microbatch_grads(state: TrainState, mb: dict, rng: jax.Array, cfg: StepConfig,
                     loss_scale, teacher: dict | None = None
                     ) -> tuple[tuple[jax.Array, Any], Any, jax.Array]:
  """One microbatch's forward and backward pass (and its teacher's forward, if any).

  Returns ((summed correct predictions, BatchNorm updates), gradients, loss share). The
  loss share is the microbatch's part of the batch's loss: `loss_scale` times the summed
  per-example loss, or the mean when unweighted."""
  mutable = ["batch_stats"] if state.batch_stats is not None else False
  inputs, labels = augmented(model_inputs(mb, cfg), mb, rng, cfg), targets(mb, cfg)
  soft_targets = teacher_logits(state, teacher, inputs)

  def loss_fn(params):
    out = state.apply_fn(_variables(state, params), inputs, train=True,
                         mutable=mutable, rngs={"dropout": rng})
    logits, updates = out if mutable else (out, {})
    loss, predicted = _loss(logits, labels, soft_targets, cfg)
    if "weight" in mb:
      loss = jnp.sum(mb["weight"] * loss.reshape(loss.shape[0], -1).mean(-1))
    else:
      loss = loss.mean()
    correct = jnp.sum(predicted == labels, dtype=jnp.float32)
    return loss_scale * loss, (correct, updates.get("batch_stats"))

  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  return aux, grads, loss


def _accumulated_step(state: TrainState, batch: dict, rng: jax.Array, cfg: StepConfig,
                      teacher: dict | None = None) -> tuple[TrainState, dict]:
  """`cfg.microbatches` microbatches' gradients summed in a scan, then one update.

  Each microbatch's loss is its share of the whole batch's, so the summed gradient is the
  unsplit step's. Unweighted, the share is a k-th of the mean. Weighted, it is
  sum_i w_i l_i over the total weight of the batch on every device of `cfg.data_axis`.

  BatchNorm normalises per microbatch (ghost batch norm). The running statistics take one
  update per step, from the microbatches' mean batch statistics: the mean is exact, the
  variance is the mean of the per-microbatch ones.
  """
  k = cfg.microbatches
  rows = jax.tree.leaves(batch)[0].shape[0]
  devices = 1 if cfg.data_axis is None else jax.lax.axis_size(cfg.data_axis)
  weighted = "weight" in batch
  if weighted:  # sum_i w_i l_i / sum_i w_i over the whole batch, whatever each part holds
    total = jnp.sum(batch["weight"])
    if cfg.data_axis is not None:
      total = jax.lax.psum(total, cfg.data_axis)
    loss_scale = devices / jnp.maximum(total, 1e-12)  # the pmean divides by `devices`
  else:
    loss_scale = 1.0 / k
  has_stats = state.batch_stats is not None

  def body(acc, xs):
    j, mb = xs
    (correct, stats), grads, loss = microbatch_grads(state, mb, jax.random.fold_in(rng, j),
                                                     cfg, loss_scale, teacher)
    out = {"grads": jax.tree.map(jnp.add, acc["grads"], grads), "loss": acc["loss"] + loss,
           "correct": acc["correct"] + correct}
    if has_stats:
      out["stats"] = jax.tree.map(jnp.add, acc["stats"], stats)
    if cfg.noise_scale:  # |g_j|^2 of the microbatch's own mean gradient
      own = (loss_scale * jnp.maximum(jnp.sum(mb["weight"]), 1e-12) if weighted
             else loss_scale)  # the microbatch's loss share / its own mean loss
      g = grads if state.prune_mask is None else _masked(grads, state.prune_mask)
      out["micro_grad_sq"] = acc["micro_grad_sq"] + optax.tree.norm(g, squared=True) / own**2
    return out, None

  zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)  # noqa: E731
  init = {"grads": zeros(state.params), "loss": jnp.zeros((), jnp.float32),
          "correct": jnp.zeros((), jnp.float32)}
  if has_stats:
    init["stats"] = zeros(state.batch_stats)
  if cfg.noise_scale:
    init["micro_grad_sq"] = jnp.zeros((), jnp.float32)
  acc, _ = jax.lax.scan(body, init, (jnp.arange(k), split_microbatches(batch, k)))
  batch_stats = jax.tree.map(lambda x: x / k, acc["stats"]) if has_stats else None
  labels_per_row = math.prod(jax.eval_shape(lambda b: targets(b, cfg), batch).shape[1:])
  accuracy = acc["correct"] / (rows * labels_per_row)
  state, metrics = _update(state, acc["grads"], batch_stats, acc["loss"], accuracy, cfg)
  if cfg.noise_scale:
    micro_grad_sq = acc["micro_grad_sq"] / k
    if cfg.data_axis is not None:  # a microbatch's gradient was one device's part of it
      micro_grad_sq = jax.lax.pmean(micro_grad_sq, cfg.data_axis)
    metrics |= noise_scale.step_estimates(micro_grad_sq, metrics["grad_norm"]**2,
                                          rows // k, rows * devices)
  return state, metrics


def microbatch_flops(state: TrainState, mb: dict, cfg: StepConfig, teacher=None) -> float:
  """XLA's FLOPs of one microbatch's forward and backward (one model, one device), with
  its teacher's forward if `teacher` (its variables) is given.

  XLA's cost analysis counts a while loop's body once, so a step of k microbatches is
  counted short by k - 1 of these. `state`, `mb` and `teacher` may be abstract
  (ShapeDtypeStruct).
  """
  cfg = dataclasses.replace(cfg, data_axis=None)
  fn = jax.jit(lambda s, b, r, t: microbatch_grads(s, b, r, cfg, 1.0, t))
  return costs.flops(fn.lower(state, mb, jax.random.key(0), teacher).compile())


def snip_prune(state: TrainState, batch: dict, cfg: StepConfig, sparsity: float) -> TrainState:
  """SNIP (Lee et al., 2019): a data-driven pruning mask, fixed at init.

  It zeroes the `sparsity` fraction of kernel weights (ndim > 1) with the smallest
  saliency |dL/dw * w| on one batch.

  The forward uses running BatchNorm statistics (no batch-stat collectives), so it runs
  unchanged under vmap over stacked workers. The mask goes into `state.prune_mask` (every
  non-kernel parameter kept), which `train_step` applies to every later update.
  """
  inputs, labels = model_inputs(batch, cfg), targets(batch, cfg)

  def loss_fn(params):
    logits = state.apply_fn(_variables(state, params), inputs, train=False)
    return cross_entropy(logits, labels).mean()

  grads = jax.grad(loss_fn)(state.params)
  leaves, treedef = jax.tree.flatten(state.params)
  kernel_ids = [i for i, p in enumerate(leaves) if p.ndim > 1]
  weights = jnp.concatenate([leaves[i].ravel() for i in kernel_ids])
  saliency = jnp.abs(jnp.concatenate([jax.tree.leaves(grads)[i].ravel() for i in kernel_ids])
                     * weights)
  # Exactly `sparsity` of the kernel weights pruned, lowest saliency first; ties (e.g. the
  # zero-saliency branches behind zero-initialised residual BatchNorm scales) by |w|.
  order = jnp.lexsort((jnp.abs(weights), saliency))
  keep = jnp.ones(weights.shape, bool).at[order[:int(sparsity * weights.size)]].set(False)
  offsets = np.cumsum([0] + [leaves[i].size for i in kernel_ids])
  masks = [jnp.ones(p.shape, bool) for p in leaves]
  for j, i in enumerate(kernel_ids):
    masks[i] = keep[offsets[j]:offsets[j + 1]].reshape(leaves[i].shape)
  mask = jax.tree.unflatten(treedef, masks)
  return state.replace(params=_masked(state.params, mask), prune_mask=mask)


def _masked(tree, mask):
  return jax.tree.map(lambda x, m: jnp.where(m, x, jnp.zeros_like(x)), tree, mask)


def batch_statistics(model, params, batch_stats, stacked_batch: dict, cfg: StepConfig):
  """BatchNorm running statistics of `params`, re-estimated on a stacked batch.

  The [N, b, ...] batch is seen as one batch of N * b. The statistics are what these
  weights see, not an average of other models'.

  From zero running statistics one train-mode pass leaves (1 - momentum) x the batch's
  statistics; dividing by it gives them exactly. `model` must not name a mesh axis.
  """
  flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), stacked_batch)
  zeros = jax.tree.map(jnp.zeros_like, batch_stats)
  _, updates = model.apply({"params": params, "batch_stats": zeros}, model_inputs(flat, cfg),
                           train=True, mutable=["batch_stats"])
  keep = 1.0 - model.bn_momentum
  return jax.tree.map(lambda x: x / keep, updates["batch_stats"])


def predict(state: TrainState, batch: dict, cfg: StepConfig) -> jax.Array:
  """Eval-mode logits [B, C] or [B, T, V] (running BatchNorm statistics)."""
  return state.apply_fn(_variables(state, state.params), model_inputs(batch, cfg), train=False)


def predict_with_features(state: TrainState, batch: dict, cfg: StepConfig
                          ) -> tuple[jax.Array, jax.Array]:
  """Eval-mode logits [B, C] and penultimate embeddings [B, D]: what pools score and cluster.

  A model offers its embedding by sowing it as `intermediates/features` (ResNet does); this
  is the one place that reads it.
  """
  logits, inter = state.apply_fn(_variables(state, state.params), model_inputs(batch, cfg),
                                 train=False, mutable=["intermediates"])
  return logits, inter["intermediates"]["features"][0]


def num_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
