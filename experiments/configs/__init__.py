"""The workload config files, and what their sweep grids share."""

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
