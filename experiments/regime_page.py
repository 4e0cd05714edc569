"""docs/results/regime.md's context: where data-parallel stops scaling (the critical-batch
sweeps), the many-worker sweeps, and the projection to 1,024 devices, from committed JSON."""
from __future__ import annotations

import glob
import os

from experiments import docs_data as data
from experiments import many_workers_table, projection, targets
from experiments.docs_data import tables
from experiments.sweeps import critical_batch

# Each critical-batch sweep (results/critical_batch/<name>): its label, the grid and curve
# whose largest batch it extends, the batch's unit, and the sweep's (--workload, --grid).
SWEEPS = (("fashion", "Fashion-MNIST", "fashion_mnist", "data_parallel", "images",
           ("fashion", "full")),
          ("fashion_small_model", "Fashion-MNIST's small model", "fashion_mnist",
           "dp_small_model", "images", ("fashion", "small_model")),
          ("pydocs", "The Python docs", "pydocs_gpt2", "data_parallel", "windows",
           ("pydocs", "full")))
MANY_WORKERS = {"fashion": "Fashion-MNIST", "pydocs": "the Python docs"}  # many_workers_table's
# The projections (experiments/results/projection/<name>.json): measured models first.
PROJECTIONS = ("fashion_mnist", "pydocs_gpt2", "fashion_mnist_whatif_resnet50",
               "fashion_mnist_whatif_resnet50_pools_charged", "pydocs_gpt2_whatif_gpt2_small",
               "pydocs_gpt2_whatif_gpt2_small_pools_charged")


def sweep(name: str, label: str, grid: str, curve: str, unit: str, workload) -> dict:
  """One critical-batch sweep: its table, fit, knee (`critical_batch.stops_halving`) and where
  its steps stop falling (`stops_falling`), against the largest batch its grid's `curve` trains."""
  summary = data.critical_batch(name)
  [table] = tables(critical_batch.table(critical_batch.summarize(
      os.path.join(data.RESULTS, "critical_batch", name),
      critical_batch.load_workload(*workload))))
  rows = [r for r in summary["rows"] if r["median_steps"] is not None]
  knee, flat = critical_batch.stops_halving(rows), critical_batch.stops_falling(rows)
  largest = max(r["examples_per_step"]
                for r in data.stored_runs(f"{grid}/{curve}/*/seed*/results.json"))
  return {"name": name, "label": label, "unit": unit, "target": summary["target"],
          "per_device": summary["per_device"], "table": table,
          "figure": f"experiments/results/critical_batch/{name}/critical_batch.png",
          "knee": knee, "knee_is_smallest": knee is rows[0], "flat": flat,
          "flat_is_largest": flat is rows[-1], "grid_batch": largest,
          "grid_devices": largest // summary["per_device"],
          "fit": summary["fit"], "b_simple": summary["b_simple"]}


def many_workers(workload: str) -> dict:
  """A many-worker sweep: its table (of its reported seeds) and the steps L its points train."""
  w = many_workers_table.WORKLOADS[workload]
  [table] = tables(many_workers_table.table(
      many_workers_table.load(os.path.join(data.REPO, w.workdir)), workload,
      many_workers_table.grid_sizes(workload)))
  lengths = sorted({int(p.rsplit("_L", 1)[1])
                    for p in glob.glob(os.path.join(data.REPO, w.workdir, "*", "N*_L*"))})
  return {"label": MANY_WORKERS[workload], "target": w.target, "lengths": lengths,
          "table": table, "figure": f"{w.workdir}/cost_vs_time_ib_xdr800.png"}


def _cell(row: dict, kind: str) -> dict | None:
  """A projection row's `kind` ratio ('time' or 'compute'), its point, baseline and verdict."""
  ratio = row[f"{kind}_ratio"]
  if ratio is None:
    return None
  return {"ratio": ratio, "range": row[f"{kind}_range"], "devices": row["devices"],
          "name": data.point_name(row["method"], row["method_point"]),
          "vs": data.point_name(*row[f"{kind}_baseline"].split()),
          "verdict": targets.verdict_word(ratio, row[f"{kind}_range"])}


def projected(name: str) -> dict:
  """One projection: per preset the closest method point in time and in compute, and how
  many of its (method, D) cells beat the strongest baseline on every seed."""
  rows = data.load_json("projection", name + ".json")["rows"]
  presets = []
  for preset in data.PRESET_NAMES:
    mine = [r for r in rows if r["preset"] == preset]
    best = {kind: max((c for c in (_cell(r, kind) for r in mine) if c),
                      key=lambda c: c["ratio"], default=None) for kind in ("time", "compute")}
    presets.append({"preset": data.PRESET_NAMES[preset], **best, "cells": len(mine),
                    "beats": sum(any((c := _cell(r, k)) and c["verdict"] == "beats"
                                     for k in ("time", "compute")) for r in mine)})
  closest = max(({**p["time"], "preset": p["preset"]} for p in presets if p["time"]),
                key=lambda c: c["ratio"])
  return {"name": name, "what_if": "whatif" in name, "presets": presets,
          "closest": closest, "beats": sum(p["beats"] for p in presets),
          "cells": sum(p["cells"] for p in presets)}


def context() -> dict:
  return {"sweeps": [sweep(*s) for s in SWEEPS],
          "many_workers": [many_workers(w) for w in many_workers_table.WORKLOADS],
          "projections": [projected(n) for n in PROJECTIONS],
          "max_devices": max(projection.DEVICES)}

