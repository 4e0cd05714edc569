"""The only coordination of the ensemble: one reduction over the worker axis, at the end.

Each aggregation mode is a `Mode` in `MODES`, registered with `register_mode`: how it
combines per-worker logits [N, B, C] into ensemble log-scores [B, C] (`combine`), whether it
can instead reduce each worker's log-probability of the target alone, [N, B] or [N, B, T]
(`targets`: what a language model's perplexity needs, whatever the vocabulary), and whether
its weights come from the batch's routing (`routed`). Workers with weight 0 (diverged, or
routed away) contribute nothing, not even their NaNs.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ensemble_jax.config_lib import ConfigError
from ensemble_jax.registry import Registry


# What a mode's `combine` may return, as it declares (`returns=`): the engine scores each
# with a log-softmax, after a log for probabilities.
RETURNS = ("log_probs", "logits", "probs")


@dataclasses.dataclass(frozen=True)
class Mode:
  """An aggregation mode: what `methods/ensemble.py` must know to evaluate and report it.

  combine: (logits_Nx, weights_N) -> scores [..., C] the engine log-softmaxes (a mode that
    returns probabilities is registered with their log); None for a mode that averages
    weights rather than predictions (`soup`, reduced by `ensemble.final_results`).
  returns: what the registered function returns: log_probs (log-scores, each row's
    logsumexp 0), logits (any finite scores) or probs (each row's sum 1).
  targets: (target log-probs_Nx, weights_N) -> the mode's log-probability of each target,
    equal to `combine` read at the target; None when the mode needs the full logits (a
    language model then reduces [N, B, T, V] at every evaluation it is the headline of).
  routed: its weights are the batch's `route` (a pool that routes, `distill.registry`).
  requires: config -> None, or the fix a config must make to use the mode.
  """
  name: str
  combine: Callable | None
  targets: Callable | None = None
  routed: bool = False
  requires: Callable | None = None
  returns: str = "logits"

  @property
  def mixture(self) -> bool:
    """Whether it mixes the workers' predictions (every evaluation can score it)."""
    return self.combine is not None


def _mode(name: str, combine: Callable | None, *, returns: str = "logits",
          targets: Callable | None = None, routed: bool = False,
          requires: Callable | None = None) -> Mode:
  if returns not in RETURNS:
    raise ValueError(f"aggregation mode {name!r}: returns={returns!r}; declare one of "
                     f"{RETURNS}")
  scores = combine
  if combine is not None and returns == "probs":
    scores = lambda logits_Nx, weights_N: jnp.log(combine(logits_Nx, weights_N))  # noqa: E731
  return Mode(name, scores, targets, routed, requires, returns)


def _normalised(weights_N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The weights renormalised over the workers, which of them count, and their logs.

  A worker of weight 0 counts for nothing: its log-weight is -inf."""
  weights_N = weights_N.astype(jnp.float32)
  valid_N = weights_N > 0
  weights_N = weights_N / jnp.sum(weights_N, axis=0)
  log_w_N = jnp.where(valid_N, jnp.log(jnp.where(valid_N, weights_N, 1.0)), -jnp.inf)
  return weights_N, valid_N, log_w_N


def target_log_probs(logits_Bx: jax.Array, labels_B: jax.Array) -> jax.Array:
  """One model's log-probability of each target: logits [B, C] or [B, T, V] -> [B] or
  [B, T]."""
  log_probs = jax.nn.log_softmax(logits_Bx.astype(jnp.float32))
  return jnp.take_along_axis(log_probs, labels_B[..., None], axis=-1)[..., 0]


def _refuse(mode: Mode, message: str):
  raise ConfigError(f"aggregation mode {mode.name!r}: {message}")


def _check_inputs(mode: Mode, shape: tuple[int, ...]):
  """Logits of `shape` [N, ...] from 3 workers, worker 1 excluded (weight 0, NaN logits, as
  a diverged one), the weights routed per example for a routed mode."""
  rng = np.random.default_rng(0)
  logits_Nx = (3 * rng.normal(size=shape)).astype(np.float32)
  logits_Nx[1] = np.nan
  weights_N = np.asarray([1.0, 0.0, 2.0], np.float32)
  if mode.routed:
    weights_N = np.broadcast_to(weights_N.reshape((3,) + (1,) * (len(shape) - 2)),
                                shape[:-1]).copy()
  return logits_Nx, weights_N


_SHAPES = ((3, 4, 5), (3, 2, 3, 5))  # [N, B, C] and a language model's [N, B, T, V]
_SHAPED: set[Mode] = set()  # modes whose shapes are checked
# The built-in modes: their values are checked by tests/test_registry.py, not in every
# process (a check compiles its programs: ~1.5 s each time on a loaded CPU).
_TESTED: set[Mode] = set()
_BUILTINS_REGISTERING = True  # until this module has registered them


def _check(mode: Mode) -> bool:
  """Checks a mode once on small stacked inputs with an excluded worker: its scores reduced
  over the workers, finite, and what it declares (`returns`). Shapes at registration;
  values too once JAX's backends run (registration starts none: jax.distributed.initialize
  must come first), else at its first lookup after. Whether its values are checked."""
  if mode.combine is None:
    return True
  if mode not in _SHAPED:
    for shape in _SHAPES:
      try:
        out = jax.eval_shape(mode.combine, *_check_inputs(mode, shape))
      except Exception as e:  # noqa: BLE001  (the user's function: say which and where)
        _refuse(mode, f"fails on logits {shape} (workers first): {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}")
      if out.shape != shape[1:]:
        _refuse(mode, f"returns shape {out.shape} for logits {shape} (workers first): reduce "
                      f"over the workers' axis 0 to {shape[1:]}.")
    _SHAPED.add(mode)
  if _BUILTINS_REGISTERING:
    _TESTED.add(mode)
  if mode in _TESTED:
    return True
  if not _backends_started():
    return False
  check_values(mode)
  return True


def check_values(mode: Mode) -> None:
  """The values half of a mode's check (starts JAX's backends)."""
  with jax.ensure_compile_time_eval():
    for shape in _SHAPES:
      _check_values(mode, *_check_inputs(mode, shape))


def _check_values(mode: Mode, logits_Nx, weights_N) -> None:
  scores = np.asarray(mode.combine(jnp.asarray(logits_Nx), jnp.asarray(weights_N)), np.float64)
  if not np.all(np.isfinite(scores)):
    _refuse(mode, "returns non-finite scores when an excluded worker (weight 0) has NaN "
                  "logits: leave workers of weight 0 out (jnp.where(weights > 0, ...)).")
  lse = np.log(np.sum(np.exp(scores - scores.max(-1, keepdims=True)), -1)) + scores.max(-1)
  normalised = np.allclose(lse, 0.0, atol=1e-3)
  probabilities = (np.all(scores >= 0) and np.all(scores <= 1)
                   and np.allclose(scores.sum(-1), 1.0, atol=1e-3))
  if probabilities and mode.returns != "probs":
    _refuse(mode, f"returns probabilities (each row sums to 1) but declares "
                  f"returns={mode.returns!r}: declare returns='probs', or return their log.")
  if mode.returns == "probs" and not normalised:
    _refuse(mode, "declares returns='probs' but its rows sum to "
                  f"{np.exp(lse).ravel()[:3].round(4).tolist()}..., not 1.")
  if mode.returns == "log_probs" and not normalised:
    _refuse(mode, "declares log-scores (returns='log_probs') but its rows' logsumexp is "
                  f"{lse.ravel()[:3].round(4).tolist()}..., not 0: declare returns='logits'.")
  if mode.targets is not None:
    labels = np.arange(np.prod(logits_Nx.shape[1:-1])).reshape(logits_Nx.shape[1:-1]) % 5
    log_probs_Nx = jax.vmap(target_log_probs, (0, None))(jnp.asarray(logits_Nx), labels)
    got = np.asarray(mode.targets(log_probs_Nx, jnp.asarray(weights_N)), np.float64)
    want = np.take_along_axis(scores - lse[..., None], labels[..., None], -1)[..., 0]
    if got.shape != want.shape or not np.allclose(got, want, atol=1e-4):
      _refuse(mode, "its targets= form is not its combine read at the target (the log-"
                    "softmax of its scores at each label).")


def _backends_started() -> bool:
  try:
    from jax._src import xla_bridge
  except ImportError:  # a JAX without it: assume they run
    return True
  return xla_bridge.backends_are_initialized()


MODES: Registry[Mode] = Registry("method.aggregation", entry=_mode, check=_check)


# Decorator: `@register_mode("name", returns="log_probs")` registers
# `combine(logits_Nx, weights_N) -> scores` as mode `name` (MODES.register itself).
register_mode = MODES.register


def combine(logits_Nx: jax.Array, weights_N: jax.Array, mode: str) -> jax.Array:
  """Combines per-worker logits [N, ..., C] into ensemble log-scores [..., C] by `mode`.

  logits_Nx is e.g. [N, B, C] or [N, B, T, V]. weights_N is [N], one per worker, or
  [N, B] for routing, one per worker and example."""
  reduce = MODES[mode].combine
  if reduce is None:
    raise ValueError(f"mode {mode!r} averages weights, not logits (soup_params)")
  return reduce(logits_Nx, weights_N)


def _expanded(weights_N: jax.Array, values_Nx: jax.Array):
  """(weights, validity, log-weights) renormalised and broadcast to `values_Nx`, whose
  excluded workers' values are zeroed."""
  weights_N, valid_N, log_w_N = _normalised(weights_N)
  expand = (slice(None),) * weights_N.ndim + (None,) * (values_Nx.ndim - weights_N.ndim)
  values_Nx = jnp.where(valid_N[expand], values_Nx.astype(jnp.float32), 0.0)
  return weights_N[expand], values_Nx, log_w_N[expand]


