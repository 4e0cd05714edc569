"""README.md's generated regions: the first screen's answers, rendered from the committed JSON.

Each region's context, for experiments/docs_render.py's `REGIONS` (which renders it between
the README's `<!-- generated: NAME -->` and `<!-- end -->` lines from template NAME.md.j2):
a number in such a paragraph cannot drift from the results. A context reads only committed
JSON and raises `Contradicted` where the results no longer bear out its template's wording.
"""
from __future__ import annotations

import statistics

from ensemble_jax import costs, report
from experiments import (cost_vs_time_page, distillation_page, one_device_page, projection,
                         regime_page, targets)
from experiments import docs_data as data
from experiments.distillation_page import DISTILLED, TAUGHT
from experiments.docs_data import Contradicted, grid
from experiments.sweeps import critical_batch as critical_batch_sweep

WHATIF = "fashion_mnist_whatif_resnet50"
SMALL_ROUTED = "ensemble_pca_routed_small"


def rows(name: str, **match) -> list[dict]:
  """The projection `name`'s rows that match every key=value."""
  return [r for r in data.projection(name)["rows"] if all(r[k] == v for k, v in match.items())]


def _wins(name: str, method: str, preset: str) -> list[dict]:
  return [r for r in rows(name, method=method, preset=preset) if projection.wins(r)]


def _n(point_name: str) -> int:
  return int(point_name.split("_")[0][1:])


def _workers(sub: str, curve: str, n: int) -> dict:
  """A grid's point of `curve` at N = n workers."""
  return next(p for p in grid(sub) if p["curve"] == curve and _n(p["point"]) == n)


def knee(summary: dict) -> dict:
  """Where data-parallel stops scaling (`critical_batch.stops_halving`)."""
  return critical_batch_sweep.stops_halving(summary["rows"])


def critical_batch() -> dict:
  """Where data-parallel stops scaling: the knee and the fits of the critical-batch sweeps."""
  fashion, small, docs = (data.critical_batch(w) for w in
                          ("fashion", "fashion_small_model", "pydocs"))
  top, smallest = knee(fashion), docs["rows"][0]["batch"]
  if top is fashion["rows"][-1] or knee(docs)["batch"] != smallest or max(
      docs["fit"]["b_crit"], docs["b_simple"]) >= smallest:
    raise Contradicted("readme_regime: a knee moved (Fashion-MNIST's to its largest batch, "
                       "or the Python docs' above their smallest)")
  return {"fashion": fashion, "small": small, "docs": docs, "knee": top, "smallest": smallest}


def many_workers() -> dict:
  """The many-worker grid against data-parallel beyond its knee, and the small model's
  routed experts at N = 64 against its own data-parallel on 16-64 devices (the projection's
  pricing on nvlink)."""
  sub, preset = "many_workers", "ib_xdr800"
  fashion = data.critical_batch("fashion")
  past = [r["median_steps"] for r in fashion["rows"] if r["batch"] >= knee(fashion)["batch"]]
  streams = [p for p in grid(sub) if p["curve"] == "ensemble" and _n(p["point"]) >= 8]
  routed = [_workers(sub, "ensemble_pca_routed", n) for n in (64, 128)]
  points = {(p["curve"], p["name"]): p for p in data.projection("fashion_mnist")["points"]}
  dp = [projection.Point.from_json(points["data_parallel", f"B{fashion['per_device'] * d}"])
        for d in (32, 64)]
  dp_s = [p.time_s(costs.INTERCONNECTS[preset]) for p in dp]
  small = rows("fashion_mnist", method=SMALL_ROUTED, preset="nvlink")
  n64 = next(r for r in small if r["method_point"].startswith("N64_"))
  beyond = [r for r in small if 16 <= r["devices"] <= 64]
  routed_n64 = _workers(sub, SMALL_ROUTED, 64)
  if (max(p["steps"]["max"] for p in streams) > 1.2 * min(p["steps"]["min"] for p in streams)
      or round(statistics.median(p["steps"]["median"] for p in streams), -1) <= max(past)
      or min(p["time_s"][preset]["median"] for p in routed) <= max(dp_s)
      or n64["method_time_s"] <= beyond[-1]["baseline_time_s"]
      or any(p["reached"] < p["seeds"] for p in streams + routed + [routed_n64])):
    raise Contradicted("readme_regime: the many-worker points moved against data-parallel")
  return {"preset": preset, "past": past, "streams": [_n(p["point"]) for p in streams],
          "about": round(statistics.median(p["steps"]["median"] for p in streams), -1),
          "routed": routed, "dp": dp, "dp_s": dp_s, "n64": n64, "routed_n64": routed_n64,
          "beyond": beyond, "dp_steps": [points["dp_small_model", r["time_baseline"].split()[1]]
                                         ["steps"] for r in beyond]}


