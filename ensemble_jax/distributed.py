"""Multi-host start-up through JAX's own runtime (`jax.distributed.initialize`)."""
from __future__ import annotations

import jax


def maybe_initialize(dist_config) -> None:
  """Joins the multi-process runtime when `config.distributed.initialize` is set."""
  if not dist_config.initialize:
    return
  kwargs = {}
  if dist_config.coordinator_address:
    kwargs["coordinator_address"] = dist_config.coordinator_address
  if dist_config.num_processes > 0:
    kwargs["num_processes"] = dist_config.num_processes
  if dist_config.process_id >= 0:
    kwargs["process_id"] = dist_config.process_id
  if dist_config.local_device_count > 0:
    kwargs["local_device_ids"] = list(range(dist_config.local_device_count))
  jax.distributed.initialize(**kwargs)
