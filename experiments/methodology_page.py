"""docs/methodology.md's generated regions: the rules' settings from the code that applies
them, and the few numbers the page quotes from the committed JSON."""
from __future__ import annotations

import collections
import glob
import os

from ensemble_jax import config_lib, costs, stored
from ensemble_jax import record as record_lib
from ensemble_jax.distill import synthetic
from experiments import cost_vs_time_page
from experiments import docs_data as data
from experiments.configs import fashion_mnist
from experiments.docs_data import RESULTS
# the cost-vs-time studies whose routed runs read a re-timed pool build
ROUTED_STUDIES = ("fashion_mnist", "many_workers", "pydocs_gpt2", "many_workers_pydocs")


def budget(sub: str) -> dict:
  """A grid's budget in examples (windows) and its multiple of what data-parallel on one
  device needs to reach the target (its reported seeds' median steps x its batch)."""
  d1 = data.point(sub, "data_parallel", "D1")
  run = data.stored_runs(f"{sub}/data_parallel/D1/seed*/results.json")[-1]
  examples = (run["step_budget"] / run["config"]["train"].get("schedule_fraction", 1.0)
              * run["examples_per_step"])
  return {"name": cost_vs_time_page.GRIDS[sub], "examples": round(examples),
          "epochs": (examples / run["data"]["train_examples"]
                     if "train_examples" in run["data"] else None),
          "multiple": examples / (d1["steps"]["median"] * run["examples_per_step"])}


def winners_curse() -> dict:
  """Over both grids' points that reached on every seed: how often the tuning seed's chosen
  run took at most as many steps as every reported seed (chance: one in seeds + 1)."""
  pts = [p for sub in cost_vs_time_page.GRIDS for p in data.grid(sub)
         if p["reached"] == p["seeds"] and p["tuning_seed_steps"]]
  return {"low": sum(p["tuning_seed_steps"] <= p["steps"]["min"] for p in pts),
          "points": len(pts), "chance": sum(1 / (p["seeds"] + 1) for p in pts)}


def pool_retiming() -> dict:
  """Which routed runs are priced at a re-timed pool build, on which host at what load, and
  which keep the build time their own run measured."""
  runs = []
  for study in ROUTED_STUDIES:
    for pattern in ("*/*/seed*/results.json", "*/*/tune/*/results.json"):
      for path in sorted(glob.glob(os.path.join(RESULTS, study, pattern))):
        d = stored.load(path).get("distill") or {}
        if d.get("cached") and d.get("builder") == "kmeans" and d.get("proxy") is None:
          curve, name, *run = os.path.relpath(path, os.path.join(RESULTS, study)).split(os.sep)
          runs.append({"point": f"{study}/{curve}/{name}", "run": "/".join(run[:-1]), "d": d})
  retimed = [r for r in runs if r["d"].get("retimed")]
  hosts = [r["d"]["retimed_on"] for r in retimed if r["d"].get("retimed_on")]
  own = collections.defaultdict(list)
  for r in runs:
    if not r["d"].get("retimed"):
      own[r["point"]].append(r["run"])
  return {
      "calibrated_on": sorted({record_lib.describe_host(r.get("host") or {})
                               for s in ROUTED_STUDIES for r in data.stored_runs(
                                   f"{s}/calibration/*/results.json")}),
      "runs": len(runs), "retimed": len(retimed),
      "checks": sorted(collections.Counter(r["d"]["retimed"].split(" (")[0]
                                           for r in retimed).items()),
      "hosts": sorted({record_lib.describe_host(h) for h in hosts}), "hosts_timed": len(hosts),
      "loads": [min(h["load_average_1min"] for h in hosts),
                max(h["load_average_1min"] for h in hosts)] if hosts else None,
      "own": sorted(own.items()), "own_runs": sum(map(len, own.values()))}


def distilled_timing() -> dict:
  """The committed distilled pools' iteration times: how many hold the fastest of their
  timed chunks, not the median (`synthetic.iteration_statistic`), and the hosts' loads."""
  pools = {}
  for path in glob.glob(os.path.join(RESULTS, "*", "*", "*", "seed*", "results.json")):
    d = stored.load(path).get("distill") or {}
    if d.get("distillation", {}).get("iteration_time_s"):
      pools[d.get("cached") or path] = d["distillation"]
  loads = [d["host_load_average"] for d in pools.values() if "host_load_average" in d]
  return {"pools": len(pools), "loads": [min(loads), max(loads)] if loads else None,
          "fastest": sum(synthetic.iteration_statistic(d) == "fastest" for d in pools.values())}


# region -> the function building its context; its template is NAME.md.j2
REGIONS = {
    "methodology_tuning": lambda: {"tune": config_lib.base_config().tune,
                                   "moves": len(data.load_json("rerun_plan.json")["tuning"])},
    "methodology_winners_curse": winners_curse,
    "methodology_schedule": lambda: {"tune": config_lib.base_config().tune},
    "methodology_budgets": lambda: {"budgets": [budget(s) for s in cost_vs_time_page.GRIDS]},
    "methodology_ceilings": lambda: {"epochs": fashion_mnist.CEILING_EPOCHS},
    "methodology_pools": lambda: {"pools": pool_retiming(), "distilled": distilled_timing()},
    "methodology_ratios": lambda: {"baselines": sorted(
        {b for g in cost_vs_time_page.context()["grids"] for b in g["reading"]["baselines"]})},
    "methodology_presets": lambda: {"presets": costs.INTERCONNECTS}}