def projected() -> dict:
  """The projection's verdict: no win on the measured models, the what-ifs' wins on 10 GbE
  only, GPT-2 small's within the spread; the closest points and the small model's
  data-parallel."""
  for name in ("fashion_mnist", "pydocs_gpt2"):
    if any(projection.wins(r) for r in data.projection(name)["rows"]):
      raise Contradicted(f"a method point wins in the projection {name}")
  closest = [r["time_ratio"] for r in rows("fashion_mnist", method=SMALL_ROUTED)]
  if max(closest) < max(r["time_ratio"] or 0 for r in data.projection("fashion_mnist")["rows"]):
    raise Contradicted("the small-model routed experts are no longer the closest")
  if not _wins(WHATIF, SMALL_ROUTED, "eth10g") or not _wins(
      WHATIF, "ensemble_pca_routed", "eth10g") or _wins(
      WHATIF + "_pools_charged", "ensemble_pca_routed", "eth10g") or any(
      projection.wins(r) for r in data.projection(WHATIF)["rows"] if r["preset"] != "eth10g"):
    raise Contradicted("the ResNet-50 what-if's wins moved")
  [ib] = rows(WHATIF, method=SMALL_ROUTED, preset="ib_xdr800", devices=8)
  [gpt] = rows("pydocs_gpt2_whatif_gpt2_small", method="ensemble_tfidf_routed_small",
               preset="nvlink", devices=8)
  if projection.wins(ib) or projection.wins(gpt):
    raise Contradicted("a within-the-spread point now wins")
  dp = [p for p in data.projection("fashion_mnist")["points"] if p["curve"] == "dp_small_model"]
  return {"closest": closest, "gpt": gpt, "devices": max(projection.DEVICES),
          "dp_measured": max(p["devices"] for p in dp),
          "dp_fastest": min(dp, key=lambda p: p["steps"] * p["device_step_s"])["devices"]}


def one_device() -> dict:
  """The H200 run's points by curve; data-parallel's fastest first to the target."""
  ctx = one_device_page.context()
  if ctx["first"]["curve"] != "data_parallel":
    raise Contradicted("one model is no longer first to the target on one device")
  by_curve = {r["curve"]: r for r in ctx["rows"]}
  return {"dp": ctx["first"], "seeds": ctx["seed_list"], "ensemble": by_curve["ensemble"],
          "routed": by_curve[SMALL_ROUTED]}


def regime() -> dict:
  """The first screen's regime, many-worker, projection and one-GPU bullets."""
  return {"critical": critical_batch(), "many": many_workers(), "projected": projected(),
          "one_device": one_device()}


def distilled() -> dict:
  """The literature check (what was compared with what), one set's charged compute, and
  the best matched time ratio of the Fashion-MNIST grid's distilled points and of the
  Python docs' taught ones, charged and amortised; none may beat the strongest baseline."""
  synthetic, taught = distillation_page.distilled(), distillation_page.taught()

  def best(pts: list[dict], curves, what: str) -> dict | None:
    t = targets.best_matched(pts, curves, "time")
    if t and t["range"][0] > 1 or any(r["ahead"] for c in curves for p in report.PRESETS
                                      for r in report.matched(pts, c, p)):
      raise Contradicted(f"readme_distilled: {what} beats the strongest baseline")
    return t

  return {"literature": distillation_page.literature(), "cost": distillation_page.one_set(),
          "charged": best(synthetic["grid"], DISTILLED, "charged"),
          "amortised": best(synthetic["whatif"], [c + report.AMORTISED for c in DISTILLED],
                            "amortised, a what-if,"),
          "kd_charged": best(taught["grid"], TAUGHT, "charged"),
          "kd_amortised": best(taught["whatif"], [c + report.AMORTISED for c in TAUGHT],
                               "amortised")}


# region -> the function building its context
REGIONS = {
    "readme_answer": lambda: {**cost_vs_time_page.context(), **regime_page.context(),
                              "ladder": targets.context("fashion_mnist")},
    "readme_targets": lambda: targets.context("fashion_mnist"),
    "readme_grids": cost_vs_time_page.context,
    "readme_regime": regime,
    "readme_distilled": distilled}
