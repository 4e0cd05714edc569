"""Multi-host start-up through JAX's own runtime (`jax.distributed.initialize`).

Must run before anything touches a device: the runtime has to exist when JAX builds its
backends, or each process sees only its own devices.
"""
from __future__ import annotations

import jax


def maybe_initialize(dist_config) -> None:
  """Joins the multi-process runtime when `config.distributed.initialize` is set.

  Idempotent: a second call in the same process (a second run, a test) is a no-op.
  """
  if not dist_config.initialize or jax.distributed.is_initialized():
    return
  # On CPU, cross-process collectives need an implementation; gloo (over TCP) needs
  # nothing installed. It is jax 0.10's default, set anyway for versions where it is not,
  # and kept if the user chose another (e.g. JAX_CPU_COLLECTIVES_IMPLEMENTATION=mpi).
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if dist_config.local_device_count > 0:
    # Fake CPU devices per process (tests); same as XLA_FLAGS
    # --xla_force_host_platform_device_count=N, which the process may set instead.
    # (`local_device_ids` would not do it: it selects GPUs, not CPU devices.)
    jax.config.update("jax_num_cpu_devices", dist_config.local_device_count)
  kwargs = {}
  if dist_config.coordinator_address:
    kwargs["coordinator_address"] = dist_config.coordinator_address
  if dist_config.num_processes > 0:
    kwargs["num_processes"] = dist_config.num_processes
  if dist_config.process_id >= 0:
    kwargs["process_id"] = dist_config.process_id
  jax.distributed.initialize(**kwargs)
