"""Optax optimizers and learning-rate schedules from `config.optim`."""
from __future__ import annotations

import optax


def peak_learning_rate(optim_config, batch_size: int) -> float:
  """The peak learning rate: learning_rate at base_batch_size, scaled to the batch.

  `linear` scales by the batch ratio, `sqrt` by its root (the usual rule for Adam), `none`
  not at all."""
  ratio = batch_size / optim_config.base_batch_size
  factor = {"linear": ratio, "sqrt": ratio**0.5, "none": 1.0}[optim_config.lr_scaling]
  return optim_config.learning_rate * factor


def warmup_steps(optim_config, total_steps: int, steps_per_epoch: int) -> int:
  """The linear warm-up's length in steps.

  `warmup_fraction` of the run's own step budget when > 0, one rule for every method and
  budget; else `warmup_steps`; else `warmup_epochs`."""
  if optim_config.warmup_fraction > 0:
    warmup = int(round(optim_config.warmup_fraction * total_steps))
  elif optim_config.warmup_steps > 0:
    warmup = optim_config.warmup_steps
  else:
    warmup = int(round(optim_config.warmup_epochs * steps_per_epoch))
  return min(warmup, max(total_steps - 1, 0))


def create_schedule(optim_config, batch_size: int, total_steps: int,
                    steps_per_epoch: int) -> optax.Schedule:
  peak = peak_learning_rate(optim_config, batch_size)
  warmup = warmup_steps(optim_config, total_steps, steps_per_epoch)
  if optim_config.schedule == "constant":
    after = optax.constant_schedule(peak)
  else:
    after = optax.cosine_decay_schedule(peak, decay_steps=max(total_steps - warmup, 1))
  return optax.join_schedules([optax.linear_schedule(0.0, peak, max(warmup, 1)), after],
                              [warmup]) if warmup else after


def create_optimizer(optim_config, batch_size: int, total_steps: int,
                     steps_per_epoch: int) -> optax.GradientTransformation:
  schedule = create_schedule(optim_config, batch_size, total_steps, steps_per_epoch)
  clip = ([optax.clip_by_global_norm(optim_config.grad_clip_norm)]
          if optim_config.grad_clip_norm > 0 else [])
  if optim_config.name == "sgd":
    # Classic ResNet recipe: L2 on the gradient, Nesterov momentum; no decay on BN/bias.
    return optax.chain(*clip,
                       optax.add_decayed_weights(optim_config.weight_decay, mask=_decay_mask),
                       optax.sgd(schedule, momentum=optim_config.momentum,
                                 nesterov=optim_config.nesterov))
  return optax.chain(*clip, optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2,
                                        weight_decay=optim_config.weight_decay,
                                        mask=_decay_mask))


def _decay_mask(params):
  """Decay kernels and embeddings only (ndim > 1), not biases or norm scales."""
  import jax

  return jax.tree.map(lambda p: p.ndim > 1, params)
