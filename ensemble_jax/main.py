"""Flags only: `python -m ensemble_jax.main --config=experiments/configs/X.py --workdir=DIR`.

Override any field: `--config.train.batch_size=256 --config.method.fsdp=True`.
"""
import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from ensemble_jax import checkpoint, config_lib, train
from ensemble_jax.data import fetch

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and results go.")
flags.mark_flags_as_required(["config", "workdir"])


def _quiet_orbax(record: logging.LogRecord) -> bool:
  """Orbax logs every save phase at INFO; keep its warnings and errors only."""
  return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.getLogger("absl").addFilter(_quiet_orbax)
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (config_lib.ConfigError, fetch.DatasetUnavailableError,
          checkpoint.CheckpointError) as e:
    # A config, dataset or checkpoint that cannot work: one message, exit status 2.
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
