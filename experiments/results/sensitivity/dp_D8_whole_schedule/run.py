"""Sensitivity: data-parallel D = 8 at its whole-budget schedule on the reported seeds."""
import json
import ml_collections
from ensemble_jax import run as run_lib
from ensemble_jax import stored
src = stored.load("experiments/results/fashion_mnist/data_parallel_sync_bn/D8/seed1/results.json")
for seed in (1, 2, 3):
  c = ml_collections.ConfigDict(src["config"])
  c.seed, c.train.schedule_fraction = seed, 1.0
  c.tune.schedule_seeds = (1000,)
  d = f"experiments/results/sensitivity/dp_D8_whole_schedule/seed{seed}"
  r = run_lib.train_and_evaluate(c, d)
  t = r["target"]
  print(json.dumps({"seed": seed, "reached": t["reached"], "step": t["reached_step"],
                    "final": r["final"]["accuracy"], "steps": r["steps"],
                    "budget": r["step_budget"],
                    "time_s": {p: v for p, v in r["cost"]["modelled"]["critical_path_s"].items()},
                    "train_time_s": r["cost"]["modelled"].get("train_s")}), flush=True)
