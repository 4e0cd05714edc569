"""docs/results/lipt.md's context: the LiPT pipeline's phases per seed, from the committed
runs (experiments/results/lipt/)."""
from __future__ import annotations

import glob
import json
import os

from ensemble_jax import stored
from experiments import docs_data as data
from experiments import lipt_pipeline

WORKDIR = os.path.join(data.RESULTS, "lipt")
PHASES = ("full", "coreset", "finetune")


def table(seeds: list[int]) -> list[str]:
  """The pipeline's table from its committed phases (`measure` would train a missing one)."""
  for seed in seeds:
    for phase in PHASES:
      if not os.path.exists(os.path.join(WORKDIR, f"seed{seed}", phase, "results.json")):
        raise FileNotFoundError(f"lipt: seed{seed}/{phase}/results.json is not committed; "
                                "run `make lipt`")
  [rows] = data.tables(lipt_pipeline.table([lipt_pipeline.measure(s, WORKDIR) for s in seeds]))
  return rows


def context() -> dict:
  runs = {phase: [stored.load(p) for p in sorted(glob.glob(
      os.path.join(WORKDIR, "seed*", phase, "results.json")))] for phase in PHASES}
  every = [r for phase in PHASES for r in runs[phase]]
  with open(os.path.join(WORKDIR, "summary.json")) as f:
    rows = json.load(f)
  coreset = runs["coreset"]
  [(warmup, evals, devices, flops)] = {  # one setting for every run
      (r["config"]["optim"]["warmup_epochs"], r["config"]["eval"]["every_steps"],
       r["num_devices"], r["flops_per_step"]) for r in every}
  with open(os.path.join(WORKDIR, "table.md")) as f:
    caption = f.readline().strip()  # the pipeline's caption, as it wrote its table
  seeds = sorted(r["seed"] for r in rows)
  spread = lambda key: data.spread([r[key] for r in rows if r[key] is not None])
  return {
      "table": table(seeds), "caption": caption, "seeds": seeds,
      "devices": devices, "warmup_epochs": warmup, "eval_every": evals,
      "fraction": coreset[0]["config"]["distill"]["fraction"],
      "warm": coreset[0]["target"]["value"], "target": runs["finetune"][0]["target"]["value"],
      "budget": coreset[0]["step_budget"],
      "proxy": [r["distill"]["proxy"]["accuracy"] for r in coreset],
      "coreset_sizes": data.spread([r["distill"]["pool_size"] for r in coreset]),
      "coreset_final": [r["final"]["accuracy"] for r in coreset],
      "coreset_reached": sum(r["target"]["reached"] for r in coreset),
      "full_to_warm": spread("full_steps_to_warm"), "finetune": spread("finetune_steps"),
      "full_to_target": spread("full_steps_to_target"), "build_tflops": spread("build_tflops"),
      "speedups": sum(any("speedup" in k for k in r) for r in rows),
      "published": lipt_pipeline.PUBLISHED, "gflops_per_step": flops / 1e9,
      "step_s": data.spread([r["step_time_s"] for r in every])}
