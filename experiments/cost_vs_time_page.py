"""docs/results/cost_vs_time.md's context (README.md's grids region's too): the two grids'
tables (`ensemble_jax.report`) and reading (`targets.closest`), from committed JSON only."""
from __future__ import annotations

import functools
import json
import os

from ensemble_jax import config_lib, report
from experiments import docs_data as data
from experiments import targets
from experiments.docs_data import REPO, RESULTS, cells, tables
# the grids this page reads, under experiments/results/, and how the page names them
GRIDS = {"fashion_mnist": "Fashion-MNIST", "pydocs_gpt2": "Python docs (byte-level GPT-2)"}
# the points table's columns the page leaves to table.md (every preset's time but one)
DROPPED = {"time nvlink (s)", "time eth10g (s)", "host train s"}
# which calibrated device step prices which committed runs: results -> the grid calibrating them
CALIBRATED = tuple((f"experiments/results/{results}", f"experiments/results/{grid}/calibration")
                   for results, grid in {
                       "fashion_mnist": "fashion_mnist", "many_workers": "fashion_mnist",
                       "fashion_mnist_ceilings": "fashion_mnist", "pydocs_gpt2": "pydocs_gpt2",
                       "many_workers_pydocs": "pydocs_gpt2"}.items())


def seeds(sub: str, pts: list[dict]) -> dict:
  """A grid's seeds: the rate's tuning seed(s), the schedule's second tuning seed(s), the
  reported seeds, and the curves whose points do not tune their schedule's length."""
  records = {(p["curve"], p["point"]): data.tuning(sub, p["curve"], p["point"]) for p in pts}
  tunes = {k: any(a["key"] == config_lib.SCHEDULE_FRACTION for a in r["axes"])
           for k, r in records.items()}
  return {"tuning": sorted({r["seed"] for r in records.values()}),
          "schedule": sorted({s for k, r in records.items() if tunes[k]
                              for s in r.get("schedule_seeds", [])}),
          "reported": sorted({s for p in pts for s in p["seed_list"]}),
          "fixed": sorted({c for c, _ in tunes} - {c for (c, _), t in tunes.items() if t})}


def grid(sub: str) -> dict:
  """One grid: its model, target, seeds, reading (`targets.closest`) and the report's tables."""
  results = os.path.join(RESULTS, sub)
  runs, pts = report.load_runs(results), list(data.grid(sub))
  first = data.stored_runs(f"{sub}/data_parallel/D1/seed*/results.json")[0]
  made = tables(report.table(runs))  # points, matched, summary, tuning per point, per curve
  keep = [i for i, h in enumerate(cells(made[0][0])) if h not in DROPPED]  # points' columns
  points = ["| " + " | ".join(cells(row)[i] for i in keep) + " |" for row in made[0]]
  return {
      "sub": sub, "name": GRIDS[sub], "target": sorted({r["target"] for r in runs}),
      "model": data.model_name(first["config"]), "params": first.get("num_params"),
      "points": len(pts), "seeds": seeds(sub, pts), "reading": targets.closest(pts),
      # the points chosen at the schedule axis's short edge with no shorter one tried
      "schedule_edges": [{"point": f"{p['curve']} {p['point']}", "fraction": a["chosen"]}
                         for p in pts for a in data.tuning(sub, p["curve"], p["point"])["axes"]
                         if a["key"] == config_lib.SCHEDULE_FRACTION and a.get("at_edge")],
      "figure": f"experiments/results/{sub}/cost_vs_time_ib_xdr800.png",
      "points_table": "\n".join([points[0], "|" + "---|" * len(keep), *points[2:]]),
      "matched_table": "\n".join(made[1]),
      "tuning_table": "\n".join(made[3]), "tuning_curves_table": "\n".join(made[4]),
      "schedule_table": "\n".join(tables(report.schedule_check(results))[0])}


@functools.lru_cache(maxsize=None)
def _context() -> str:
  [calibration] = tables(report.calibration_table(list(CALIBRATED), REPO))
  return json.dumps({"grids": [grid(sub) for sub in GRIDS],
                     "devices": max(p["devices"] for sub in GRIDS for p in data.grid(sub)),
                     "calibration_table": "\n".join(calibration)})


def context() -> dict:  # a fresh copy each call: the cached one stays as built
  return json.loads(_context())

