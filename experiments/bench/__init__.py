"""Benchmarks: ratios measured side by side in one run, printed and written as JSON."""
import time


def step_times(step, state, batch, rng, steps: int, warmup: int = 1):
  """(the seconds of each of `steps` calls of `step(state, batch, rng) -> (state,
  metrics)` after `warmup` untimed ones, the last state, the last metrics); each call
  waited for.
  JAX is imported here, not at the package's import: benches set XLA_FLAGS first."""
  import jax

  for _ in range(warmup):
    state, metrics = step(state, batch, rng)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = step(state, batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return times, state, metrics
