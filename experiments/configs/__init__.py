"""The workload config files, and what their sweep grids share."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "results")
# The embedded workloads' config files by their short names (--workload=fashion|pydocs).
WORKLOAD_CONFIGS = {"fashion": os.path.join(HERE, "fashion_mnist.py"),
                    "pydocs": os.path.join(HERE, "pydocs_gpt2.py")}

RATES = {"diloco": ("optim.learning_rate", "method.outer_learning_rate")}  # else the rate only


def tuned_schedule(point: tuple[str, dict]) -> tuple[str, dict]:
  """A grid point `(variant, overrides)` that also tunes its schedule's length
  (`train.schedule_fraction`) after its rates, stopping losers early.

  The cost-vs-time grids tune it on every curve but the fixed short schedules: it moves
  points beyond their seeds' spread (docs/results/cost_vs_time.md)."""
  variant, overrides = point
  rates = RATES.get("diloco" if "diloco" in variant.split(",") else "", ("optim.learning_rate",))
  return variant, {**overrides, "tune.fields": (*rates, "train.schedule_fraction"),
                   "tune.stop_losers": True}


def tuned_choice(workload: str, curve: str, point: str) -> dict:
  """What the full grid's tuning chose for `point` of `workload` (its committed
  experiments/results/<workload>/<curve>/<point>/tuning.json's "chosen"): the grids that
  train at the full grid's choices (many_workers, one_device, demo) read it."""
  path = os.path.normpath(os.path.join(RESULTS, workload, curve, point, "tuning.json"))
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: this grid trains at the full grid's "
                            f"choices; run the full {workload} grid first (make sweep-...)")
  with open(path) as f:
    return json.load(f)["chosen"]


def at_choice(chosen: dict) -> dict:
  """Overrides that train a point once at another grid's tuning choice (`tuned_choice`):
  the chosen values, one tuning factor, and the chosen fields marked `tune.inherited`, so
  that when that choice moves the point's runs at the former one are set aside and train
  again rather than make the workdir another study's."""
  return {**chosen, "tune.factors": (1.0,), "tune.inherited": tuple(chosen)}
