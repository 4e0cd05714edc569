"""docs/results/cost_vs_time.md's context: the two cost-vs-time grids, read from their
committed JSON (results.json, tuning.json, the calibrations), never trained.

  python -m experiments.cost_vs_time_page   # the context, as JSON

The tables are the report's own (`ensemble_jax.report`), the reading is `targets.closest`'s
(the one rule that names the closest method point and the strongest baseline), the
verdict `targets.verdict_word`'s. experiments/docs_render.py renders the page from
docs/templates/cost_vs_time.md.j2; README.md's grids region reads the same context.
"""
from __future__ import annotations

import functools
import glob
import json
import os

from ensemble_jax import config_lib, report, stored
from experiments import docs_data as data
from experiments import targets
from experiments.docs_data import REPO, RESULTS, cells, tables
# the grids this page reads, under experiments/results/, and how the page names them
GRIDS = {"fashion_mnist": "Fashion-MNIST", "pydocs_gpt2": "Python docs (byte-level GPT-2)"}
# the points table's columns the page leaves to table.md (every preset's time but one)
DROPPED = {"time nvlink (s)", "time eth10g (s)", "host train s"}
# which calibrated device step prices which committed runs: (results, calibration dir)
CALIBRATED = (("experiments/results/fashion_mnist", "experiments/results/fashion_mnist/calibration"),
              ("experiments/results/many_workers", "experiments/results/fashion_mnist/calibration"),
              ("experiments/results/fashion_mnist_ceilings",
               "experiments/results/fashion_mnist/calibration"),
              ("experiments/results/pydocs_gpt2", "experiments/results/pydocs_gpt2/calibration"),
              ("experiments/results/many_workers_pydocs",
               "experiments/results/pydocs_gpt2/calibration"))


def columns(table: list[str], dropped=DROPPED) -> str:
  """A table without the columns named in `dropped`, as Markdown."""
  keep = [i for i, h in enumerate(cells(table[0])) if h not in dropped]
  rows = ["| " + " | ".join(cells(row)[i] for i in keep) + " |" for row in table]
  return "\n".join([rows[0], "|" + "---|" * len(keep), *rows[2:]])


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
          "fixed": sorted({c for (c, _), t in tunes.items() if not t}
                          - {c for (c, _), t in tunes.items() if t})}


def schedule_edges(sub: str, pts: list[dict]) -> list[dict]:
  """The points whose chosen schedule fraction sits at the short edge of its axis with no
  shorter one tried (`at_edge`: a shorter schedule might do better still; rerun_plan.md
  lists them, the rule now extending the axis there)."""
  out = []
  for p in pts:
    for axis in data.tuning(sub, p["curve"], p["point"])["axes"]:
      if axis["key"] == config_lib.SCHEDULE_FRACTION and axis.get("at_edge"):
        out.append({"point": f"{p['curve']} {p['point']}", "fraction": axis["chosen"]})
  return out


def grid(sub: str) -> dict:
  """One grid: its model, target, seeds and device steps, the reading (`targets.closest`),
  the points chosen at the schedule axis's edge, and the report's tables."""
  runs = report.load_runs(os.path.join(RESULTS, sub))
  pts = list(data.grid(sub))
  first = stored.load(sorted(glob.glob(os.path.join(RESULTS, sub, "data_parallel", "D1",
                                                    "seed*", "results.json")))[0])
  results = os.path.join(RESULTS, sub)
  steps = sorted((r for r in report.calibrations(results, os.path.join(results, "calibration"))
                  if r["runs"]), key=lambda r: -r["params"])
  made = tables(report.table(runs))  # points, matched, summary, tuning per point, per curve
  return {
      "sub": sub, "name": GRIDS[sub], "target": sorted({r["target"] for r in runs}),
      "model": data.model_name(first["config"]), "params": first.get("num_params"),
      "per_device": steps[0]["per_device_batch"],
      "points": len(pts), "seeds": seeds(sub, pts),
      "device_steps": [{"params": r["params"], "step_s": r["device_step_s"],
                        "points": r["points"]} for r in steps],
      "reading": targets.closest(pts),
      "schedule_edges": schedule_edges(sub, pts),
      "figure": f"experiments/results/{sub}/cost_vs_time_ib_xdr800.png",
      "points_table": columns(made[0]), "matched_table": "\n".join(made[1]),
      "tuning_table": "\n".join(made[3]), "tuning_curves_table": "\n".join(made[4]),
      "schedule_table": "\n".join(tables(report.schedule_check(results))[0])}


@functools.lru_cache(maxsize=None)
def _context() -> str:
  grids = [grid(sub) for sub in GRIDS]
  [calibration] = tables(report.calibration_table(list(CALIBRATED), REPO))
  return json.dumps({"grids": grids, "verdicts": targets.VERDICTS,
                     "devices": max(p["devices"] for sub in GRIDS for p in data.grid(sub)),
                     "calibration_table": "\n".join(calibration)})


def context() -> dict:
  """What docs/results/cost_vs_time.md (and README.md's grids region) is rendered from."""
  return json.loads(_context())


if __name__ == "__main__":
  print(json.dumps(context(), indent=1))
