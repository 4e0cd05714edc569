"""docs/results/one_device.md's context: the one-device grid's points on an NVIDIA H200,
each beside the CPU grid's point it takes its tuned values from, from committed JSON only."""
from __future__ import annotations

import os

from ensemble_jax import report
from experiments import docs_data as data
from experiments import rerun_plan, targets

SUB = "one_device_h200/fashion_mnist"
CPU = "fashion_mnist"


def trained_choice(run: dict, chosen: dict) -> dict:
  """The values a run trained at, for the keys a tuning's `chosen` holds."""
  return {k: rerun_plan.config_value(run, k) for k in chosen}


def namesake(curve: str, point: str, per_device: int) -> tuple[str, str]:
  """The CPU grid's point whose tuned values an H200 point trains at: a data-parallel point
  of batch B is D = B / per_device devices' (one device normalises its whole batch, as the
  synchronised-BatchNorm curve does over D > 1), every other point its own name."""
  if curve != "data_parallel":
    return curve, point
  d = int(point[1:]) // per_device
  return ("data_parallel_sync_bn" if d > 1 else "data_parallel"), f"D{d}"


def _cpu_steps(name: tuple[str, str], trained: dict, seeds) -> dict | None:
  """The steps to target of `name`'s CPU runs (seed or `superseded/`) on `seeds` trained at
  `trained`; None unless every seed ran there and reached it."""
  found = {}
  for pattern in ("seed*", "superseded/seed*"):
    for r in data.results(f"{CPU}/{name[0]}/{name[1]}/{pattern}/results.json"):
      if r["config"]["seed"] in seeds and trained_choice(r, trained) == trained:
        found.setdefault(r["config"]["seed"], r)
  if len(found) != len(seeds) or not all(r["target"]["reached"] for r in found.values()):
    return None
  return data.spread([r["steps"] for r in found.values()])


def context() -> dict:
  runs = report.reported(report.load_runs(os.path.join(data.RESULTS, SUB)))
  per_device = data.critical_batch("fashion")["per_device"]
  pts = list(data.grid(SUB))
  rows = []
  for p in pts:
    mine = [r for r in runs if (r["curve"], r["point"]) == (p["curve"], p["point"])]
    name = namesake(p["curve"], p["point"], per_device)
    chosen = data.tuning(CPU, *name)["chosen"]
    h200 = data.results(f"{SUB}/{p['curve']}/{p['point']}/seed*/results.json")
    [trained] = {tuple(sorted(trained_choice(r, chosen).items())) for r in h200}
    cpu = _cpu_steps(name, dict(trained), p["seed_list"])
    rows.append({
        **p, "name": data.point_name(p["curve"], p["point"]), "time": p["time_s"]["nvlink"],
        "host": p["host_time_s"],
        "step_ms": data.spread([1e3 * r["cost"]["modelled"]["device_step_time_s"]
                            for r in h200 if r["config"]["seed"] in p["seed_list"]]),
        "pool_s": data.spread([r["pool_build_s"] for r in mine]) if any(
            r["pool_build_s"] for r in mine) else None,
        # how far steps x the median step (pool build apart) reads under the run's clock
        "under": data.spread([1 - (r["time_s"]["nvlink"] - r["pool_build_s"]) / r["host_time_s"]
                          for r in mine]),
        "namesake": f"{name[0]} {name[1]}", "trained": dict(trained), "chosen": chosen,
        "cpu_steps": cpu, "cpu_runs": "seed runs" if dict(trained) == chosen else "superseded/",
        "steps_overlap": bool(cpu and p["steps"]["min"] <= cpu["max"]
                              and p["steps"]["max"] >= cpu["min"])})
  first = min(rows, key=lambda r: r["host"]["median"])
  methods = sorted({p["curve"] for p in pts} - set(report.baseline_curves(pts)))
  for curve in methods:  # one device has no collectives: every preset reads the same
    for m in report.matched(pts, curve, "nvlink"):
      if "time" in m["ahead"]:
        raise ValueError(f"{curve} {m['point']} is ahead of every baseline on one device: "
                         "word the page's answer for it")
  return {"rows": rows, "first": first, "best": targets.best_matched(pts, methods, "time"),
          "seed_list": pts[0]["seed_list"], "target": runs[0]["target_value"],
          "figure": f"experiments/results/{SUB}/cost_vs_time_nvlink.png", "host": h200[0]["host"]}