@register_mode("logits", returns="logits")
def mean_logits(logits_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The weighted mean of logits (the default headline)."""
  weights, logits_Nx, _ = _expanded(weights_N, logits_Nx)
  return jnp.sum(weights * logits_Nx, axis=0)


def mixture_log_probs(log_probs_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The `probs` mixture's log-probability of each target, from the workers' own.

  log p(y) = logsumexp_i (log w_i + log p_i(y)): `combine(logits, w, 'probs')` read at the
  target, equal to it up to float rounding. `log_probs_Nx` is [N, B] or [N, B, T]
  (`target_log_probs` of each worker); `weights_N` is [N], or [N, B] / [N, B, T] for
  routing. What crosses workers is one number per worker and target, whatever the
  vocabulary.
  """
  _, log_probs_Nx, log_w = _expanded(weights_N, log_probs_Nx)
  return jax.nn.logsumexp(log_probs_Nx + log_w, axis=0)


@register_mode("probs", returns="log_probs", targets=mixture_log_probs)
def mixture(logits_Nx: jax.Array, weights_N: jax.Array) -> jax.Array:
  """The log of the weighted mean of probabilities: the mixture's predictive distribution,
  so its NLL is the ensemble's proper perplexity."""
  _, logits_Nx, log_w = _expanded(weights_N, logits_Nx)
  return jax.nn.logsumexp(jax.nn.log_softmax(logits_Nx) + log_w, axis=0)


def _soup_requires(config) -> str | None:
  if not config.method.shared_init:
    return ("'soup' averages weights, which is only meaningful from one shared init: set "
            "config.method.shared_init=True or drop 'soup'.")
  return None


# c-BTM: `probs` with per-example weights from the distance of each example to the
# workers' k-means clusters (ensemble_jax/distill/clusters.py:routing_weights).
register_mode("routed", mixture, returns="log_probs", targets=mixture_log_probs, routed=True)
# The workers' weights averaged into one model (`soup_params`, `ensemble.soup_state`).
register_mode("soup", None, requires=_soup_requires)
_BUILTINS_REGISTERING = False


def soup_params(stacked_tree, weights_N: jax.Array):
  """Weighted average over the leading worker axis (valid only from a shared init)."""
  weights_N = weights_N.astype(jnp.float32) / jnp.sum(weights_N)
  valid_N = weights_N > 0

  def average(x_N):
    x_N = jnp.where(valid_N.reshape((-1,) + (1,) * (x_N.ndim - 1)), x_N, 0)
    return jnp.tensordot(weights_N, x_N.astype(jnp.float32), axes=1).astype(x_N.dtype)

  return jax.tree.map(average, stacked_tree)


def routed(modes) -> bool:
  """Whether any of `modes` weights the workers by the batch's routing (DiLoCo's `global`,
  not a mode of the ensemble, does not)."""
  return any(MODES[mode].routed for mode in modes if mode in MODES)
