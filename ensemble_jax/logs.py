"""Log filters: a run's output carries what its user can act on, not library chatter."""
import logging

# (logger, message prefix) pairs dropped below WARNING, and warnings dropped by content.
_CHATTER = (
    # jax probes for a TPU on every start; on a machine without one the fallback is normal
    ("jax._src.xla_bridge", "Unable to initialize backend"),
)
_WARNINGS = (
    # orbax says so when `checkpoint._register_array_handler` replaces its default handler
    "Type handler registry type",
)


def _keep(record: logging.LogRecord) -> bool:
  message = str(record.msg)
  if record.levelno < logging.WARNING:
    if "/orbax/" in record.pathname:  # orbax logs every save phase at INFO
      return False
    if any(record.name == name and message.startswith(prefix) for name, prefix in _CHATTER):
      return False
  return not any(message.startswith(prefix) for prefix in _WARNINGS)


def quiet() -> None:
  """Installs the filters; call before JAX picks its backend."""
  for name in ("absl", "jax._src.xla_bridge"):
    logger = logging.getLogger(name)
    if _keep not in logger.filters:
      logger.addFilter(_keep)
