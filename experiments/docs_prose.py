"""The docs' paragraphs that quote numbers, rendered from the committed JSON.

A page holds a rendered paragraph between two marker lines,

  <!-- generated: NAME -->
  ...
  <!-- end -->

and experiments/docs_tables.py checks each region against its template (the `prose`
family) and `--write` fills it, as it does the tables: a number in such a paragraph cannot
drift from the results. A template is one function registered under its page and name; it
reads only committed JSON (results.json, tuning.json, a sweep's summary.json, the
projection's and the benchmarks' JSON) and raises `Contradicted` where the results no
longer bear out its wording (a "no win" that became one), so a rerun that changes the
answer fails the check instead of rewording it. A what-if that no JSON holds is computed
from the JSON's own points by the code that wrote it (`held_rows`), and said so in the
wording.
"""
from __future__ import annotations

import collections
import functools
import glob
import json
import math
import os
import re
import statistics
import textwrap
from typing import Callable

from ensemble_jax import config_lib, costs, report, stored
from ensemble_jax import record as record_lib
from experiments import projection, rerun_plan
from experiments.sweeps import critical_batch as critical_batch_sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "experiments", "results")
README, COST_VS_TIME, REGIME = "README.md", "docs/results/cost_vs_time.md", "docs/results/regime.md"
ONE_DEVICE = "docs/results/one_device.md"
METHODOLOGY = "docs/methodology.md"
DISTILLATION = "docs/results/distillation.md"
BEGIN = re.compile(r"^<!-- generated: ([\w.-]+) -->$")
END = "<!-- end -->"
WIDTH = 90


class Contradicted(Exception):
  """The committed results no longer bear out a template's wording: rewrite the template."""


TEMPLATES: dict[str, tuple[str, Callable[[], str]]] = {}  # name -> (page, render)


def template(page: str, name: str):
  """Registers `render() -> Markdown` as the paragraph `name` of `page`."""
  def register(render):
    if name in TEMPLATES:
      raise ValueError(f"template {name} registered twice")
    TEMPLATES[name] = (page, render)
    return render
  return register


def regions(text: str) -> dict[str, tuple[int, int]]:
  """Each generated region of a page: name -> (first line, last line + 1) of its body, the
  lines between its markers (the page split on "\\n")."""
  lines, out, name = text.split("\n"), {}, None
  for i, line in enumerate(lines):
    if (m := BEGIN.match(line)) and name is None:
      name, start = m[1], i + 1
    elif line == END and name is not None:
      out[name] = (start, i)
      name = None
  return out


# ---- formatting ----------------------------------------------------------------------------

KEEP = "\u00a0"  # joins "N = 8" and "6.3 s" while wrapping (textwrap splits on ASCII whitespace only)


def _fill(text: str, **indent) -> str:
  text = re.sub(r"(\w) = (\w)", rf"\1{KEEP}={KEEP}\2", " ".join(text.split()))
  text = re.sub(r"(\d) (s|ms|steps)\b", rf"\1{KEEP}\2", text)  # a number keeps its unit
  return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False,
                       **indent).replace(KEEP, " ")


def paragraph(text: str) -> str:
  return _fill(text)


def bullet(text: str) -> str:
  return _fill(text, initial_indent="- ", subsequent_indent="  ")


def x(v: float) -> str:
  return f"{v:.2f}x"


def span(values, fmt=x) -> str:
  """'a-b' over the values ('a' where they round alike)."""
  lo, hi = fmt(min(values)), fmt(max(values))
  return lo if lo == hi else f"{lo}-{hi}"


def s(v: float) -> str:
  return f"{v:.1f} s"


def within(rng) -> bool:
  return rng[0] <= 1 <= rng[1]


def _two(v: float) -> str:
  return f"{v:.2f}"


def _whole(v: float) -> str:
  return f"{v:.0f}"


def listing(items: list[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def as_fraction(f: float) -> str:
  """'1/4', '1', '2'."""
  return f"1/{1 / f:g}" if f < 1 else f"{f:g}"


def listed(values) -> str:
  """'1, 2 and 3'."""
  return listing([str(v) for v in values])


# ---- the committed results -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def grid(sub: str) -> tuple[dict, ...]:
  """A cost-vs-time grid's points (`report.points`, seeds 1-3)."""
  return tuple(report.points(report.load_runs(os.path.join(RESULTS, sub))))


def point(sub: str, curve: str, name: str) -> dict:
  return next(p for p in grid(sub) if p["curve"] == curve and p["point"] == name)


@functools.lru_cache(maxsize=None)
def _projection(name: str) -> dict:
  with open(os.path.join(RESULTS, "projection", name + ".json")) as f:
    return json.load(f)


def rows(name: str, **match) -> list[dict]:
  """The projection `name`'s rows that match every key=value."""
  return [r for r in _projection(name)["rows"] if all(r[k] == v for k, v in match.items())]


def row(name: str, **match) -> dict:
  [r] = rows(name, **match)
  return r


def _results(pattern: str) -> list[dict]:
  return [report.read_run(path)
          for path in sorted(glob.glob(os.path.join(RESULTS, pattern)))]


@functools.lru_cache(maxsize=None)
def critical_batch(workload: str) -> dict:
  """A critical-batch sweep's `summary.json` (fashion, fashion_small_model, pydocs)."""
  with open(os.path.join(RESULTS, "critical_batch", workload, "summary.json")) as f:
    return json.load(f)


def knee(summary: dict) -> dict:
  """The critical-batch row past which no larger batch halves the steps (perfect scaling
  would halve them at every doubling): where data-parallel stops scaling."""
  measured = [r for r in summary["rows"] if r["median_steps"] is not None]
  return next(r for i, r in enumerate(measured)
              if all(2 * q["median_steps"] > r["median_steps"] for q in measured[i + 1:]))


def device_step(sub: str, curve: str, name: str) -> float:
  """The calibrated device step that prices a grid point's runs."""
  [step] = {r["cost"]["modelled"]["device_step_time_s"]
            for r in _results(f"{sub}/{curve}/{name}/seed*/results.json")}
  return step


def projected_point(name: str, curve: str, point: str) -> projection.Point:
  """A point of the projection `name`, to price as it does."""
  return projection.Point.from_json(next(p for p in _projection(name)["points"]
                                         if p["curve"] == curve and p["name"] == point))


def dp_at_batch(name: str, batch: int) -> projection.Point:
  """The projection's data-parallel point at global batch `batch`: the grid's D point where
  it reached the target on every seed (it replaces the critical-batch sweep's B point of
  the same batch there), else the sweep's."""
  return next(projection.Point.from_json(p) for p in _projection(name)["points"]
              if p["curve"] == "data_parallel"
              and p["name"] in (f"B{batch}", f"D{batch // p['batch_per_device']}"))


def strongest(sub: str, preset: str) -> dict:
  """The fastest baseline point that reached the target on every reported seed."""
  baselines = report.baseline_curves(list(grid(sub)))
  return min((p for p in grid(sub) if p["curve"] in baselines and p["reached"] == p["seeds"]),
             key=lambda p: p["time_s"][preset]["median"])


def matched_rows(sub: str, preset: str) -> list[tuple[str, dict]]:
  """Every method point of a grid against the strongest baseline at its own budget on
  `preset` (`report.matched`'s rows): (curve, row)."""
  pts = list(grid(sub))
  methods = sorted({p["curve"] for p in pts} - set(report.baseline_curves(pts)))
  return [(curve, m) for curve in methods for m in report.matched(pts, curve, preset)]


def best_matched(sub: str, kind: str, preset: str | None = None) -> tuple:
  """The best matched `kind` ratio ('time' or 'compute') of any method point on `preset`
  (default: any): (ratio, seed range, curve, point, preset, the baseline compared)."""
  best = None
  for preset in (preset,) if preset else report.PRESETS:
    for curve, m in matched_rows(sub, preset):
      if kind in m["ahead"]:
        raise Contradicted(f"{sub}'s {curve} {m['point']} is ahead of every baseline in "
                           f"{kind} on {preset}")
      if m[kind] is not None and (best is None or m[kind][0] > best[0]):
        best = (m[kind][0], m[f"{kind}_range"], curve, m["point"], preset, m[kind][1])
  return best


def at_or_above_one(sub: str) -> list[tuple]:
  """Every matched ratio of a method point at or above 1x, on any preset: (kind, ratio,
  seed range, curve, point, preset). A win is one whose whole seed range is above 1x."""
  return [(kind, m[kind][0], m[f"{kind}_range"], curve, m["point"], preset)
          for preset in report.PRESETS for curve, m in matched_rows(sub, preset)
          for kind in ("time", "compute") if m[kind] and m[kind][0] >= 1]


PRESET_NAMES = {"nvlink": "nvlink", "ib_xdr800": "ib_xdr800", "eth10g": "10 GbE"}
CURVE_NAMES = {  # how the prose names a curve
    "ensemble": "random streams", "ensemble_tfidf_routed": "tf-idf-routed experts",
    "dp_small_model": "the small model",
    "dp_small_model_sync_bn": "the small model (synchronised BatchNorm)",
    "data_parallel_sync_bn": "data-parallel (synchronised BatchNorm)",
    "ensemble_pca_routed_small": "small-model PCA-routed experts",
    "ensemble_tfidf_routed_small": "small-model tf-idf-routed experts",
    "ensemble_pca_routed": "PCA-routed experts", "data_parallel": "data-parallel",
    "dp_wide_model": "the wider model (width 16)"}


def point_name(curve: str, point: str) -> str:
  """A point as the docs name it, one name per thing: 'small-model PCA-routed experts, N = 4'
  for ensemble_pca_routed_small N4_L469 (the steps left out), 'the small model at D = 8
  (synchronised BatchNorm)' for dp_small_model_sync_bn D8, 'data-parallel at D = 8, 2
  epochs' for data_parallel D8_E2 (a fixed length said)."""
  family = curve.removesuffix("_sync_bn")  # its BatchNorm said last
  name = CURVE_NAMES.get(family, family.replace("_", "-"))
  bn = " (synchronised BatchNorm)" if family != curve else ""
  size, *rest = point.split("_")
  length = "".join(f", {r[1:]} epochs" for r in rest if r.startswith("E"))
  return (f"{name} at D = {size[1:]}{bn}{length}" if size[0] == "D"
          else f"{name}, {size[0]} = {size[1:]}{bn}{length}")


def _n(point_name: str) -> str:
  return point_name.split("_")[0][1:]


def _workers(sub: str, curve: str, n: int) -> dict:
  """A grid's point of `curve` at N = n workers."""
  return next(p for p in grid(sub) if p["curve"] == curve and _n(p["point"]) == str(n))


def _against(t: float, other: float) -> str:
  """How a time reads beside another: 'level with' within 10%, else faster or slower."""
  return "level with" if 0.9 < t / other < 1.1 else "faster than" if t < other else "slower than"


def _ranged(r: tuple[float, tuple], what: str = "") -> str:
  """'0.94x (0.81x-1.09x over the seeds, within the spread)'."""
  value, rng = r
  return (f"{x(value)}{what} ({x(rng[0])}-{x(rng[1])}"
          + (", within the spread)" if within(rng) else ")"))


# ---- the projection ------------------------------------------------------------------

WHATIF = "fashion_mnist_whatif_resnet50"
SMALL_ROUTED = "ensemble_pca_routed_small"


def _wins(name: str, method: str, preset: str) -> list[dict]:
  return [r for r in rows(name, method=method, preset=preset) if projection.wins(r)]


def small_model_beyond() -> dict:
  """The small model's routed experts at N = 64 against the small model's own data-parallel
  beyond 8 devices (16-64), as the projection prices them on nvlink."""
  n64 = next(r for r in rows("fashion_mnist", method=SMALL_ROUTED, preset="nvlink")
             if r["method_point"].startswith("N64_"))
  beyond = [r for r in rows("fashion_mnist", method=SMALL_ROUTED, preset="nvlink")
            if 16 <= r["devices"] <= 64]
  dp_points = {p["name"]: p for p in _projection("fashion_mnist")["points"]
               if p["curve"] == "dp_small_model"}
  return {"n64": n64, "beyond": beyond,
          "dp_steps": [dp_points[r["time_baseline"].split()[1]]["steps"] for r in beyond]}


def small_dp() -> dict:
  """The small model's data-parallel in the projection: the most devices it was measured on
  and those of its fastest point."""
  points = [p for p in _projection("fashion_mnist")["points"] if p["curve"] == "dp_small_model"]
  return {"measured": max(p["devices"] for p in points),
          "fastest": min(points, key=lambda p: p["steps"] * p["device_step_s"])["devices"]}


def projected() -> dict:
  """The projection's verdict: no win on the measured models, the what-ifs' wins on 10 GbE
  and their points within the spread."""
  for name in ("fashion_mnist", "pydocs_gpt2"):
    if any(projection.wins(r) for r in _projection(name)["rows"]):
      raise Contradicted(f"a method point wins in the projection {name}")
  closest = [r["time_ratio"] for r in rows("fashion_mnist", method=SMALL_ROUTED)]
  if max(closest) < max(r["time_ratio"] or 0 for r in _projection("fashion_mnist")["rows"]):
    raise Contradicted("the small-model routed experts are no longer the closest")
  routed = _wins(WHATIF, "ensemble_pca_routed", "eth10g")
  out = {
      "closest": closest,
      "eth": [r["time_ratio"] for r in _wins(WHATIF, SMALL_ROUTED, "eth10g")],
      "eth_charged": [r["time_ratio"]
                      for r in _wins(WHATIF + "_pools_charged", SMALL_ROUTED, "eth10g")],
      "routed_points": sorted({r["method_point"] for r in routed}),
      "routed_ratios": sorted({round(r["time_ratio"], 2) for r in routed}),
      "ib": row(WHATIF, method=SMALL_ROUTED, preset="ib_xdr800", devices=8),
      "ib_charged": row(WHATIF + "_pools_charged", method=SMALL_ROUTED, preset="ib_xdr800",
                        devices=8),
      "gpt": row("pydocs_gpt2_whatif_gpt2_small", method="ensemble_tfidf_routed_small",
                 preset="nvlink", devices=8),
      "gpt_charged": row("pydocs_gpt2_whatif_gpt2_small_pools_charged",
                         method="ensemble_tfidf_routed_small", preset="nvlink", devices=8)}
  if not out["eth"] or not routed or _wins(
      WHATIF + "_pools_charged", "ensemble_pca_routed", "eth10g") or any(
      projection.wins(r) for r in _projection(WHATIF)["rows"] if r["preset"] != "eth10g"):
    raise Contradicted("the ResNet-50 what-if's wins moved")
  for r in (out["ib"], out["gpt"]):
    if projection.wins(r):
      raise Contradicted("a within-the-spread point now wins")
  return out


# ---- README.md -----------------------------------------------------------------------------

@template(README, "readme_targets")
def readme_targets() -> str:
  """The first screen's answer at every target up to the ceiling (a Jinja2 template)."""
  from experiments import docs_render, targets
  return docs_render.render_template("readme_targets.md.j2",
                                     targets.context("fashion_mnist")).rstrip("\n")

@template(README, "readme_grids")
def readme_grids() -> str:
  """The first screen's verdict on the two grids, from their matched ratios."""
  parts = []
  for sub, label in (("fashion_mnist", "Fashion-MNIST"), ("pydocs_gpt2", "Python docs")):
    t, c = best_matched(sub, "time"), best_matched(sub, "compute")
    for r in (t, c):
      if r[1][0] > 1:
        raise Contradicted(f"readme_grids: {sub}'s {r[2]} {r[3]} wins ({r[0]:.2f}x) on {r[4]}")
    who = (f"{CURVE_NAMES.get(c[2], c[2])}, N = {_n(c[3])}" +
           ("" if c[5] == t[5] else f", against {_baseline_name(sub, c[5])}"))
    # the preset named only where the best time ratio depends on it
    every = {x(best_matched(sub, "time", preset)[0]) for preset in report.PRESETS}
    where = "" if len(every) == 1 else f"{PRESET_NAMES[t[4]]}; "
    # the time's point named too where another point holds the best compute ratio
    also = ("" if (t[2], t[3]) == (c[2], c[3]) else
            f"; {CURVE_NAMES.get(t[2], t[2])}, N = {_n(t[3])}")
    parts.append(f"{label} {x(t[0])} in time ({where}{x(t[1][0])}-{x(t[1][1])} "
                 f"over the seeds{', within the spread' if within(t[1]) else ''}{also}) and "
                 f"{x(c[0])} in compute ({x(c[1][0])}-{x(c[1][1])}; {who})")
  return bullet(
      "**No method point beats the strongest baseline** on either embedded workload's grid "
      "(up to 8 devices), at its own budget, on any interconnect. Best matched ratios on any "
      f"preset (above 1x over the seeds' range would be a win): {parts[0]}; {parts[1]}. "
      "Both grids report seeds 1-3 at choices made on two tuning seeds (the schedule's length "
      "tuned too, a length chosen only if every tuning seed reaches the target within "
      f"{100 * rerun_plan.DEFAULTS.schedule_margin:.0f}% of its steps), never reported: "
      + _fashion_baselines_sentence())


def _fashion_baselines_sentence() -> str:
  """The Fashion-MNIST grid's baselines as tuned: a baseline point that missed the target on
  every reported seed though its tuning seeds reached it, where one does, and the strongest
  baseline."""
  sub = "fashion_mnist"
  pts = list(grid(sub))
  baselines = report.baseline_curves(pts)
  best = strongest(sub, "ib_xdr800")
  bests = {preset: strongest(sub, preset) for preset in report.PRESETS}
  if len({(_family(b["curve"]), b["devices"]) for b in bests.values()}) != 1:
    raise Contradicted("readme_grids: the strongest Fashion-MNIST baseline's model or devices "
                       "depend on the preset")
  name = CURVE_NAMES.get(_family(best["curve"]), best["curve"]) + (
      "" if len({b["curve"] for b in bests.values()}) == 1 else
      f" ({_bn_by_preset({p: [b['curve'] + ' ' + b['point']] for p, b in bests.items()})})")
  missed = [p for p in pts if p["curve"] in baselines and p["reached"] == 0
            and _tunes_schedule(tuning(sub, p["curve"], p["point"]))]
  if not missed:
    # data-parallel on the most devices, the point whose seeds once all missed
    top = max((p for p in pts if p["curve"] == "data_parallel"), key=lambda p: p["devices"])
    runs = _reported_runs(sub, "data_parallel", top["point"])
    hit = [r for r in runs if r["reached"]]
    length = LENGTHS[schedule_axis(sub, "data_parallel", top["point"])["chosen"]]
    return (f"on Fashion-MNIST every baseline point reaches the target on a reported seed "
            f"(data-parallel at D = {top['devices']}, at its {length}-length schedule, on "
            f"seed{'s' if len(hit) > 1 else ''} {listed([r['seed'] for r in hit])}: "
            f"step{'s' if len(hit) > 1 else ''} {listed([r['steps'] for r in hit])} of "
            f"{hit[0]['step_budget']}), and the fastest baseline is {name} at "
            f"D = {best['devices']}.")
  said = []
  for p in missed:
    ts = _tuning_schedule(sub, p["curve"], p["point"])
    said.append(f"{CURVE_NAMES.get(p['curve'], p['curve'].replace('_', '-'))} at "
                f"D = {p['devices']}, whose {ts['length']}-length schedule reached the target "
                f"on its tuning seeds ({ts['steps']}), missed it on seeds "
                f"{listed(p['seed_list'])}")
  return (f"on Fashion-MNIST {listing(said)}; the fastest baseline is {name} at "
          f"D = {best['devices']}.")


def _critical_batch_bullet() -> str:
  """Where data-parallel stops scaling: the knee and the fits of the critical-batch sweeps."""
  fashion, small, docs = (critical_batch(w) for w in ("fashion", "fashion_small_model", "pydocs"))
  top, smallest = knee(fashion), docs["rows"][0]["batch"]
  if top is fashion["rows"][-1] or knee(docs)["batch"] != smallest or max(
      docs["fit"]["b_crit"], docs["b_simple"]) >= smallest:
    raise Contradicted("readme_regime: a knee moved (Fashion-MNIST's to its largest batch, "
                       "or the Python docs' above their smallest)")
  return bullet(
      "**Data-parallel stops scaling early**, so the regime the claim needs is reached: "
      f"Fashion-MNIST at a global batch of about {top['batch']} (fit B_crit "
      f"{fashion['fit']['b_crit']:.0f}, with the schedule's length tuned per batch; the small "
      f"model's {small['fit']['b_crit']:.0f}); the Python docs below {smallest} windows "
      f"(B_crit {docs['fit']['b_crit']:.0f}, noise scale {docs['b_simple']:.0f}). The "
      "ensemble still does not win there.")


def _many_workers_bullet() -> str:
  """The many-worker grid against data-parallel beyond its knee."""
  sub, preset = "many_workers", "ib_xdr800"
  fashion = critical_batch("fashion")
  past = [r["median_steps"] for r in fashion["rows"] if r["batch"] >= knee(fashion)["batch"]]
  streams = [p for p in grid(sub) if p["curve"] == "ensemble" and int(_n(p["point"])) >= 8]
  about = round(statistics.median(p["steps"]["median"] for p in streams), -1)
  routed = [_workers(sub, "ensemble_pca_routed", n) for n in (64, 128)]
  dp = [projected_point("fashion_mnist", "data_parallel", f"B{fashion['per_device'] * d}")
        for d in (32, 64)]
  dp_s = [p.time_s(costs.INTERCONNECTS[preset]) for p in dp]
  small, n64 = small_model_beyond(), _workers(sub, SMALL_ROUTED, 64)
  beyond = small["beyond"]
  if (max(p["steps"]["max"] for p in streams) > 1.2 * min(p["steps"]["min"] for p in streams)
      or about <= max(past) or min(p["time_s"][preset]["median"] for p in routed) <= max(dp_s)
      or small["n64"]["method_time_s"] <= beyond[-1]["baseline_time_s"]
      or any(p["reached"] < p["seeds"] for p in streams + routed + [n64])):
    raise Contradicted("readme_regime: the many-worker points moved against data-parallel")
  return bullet(
      f"**Many workers**: from N = {_n(streams[0]['point'])} to {_n(streams[-1]['point'])}, "
      f"random-stream ensembles stay at about {about:.0f} steps to 85%, where data-parallel "
      f"beyond its knee needs {span(past, lambda v: f'{v:g}')}. Routed experts fall to "
      f"{routed[0]['steps']['median']:g} steps at N = 64 and {routed[1]['steps']['median']:g} at "
      f"N = 128; with their pool build they take {s(routed[0]['time_s'][preset]['median'])} and "
      f"{s(routed[1]['time_s'][preset]['median'])} to target against data-parallel's "
      f"{dp[0].steps:g}-{dp[1].steps:g} steps ({dp_s[0]:.1f}-{s(dp_s[1])}, modelled) on "
      f"{dp[0].devices}-{dp[1].devices} devices. Small-model routed experts reach "
      f"85% in {n64['steps']['median']:g} steps at N = 64 ({s(small['n64']['method_time_s'])} "
      "with their build), where the small model's data-parallel on "
      f"{beyond[0]['devices']}-{beyond[-1]['devices']} devices needs "
      f"{small['dp_steps'][0]:g}-{small['dp_steps'][-1]:g} steps "
      f"({beyond[0]['baseline_time_s']:.1f}-{s(beyond[-1]['baseline_time_s'])}, modelled).")


def _projection_bullet() -> str:
  """The projection to 1,024 devices and its what-ifs, in one line each."""
  v, dp = projected(), small_dp()
  gpt = v["gpt"]
  return bullet(
      f"**Projected to {max(projection.DEVICES):,} devices** (modelled from the measured "
      "steps, each method point against the baselines at its own compute and its own time): "
      "**no method point beats the strongest baseline** at any device count on any preset. "
      f"The closest, the small-model routed experts, reach {span(v['closest'])} in time at "
      f"their compute; the small model's data-parallel, measured to {dp['measured']} devices, "
      f"gets faster up to {dp['fastest']}. The wins are in the ResNet-50 what-if on 10 GbE "
      "(its H100 step scaled by each point's FLOPs, with the routed experts' pool builds left "
      "out or charged as measured here); GPT-2 small's what-if comes within the seeds' spread "
      f"({x(gpt['time_ratio'])}, {x(gpt['time_range'][0])}-{x(gpt['time_range'][1])}), not "
      "past it: [docs/results/regime.md](docs/results/regime.md).")


H200 = "one_device_h200/fashion_mnist"


def one_device() -> dict:
  """The H200 run's points by curve, their median pool build, and the fastest baseline."""
  pts = {p["curve"]: p for p in grid(H200) if p["curve"] != "data_parallel"}
  dp = min((p for p in grid(H200) if p["curve"] == "data_parallel"),
           key=lambda p: p["host_time_s"]["median"])
  if any(p["host_time_s"]["median"] <= dp["host_time_s"]["median"] for p in pts.values()):
    raise Contradicted("one model is no longer first to the target on one device")
  pools = [r["pool_build_s"] for r in report.reported(
      [r for r in report.load_runs(os.path.join(RESULTS, H200)) if r["curve"] == SMALL_ROUTED])]
  return {"dp": dp, "ensemble": pts["ensemble"], "routed": pts[SMALL_ROUTED], "pools": pools}


def _trained(p: dict) -> str:
  """A one-device point's median training time, on its own clock."""
  return s(p["host_time_s"]["median"])


WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 7: "seven", 8: "eight", 9: "nine",
         16: "sixteen"}


def _one_gpu_bullet() -> str:
  """The H200 run's training times to 85%."""
  d = one_device()
  return bullet(
      f"**On one real GPU** (an H200, every time measured, seeds "
      f"{d['dp']['seed_list'][0]}-{d['dp']['seed_list'][-1]}): one model at batch "
      f"{d['dp']['point'][1:]} reaches 85% on Fashion-MNIST in {_trained(d['dp'])} of training, "
      f"{WORDS[int(_n(d['ensemble']['point']))]} stacked models in {_trained(d['ensemble'])}, "
      f"{WORDS[int(_n(d['routed']['point']))]} routed experts in {_trained(d['routed'])} plus "
      "a pool build: [one_device.md](docs/results/one_device.md).")


@template(ONE_DEVICE, "one_device_first")
def one_device_first() -> str:
  """The H200 page's answer: which point reaches the target first, in its own clock."""
  d = one_device()
  return paragraph(
      f"**On one NVIDIA H200, one model at batch {d['dp']['point'][1:]} reaches 85% on "
      f"Fashion-MNIST first**: in {_trained(d['dp'])} of training (median of seeds "
      f"{d['dp']['seed_list'][0]}-{d['dp']['seed_list'][-1]}), against {_trained(d['ensemble'])} "
      f"for {WORDS[int(_n(d['ensemble']['point']))]} models stacked on the device and "
      f"{_trained(d['routed'])} of training plus a ~{s(statistics.median(d['pools']))} pool build "
      f"for {WORDS[int(_n(d['routed']['point']))]} small-model routed experts. Every time here "
      "is measured on the device; nothing is simulated.")


ORDINALS = {3: "third", 4: "quarter", 5: "fifth", 6: "sixth", 7: "seventh", 8: "eighth"}


def _about_a(fraction: float) -> str:
  """'a sixth': the unit fraction nearest `fraction`."""
  n = round(1 / fraction)
  if n not in ORDINALS or abs(1 / n - fraction) > 0.25 / n:
    raise Contradicted(f"{fraction:.3f} is no longer about a unit fraction")
  return f"a {ORDINALS[n]}"


@template(ONE_DEVICE, "one_device_shows")
def one_device_shows() -> str:
  """What the H200 run shows: its steps match the CPU grid's namesakes, the time model
  reads its own clock low, and a larger batch costs almost no step time there."""
  d = one_device()
  runs = report.reported(report.load_runs(os.path.join(RESULTS, H200)))
  per_device = critical_batch("fashion")["per_device"]
  pts = list(grid(H200))
  # each H200 point trains at its namesake's tuned values (experiments/configs/fashion_mnist.py):
  # one device normalises its whole batch, as the synchronised-BatchNorm curve's D devices
  def namesake(p: dict) -> tuple[str, str]:
    if p["curve"] != "data_parallel":
      return p["curve"], p["point"]
    d = int(p["point"][1:]) // per_device
    return ("data_parallel_sync_bn" if d > 1 else "data_parallel"), f"D{d}"

  names = {(p["curve"], p["point"]): namesake(p) for p in pts}
  # ... or at the full grid's former choice where it was re-tuned since: each H200 point is
  # compared with the CPU runs trained at the same values (`superseded/` where re-tuned)
  former = {}
  for p in pts:
    h200 = _results(f"{H200}/{p['curve']}/{p['point']}/seed*/results.json")
    cpu_name = names[(p["curve"], p["point"])]
    chosen = tuning("fashion_mnist", *cpu_name)["chosen"]
    [choice] = {tuple(sorted(trained_choice(r, chosen).items())) for r in h200}
    if dict(choice) != chosen:
      former[p["curve"]] = (cpu_name, dict(choice))
    cpu = [r["steps"] for r in at_choice("fashion_mnist", *cpu_name, dict(choice),
                                          p["seed_list"]) if r["target"]["reached"]]
    if (len(cpu) != len(p["seed_list"]) or p["steps"]["min"] > max(cpu)
        or p["steps"]["max"] < min(cpu)):
      raise Contradicted(f"one_device_shows: {p['curve']} {p['point']}'s steps left the spread "
                         "of the CPU grid's runs at the same tuned values")
  over = [r["host_time_s"] / (r["time_s"]["nvlink"] - r["pool_build_s"]) - 1 for r in runs]

  def step_ms(curve: str, name: str = "") -> str:
    return span([r["cost"]["modelled"]["device_step_time_s"] * 1e3
                 for r in _results(f"{H200}/{curve}/{name}*/seed*/results.json")
                 if r["config"]["seed"] in d["dp"]["seed_list"]], lambda v: f"{v:.0f}")

  small = [p for p in pts if p["curve"] == "data_parallel" and p is not d["dp"]]
  [b64] = small
  third = d["dp"]["steps"]["median"] / b64["steps"]["median"]

  def versus(p: dict) -> str:
    steps, base = p["steps"]["median"], d["dp"]["steps"]["median"]
    if steps < base:
      raise Contradicted(f"one_device_shows: {p['curve']} needs fewer steps than one model")
    return "more" if steps > base else "as many"

  modelled = {(p["curve"], p["point"]): statistics.median(
      r["time_s"]["nvlink"] - r["pool_build_s"] for r in runs
      if (r["curve"], r["point"]) == (p["curve"], p["point"])) for p in pts}
  if min(over) <= 0 or sorted(pts, key=lambda p: p["host_time_s"]["median"]) != sorted(
      pts, key=lambda p: modelled[(p["curve"], p["point"])]):
    raise Contradicted("one_device_shows: the time model no longer reads every run low, or "
                       "it reorders the points")
  dp_names = [names[(p["curve"], p["point"])][1] for p in (b64, d["dp"])]
  if "data_parallel" in former:
    raise Contradicted("one_device_shows: a data-parallel point trained at a former choice")

  def retuned(curve: str, what: str) -> str:
    if curve not in former:
      return what
    (_, name), choice = former[curve]
    length = choice.get(rerun_plan.SCHEDULE)
    return (f"{what} at the full grid's former choice ({LENGTHS[length]}-length schedule), "
            f"read against that point's `superseded/` runs: the full grid has re-tuned "
            f"{name} since and these runs are not yet re-run")

  return "\n".join((
      bullet(
          "**Steps carry over between hardware.** The points take the steps the CPU grid's "
          "namesakes take at the same tuned values (data-parallel D = "
          f"{_n(dp_names[0])} and D = {_n(dp_names[1])}, "
          f"{retuned('ensemble', 'the ensemble at N = ' + _n(d['ensemble']['point']))}, "
          f"{retuned(SMALL_ROUTED, 'the experts at N = ' + _n(d['routed']['point']))}; "
          "[cost_vs_time.md](cost_vs_time.md)) within the seeds' spread."),
      bullet(
          f"**The time model reads low by about {_about_a(statistics.median(over))}.** Steps x "
          f"the median step is {span(over, lambda v: f'{100 * v:.0f}')}% under the run's own "
          "clock in every run (the clock also holds the slower steps after each evaluation "
          "and the host's share); the points keep their order either way."),
      bullet(
          "**On one device a larger batch is nearly free.** A step at batch "
          f"{d['dp']['point'][1:]} takes {step_ms('data_parallel', d['dp']['point'])} ms and at "
          f"{b64['point'][1:]}, {step_ms('data_parallel', b64['point'])} ms: this model leaves "
          f"the GPU idle, so one model at batch {d['dp']['point'][1:]} needs "
          f"{_about_a(third)} of the steps for almost the same step "
          f"time. {WORDS[int(_n(d['ensemble']['point']))].capitalize()} stacked models step in "
          f"{step_ms('ensemble')} ms and need {versus(d['ensemble'])} steps than batch "
          f"{d['dp']['point'][1:]}, {WORDS[int(_n(d['routed']['point']))]} small ones step in "
          f"{step_ms(SMALL_ROUTED)} ms and need {versus(d['routed'])}; the experts also pay "
          f"their pool build ({span(d['pools'], lambda v: f'{v:.1f}')} s). On one device the "
          "method loses in time, like on the modelled clusters.")))

@template(README, "readme_regime")
def readme_regime() -> str:
  """The first screen's regime, many-worker, projection and one-GPU bullets."""
  return "\n".join((_critical_batch_bullet(), _many_workers_bullet(), _projection_bullet(),
                    _one_gpu_bullet()))


LENGTHS = {0.25: "quarter", 0.5: "half", 1.0: "whole"}


@functools.lru_cache(maxsize=None)
def tuning(sub: str, curve: str, name: str) -> dict:
  """A grid point's `tuning.json`: its tuning seeds, axes and runs."""
  with open(os.path.join(RESULTS, sub, curve, name, "tuning.json")) as f:
    return json.load(f)


def trained_choice(run: dict, chosen: dict) -> dict:
  """The values a run trained at, for the keys a tuning's `chosen` holds."""
  return {k: rerun_plan.config_value(run, k) for k in chosen}


def at_choice(sub: str, curve: str, name: str, choice: dict, seeds) -> list[dict]:
  """A grid point's runs on `seeds` trained at `choice`: its reported runs, or, when the
  point was re-tuned since, the superseded ones (`superseded/`) that trained there."""
  found = {}
  for pattern in ("seed*", "superseded/seed*"):
    for r in _results(f"{sub}/{curve}/{name}/{pattern}/results.json"):
      if r["config"]["seed"] in seeds and trained_choice(r, choice) == choice:
        found.setdefault(r["config"]["seed"], r)
  return [found[seed] for seed in sorted(found)]


def former_choice(sub: str, curve: str, name: str, workload: str = "fashion_mnist",
                  full_point: str | None = None) -> dict | None:
  """The full grid's choice a feed grid's point trained at, where it is no longer the full
  grid's current one (its tuning.json's `chosen`): None where the runs are current."""
  chosen = tuning(workload, curve, full_point or name)["chosen"]
  trained = {tuple(sorted(trained_choice(r, chosen).items()))
             for r in _results(f"{sub}/{curve}/{name}/seed*/results.json")}
  [choice] = trained
  return None if dict(choice) == chosen else dict(choice)


def schedule_axis(sub: str, curve: str, name: str) -> dict:
  """A point's tuning of its schedule's length: the chosen fraction and the runs per fraction."""
  return next(a for a in tuning(sub, curve, name)["axes"] if a["key"] == rerun_plan.SCHEDULE)


def _tuning_schedule(sub: str, curve: str, name: str) -> dict:
  """A point's chosen schedule length and its tuning seeds' steps to target ('step 54 and
  48 of 59')."""
  axis = schedule_axis(sub, curve, name)
  chosen = next(r for r in axis["runs"] if r["value"] == axis["chosen"])
  runs = rerun_plan._seeds(chosen)
  if not all(r["reached"] for r in runs):
    raise Contradicted(f"{sub}/{curve}/{name}: a tuning seed missed at its chosen schedule")
  return {"length": LENGTHS[axis["chosen"]],
          "steps": f"step{'s' if len(runs) > 1 else ''} {listing([str(r['steps_to_target']) for r in runs])} of "
                   f"{chosen['step_budget']}"}


# ---- cost_vs_time.md -----------------------------------------------------------------------

SENSITIVITY = "sensitivity/dp_D8_whole_schedule"
# The point those sensitivity runs re-run: data-parallel D = 8 with synchronised BatchNorm.
SYNC_D8 = ("data_parallel_sync_bn", "D8")


def _bn(curve: str) -> str:
  """' (synchronised BatchNorm)' for a `*_sync_bn` curve, else ''."""
  return " (synchronised BatchNorm)" if curve.endswith("_sync_bn") else ""


def _family(curve: str) -> str:
  """A baseline curve's model and schedule, whatever its BatchNorm: 'dp_small_model' for
  dp_small_model and dp_small_model_sync_bn."""
  return curve.removesuffix("_sync_bn")


def _baseline_name(sub: str, name: str) -> str:
  """'the small model at D = 8 (per-device BatchNorm)' for 'dp_small_model D8' where the grid
  runs both BatchNorms, else without the BatchNorm."""
  curve, point = name.split()
  both = {_family(curve), _family(curve) + "_sync_bn"} <= {p["curve"] for p in grid(sub)}
  return (f"{CURVE_NAMES.get(_family(curve), _family(curve))} at D = {point[1:]}"
          + ((_bn(curve) or " (per-device BatchNorm)") if both else ""))


def _family_point(name: str) -> str:
  """'dp_small_model D8' for 'dp_small_model_sync_bn D8' (`_family`)."""
  curve, point = name.split()
  return f"{_family(curve)} {point}"


def _bn_by_preset(points: dict[str, list[str]]) -> str:
  """Which BatchNorm the named baseline points ({preset: ['dp_small_model_sync_bn D8', ...]})
  use where it matters (D >= 2), per preset: 'synchronised on nvlink and ib_xdr800,
  per-device on 10 GbE', or one word where every preset agrees."""
  kinds: dict[str, list[str]] = {}
  for preset, names in points.items():
    bns = {("synchronised" if n.split()[0].endswith("_sync_bn") else "per-device")
           for n in names if n.split()[1] != "D1"}
    kinds.setdefault(" and ".join(sorted(bns)) or "either", []).append(PRESET_NAMES[preset])
  if len(kinds) == 1:
    return f"{next(iter(kinds))} BatchNorm"
  return "BatchNorm " + listing([f"{k} on {listing(v)}" for k, v in kinds.items()])
GRIDS = ("fashion_mnist", "pydocs_gpt2")  # the cost-vs-time grids


def _tunings(sub: str) -> dict[tuple[str, str], dict]:
  """Every point of a grid's `tuning.json`, by (curve, point)."""
  return {(p["curve"], p["point"]): tuning(sub, p["curve"], p["point"]) for p in grid(sub)}


def _tunes_schedule(record: dict) -> bool:
  return any(a["key"] == rerun_plan.SCHEDULE for a in record["axes"])


@functools.lru_cache(maxsize=None)
def grid_seeds(sub: str) -> dict:
  """A grid's seeds: the one it tunes on, the second its schedule lengths are tuned on, the
  reported ones (none a tuning seed), and the curves that do not tune their length."""
  records = _tunings(sub)
  tuned = {r["seed"] for r in records.values()}
  second = {tuple(r["schedule_seeds"]) for r in records.values() if _tunes_schedule(r)}
  reported = {tuple(p["seed_list"]) for p in grid(sub)}
  if len(tuned) != 1 or len(second) != 1 or len(reported) != 1 or (
      {*tuned, *next(iter(second))} & {*next(iter(reported))}):
    raise Contradicted(f"{sub}: its points' tuning or reported seeds moved")
  [tuning_seed], [second], [reported] = tuned, second, reported
  return {"tuning": tuning_seed, "schedule": second, "reported": reported,
          "fixed": {c for (c, _), r in records.items() if not _tunes_schedule(r)}}


@template(COST_VS_TIME, "cost_vs_time_setup")
def cost_vs_time_setup() -> str:
  """The grids' machine and seeds: one tuning seed for the rates, a second for the
  schedule's length on every curve but the fixed short schedules, the same reported seeds."""
  seeds = [grid_seeds(sub) for sub in GRIDS]
  if any(s != seeds[0] for s in seeds) or seeds[0]["fixed"] != {"dp_short_schedule"}:
    raise Contradicted("cost_vs_time_setup: the grids' tuning or reported seeds differ")
  seeds = seeds[0]
  return paragraph(
      "Machine: a 2-core CPU machine simulating "
      f"{max(p['devices'] for sub in GRIDS for p in grid(sub))} devices. Seeds: each point's "
      "learning rate (and, on every curve but the fixed short schedules, its schedule's "
      f"length, on a second tuning seed, {listed(seeds['schedule'])}, too) is tuned on "
      f"seed {seeds['tuning']}; the tables report seeds {listed(seeds['reported'])}, run at "
      "the chosen values, which played no part in the choice. Every point is run by the "
      "rules in [methodology.md](../methodology.md), which also says which numbers are "
      "measured and which are modelled (the time axis is modelled).")


DISTILLED = ("ensemble_distilled", "ensemble_distilled_warm")


def _distilled() -> dict:
  """The Fashion-MNIST grid's distilled curves: their reported `points`, all the grid's
  points (`grid`) and `runs`, the amortised what-if's points beside the baselines'
  (`whatif`), and those curves' grid points with no reported seed yet (`waiting`)."""
  from experiments.configs import fashion_mnist

  pts = list(grid("fashion_mnist"))
  runs = report.load_runs(os.path.join(RESULTS, "fashion_mnist"))
  return {"points": [p for p in pts if p["curve"] in DISTILLED], "grid": pts, "runs": runs,
          "whatif": report.points(_baseline_runs(runs) + report.amortised(runs)),
          "waiting": _waiting(pts, {c: fashion_mnist.sweep_grid("full")[c] for c in DISTILLED})}


def _baseline_runs(runs: list[dict]) -> list[dict]:
  """The runs of `runs`' baseline curves (`report.baseline_curves`)."""
  baselines = report.baseline_curves(report.points(runs))
  return [r for r in runs if r["curve"] in baselines]


def _waiting(pts: list[dict], curves: dict) -> list[str]:
  """'curve point' of each grid point of `curves` ({curve: its points}) not among `pts`
  (no reported seed yet)."""
  ran = {(p["curve"], p["point"]) for p in pts}
  return sorted(f"{c} {q}" for c, qs in curves.items() for q in qs if (c, q) not in ran)


def _distilled_best(pts: list[dict], curves) -> dict:
  """The best matched ratio of `curves`' points over the presets, time and compute:
  {kind: (ratio, seed range, curve, point, preset)}, and `ahead`: a point ahead of every
  baseline, if any."""
  best = {}
  for curve in curves:
    for preset in report.PRESETS:
      for r in report.matched(pts, curve, preset):
        if r["ahead"]:
          best["ahead"] = f"{curve} {r['point']} in {' and '.join(r['ahead'])} on {preset}"
        for kind in ("time", "compute"):
          if r[kind] is not None and (kind not in best or r[kind][0] > best[kind][0]):
            best[kind] = (r[kind][0], r[f"{kind}_range"], curve, r["point"], preset)
  return best


@template(README, "readme_distilled")
def readme_distilled() -> str:
  """The first screen's distilled-data bullet: the literature check, the charged cost of
  one set, and the grid's distilled curves, charged and amortised."""
  from experiments import distillation_check

  lit = distillation_check.load([os.path.join(REPO, p) for p in distillation_check.COMMITTED])
  dm10 = lit["dm"]["10"]["curve"][-1]["mean"] * 100
  published = lit["published"]["dsa"]["10"]
  with open(os.path.join(REPO, distillation_check.BENCH)) as f:
    cases = json.load(f)
  iterations, real = distillation_check.grid_protocol()
  base = point("fashion_mnist", *report.verdict(list(grid("fashion_mnist")))["strongest"].split())
  one_set = iterations * distillation_check.iteration_flops(cases, real) / base["flops"]["median"]
  text = ("**Synthetic distilled data** (distribution matching) reaches the published level "
          f"on Fashion-MNIST ({dm10:.1f}% at 10 images per class against DSA's published "
          f"{published}%). Charged, one worker's set at the grid's {iterations} iterations "
          f"costs {one_set:.0f}x the strongest baseline's compute to the target, so no "
          "distilled point can win in compute. ")
  study = _distilled()
  pts = study["points"]
  if not pts:
    return bullet(text + "The grid's distilled curves have no reported seed yet: "
                  "[docs/results/distillation.md](docs/results/distillation.md).")
  charged = _distilled_best(list(grid("fashion_mnist")), DISTILLED)
  amortised = _distilled_best(study["whatif"], [c + report.AMORTISED for c in DISTILLED])
  for name, best in (("charged", charged), ("amortised", amortised)):
    if "ahead" in best:
      raise Contradicted(f"readme_distilled: {best['ahead']} is ahead of every baseline, "
                         f"{name}")
    for kind in ("time", "compute"):
      if kind in best and best[kind][1][0] > 1:
        raise Contradicted(f"readme_distilled: a distilled point wins {name} in {kind}")
  done = listing([f"{p['curve'].replace('ensemble_', '')} N{KEEP}={KEEP}{_n(p['point'])} "
                  f"({p['reached']}/{p['seeds']} seeds reached 85%, seed"
                  f"{'s' if p['seeds'] > 1 else ''} {', '.join(map(str, p['seed_list']))})"
                  for p in pts])

  def best(b: dict) -> str:
    if "time" not in b:
      return "no distilled point reaches the target on every seed"
    t = b["time"]
    return (f"best matched time ratio {x(t[0])} ({x(t[1][0])}-{x(t[1][1])} over the seeds"
            f"{', within the spread' if within(t[1]) else ''}; "
            f"{t[2].replace('ensemble_', '').replace(report.AMORTISED, '')} N{KEEP}={KEEP}"
            f"{_n(t[3])}, {PRESET_NAMES[t[4]]})")
  waiting = len(study["waiting"])
  rest = (f" ({waiting} more point{'s' if waiting > 1 else ''} of these curves not run yet)"
          if waiting else "")
  return bullet(text + f"On the grid, {done}{rest}: **no distilled point beats the strongest "
                f"baseline**, charged ({best(charged)}) or with the distillation amortised, a "
                f"what-if ({best(amortised)}). " + _taught_sentence() +
                "[docs/results/distillation.md](docs/results/distillation.md).")


def _taught_sentence() -> str:
  """The README's reading of the Python docs' knowledge-distilled curve, once it has a
  reported point: charged it cannot win (kd_study checks); amortised, whatever it shows."""
  study = _taught()
  if not study["points"]:
    return ("Knowledge distillation for text (a teacher's soft targets) is built, its curve "
            "not run yet: ")
  amortised = _distilled_best(study["whatif"], [c + report.AMORTISED for c in TAUGHT])
  done = listing([f"N = {_n(p['point'])} ({p['reached']}/{p['seeds']} seeds reached "
                  f"perplexity 12)" for p in study["points"]])
  if "ahead" in amortised or "time" in amortised and amortised["time"][1][0] > 1:
    verdict = "amortised, a what-if, it **beats** the strongest baseline"
  else:
    verdict = "amortised, a what-if, it does not beat it either"
  t = amortised.get("time")
  ratio = (f" (best matched time ratio {x(t[0])}, {x(t[1][0])}-{x(t[1][1])} over the seeds, "
           f"{t[3]}, {PRESET_NAMES[t[4]]})" if t else "")
  return (f"Knowledge distillation on the Python docs (each worker against a teacher's soft "
          f"targets), {done}: charged with its teacher it cannot win; {verdict}{ratio}: ")


@template(DISTILLATION, "distillation_study")
def distillation_study() -> str:
  """The distilled curves' reported points: charged as the study charges them, and the
  amortised what-if, each against the strongest baseline's frontier (10 GbE)."""
  study = _distilled()
  if not study["points"]:
    return paragraph(f"None of their {len(study['waiting'])} points has a reported seed yet; "
                     "this page and the README say so until they have.")
  builds = {}
  for r in study["runs"]:
    if r["curve"] in DISTILLED:
      builds.setdefault((r["curve"], r["point"]), []).append(r["pool_build_s"])
  return (paragraph(
      "Their reported points (seeds 1-3 once they have run, the tuning seed's run until then; "
      "median [min, max] over the seeds named; steps and times to 85%, or the whole budget "
      "where a seed missed; the ratios against the strongest-baseline frontier at each "
      "point's own budget, above 1x the point is better; amortised: the what-if that does "
      "not charge the distillation):") + "\n\n"
      + _charged_table(study, "final accuracy", "{:.4f}",
                       "one set's distillation (s)",
                       lambda p: statistics.median(builds[(p["curve"], p["point"])])))


def _charged_table(study: dict, final: str, final_fmt: str, reused: str, reused_s) -> str:
  """One row per reported point of `study` (`_distilled`, `_taught`): its steps and final
  metric, what it reuses (`reused_s(point)` seconds), its time charged and amortised and
  the matched ratios on 10 GbE, charged (among the study's `grid`) and amortised."""
  def ratio(rows, name, kind):
    [row] = [r for r in rows if r["point"] == name]
    if row[kind] is None:
      return row["why"] or (report.AHEAD if kind in row["ahead"] else
                            "no baseline within budget")
    lo, hi = row[f"{kind}_range"]
    return f"{x(row[kind][0])} [{x(lo)}, {x(hi)}]"

  lines = [f"| curve | point | seeds | reached | steps to target | {final} | {reused} | "
           "time 10 GbE, charged (s) | amortised (s) | time ratio 10 GbE, charged | amortised "
           "| compute ratio, amortised |", "|---" * 12 + "|"]
  for p in study["points"]:
    charged = report.matched(study["grid"], p["curve"], "eth10g")
    amortised = report.matched(study["whatif"], p["curve"] + report.AMORTISED, "eth10g")
    [a] = [q for q in study["whatif"] if q["curve"] == p["curve"] + report.AMORTISED
           and q["point"] == p["point"]]
    lines.append(
        f"| {p['curve']} | {p['point']} | {', '.join(map(str, p['seed_list']))} | "
        f"{p['reached']}/{p['seeds']} | "
        f"{p['steps']['median']:.0f} [{p['steps']['min']:.0f}, {p['steps']['max']:.0f}] | "
        f"{final_fmt.format(p['final']['median'])} | {reused_s(p):.0f} | "
        f"{p['time_s']['eth10g']['median']:.1f} | {a['time_s']['eth10g']['median']:.1f} | "
        f"{ratio(charged, p['point'], 'time')} | {ratio(amortised, p['point'], 'time')} | "
        f"{ratio(amortised, p['point'], 'compute')} |")
  waiting = study["waiting"]
  return "\n".join(lines) + (f"\n\nNot run yet: {', '.join(waiting)}." if waiting else "")


TAUGHT = ("ensemble_kd",)


def _taught() -> dict:
  """The Python docs' knowledge-distilled curve (its own study, `pydocs_gpt2_kd`, run after
  the full grid, whose seed run teaches it) beside the full grid's baselines, in
  `_distilled`'s form."""
  from experiments.configs import pydocs_gpt2

  base = _baseline_runs(report.load_runs(os.path.join(RESULTS, "pydocs_gpt2")))
  kd_dir = os.path.join(RESULTS, "pydocs_gpt2_kd")
  taught = report.load_runs(kd_dir) if os.path.isdir(kd_dir) else []
  pts = report.points(base + taught)
  return {"points": [p for p in pts if p["curve"] in TAUGHT], "grid": pts, "runs": taught,
          "whatif": report.points(base + report.amortised(taught)),
          "waiting": _waiting(pts, pydocs_gpt2.sweep_grid("kd"))}


@template(DISTILLATION, "kd_study")
def kd_study() -> str:
  """The knowledge-distilled curve's reported points against the Python docs grid's
  strongest baseline, charged (the teacher's training on its critical path) and amortised;
  charged, it cannot win (its teacher is a baseline run that reached the target)."""
  study = _taught()
  if not study["points"]:
    return paragraph(f"None of its {len(study['waiting'])} points has a reported seed yet "
                     f"({', '.join(study['waiting'])}): `make sweep-pydocs-kd` runs them.")
  for p in study["points"]:
    for r in report.matched(study["grid"], p["curve"], "eth10g"):
      if r["ahead"] or r["time"] is not None and r["time_range"][0] > 1:
        raise Contradicted(f"kd_study: {p['curve']} {r['point']} beats the strongest baseline "
                           "charged")
  teacher = {(r["curve"], r["point"]): r["teacher_s"]["eth10g"] for r in study["runs"]}
  return (paragraph(
      "Its reported points (median [min, max] over the seeds named; steps and times to "
      "perplexity 12, or the whole budget where a seed missed; each taught step priced as "
      "the full grid's untaught step of the same point times their XLA FLOPs, the teacher's "
      "forward included; the ratios against the full grid's strongest-baseline frontier at "
      "each point's own budget, above 1x the point is better; amortised: the what-if that "
      "does not charge the teacher's training):") + "\n\n"
      + _charged_table(study, "final perplexity", "{:.2f}",
                       "teacher's training, 10 GbE (s)",
                       lambda p: teacher[(p["curve"], p["point"])]))


def _calibrated(sub: str) -> dict:
  """A grid's calibrated device steps: `main` prices every point of the full-size model,
  `small` every point of the small model's curves, `unused` lists those that price none."""
  results = os.path.join(RESULTS, sub)
  rows = report.calibrations(results, os.path.join(results, "calibration"))
  used = sorted((r for r in rows if r["runs"]), key=lambda r: -r["params"])
  small = sum("small" in p["curve"] for p in grid(sub))
  if len(used) != 2 or [r["points"] for r in used] != [len(grid(sub)) - small, small]:
    raise Contradicted(f"{sub}: its points are no longer priced at one step per model")
  return {"main": used[0], "small": used[1], "unused": [r for r in rows if not r["runs"]]}


@template(COST_VS_TIME, "fashion_grid_intro")
def fashion_grid_intro() -> str:
  """The Fashion-MNIST grid's size and the device steps that price it."""
  sub = "fashion_mnist"
  cal = _calibrated(sub)
  return paragraph(
      f"{len(grid(sub))} points, tuned on seed {grid_seeds(sub)['tuning']} (table 5 counts the "
      f"runs), all under `experiments/results/{sub}/`. The device step comes from the "
      "calibration, timed quietly on one 2-core machine, one simulated device: "
      f"{cal['main']['device_step_s']:.3f} s for the ResNet at "
      f"{cal['main']['per_device_batch']} examples (every data-parallel, ensemble and DiLoCo "
      f"point runs this one program) and {cal['small']['device_step_s']:.3f} s for the small "
      "model ([which calibration run prices which "
      "results](#which-calibration-prices-which-results)).")


def _point_runs(sub: str, curve: str, name: str) -> list[dict]:
  """A grid point's results.json, seed by seed (the tuning seed's among them)."""
  return _results(f"{sub}/{curve}/{name}/seed*/results.json")


def _budget(run: dict) -> float:
  """A run's whole budget in examples (windows): its steps at the whole schedule's length."""
  return run["step_budget"] / run["config"]["train"].get("schedule_fraction", 1.0) * run[
      "examples_per_step"]


@template(COST_VS_TIME, "pydocs_grid_intro")
def pydocs_grid_intro() -> str:
  """The Python docs grid's size, batch and budget, the device steps that price it, and the
  attention benchmark the calibration predates."""
  sub = "pydocs_gpt2"
  cal, pts = _calibrated(sub), list(grid(sub))
  runs = {(p["curve"], p["point"]): _point_runs(sub, p["curve"], p["point"]) for p in pts}
  short = [(rs[0]["step_budget"], p["devices"]) for p, rs in zip(pts, runs.values())
           if p["curve"] == "dp_short_schedule"]
  budgets = {round(_budget(r)) for (c, _), rs in runs.items() if c != "dp_short_schedule"
             for r in rs}
  small = {c for c, n in runs if device_step(sub, c, n) == cal["small"]["device_step_s"]}
  [context] = {r["config"]["data"]["context"] for rs in runs.values() for r in rs}
  [size] = {r["config"]["model"]["size"] for (c, _), rs in runs.items() if c in small for r in rs}
  with open(os.path.join(RESULTS, "bench", "vs_torch_docs_sizes.json")) as f:
    [bench] = [b for b in json.load(f) if b["size"] == "tiny"]
  faster = bench["median_wall_s"]["jax_before"] / bench["median_wall_s"]["jax"]
  [devices] = {d for _, d in short}
  seeds = grid_seeds(sub)
  if (len(budgets) != 1 or small != {"dp_small_model", "ensemble_tfidf_routed_small"}
      or faster <= 1):
    raise Contradicted("pydocs_grid_intro: the grid's budget, models or calibrations moved")
  [budget] = budgets
  unused = sorted(r["device_step_s"] for r in cal["unused"])[::-1]
  also = (f", and the earlier {listing([f'{v:.4f} s' for v in unused])} timings that price "
          "none" if unused else "")
  return paragraph(
      f"{len(pts)} points, tuned on seed {grid_seeds(sub)['tuning']} (table 5 counts the runs), "
      f"all under `experiments/results/{sub}/`. "
      f"{cal['main']['per_device_batch']} windows of {context} bytes per device or worker; "
      f"every point's budget is {budget:,} windows (the short schedules: "
      f"{span([b for b, _ in short], str)} steps at D = {devices}). The device step comes "
      "from the calibration, timed quietly on one simulated device: "
      f"{cal['main']['device_step_s']:.4f} s for GPT-2 tiny at "
      f"{cal['main']['per_device_batch']} windows (every data-parallel, ensemble and DiLoCo "
      f"point), {cal['small']['device_step_s']:.4f} s for the small model (`dp_small_model` "
      f"and `ensemble_tfidf_routed_small`: GPT-2 `{size}`, {cal['small']['params']:,} "
      f"params) (the calibration runs each prices{also}: "
      "[the table below](#which-calibration-prices-which-results)). A calibration times the "
      "programs of the code that runs it, so every point is priced at one program's speed "
      "whatever code trained it: GPT-2's blocked causal attention on CPU, which some runs "
      f"predate (the same arithmetic), makes GPT-2 tiny's step {x(faster)} faster at "
      f"{bench['batch']} x {bench['context']} ([benchmarks](../benchmarks.md)). Every "
      "point's learning rate and schedule length were chosen on two tuning seeds "
      f"({listed([seeds['tuning'], *seeds['schedule']])}, never reported); the tables hold "
      f"seeds {listed(seeds['reported'])} at those choices.")


@template(COST_VS_TIME, "dp_d8_whole_schedule")
def dp_d8_whole_schedule() -> str:
  """Data-parallel D = 8 at its chosen schedule, at its former (superseded) shorter one, and
  at its whole schedule (the sensitivity runs, priced at the grid's calibrated step)."""
  sub, (curve, name) = "fashion_mnist", SYNC_D8
  d8 = point(sub, curve, name)
  tuned, former, seeds = _tuning_schedule(sub, curve, name), _former_d8(sub), grid_seeds(sub)
  step = device_step(sub, curve, name)
  runs = _results(SENSITIVITY + "/seed*/results.json")
  steps = [r["cost"]["measured"]["steps_to_target"] for r in runs]
  old = {r["cost"]["modelled"]["device_step_time_s"] for r in runs}
  recorded = [r["cost"]["modelled"]["critical_path_s"]["nvlink"] for r in runs]
  # the same runs at the grid's step: their steps re-priced, their collectives as recorded
  repriced = [t + n * (step - r["cost"]["modelled"]["device_step_time_s"])
              for t, n, r in zip(recorded, steps, runs)]
  small, mine = strongest(sub, "nvlink"), d8["time_s"]["nvlink"]
  if d8["reached"] < d8["seeds"]:
    raise Contradicted("dp_d8_whole_schedule: data_parallel D8 missed the target on a seed")
  if (not small["curve"].startswith("dp_small_model")
      or mine["min"] <= small["time_s"]["nvlink"]["max"]
      or min(repriced) <= small["time_s"]["nvlink"]["max"]
      or not d8["steps"]["min"] <= min(steps) <= max(steps) <= d8["steps"]["max"]):
    raise Contradicted("dp_d8_whole_schedule: D = 8 is as fast as the fastest baseline on a "
                       "seed, or its whole schedule left its chosen one's spread")
  fast, finals = small["time_s"]["nvlink"], [r["final"]["accuracy"] for r in former["dropped"]]
  return paragraph(
      "Every point's learning rate and schedule length were chosen on two tuning seeds ("
      f"{listed([seeds['tuning'], *seeds['schedule']])}, never reported) and the tables hold "
      f"seeds {listed(seeds['reported'])} at those choices; runs at earlier choices are kept "
      f"under each point's `superseded/`. Data-parallel at D = 8 with synchronised "
      f"BatchNorm (`{curve}`) chose a {tuned['length']}-"
      f"length schedule (it reached the target at {tuned['steps']} on the tuning seeds) and "
      f"reaches 85% within it on seeds {listed(d8['seed_list'])} in "
      f"{d8['steps']['median']:g} steps ({d8['steps']['min']:g}-{d8['steps']['max']:g}): "
      f"{s(mine['median'])} on nvlink ({mine['min']:.1f}-{s(mine['max'])} over the seeds), "
      f"slower on every seed than the fastest baseline, the small model at "
      f"D = {small['devices']}{_bn(small['curve'])} ({s(fast['median'])}, "
      f"{fast['min']:.1f}-{s(fast['max'])}). A "
      f"{LENGTHS[former['fraction']]}-length schedule (its runs under superseded/) reached "
      f"the target at "
      f"steps {former['steps']} on the tuning seeds and missed it on seeds "
      f"{listed([r['config']['seed'] for r in former['dropped']])} (final "
      f"{', '.join(f'{v:.3f}' for v in finals)}); both tuning seeds "
      f"reached it after {former['margin']:.0%} of its steps, which the rule counts as a miss "
      "(a length is chosen only if every tuning seed reaches the target within that share "
      "of it). At its whole "
      f"schedule D = 8 reaches 85% on seeds {min(r['config']['seed'] for r in runs)}-"
      f"{max(r['config']['seed'] for r in runs)} in {span(steps, str)} steps, inside the "
      f"chosen schedule's spread: {span(repriced, lambda v: f'{v:.1f}')} s on nvlink at the "
      f"grid's calibrated {step:.3f} s step ({span(recorded, lambda v: f'{v:.1f}')} s as the "
      f"sensitivity runs record them, at their older "
      f"{'/'.join(f'{v:.3f}' for v in sorted(old))} s calibration), slower than the small "
      "model too: neither length that reaches the target puts D = 8 on the frontier in time "
      "([sensitivity runs](../../experiments/results/sensitivity/dp_D8_whole_schedule/"
      "README.md)).")


def _baselines(rows: list[tuple[str, dict]], kind: str) -> set[str]:
  """The baseline points the matched rows compare in `kind` ('dp_small_model D8')."""
  return {m[kind][1] for _, m in rows if m[kind]}


def _devices(points: set[str]) -> str:
  """'D = 1, 4 and 8' for baseline points named 'curve D1' ..."""
  return "D = " + listing([str(d) for d in sorted(int(p.split()[1][1:]) for p in points)])


def _tuning_flops(sub: str) -> dict[str, float]:
  """Per curve: its tuning compute (table 5)."""
  return {c: sum(p["tuning"]["flops"] for p in grid(sub) if p["curve"] == c)
          for c in sorted({p["curve"] for p in grid(sub)})}


def _tuning_factors(sub: str) -> list[float]:
  """Per curve: its tuning compute over its costliest point's run."""
  return [f / max(p["flops"]["median"] for p in grid(sub) if p["curve"] == c)
          for c, f in _tuning_flops(sub).items()]


def _medians(points) -> str:
  """'192, 183 and 143': the points' median steps."""
  return listing([f"{p['steps']['median']:g}" for p in points])


def _from_n(faster: dict[int, bool]) -> int:
  """The fewest workers N from which every larger N is faster."""
  return min(n for n in faster if all(faster[m] for m in faster if m >= n))


def _baseline_front(sub: str, preset: str) -> list[str]:
  """The baselines' Pareto frontier in time and compute on `preset`: its points' names
  ('dp_small_model D8'), fastest first."""
  pts, front, cheapest = list(grid(sub)), [], math.inf
  for _, flops, name in sorted(report._reached(pts, report.baseline_curves(pts), preset)):
    if flops < cheapest:
      front.append(name)
      cheapest = flops
  return front


@template(COST_VS_TIME, "fashion_readings")
def fashion_readings() -> str:
  """The Fashion-MNIST grid's reading: no method point wins, the frontier is the small
  model, the ensemble's steps against data-parallel's, routing's, DiLoCo's and tuning's."""
  sub, preset = "fashion_mnist", "ib_xdr800"
  rows = matched_rows(sub, preset)
  curve, close = max(((c, m) for c, m in rows if m["time"]), key=lambda cm: cm[1]["time"][0])
  cheap_curve, cheap = max(((c, m) for c, m in rows if m["compute"]),
                           key=lambda cm: cm[1]["compute"][0])
  # the closest in compute: every point whose ratio prints alike to two decimals
  ties = sorted((m for c, m in rows
                 if m["compute"] and x(m["compute"][0]) == x(cheap["compute"][0])),
                key=lambda m: -m["compute"][0])
  [eth] = [m for c, m in matched_rows(sub, "eth10g") if (c, m["point"]) == (curve, close["point"])]
  base = strongest(sub, preset)
  fronts = {p: _baseline_front(sub, p) for p in report.PRESETS}
  dp = {d: point(sub, "data_parallel", f"D{d}") for d in (1, 2, 4, 8)}
  dp8, fast = dp[8]["time_s"][preset], base["time_s"][preset]
  streams = {n: _workers(sub, "ensemble", n) for n in (2, 4, 8)}
  gaps = [streams[n]["steps"]["median"] / dp[n]["steps"]["median"] for n in streams]
  routed = {c: {n: _workers(sub, c, n) for n in streams}
            for c in ("ensemble_pca_routed", SMALL_ROUTED)}
  faster = {n: all(r[n]["steps"]["median"] < streams[n]["steps"]["median"] for r in routed.values())
            for n in streams}
  builds = [statistics.median(r["pool_build_s"] for r in _reported_runs(sub, c, "N8_L235"))
            for c in routed]
  diloco = [p for p in grid(sub) if p["curve"] == "diloco"]
  reached = [p for p in diloco if p["reached"] == p["seeds"]]
  missed = [p for p in diloco if p["reached"] < p["seeds"]]
  lost = [r for p in missed for r in _reported_runs(sub, "diloco", p["point"]) if not r["reached"]]
  tuned, factors = _tuning_flops(sub), _tuning_factors(sub)
  one_device()  # one model first on the H200 too
  steps = [dp[d]["steps"]["median"] for d in sorted(dp)]
  level = at_or_above_one(sub)
  if (any(not within(r[2]) for r in level)
      or curve != SMALL_ROUTED or cheap_curve != curve
      or len({_family_point(m["time"][1]) for m in (eth, close)}) != 1
      or any(m not in [r for c, r in rows if c == curve] for m in ties)
      or len({m["compute"][1] for m in ties}) != 1
      or {_family(close["time"][1].split()[0]), _family(cheap["compute"][1].split()[0])}
      != {_family(base["curve"])}):
    raise Contradicted("fashion_readings: a method point's ratio reached 1x, or the closest "
                       "points or their baselines moved")
  if (fronts[preset][0] != f"{base['curve']} {base['point']}"
      or {_family(n.split()[0]) for f in fronts.values() for n in f} != {_family(base["curve"])}
      or len({frozenset(n.split()[1] for n in f) for f in fronts.values()}) != 1
      or dp[8]["reached"] < dp[8]["seeds"] or sorted(steps, reverse=True) != steps
      or len(set(steps)) != len(steps) or dp8["min"] <= fast["max"]):
    raise Contradicted("fashion_readings: the baselines' frontier or data-parallel's points "
                       "moved")
  if (any(p["reached"] < p["seeds"] for p in streams.values())
      or min(gaps) <= 1 or len(missed) != 1 or len(lost) != 1 or min(factors) <= 1
      or tuned["ensemble"] <= tuned["data_parallel"]):
    raise Contradicted("fashion_readings: the ensemble's, DiLoCo's or tuning's points moved")
  at = lambda m, k: _baseline_name(sub, m[k][1])
  return "\n".join((
      bullet("**No method point beats the strongest baseline at its own budget, on any "
             "preset** (table 2: every ratio is below 1x"
             + ("" if not level else ", but " + listing([
                 f"{_ranged((r[1], r[2]), f' in {r[0]}')} for the {CURVE_NAMES[r[3]]} at "
                 f"N = {_n(r[4])} on {PRESET_NAMES[r[5]]}" for r in level])
                + ", where the seeds span 1x: level, not a win")
             + "). Closest in time are the "
             f"small-model routed experts at N = {_n(close['point'])} (`{curve}`: experts of "
             "the width-4 ResNet, each on its k-means cluster of PCA'd pixels): "
             f"{point(sub, curve, close['point'])['steps']['median']:g} steps, "
             f"{_ranged((close['time'][0], close['time_range']), ' in time')} against "
             f"{at(close, 'time')} on {preset}, "
             f"{_ranged((eth['time'][0], eth['time_range']), ' on 10 GbE')} against "
             f"{at(eth, 'time')}. Closest in "
             "compute are the same experts, "
             + listing([f"{_ranged((m['compute'][0], m['compute_range']))} at "
                        f"N = {_n(m['point'])} "
                        f"({point(sub, curve, m['point'])['steps']['median']:g} steps)"
                        for m in ties])
             + f", in compute against {at(cheap, 'compute')}."),
      bullet(f"The frontier is the small ResNet (`{_family(base['curve'])}`) at every budget, "
             f"on every preset: {_devices(set(fronts[preset]))}, with "
             f"{_bn_by_preset(fronts)}, D = {base['devices']} the fastest "
             f"({base['steps']['median']:g} steps, {s(fast['median'])} on {preset}). "
             "Data-parallel with the full model takes fewer steps at every D "
             f"({_medians(dp.values())} at D = 1, 2, 4, 8); at D = 8 its chosen "
             f"{_tuning_schedule(sub, 'data_parallel', 'D8')['length']}-length schedule "
             f"reaches the target in every reported seed (above), in {s(dp8['median'])} on "
             f"{preset} ({dp8['min']:.1f}-{s(dp8['max'])}), slower on every seed than the small "
             f"model at D = {base['devices']} ({fast['min']:.1f}-{s(fast['max'])})."),
      bullet("The random-stream ensemble reaches 85% at every N, in "
             f"{_medians(streams.values())} steps at N = 2, 4, 8: each worker trains longer than "
             f"data-parallel at D = N, {listing([f'{g:.1f}x' for g in gaps])} its steps."),
      bullet(f"Routing helps the steps from N = {_from_n(faster)}: PCA-routed experts take "
             f"{_medians(routed['ensemble_pca_routed'].values())} steps at N = 2, 4, 8, the "
             f"small-model experts {_medians(routed[SMALL_ROUTED].values())}. The pool's build "
             f"({span(builds, lambda v: f'{v:.1f}')} s at N = 8, the median of the reported "
             "seeds, timed by the current build code on a quiet machine) is on their critical "
             "path."),
      bullet(f"DiLoCo (N = {missed[0]['devices']}) reaches 85% at "
             f"H = {listing([p['point'][1:] for p in reached])} in every seed "
             f"({_medians(reached)} steps); at "
             f"H = {missed[0]['point'][1:]} {WORDS[len(lost)]} seed of "
             f"{WORDS[missed[0]['seeds']]} "
             f"misses it within the budget (final {lost[0]['final']:.4f} at step "
             f"{lost[0]['steps']})."),
      bullet(f"Tuning a curve costs more than its costliest point's run "
             f"({span(factors, lambda v: f'{v:.1f}x')}; table 5), the ensemble's more "
             "than data-parallel's, since every tuning run trains N workers."),
      bullet("The claim under test (about 4x less time at fixed compute, about 3x less "
             "compute at fixed time) is not reproduced here. Where data-parallel stops scaling "
             "is the question of [regime.md](regime.md); on one real GPU one model reaches the "
             "target first as well ([one_device.md](one_device.md)).")))


@template(COST_VS_TIME, "fashion_schedule_intro")
def fashion_schedule_intro() -> str:
  """Why the schedule's length is tuned: the budget rule's schedules, and the fractions and
  seeds it is tuned at."""
  sub = "fashion_mnist"
  whole = {d: {r["value"]: r for r in schedule_axis(sub, "data_parallel", f"D{d}")["runs"]}[1.0]
           for d in (1, 8)}
  fractions = sorted({r["value"] for (c, n), record in _tunings(sub).items()
                      if _tunes_schedule(record) for r in schedule_axis(sub, c, n)["runs"]},
                     reverse=True)
  seeds = grid_seeds(sub)
  if whole[1]["step_budget"] <= whole[8]["step_budget"]:
    raise Contradicted("fashion_schedule_intro: D = 8's schedule is no longer the shorter")
  return paragraph(
      f"The budget rule gives data-parallel at D = 1 a {whole[1]['step_budget']:,}-step cosine "
      f"schedule and at D = 8 a {whole[8]['step_budget']:,}-step one, and a shorter schedule "
      "decays sooner. So each point's schedule length was tuned after its rates, at "
      f"{listing([as_fraction(f) for f in fractions])} of its budget "
      f"(`train.schedule_fraction`, tuning seeds "
      f"{listed([seeds['tuning'], *seeds['schedule']])}, stopping runs that could no longer "
      "be chosen). The table holds those tuning runs and, beside them, the other seeds' runs "
      "over the whole budget (`python -m ensemble_jax.report "
      f"experiments/results/{sub}` writes it at the end of `table.md`):")


def _tuned_steps(sub: str, curve: str, name: str, fraction: float) -> list[int | None]:
  """A point's tuning runs at one schedule fraction, seed by seed: steps to target (None:
  missed)."""
  [run] = [r for r in schedule_axis(sub, curve, name)["runs"] if r["value"] == fraction]
  return [r["steps_to_target"] if r["reached"] else None for r in rerun_plan._seeds(run)]


def _whole_budget(sub: str, curve: str, name: str) -> list[int | None]:
  """A point's whole-budget runs on the seeds it did not tune on (None: missed)."""
  return report._whole_budget_seeds(os.path.join(RESULTS, sub, curve, name),
                                    tuning(sub, curve, name)["seed"])


def _gained(sub: str, curve: str, name: str) -> tuple[list[int], list[int]]:
  """A point whose shorter schedule beats every whole-budget seed on both tuning seeds: the
  tuning seeds' steps at its chosen length and the whole-budget seeds'."""
  chosen = schedule_axis(sub, curve, name)["chosen"]
  tuned, whole = _tuned_steps(sub, curve, name, chosen), _whole_budget(sub, curve, name)
  if chosen == 1 or None in tuned + whole or max(tuned) >= min(whole):
    raise Contradicted(f"fashion_schedule_readings: {curve} {name}'s shorter schedule no "
                       "longer beats its whole budget")
  return tuned, whole


def _former_d8(sub: str) -> dict:
  """Data-parallel D = 8's former (superseded) schedule length: the fraction, its tuning
  runs on the two tuning seeds, and its runs on the reported seeds. Raises `Contradicted`
  unless both tuning seeds reached the target only after the margin's share of it and every
  reported seed missed it."""
  curve, name = SYNC_D8
  axis, seeds = schedule_axis(sub, curve, name), grid_seeds(sub)
  superseded = [r for r in _results(f"{sub}/{curve}/{name}/superseded/seed*/results.json")
                if r["config"]["seed"] in seeds["reported"]]
  fraction = lambda r: r["config"]["train"].get("schedule_fraction", 1.0)
  [former] = {fraction(r) for r in superseded} - {1.0, axis["chosen"]} or [None]
  dropped = sorted((r for r in superseded if fraction(r) == former),
                   key=lambda r: r["config"]["seed"])
  late = sorted((r for r in _results(f"{sub}/{curve}/{name}/tune/*/results.json")
                 if fraction(r) == former
                 and r["config"]["seed"] in (seeds["tuning"], *seeds["schedule"])),
                key=lambda r: r["config"]["seed"])
  if (former is None or not dropped or any(r["target"]["reached"] for r in dropped)
      or len(late) < 2 or not all(r["target"]["reached"] and r["cost"]["measured"][
          "steps_to_target"] > axis["margin"] * r["step_budget"] for r in late)):
    raise Contradicted(f"{curve} D8's former schedule no longer missed on the reported "
                       "seeds, or no longer reached only late on the tuning seeds")
  return {"fraction": former, "late": late, "dropped": dropped, "margin": axis["margin"],
          "steps": listing([str(r["cost"]["measured"]["steps_to_target"]) for r in late])
                   + f" of {late[0]['step_budget']}"}


@template(COST_VS_TIME, "fashion_schedule_readings")
def fashion_schedule_readings() -> str:
  """What tuning the schedule's length moved: the small model's points beyond the spread,
  data-parallel D = 8's within it, the second tuning seed's and the margin's catches, and
  the method points it shortened."""
  sub = "fashion_mnist"
  # The synchronised-BatchNorm curves, whose schedules it moved
  small_curve = "dp_small_model_sync_bn"
  small = [_gained(sub, small_curve, f"D{d}") for d in (4, 8)]
  halves = {schedule_axis(sub, small_curve, f"D{d}")["chosen"] for d in (4, 8)}
  d8 = point(sub, *SYNC_D8)
  d8_chosen = schedule_axis(sub, *SYNC_D8)["chosen"]
  d8_tuned = _tuned_steps(sub, *SYNC_D8, d8_chosen)
  d8_whole = _whole_budget(sub, *SYNC_D8)
  former = _former_d8(sub)
  experts = (SMALL_ROUTED, "N4_L469")
  alone = {f: _tuned_steps(sub, *experts, f)[0] for f in (1.0, 0.5, 0.25)}
  [first] = {f for f, v in alone.items() if v == min(v for v in alone.values() if v)}
  [first_run] = [r for r in schedule_axis(sub, *experts)["runs"] if r["value"] == first]
  kept = point(sub, *experts)
  dropped = [r for r in _results(f"{sub}/{experts[0]}/{experts[1]}/superseded/seed*/results.json")
             if r["config"]["train"].get("schedule_fraction") == first
             and r["config"]["seed"] in kept["seed_list"]]
  chosen = schedule_axis(sub, *experts)["chosen"]
  baselines = set(report.baseline_curves(list(grid(sub))))
  shorter = {}
  for (curve, name), record in _tunings(sub).items():
    if (curve not in baselines and _tunes_schedule(record)
        and schedule_axis(sub, curve, name)["chosen"] < 1):
      shorter.setdefault(curve, []).append(_n(name))
  if (d8_chosen == 1 or None in d8_tuned + d8_whole or d8["reached"] < d8["seeds"]
      or min(d8_tuned + [d8["steps"]["min"]]) > max(d8_whole)
      or max(d8_tuned + [d8["steps"]["max"]]) < min(d8_whole)):
    raise Contradicted("fashion_schedule_readings: data_parallel_sync_bn D8's shorter "
                       "schedule left its whole budget's spread, or missed")
  if (len(halves) != 1 or grid_seeds(sub)["fixed"] != {"dp_short_schedule"} or first == chosen
      or None not in _tuned_steps(sub, *experts, first) or not dropped
      or alone[first] > former["margin"] * first_run["step_budget"]
      or any(r["target"]["reached"] for r in dropped) or kept["reached"] < kept["seeds"]
      or any(best_matched(sub, k)[1][0] > 1 for k in ("time", "compute"))):
    raise Contradicted("fashion_schedule_readings: a schedule's choice or outcome moved")
  level = [(k, b) for k in ("time", "compute") if (b := best_matched(sub, k))[1][1] >= 1]
  return "\n".join((
      bullet("It moves the small model's points with synchronised BatchNorm beyond the seeds' "
             "spread: at D = 4 and 8 it "
             f"gains on a {LENGTHS[schedule_axis(sub, small_curve, 'D4')['chosen']]}-"
             f"length schedule ({listing([span(t, str) for t, _ in small])} steps on the "
             f"tuning seeds, against {listing([span(w, str) for _, w in small])} over the "
             f"whole budget). Data-parallel at D = 8 with synchronised BatchNorm runs a "
             f"{LENGTHS[d8_chosen]}-length one "
             f"too ({listing([str(v) for v in d8_tuned])} steps on the tuning seeds, "
             f"{d8['steps']['min']:g}-{d8['steps']['max']:g} on seeds "
             f"{d8['seed_list'][0]}-{d8['seed_list'][-1]}), within the spread of its whole "
             f"budget ({span(d8_whole, str)} steps). So every curve but the fixed short schedules "
             "(`dp_short_schedule`, whose points are schedule lengths) tunes it "
             "(`tuned_schedule` in `experiments/configs/__init__.py`)."),
      bullet("Two tuning seeds guard the choice: a length that misses on either loses. On "
             f"seed {tuning(sub, *experts)['seed']} alone the small-model routed experts at "
             f"N = {_n(experts[1])} would have chosen a {LENGTHS[first]}-length schedule "
             f"({alone[first]} steps) that missed on seeds "
             f"{listing([str(r['config']['seed']) for r in dropped])} (`superseded/`); the "
             f"second tuning seed missed it too, and the {LENGTHS[chosen]}-length schedule "
             "they run reaches the target in every reported seed "
             f"({kept['steps']['median']:g} steps, the median). Two seeds did not catch "
             f"data-parallel D = 8's (synchronised BatchNorm) former "
             f"{LENGTHS[former['fraction']]}-length schedule: it "
             f"reached the target at steps {former['steps']} on both tuning seeds and missed "
             f"on seeds {listed([r['config']['seed'] for r in former['dropped']])} "
             "(`superseded/`). The margin catches it: a length counts only where every tuning "
             f"seed reaches the target within {former['margin']:.0%} of its steps. Two seeds "
             "narrow the winner's curse; the margin narrows it further."),
      bullet("Method points gain too ("
             + ", ".join(f"{CURVE_NAMES.get(c, c)} at N = {listing(ns)}"
                         for c, ns in shorter.items())
             + ("), but none enough to reach the frontier." if not level else
                "): " + listing([f"the {CURVE_NAMES[b[2]]} at N = {_n(b[3])} come level with "
                                 f"the frontier in {k} on {PRESET_NAMES[b[4]]} (within the seeds' "
                                 "spread)" for k, b in level])
                + ", none past it."))))


def _against_data_parallel(sub: str, curve: str) -> dict:
  """`curve` against data-parallel training of the full-size model alone, best over its
  budgets (`report.ratios`), per preset."""
  return {preset: report.ratios(list(grid(sub)), curve, preset, baselines=["data_parallel"])
          for preset in report.PRESETS}


@template(COST_VS_TIME, "pydocs_readings")
def pydocs_readings() -> str:
  """The Python docs grid's reading: no method point wins against the small model, the
  ensemble against data-parallel alone, the knee inside the grid, routing, DiLoCo, tuning."""
  sub, preset = "pydocs_gpt2", "ib_xdr800"
  pts, rows = list(grid(sub)), matched_rows(sub, preset)
  curve, close = max(((c, m) for c, m in rows if m["time"]), key=lambda cm: cm[1]["time"][0])
  base = strongest(sub, preset)
  cheapest = min((p for p in pts if p["curve"] in report.baseline_curves(pts)
                  and p["reached"] == p["seeds"]), key=lambda p: p["flops"]["median"])
  builds = {c: statistics.median(r["pool_build_s"] for r in _reported_runs(sub, c, "N2_L1200"))
            for c in (curve, "ensemble_tfidf_routed")}
  ens = _against_data_parallel(sub, "ensemble")
  experts = _against_data_parallel(sub, curve)
  small = _against_data_parallel(sub, "dp_small_model")
  dp = {d: point(sub, "data_parallel", f"D{d}") for d in (2, 4, 8)}
  small_dp = {d: point(sub, "dp_small_model", f"D{d}") for d in (4, 8)}
  streams = {n: _workers(sub, "ensemble", n) for n in (2, 4, 8)}
  routed = {n: _workers(sub, "ensemble_tfidf_routed", n) for n in (2, 4)}
  eights = [p for p in pts if p["point"].startswith("N8_")]
  [length] = {int(p["point"].split("_L")[1]) for p in eights}
  diloco = [p for p in pts if p["curve"] == "diloco"]
  shorts = [p for p in pts if p["curve"] == "dp_short_schedule"]
  short_runs = [r for p in shorts for a in tuning(sub, p["curve"], p["point"])["axes"]
                for r in a["runs"]]
  per_device = _calibrated(sub)["main"]["per_device_batch"]
  if (any(best_matched(sub, k)[1][0] > 1 for k in ("time", "compute"))
      or {b.split()[0] for k in ("time", "compute") for b in _baselines(rows, k)}
      != {"dp_small_model"}
      or base["curve"] != "dp_small_model" or cheapest["curve"] != "dp_small_model"
      or curve != "ensemble_tfidf_routed_small" or close["point"] != "N2_L1200"
      or min(r[k][0] for r in experts.values()
             for k in ("time_at_fixed_compute", "compute_at_fixed_time")) <= 1
      or min(r["time_range"][0] for r in experts.values()) <= 1
      or min(r["time_at_fixed_compute"][0] for r in small.values()) <= 1
      or not 0.9 < dp[8]["steps"]["median"] / dp[4]["steps"]["median"] < 1
      or small_dp[8]["steps"]["median"] < small_dp[4]["steps"]["median"]
      or any(streams[n]["steps"]["median"] < dp[n]["steps"]["median"] for n in (2, 4))
      or any(p["reached"] for p in eights)
      or any(not 0.9 <= routed[n]["steps"]["median"] / streams[n]["steps"]["median"] <= 1.1
             or routed[n]["time_s"][preset]["median"] <= streams[n]["time_s"][preset]["median"]
             for n in routed)
      or [p["point"] for p in diloco if p["reached"] == p["seeds"]] != ["H10", "H50"]
      or any(p["reached"] for p in diloco if p["point"] not in ("H10", "H50"))
      or any(p["reached"] for p in shorts) or any(r["reached"] for r in short_runs)
      or min(_tuning_factors(sub)) <= 1):
    raise Contradicted("pydocs_readings: the grid's points moved")
  best = lambda kind, presets: x(max(ens[p][kind][0] for p in presets))
  return "\n".join((
      bullet("**No method point beats the strongest baseline at its own budget, on any "
             "preset** (table 2). Every matched ratio is against the small GPT-2 "
             "(`dp_small_model`), the fastest and the cheapest baseline. The closest is the "
             f"small-model tf-idf-routed experts at N = {_n(close['point'])} (`{curve}`: "
             "experts of that small GPT-2, each on its tf-idf cluster): "
             f"{point(sub, curve, close['point'])['steps']['median']:g} steps, "
             f"{x(close['time'][0])} in time and {x(close['compute'][0])} in compute against "
             f"the small model on one device, its pool build ({s(builds[curve])}, the median "
             "of the reported seeds, timed by the current build code on a quiet machine) on "
             "the critical path."),
      bullet("Against data-parallel training of the same model alone, the ensemble's best "
             f"ratios are {best('time_at_fixed_compute', ['nvlink', preset])} in time at fixed "
             f"compute ({best('time_at_fixed_compute', ['eth10g'])} on 10 GbE) and "
             f"{best('compute_at_fixed_time', report.PRESETS)} in compute at fixed time; the "
             "small-model routed experts beat it ("
             f"{span([r['time_at_fixed_compute'][0] for r in experts.values()])} in time, "
             f"{span([r['compute_at_fixed_time'][0] for r in experts.values()])} in "
             "compute), as the small model alone does."),
      bullet("**This workload's critical batch lies inside the grid**: from D = 4 to 8 "
             f"({4 * per_device} to {8 * per_device} windows a step) data-parallel's steps "
             f"barely fall ({_medians([dp[4], dp[8]])}) and the small model's do not "
             f"({_medians([small_dp[4], small_dp[8]])}). That is the regime the claim needs, and "
             "the ensemble still does not win in it: each worker needs as many steps as one "
             f"data-parallel model or more, and N = 8 x {length} steps misses the target in "
             "every seed."),
      bullet("The tf-idf-routed experts (c-BTM's distilled sequences; every position routed "
             "on its own prefix) take about as many steps as random streams at N = 2 and 4 "
             f"({_medians(routed.values())} against {_medians([streams[2], streams[4]])}) and are "
             f"slower: the pool's build ({s(builds['ensemble_tfidf_routed'])} at N = 2, the "
             "median of the reported seeds) is on the critical path."),
      bullet(f"DiLoCo (N = {diloco[0]['devices']}) reaches the target at H = 10 and 50, not "
             "at H = "
             f"{listing([p['point'][1:] for p in diloco if p['point'] not in ('H10', 'H50')])}. "
             "The shorter full schedules miss at every rate."),
      bullet(f"Tuning costs {sum(p['tuning']['runs'] for p in pts)} runs; a curve's tuning "
             "costs more than its costliest point's run "
             f"({span(_tuning_factors(sub), lambda v: f'{v:.1f}x')}; table 5).")))


def _worst(steps: list[int | None]) -> float:
  """The slowest of a point's tuning seeds (a miss: slower than any)."""
  return math.inf if None in steps else max(steps)


@template(COST_VS_TIME, "pydocs_schedule_readings")
def pydocs_schedule_readings() -> str:
  """What tuning the schedule's length did on the docs: half-length wins within the spread
  at the small D and N, the whole budget kept beyond them."""
  sub = "pydocs_gpt2"
  baselines = report.baseline_curves(list(grid(sub)))
  axes = {(c, n): schedule_axis(sub, c, n) for (c, n), r in _tunings(sub).items()
          if _tunes_schedule(r)}
  shorter = [key for key, a in axes.items() if a["chosen"] < 1]
  gains = [1 - _worst(_tuned_steps(sub, *key, axes[key]["chosen"]))
           / _worst(_tuned_steps(sub, *key, 1.0)) for key in shorter]
  apart = [key for key in shorter if not (
      min(_whole_budget(sub, *key)) <= point(sub, *key)["steps"]["max"]
      and point(sub, *key)["steps"]["min"] <= max(_whole_budget(sub, *key)))]
  wide = [key for key in axes if point(sub, *key)["devices"] >= 4]
  slower = sorted({point(sub, *key)["devices"] for key in wide for f in (0.5, 0.25)
                   if None not in _tuned_steps(sub, *key, f)})
  frontier = _baselines(matched_rows(sub, "ib_xdr800"), "time") | _baselines(
      matched_rows(sub, "ib_xdr800"), "compute")
  if ({axes[key]["chosen"] for key in shorter} != {0.5} or apart or min(gains) < 0
      or any(axes[key]["chosen"] != 1 for key in wide)
      or any(None not in _tuned_steps(sub, *key, f)
             and _worst(_tuned_steps(sub, *key, f)) <= _worst(_tuned_steps(sub, *key, 1.0))
             for key in wide for f in (0.5, 0.25))
      or {b.split()[0] for b in frontier} != {"dp_small_model"}):
    raise Contradicted("pydocs_schedule_readings: a schedule's choice moved")
  names = {"data_parallel": "data-parallel", **CURVE_NAMES}
  by_curve = {}
  for curve, name in shorter:
    by_curve.setdefault(curve, []).append(
        point(sub, curve, name)["devices"] if curve in baselines else int(_n(name)))
  d1 = ("data_parallel", "D1")
  return bullet(
      "It moves no point beyond the seeds' spread. Half-length schedules win the choice for "
      + ", ".join(f"{names.get(c, c)} at {'D' if c in baselines else 'N'} = {listed(ns)}"
                  for c, ns in by_curve.items())
      + f", by {span(gains, lambda v: f'{100 * v:.0f}')}% on the tuning seeds, within the "
      "reported seeds' spread (data-parallel at D = 1: "
      f"{point(sub, *d1)['steps']['min']:g}-{point(sub, *d1)['steps']['max']:g} steps at half "
      f"length, {span(_whole_budget(sub, *d1), str)} over the whole budget). At D = 4 and 8 "
      "and at N >= 4 the shorter schedules miss on a tuning seed"
      + (f" or, at D = {listed(slower)}, take more steps" if slower else "")
      + ", so the whole budget stays. The frontier (the small model at "
      f"{_devices(frontier)}) and every method's best point keep their places.")


ETH = costs.INTERCONNECTS["eth10g"]


def _programs(sub: str, curve: str, name: str, program: str) -> list[list[dict]]:
  """A point's compiled collectives of one program (results.json `cost.modelled.collectives`),
  one list per reported seed."""
  seeds = point(sub, curve, name)["seed_list"]
  return [[c for c in r["cost"]["modelled"]["collectives"] if c["program"] == program]
          for r in _point_runs(sub, curve, name) if r["config"]["seed"] in seeds]


def _count(cs) -> int:
  """How many collectives run, each as often as it does."""
  return sum(c["count"] for c in cs)


def _at_least(cs, size: int) -> list[dict]:
  return [c for c in cs if c["bytes"] >= size]


def _bytes(cs) -> int:
  """The bytes they carry together."""
  return sum(c["bytes"] * c["count"] for c in cs)


def _eth_s(cs: list[dict], latency_only: bool = False) -> float:
  """Their time on 10 GbE, each as often as it runs (with no bytes: its latencies alone)."""
  return sum(c["count"] * (costs.collective_time(c["kind"], 0, c["group_size"], ETH)
                           if latency_only else c["seconds"]["eth10g"]) for c in cs)


def _shape(cs: list[dict]) -> list[tuple]:
  """What collectives communicate, whichever program holds them."""
  return [(c["kind"], c["bytes"], c["group_size"], c["count"]) for c in cs]


def _ms(values) -> str:
  return span([1e3 * v for v in values], lambda v: f"{v:.1f}") + " ms"


def _each(per_seed: list[list[dict]], value, fmt=str) -> str:
  """A value of each seed's collectives, spanned over the seeds."""
  return span([value(cs) for cs in per_seed], fmt)


@template(COST_VS_TIME, "compiled_collectives")
def compiled_collectives() -> str:
  """What each compiled program communicates, read from the runs' recorded collectives."""
  fashion, docs = "fashion_mnist", "pydocs_gpt2"
  dp = _programs(fashion, "data_parallel", "D8", "train_step")
  grads = [max(cs, key=lambda c: c["bytes"]) for cs in dp]
  rest = [[c for c in cs if c is not g] for cs, g in zip(dp, grads)]
  docs_dp = _programs(docs, "data_parallel", "D8", "train_step")
  ens = _programs(fashion, "ensemble", "N8_L235", "eval")
  ens_train = [c for n in ("train_step", "sync", "deployable")
               for cs in _programs(fashion, "ensemble", "N8_L235", n) for c in cs]
  docs_eval = _programs(docs, "ensemble", "N8_L300", "eval")
  final = _programs(docs, "ensemble", "N8_L300", "final_eval")
  docs_run = _point_runs(docs, "ensemble", "N8_L300")[0]
  windows = docs_run["config"]["eval"]["num_examples"]
  context = docs_run["config"]["data"]["context"]
  vocab = docs_run["data"]["vocab_size"]
  logits = windows * context * vocab * 4
  sync = _programs(fashion, "diloco", "H10", "sync")
  between = _programs(fashion, "diloco", "H10", "deployable")
  [weights] = {4 * r["num_params_per_worker"] for r in _point_runs(fashion, "diloco", "H10")}
  [groups] = {c["group_size"] for cs in dp + docs_dp + ens + docs_eval for c in cs}
  [examples] = {r["config"]["eval"]["num_examples"]
                for r in _point_runs(fashion, "ensemble", "N8_L235")}
  # Per-device BatchNorm (method.batchnorm): the step's one all-reduce; synchronised: the
  # gradients' and one per layer's statistics, latency-bound.
  per_device = {_count(cs) for cs in dp} == {1}
  if (any(c["kind"] != "all-reduce" for cs in dp for c in cs) or ens_train
      or (not per_device and any(_eth_s(cs, True) < 0.5 * _eth_s(cs) for cs in dp))
      or {_count(cs) for cs in docs_dp} != {1}
      or {max(c["bytes"] for c in cs) for cs in docs_eval} != {windows * context * 4}
      or any(min(c["bytes"] for c in _at_least(cs, logits)) != logits for cs in final)
      or [_shape(cs) for cs in sync] != [_shape(cs) for cs in between]
      or any(max(c["bytes"] for c in cs) != weights for cs in sync)):
    raise Contradicted("compiled_collectives: a program's collectives moved")
  differ = len({_count(cs) for cs in ens}) > 1
  step = device_step(fashion, "data_parallel", "D8")
  [batch] = {r["examples_per_step"] for r in _point_runs(fashion, "data_parallel", "D8")}
  intro = paragraph(
      "The collectives below are read from the optimized HLO of each compiled program, on "
      f"{groups} simulated devices (how they are priced: "
      "[methodology.md](../methodology.md#communication)).")
  dp_bullet = bullet(
      f"Fashion-MNIST's data-parallel step at D = 8 (ResNet-18 width 8, batch {batch}, "
      "per-device BatchNorm) holds one all-reduce: the gradients with the running BatchNorm "
      f"statistics and the loss, {_each(dp, _bytes, lambda v: f'{v:,}')} bytes, "
      f"{_ms([_eth_s(cs) for cs in dp])} a step on `eth10g` next to the calibrated "
      f"{step:.3f} s device step. Synchronised BatchNorm would add one small all-reduce "
      "per layer's statistics, forward and backward, each paying its latency "
      "([design.md](../design.md#batchnorm-across-devices)).") if per_device else bullet(
      f"Fashion-MNIST's data-parallel step at D = 8 (ResNet-18 width 8, batch {batch}) "
             f"holds {_each(dp, _count)} all-reduces: the gradients in one of "
             f"{_each(grads, lambda g: g['bytes'], lambda v: f'{v:,}')} bytes, and "
             f"{_each(rest, _count)} small ones (BatchNorm statistics and the loss, "
             f"{_each(rest, _bytes, lambda v: f'{v:,}')} "
             f"bytes together). On `eth10g` their {_each(dp, _count)} latencies alone cost "
             f"{_ms([_eth_s(cs, True) for cs in dp])} a step ({_ms([_eth_s(cs) for cs in dp])} "
             f"with the bytes), next to the calibrated {step:.3f} s device step; the gradient "
             f"all-reduce alone would cost {_ms([g['seconds']['eth10g'] for g in grads])}.")
  return intro + "\n\n" + "\n".join((
      dp_bullet,
      bullet("The docs' GPT-2 tiny uses LayerNorm, so no statistics cross devices: its step "
             "compiles to the one gradient all-reduce "
             f"({_each(docs_dp, lambda cs: cs[0]['bytes'], lambda v: f'{v:,}')} bytes, "
             f"{_ms([_eth_s(cs) for cs in docs_dp])} on `eth10g`)."),
      bullet("The ensemble (N = 8) communicates only when it evaluates: "
             f"{_each(ens, _count)} collectives per evaluation of {examples:,} images (the "
             "logits reduction and the per-worker metrics"
             + ("; the seeds' compiled programs record them differently" if differ else "")
             + f"), {_ms([_eth_s(cs) for cs in ens])} on `eth10g`."),
      bullet(f"The docs' ensemble (N = 8) evaluates {windows} windows of {context} tokens. Its "
             "evaluations reduce each worker's log-probability of every target token: "
             f"{_each(docs_eval, _count)} collectives per evaluation, the largest an "
             f"all-reduce of {windows * context * 4:,} bytes, "
             f"{_ms([_eth_s(cs) for cs in docs_eval])} on `eth10g`. Its full logits "
             f"({logits:,} bytes, the byte vocabulary's {vocab} per token) are reduced only "
             f"at the end, in {_each(final, lambda cs: WORDS[_count(_at_least(cs, logits))])} "
             "all-reduces of that size for the `logits` mode and the mixture's accuracy: "
             f"{span([_eth_s(cs) for cs in final], _two)} s on `eth10g`."),
      bullet(f"DiLoCo (N = {point(fashion, 'diloco', 'H10')['devices']}): "
             f"{_each(sync, _count)} all-reduces (the weights, {weights:,} bytes, and the "
             "re-estimated BatchNorm statistics) per outer step, and again per evaluation "
             f"between outer steps, {_ms([_eth_s(cs) for cs in sync])} on `eth10g`.")))


# ---- regime.md -----------------------------------------------------------------------------

@template(REGIME, "pydocs_many_workers_length")
def pydocs_many_workers_length() -> str:
  """Why the docs' many-worker grid trains L = 300, where N = 8 misses on every seed, and why
  a longer L cannot change the answer."""
  sub, preset = "pydocs_gpt2", "ib_xdr800"
  eights = [p for p in grid(sub) if p["point"].startswith("N8_")]
  if any(p["reached"] for p in eights):
    raise Contradicted("pydocs_many_workers_length: an N = 8 point reached the target")
  [length] = {int(p["point"].split("_L")[1]) for p in eights}
  floor = {p["curve"]: length * device_step(sub, p["curve"], p["point"]) for p in eights}
  base = strongest(sub, preset)
  four = point(sub, "ensemble", "N4_L600")
  if min(floor.values()) <= base["time_s"][preset]["median"]:
    raise Contradicted("pydocs_many_workers_length: L steps of an N = 8 worker would be as "
                       "fast as the strongest baseline")
  cheapest = min(floor, key=floor.get)
  missed = [f"{CURVE_NAMES.get(p['curve'], p['curve'])} {span([p['final']['min'], p['final']['max']], _two)}"
            for p in eights]
  return paragraph(
      f"L = {length} is the grid's N = 8 point, where every curve misses the target on every "
      f"reported seed (final perplexity: {listing(missed)}), "
      "so the many-worker grid's N = 8 repeats a miss. A longer L cannot change the answer: "
      f"an N = 8 point that missed in {length} steps needs more than {length} of them, and "
      "a longer schedule decays later (the ensemble at N = 4 and L = 600 reaches perplexity "
      f"12 at step {four['steps']['median']:g}, {s(four['time_s'][preset]['median'])} on "
      f"{preset}); {length} steps alone take {s(floor['ensemble'])} of GPT-2 tiny's step and "
      f"{s(floor[cheapest])} of the small model's ({CURVE_NAMES.get(cheapest, cheapest)}), "
      f"against {s(base['time_s'][preset]['median'])} for the strongest baseline, "
      f"{CURVE_NAMES.get(base['curve'], base['curve'])} on {base['devices']} devices.")


# ---- regime.md, section 1: the critical-batch readings ---------------------------------------

def _measured(summary: dict) -> list[dict]:
  return [r for r in summary["rows"] if r["median_steps"] is not None]


def _at(summary: dict, batch: int) -> dict:
  return next(r for r in summary["rows"] if r["batch"] == batch)


@functools.lru_cache(maxsize=None)
def _sweep_tuning(workload: str, batch: int) -> dict:
  """A critical-batch point's `tuning.json`: its tuning runs, axis by axis."""
  with open(os.path.join(RESULTS, "critical_batch", workload, f"B{batch}", "tuning.json")) as f:
    return json.load(f)


def _axis_runs(workload: str, batch: int, key: str) -> list[dict]:
  """The tuning seed's runs along one axis (rerun_plan.SCHEDULE or the learning rate)."""
  return next(a for a in _sweep_tuning(workload, batch)["axes"] if a["key"] == key)["runs"]


def _fraction(workload: str, batch: int, fraction: float) -> dict:
  return next(r for r in _axis_runs(workload, batch, rerun_plan.SCHEDULE)
              if r["value"] == fraction)


def _seed_runs(workload: str, batch: int, subdir: str = "") -> list[dict]:
  """A critical-batch point's runs (under `subdir`, e.g. superseded), tuning seed 0 left out."""
  return [r for r in _results(f"critical_batch/{workload}/B{batch}/{subdir}seed*/results.json")
          if r["config"]["seed"] != 0]


def _reached(run: dict):
  return critical_batch_sweep._steps_to_target(run)


def _factor(f: float) -> str:
  """'x0.25', 'x1/8' as the prose writes a rate's factor."""
  return f"x{f:g}"


def _b(batch: int) -> str:
  return f"{batch:,}"


def _whole_budget_fit(workload: str, largest: int) -> dict:
  """The knee fitted to whole-budget schedules from the smallest batch to `largest`: each B's
  superseded runs where its tuned schedule replaced them, else its own (whole) runs."""
  points = []
  for r in critical_batch(workload)["rows"]:
    if r["batch"] > largest:
      continue
    old = [_reached(q) for q in _seed_runs(workload, r["batch"], "superseded/")]
    if old:
      points.append((r["batch"], statistics.median(old)))
    elif r["schedule_fraction"] == 1:
      points.append((r["batch"], r["median_steps"]))
    else:
      raise Contradicted(f"critical batch {workload} B{r['batch']}: no whole-budget runs")
  return critical_batch_sweep.fit_critical_batch(points)


@template(REGIME, "critical_batch_fashion")
def critical_batch_fashion() -> str:
  """Fashion-MNIST's critical-batch readings: where doubling the batch stops paying, and what
  tuning the schedule's length moved."""
  w = "fashion"
  summary = critical_batch(w)
  rows, top = _measured(summary), knee(summary)
  upto = [r for r in rows if r["batch"] <= top["batch"]]
  cuts = [a["median_steps"] / b["median_steps"] for a, b in zip(upto, upto[1:])]
  far, last = rows[-2], rows[-1]
  wander = [r for r in rows if r["batch"] > top["batch"]]
  late = next(b for a, b in zip(wander, wander[1:]) if b["median_steps"] > a["median_steps"])
  before = wander[wander.index(late) - 1]
  short = [r for r in summary["rows"] if r["schedule_fraction"] < 1]
  first = summary["rows"][0]
  whole = [_reached(q) for q in _seed_runs(w, first["batch"], "superseded/")]
  fit = _whole_budget_fit(w, far["batch"])
  if (last["median_steps"] < last["min_steps"] or last["median_steps"] < far["median_steps"]
      or late["schedule_fraction"] != 1 or min(cuts) <= 1
      or statistics.median(whole) <= first["median_steps"]):
    raise Contradicted("critical_batch_fashion: the knee or the schedules' effect moved")
  return "\n".join((bullet(
      f"Doubling the batch cuts the steps by {span(cuts, lambda v: f'{v:.1f}')}x up to "
      f"B = {top['batch']} and **little beyond**: {far['batch'] // top['batch']}x the batch "
      f"from {top['batch']} to {_b(far['batch'])} cuts them from {top['median_steps']} to "
      f"{far['median_steps']} (table), where perfect scaling would give "
      f"{top['median_steps'] * top['batch'] / far['batch']:.1f}, and doubling again to "
      f"{_b(last['batch'])} (D = {last['devices']}) takes {last['median_steps']} "
      f"({last['min_steps']}-{last['max_steps']}): no fewer. Data-parallel's critical batch "
      f"here is about {top['batch']} examples: D = {top['devices']} devices of "
      f"{summary['per_device']}, where the cost-vs-time grid stops. Beyond it the medians "
      f"wander within the seeds' spread (B = {_b(late['batch'])} took {late['median_steps']} "
      f"steps, more than B = {_b(before['batch'])}'s {before['median_steps']}: its tuning "
      "seeds chose the whole schedule, which then reached the target later on seeds 1-3)."),
      bullet(
      "**Tuning the schedule's length moved the small batches, not the knee's place**: "
      f"{WORDS[len(short)]} of the {WORDS[len(summary['rows'])]} B chose a half- or "
      f"quarter-length schedule. At B = {first['batch']} the whole {_b(first['step_budget'])}-step "
      f"schedule took {statistics.median(whole):g} steps (its runs are kept in "
      f"`B{first['batch']}/superseded/`), a {LENGTHS[first['schedule_fraction']]} of it "
      f"{first['median_steps']}; McCandlish's S(B) = S_min (1 + B_crit / B) fitted to the "
      f"medians gives S_min = {summary['fit']['s_min']:.1f} steps and B_crit = "
      f"{summary['fit']['b_crit']:.0f} (`summary.json`; {fit['b_crit']:.0f} with the "
      f"whole-budget schedules at B = {first['batch']} .. {_b(far['batch'])}).")))


@template(REGIME, "critical_batch_fashion_tuning")
def critical_batch_fashion_tuning() -> str:
  """The tuning seed's runs at the batches whose choice the table cannot show."""
  w, lr = "fashion", "optim.learning_rate"
  summary = critical_batch(w)
  edges = [r for r in summary["rows"] if r["lr_at_edge"]]
  flat_row = edges[0] if edges else _at(summary, 256)  # its rates' response is flat
  tried = _axis_runs(w, flat_row["batch"], lr)
  flat = [r["steps_to_target"] for r in tried if r["steps_to_target"] is not None]
  beyond = [_factor(r["factor"]) for r in tried if r["steps_to_target"] is None]
  far, last = summary["rows"][-2], summary["rows"][-1]
  rates = _axis_runs(w, far["batch"], lr)
  quarter = _fraction(w, far["batch"], 0.25)
  last_rates = _axis_runs(w, last["batch"], lr)
  hit = [r for r in last_rates if r["reached"]]
  missed = [r for r in last_rates if not r["reached"]]
  [whole] = {r["steps_to_target"] for r in hit}
  q = _fraction(w, last["batch"], 0.25)
  half = _fraction(w, last["batch"], 0.5)
  clock = [r["cost"]["measured"]["step_time_s"]
           for r in _results(f"critical_batch/{w}/B{last['batch']}/seed*/results.json")]
  if (max(flat) > 1.2 * min(flat) or len(edges) > 1 or not (edges or beyond)
      or any(r["steps_to_target"] is None for r in rates) or half["reached"]
      or not quarter["reached"] or not q["reached"] or far["schedule_fraction"] != 0.25):
    raise Contradicted("critical_batch_fashion_tuning: a tuning run's outcome moved")
  return "\n".join((
      bullet(f"At B = {flat_row['batch']} the response to the rate is flat: {span(flat, str)} "
             "steps at every rate that reached the target on the tuning seed"
             + (f"; the tuned rate sits at the edge of the extended grid "
                f"({flat_row['lr_factor']:g}x the base)." if edges else
                f"; extended past its former edge, the grid's {listing(beyond)} did not reach "
                f"it, so the tuned rate ({flat_row['lr_factor']:g}x the base) is interior.")),
      bullet(f"At B = {_b(far['batch'])} the rates "
             f"{' / '.join(_factor(r['factor']) for r in rates)} took "
             f"{' / '.join(str(r['steps_to_target']) for r in rates)} steps on the tuning "
             f"seed; the quarter-length schedule then {quarter['steps_to_target']}."),
      bullet(f"At B = {_b(last['batch'])} ({last['microbatches']} microbatches of "
             f"{summary['per_device']}, about {span(clock, _whole)} s a step on "
             f"a 2-core machine) the rates {listing([_factor(r['factor']) for r in hit])} took "
             f"{whole} steps with the whole schedule on the tuning seed, "
             f"{listing([_factor(r['factor']) for r in missed])} had not reached the target by "
             f"then; the quarter-length schedule at {_factor(last['lr_factor'])} took "
             f"{listing([str(r['steps_to_target']) for r in rerun_plan._seeds(q)])} on the two "
             f"tuning seeds, the half-length one had not by step {half['stopped_at_step']}.")))


@template(REGIME, "critical_batch_small_model")
def critical_batch_small_model() -> str:
  """The small model's critical batch against the big model's, and what it means for the
  small-model routed experts beyond 8 devices."""
  summary, big = critical_batch("fashion_small_model"), critical_batch("fashion")
  rows = _measured(summary)
  top = min(rows, key=lambda r: r["median_steps"])  # where its steps stop falling
  grid_edge = knee(big)
  past = [r for r in rows if grid_edge["batch"] < r["batch"] <= top["batch"]]
  wander = [r["median_steps"] for r in _measured(big) if r["batch"] > grid_edge["batch"]]
  last = rows[-1]
  at = _at(summary, grid_edge["batch"])
  beyond = small_model_beyond()
  n64 = _workers("many_workers", SMALL_ROUTED, 64)
  others = [r for r in summary["rows"] if r["schedule_fraction"] != 0.5]
  edge = [r for r in summary["rows"] if r["lr_at_edge"]]
  read = len(critical_batch_sweep._b_simple_readings(summary["rows"]))
  steps = [r["median_steps"] for r in past]
  if (top is not past[-1] or last["median_steps"] <= top["median_steps"]
      or top["median_steps"] >= summary["fit"]["s_min"]
      or beyond["n64"]["method_time_s"] <= beyond["beyond"][-1]["baseline_time_s"]):
    raise Contradicted("critical_batch_small_model: its knee or the experts' place moved")
  return "\n".join((
      bullet(
          "**The small model keeps scaling past the big model's knee, then stops**: from "
          f"{at['median_steps']} steps at B = {at['batch']} (D = {at['devices']}, where the "
          f"cost-vs-time grid stops) to {listed(steps)} at "
          f"B = {listing([_b(r['batch']) for r in past])}, where the big model wandered "
          f"between {min(wander)} and {max(wander)} past B = {grid_edge['batch']}. Doubling "
          f"again to B = {_b(last['batch'])} (D = {last['devices']}) takes "
          f"{last['median_steps']} steps ({last['min_steps']}-{last['max_steps']}), no fewer: "
          f"its knee is reached by B = {_b(top['batch'])}. The fit gives B_crit = "
          f"{summary['fit']['b_crit']:.0f} (the big model's {big['fit']['b_crit']:.0f}) and "
          f"S_min = {summary['fit']['s_min']:.0f} steps; B = {_b(top['batch'])}'s "
          f"{top['median_steps']} steps sit below S_min, so the 1/B model fits the curve's "
          "end loosely, and the projection reads the measured points, not the fit."),
      bullet(
          "**This is the baseline the small-model routed experts meet**: at "
          f"{min(steps)}-{max(steps)} steps on {past[0]['devices']}-{past[-1]['devices']} "
          "devices of the small model's step it is faster than their every point "
          f"({n64['steps']['median']:g} steps at N = 64 plus the pool build; section 3)."),
      bullet(_schedule_choices("fashion_small_model", others) + " "
             + (f"B = {listing([_b(r['batch']) for r in edge])}'s rate sits at the edge of "
                "the extended grid. " if edge else
                "Every B's rate is interior to its grid, extended where it sat at an edge. ")
             + f"The noise scale reads at the target in {read} of {len(summary['rows'])} "
             "batches only, as for the big model (the estimate of |G|^2 falls to or below "
             "zero late in a short schedule).")))


def _schedule_choices(workload: str, others: list[dict]) -> str:
  """The batches that chose other than the half-length schedule, each with its tuning
  seeds' steps at the half and at its choice."""
  if not others:
    return "Every B chose a half-length schedule."
  names = {0.25: "a quarter", 1.0: "the whole"}

  def one(r):
    def steps(fraction):
      return listing([str(s["steps_to_target"]) for s in rerun_plan._seeds(
          _fraction(workload, r["batch"], fraction))])
    return (f"B = {_b(r['batch'])} ({names.get(r['schedule_fraction'], r['schedule_fraction'])}"
            f" of its {r['step_budget']} steps: the half-length schedule took {steps(0.5)} "
            f"steps on the two tuning seeds, its choice {steps(r['schedule_fraction'])})")
  return f"Every B chose a half-length schedule but {listing([one(r) for r in others])}."


@template(REGIME, "critical_batch_pydocs")
def critical_batch_pydocs() -> str:
  """The Python docs' critical batch: below the smallest batch, by the steps, the fit and
  the noise scale, and no shorter schedule moves it."""
  w = "pydocs"
  summary = critical_batch(w)
  rows = _measured(summary)
  first, top = rows[0], knee(summary)
  ten = _at(summary, 1024)  # 16x the smallest batch
  after = [r for r in rows if r["batch"] > ten["batch"]]
  fit = summary["fit"]
  noise = critical_batch_sweep._b_simple_readings(summary["rows"])
  d1, d2 = (point("pydocs_gpt2", "data_parallel", f"D{d}") for d in (1, 2))
  windows = [16, 32]  # the grid's D = 1 and 2, at 16 windows a device
  at_fit = [fit["s_min"] * (1 + fit["b_crit"] / b) for b in windows]
  cut = [r for r in summary["rows"] if r["batch"] < summary["rows"][-1]["batch"]]
  halves = [_fraction(w, r["batch"], 0.5)["final"] for r in cut]
  quarters = [_fraction(w, r["batch"], 0.25)["final"] for r in summary["rows"]]
  largest = summary["rows"][-1]
  tune_half, tune_whole = (rerun_plan._seeds(_fraction(w, largest["batch"], f)) for f in (0.5, 1.0))
  [whole_steps] = {r["step_budget"] for r in summary["rows"]}
  if (top is not first or any(r["median_steps"] < ten["median_steps"] for r in after)
      or max(fit["b_crit"], summary["b_simple"]) >= first["batch"]
      or any(_fraction(w, r["batch"], f)["reached"] for r in cut for f in (0.25, 0.5))
      or _fraction(w, largest["batch"], 0.25)["reached"]
      or not all(r["reached"] for r in tune_half + tune_whole)
      or any(r["schedule_fraction"] != 1 for r in summary["rows"])):
    raise Contradicted("critical_batch_pydocs: the knee or the schedules' outcome moved")
  return "\n".join((
      bullet(
          f"Here the knee lies **below the smallest batch measured**: {ten['batch'] // first['batch']}x "
          f"the batch from {first['batch']} to {_b(ten['batch'])} windows cuts the steps only "
          f"{first['median_steps'] / ten['median_steps']:.1f}x, and doubling it again to "
          f"{listing([_b(r['batch']) for r in after])} cuts "
          "nothing."),
      bullet(
          f"The fit (under the table: S_min {fit['s_min']:.1f} steps, B_crit "
          f"{fit['b_crit']:.0f}) and the measured B_simple ({summary['b_simple']:.0f}, the "
          "median of the per-B medians, which are noisy, "
          f"{min(noise):.0f}-{max(noise):.0f}) agree: both under one device's "
          f"{first['batch']} windows."),
      bullet(
          f"This matches the docs' cost-vs-time grid at {windows[0]} windows a device: the "
          "fit, made without its smaller batches, puts "
          f"{listing([str(b) for b in windows])} windows at "
          f"{listing([f'{v:.0f}' for v in at_fit])} "
          f"steps, where the grid measured {d1['steps']['median']:g} and "
          f"{d2['steps']['median']:g}."),
      bullet(
          "**A shorter schedule does not help at any B.** Every B reaches the target at "
          f"{span([r['median_steps'] / whole_steps for r in rows], lambda v: f'{100 * v:.0f}')}% of its {whole_steps} "
          f"steps, yet the half- and quarter-length schedules ({whole_steps // 2} and "
          f"{whole_steps // 4} steps), tuned after the learning rate on the tuning seed, miss "
          "perplexity 12 at every B but the largest: the half-length ones end at "
          f"{span(halves, lambda v: f'{v:.1f}')} at B = {cut[0]['batch']} .. "
          f"{_b(cut[-1]['batch'])}, the quarter-length at {span(quarters, _whole)}. "
          f"At B = {_b(largest['batch'])} the half-length schedule reached it in "
          f"{listing([str(r['steps_to_target']) for r in tune_half])} steps on the two "
          f"tuning seeds, the whole one in {listing([str(r['steps_to_target']) for r in tune_whole])}. "
          "So the whole schedule stays at every B, seeds 1 and 2 stand as run and seed 3 "
          "joins them; the knee is not an artefact of the schedule's length "
          "(`B*/tuning.json`, the runs under `B*/tune/`).")))


def _ratio_factor(f: float) -> str:
  """'x1/4', 'x1', 'x2': a tuning factor as a fraction."""
  return "x" + as_fraction(f)


@template(REGIME, "critical_batch_pydocs_runs")
def critical_batch_pydocs_runs() -> str:
  """Why the docs' sweep warm-starts the rate, how often its large batches read the corpus,
  and what a step costs there."""
  w, lr = "pydocs", "optim.learning_rate"
  summary = critical_batch(w)
  warm = _at(summary, 2048)  # the batch where the plain rule would stop at a worse rate
  source = _at(summary, _sweep_tuning(w, warm["batch"])["warm_start_from_batch"])
  runs = _axis_runs(w, warm["batch"], lr)
  plain = [r for r in runs if r["factor"] >= 0.5]
  inherited = next(r for r in runs if r["factor"] == source["lr_factor"])
  chosen = next(r for r in runs if r["factor"] == warm["lr_factor"])
  scale = warm["peak_learning_rate"] / chosen["value"]
  best_plain = min(plain, key=lambda r: r["steps_to_target"])
  peaks = [r["value"] * scale for r in plain]
  if (chosen["steps_to_target"] >= inherited["steps_to_target"]
      or inherited["steps_to_target"] >= best_plain["steps_to_target"]
      or best_plain in (plain[0], plain[-1])):
    raise Contradicted("critical_batch_pydocs_runs: the warm start no longer decides B2048")
  [run] = _results(f"critical_batch/{w}/B{summary['rows'][-1]['batch']}/seed1/results.json")
  corpus = run["data"]["train_windows"]
  big = [r for r in summary["rows"] if r["batch"] >= warm["batch"]]
  epochs = [(r, r["median_steps"] * r["batch"] / corpus) for r in (big[0], big[-1])]
  every = run["config"]["checkpoint"]["every_steps"] / run["step_budget"]
  if not all(e > 2 for _, e in epochs):
    raise Contradicted("critical_batch_pydocs_runs: the large batches no longer reread the corpus")
  slow = summary["rows"][-2:]
  return "\n".join((
      bullet(
          f"B = {_b(warm['batch'])} shows why the warm start is needed. There "
          f"{listing([_ratio_factor(r['factor']) for r in plain])} (peak rates "
          f"{', '.join(f'{v:.2g}' for v in peaks)}) took "
          f"{listing([str(r['steps_to_target']) for r in plain])} steps: a flat, noisy "
          f"stretch with {_ratio_factor(best_plain['factor'])} an interior best, where the "
          f"plain rule stops. B = {_b(source['batch'])}'s choice, "
          f"{_ratio_factor(inherited['factor'])}, took {inherited['steps_to_target']}, and "
          f"{_ratio_factor(chosen['factor'])} took {chosen['steps_to_target']}: it is chosen "
          f"(`B{warm['batch']}/tuning.json`). Without the warm start this table would show "
          f"data-parallel's steps doubling past B = {_b(source['batch'])}, a baseline tuned "
          "worse than it can be."),
      bullet(
          f"From B = {_b(warm['batch'])} the small corpus ({corpus:,} training windows) is read "
          f"several times over: {listing([str(r['median_steps']) for r, _ in epochs])} steps "
          f"are about {listing([f'{e:.0f}' for _, e in epochs])} epochs at "
          f"B = {listing([_b(r['batch']) for r, _ in epochs])}."),
      bullet(
          f"Every point checkpoints each 1/{1 / every:g} of its budget, so a run cut off "
          f"resumes close to where it stopped. B = {_b(slow[1]['batch'])} takes about "
          f"{s(slow[1]['step_time_s'])} a step on a 2-core machine, B = {_b(slow[0]['batch'])} "
          f"about {s(slow[0]['step_time_s'])}.")))


def _reported_runs(sub: str, curve: str, name: str) -> list[dict]:
  """A grid point's reported runs (seeds 1-3)."""
  return [r for r in report.reported(report.load_runs(os.path.join(RESULTS, sub)))
          if r["curve"] == curve and r["point"] == name]


@template(REGIME, "many_workers_fashion")
def many_workers_fashion() -> str:
  """The Fashion-MNIST many-worker readings: random streams flat in N, routed experts
  falling to data-parallel's steps beyond its knee but not to its time."""
  sub, preset, routed = "many_workers", "ib_xdr800", "ensemble_pca_routed"
  streams = [p for p in grid(sub) if p["curve"] == "ensemble"]
  experts = [p for p in grid(sub) if p["curve"] == routed]
  fashion = critical_batch("fashion")
  at_knee = dp_at_batch("fashion_mnist", knee(fashion)["batch"])
  knee_flops = at_knee.steps * at_knee.flops_per_device_step * at_knee.devices
  two = _workers(sub, routed, 2)
  two_runs = _reported_runs(sub, routed, two["point"])
  four, n16 = _workers(sub, routed, 4), _workers(sub, routed, 16)
  n32, n64, n128 = (_workers(sub, routed, n) for n in (32, 64, 128))
  alone = statistics.median(r["worker_accuracy"] for r in _reported_runs(sub, routed, n16["point"]))
  batches = [2048, 4096]  # data-parallel beyond its knee, on 32 and 64 devices
  dp = [projected_point("fashion_mnist", "data_parallel", f"B{b}") for b in batches]
  dp_s = [p.time_s(costs.INTERCONNECTS[preset]) for p in dp]
  steps_s = [p.steps * p.device_step_s for p in dp]
  [step] = {p.device_step_s for p in dp}
  builds = [statistics.median(r["pool_build_s"] for r in _reported_runs(sub, routed, p["point"]))
            for p in experts if 8 <= int(_n(p["point"])) <= 64]
  t64 = n64["time_s"][preset]["median"]
  alone64 = n64["steps"]["median"] * device_step(sub, routed, n64["point"])
  missed = [r["seed"] for r in two_runs if not r["reached"]]
  [hit] = [r for r in two_runs if r["reached"]]
  if (streams[0]["steps"]["median"] <= streams[-1]["steps"]["median"] or t64 <= max(dp_s)
      or alone64 <= min(dp_s) or not all(p["reached"] == p["seeds"] for p in experts[1:])
      or n32["steps"]["median"] > 2 * max(p.steps for p in dp)):
    raise Contradicted("many_workers_fashion: the many-worker points moved")
  return "\n".join((
      bullet(
          "**Averaging more random-stream workers hardly cuts the steps**: from "
          f"{streams[0]['steps']['median']:g} at N = {_n(streams[0]['point'])} to "
          f"{streams[-2]['steps']['median']:g} and {streams[-1]['steps']['median']:g} at "
          f"N = {_n(streams[-2]['point'])} and {_n(streams[-1]['point'])} (medians of the "
          "reported seeds), while each worker's own accuracy falls slightly and the compute "
          f"grows with N: at N = {_n(streams[-1]['point'])} it is "
          f"{streams[-1]['flops']['median'] / 1e12:.1f} TFLOPs, "
          f"{streams[-1]['flops']['median'] / knee_flops:.0f}x data-parallel's at "
          f"D = {at_knee.devices}."),
      bullet(
          f"**Routed experts do improve with N**: from {four['steps']['median']:g} steps at "
          f"N = 4 to {n64['steps']['median']:g} at N = 64 and {n128['steps']['median']:g} at "
          f"N = 128 ({listing([str(r['steps']) for r in _reported_runs(sub, routed, n128['point'])])}); "
          f"N = 2 misses on seeds {listed(missed)} and takes "
          f"{hit['steps']} of its {hit['step_budget']} steps on seed {hit['seed']}. Each "
          f"expert is a specialist (about {round(100 * alone, -1):.0f}% accuracy alone on all "
          f"{hit['eval_examples']:,} images at N = 16)."),
      bullet(
          "At N = 32 and 64 the routed experts need about as few steps as data-parallel "
          "beyond its knee (the critical-batch table: "
          f"{', '.join(f'{p.steps} at B = {_b(b)}' for p, b in zip(dp, batches))}). "
          "Their time follows less: the pool build (k-means of PCA'd pixels, "
          f"{span(builds, lambda v: f'{v:.1f}')} s from N = 8 to 64, timed by the current "
          "build code on a quiet machine; the table's pool column) is on the critical path, "
          f"and their {s(t64)} to target at N = 64 is "
          f"{span([t64 / v for v in dp_s], lambda v: f'{v:.1f}')} times data-parallel's at "
          f"those batches ({listing([str(p.steps) for p in dp])} steps of the grid's "
          f"calibrated {step:.3f} s step: {listing([s(v) for v in steps_s])} before their "
          f"all-reduces). Steps alone ({n64['steps']['median']:g} x {step:.3f} s = "
          f"{s(alone64)}) would not close the gap either; at N = 128 they take "
          f"{s(n128['time_s'][preset]['median'])}, at "
          f"{n128['flops']['median'] / 1e12:.0f} TFLOPs.")))


def _seed0(sub: str, curve: str, name: str) -> dict:
  """A grid point's tuning-seed run (seed 0, left out of the reported seeds)."""
  [run] = _results(f"{sub}/{curve}/{name}/seed0/results.json")
  return run


def _first_difference(a: dict, b: dict, metric: str) -> int:
  """The first evaluation step at which two runs' `metric` differ."""
  return next(p["step"] for p, q in zip(a["history"], b["history"])
              if p["step"] != q["step"] or p[metric] != q[metric])


def _finals(runs: list[dict], fmt=lambda v: f"{v:.3f}") -> str:
  return span([r["final"] for r in runs], fmt)


@template(REGIME, "many_workers_fashion_small")
def many_workers_fashion_small() -> str:
  """The small-model routed experts on Fashion-MNIST: where they reach the target, their
  time at N = 64 against data-parallel beyond its knee, which points trained at the full
  grid's current N = 8 choice and which at its former one, and the N = 8 seed that did not
  reproduce across machines where it still stands."""
  sub, preset, curve = "many_workers", "ib_xdr800", SMALL_ROUTED
  pts = [p for p in grid(sub) if p["curve"] == curve]
  missed = [p for p in pts if not p["reached"]]
  partial = [p for p in pts if 0 < p["reached"] < p["seeds"]]
  full = [p for p in pts if p["reached"] == p["seeds"]]
  n64 = _workers(sub, curve, 64)
  t64 = n64["time_s"][preset]["median"]
  dp = projected_point("fashion_mnist", "data_parallel", "B2048")  # beyond its knee
  dp_s = dp.time_s(costs.INTERCONNECTS[preset])
  d8 = point("fashion_mnist", "dp_small_model", "D8")
  small = small_model_beyond()
  batches = [int(r["time_baseline"].split()[1][1:]) for r in small["beyond"]]
  # the many-worker grid trains at the full grid's N = 8 choice (`configs.tuned_choice`);
  # a point trained before the full grid was re-tuned holds the former choice until re-run
  chosen = tuning("fashion_mnist", curve, "N8_L235")["chosen"]
  formers = {p["point"]: former_choice(sub, curve, p["point"], full_point="N8_L235")
             for p in pts}
  stale = [p for p in pts if formers[p["point"]]]
  if len({repr(f) for f in formers.values() if f}) > 1 or (
      t64 <= small["beyond"][-1]["baseline_time_s"]):
    raise Contradicted("many_workers_fashion_small: the small-model experts' points moved")
  reach = []
  if missed:
    reach.append(f"N = {listing([_n(p['point']) for p in missed])} miss 85% in their "
                 f"{missed[0]['step_budget']} steps on every seed "
                 f"({_finals([r for p in missed for r in _reported_runs(sub, curve, p['point'])])})")
  for p in partial:
    runs = _reported_runs(sub, curve, p["point"])
    lost, hit = [r for r in runs if not r["reached"]], [r for r in runs if r["reached"]]
    reach.append(f"N = {_n(p['point'])} misses on seed{'s' if len(lost) > 1 else ''} "
                 f"{listing([str(r['seed']) for r in lost])} ({_finals(lost)}) and takes "
                 f"{listing([str(r['steps']) for r in hit])} steps on seeds "
                 f"{listing([str(r['seed']) for r in hit])}")
  if full:
    runs = [_reported_runs(sub, curve, p["point"]) for p in full]
    reach.append(f"N = {', '.join(_n(p['point']) for p in full)} take "
                 f"{listing([format(p['steps']['median'], 'g') for p in full])} steps "
                 f"(medians; seeds {', '.join(span([r['steps'] for r in rs], str) for rs in runs)}"
                 "; on the tuning seed "
                 + ", ".join(str(p["tuning_seed_steps"] or "missed") for p in full) + ")")
  text = (
      f"**Small-model routed experts**: {'; '.join(reach)}. Their step is the small model's, "
      f"so at N = 64 they take {s(t64)} with the pool build "
      f"({n64['flops']['median'] / 1e12:.1f} TFLOPs): {_against(t64, dp_s)} data-parallel "
      f"beyond its knee ({s(dp_s)} at B = {_b(2048)}, "
      f"{dp.steps * dp.flops_per_device_step * dp.devices / 1e12:.1f} TFLOPs) and "
      f"{_against(t64, d8['time_s'][preset]['median'])} the small model on 8 devices "
      f"({s(d8['time_s'][preset]['median'])}, {d8['flops']['median'] / 1e12:.2f} TFLOPs), "
      "and slower than the small model's own data-parallel beyond 8 devices: it keeps "
      f"speeding up ({listing([f'{v:g}' for v in small['dp_steps']])} steps at "
      f"B = {listing([_b(b) for b in batches])}; the small model's critical batch, section "
      f"1), {s(small['beyond'][-1]['baseline_time_s'])} at B = {_b(batches[-1])} (modelled, "
      "section 3).")
  if stale:
    former = next(f for f in formers.values() if f)
    text += (
        f" N = {listing([_n(p['point']) for p in stale])} trained at the full grid's former "
        f"N = 8 choice ({LENGTHS[former[rerun_plan.SCHEDULE]]}-length schedule; its "
        f"{LENGTHS[chosen[rerun_plan.SCHEDULE]]} one since)"
        + ("" if len(stale) == len(pts) else
           f", N = {listing([_n(p['point']) for p in pts if p not in stale])} at the current "
           "one")
        + ": rerun_plan.md lists the re-run.")
  eight = next(p for p in pts if p["point"] == "N8_L235")
  lost = [r for r in _reported_runs(sub, curve, eight["point"]) if not r["reached"]]
  if formers[eight["point"]] and len(lost) == 1:  # the full grid's run of the same seed
    [here] = _results(f"{sub}/{curve}/{eight['point']}/seed{lost[0]['seed']}/results.json")
    there = at_choice("fashion_mnist", curve, eight["point"], formers[eight["point"]],
                      [lost[0]["seed"]])
    if there and there[0]["target"]["reached"]:
      text += (
          f" N = 8 here repeats the full grid's point at that former choice with the same "
          f"config and seed: there (`superseded/`) seed {lost[0]['seed']} reached 85% at "
          f"step {there[0]['steps']}, here it missed ({lost[0]['final']:.3f}); the two "
          f"runs' evaluations differ from step "
          f"{_first_difference(here, there[0], 'routed/accuracy')} on (another machine, "
          "other code since), so a seed's outcome near the target is not reproducible "
          "across hosts.")
  return bullet(text)


@template(REGIME, "many_workers_pydocs")
def many_workers_pydocs() -> str:
  """The Python docs' many-worker readings: random streams flat in N, the tf-idf-routed
  experts reaching the target only at N = 64, the small model's experts on one seed."""
  sub, grid_sub, preset = "many_workers_pydocs", "pydocs_gpt2", "ib_xdr800"
  streams = [p for p in grid(sub) if p["curve"] == "ensemble" and int(_n(p["point"])) >= 8]
  workers = [statistics.median(math.exp(r["worker_nll"])
                               for r in _reported_runs(sub, "ensemble", p["point"]))
             for p in streams]
  eight = streams[0]["final"]["median"]
  routed = [p for p in grid(sub) if p["curve"] == "ensemble_tfidf_routed"]
  small = [p for p in grid(sub) if p["curve"] == "ensemble_tfidf_routed_small"]
  r64, s64 = routed[-1], small[-1]
  r32, s32 = routed[-2], small[-2]
  r64_runs = _reported_runs(sub, r64["curve"], r64["point"])
  s64_runs = _reported_runs(sub, s64["curve"], s64["point"])
  [won] = [r for r in s64_runs if r["reached"]]
  lost = [r for r in s64_runs if not r["reached"]]
  tuned = _seed0(sub, s64["curve"], s64["point"])
  d8, base = point(grid_sub, "data_parallel", "D8"), strongest(grid_sub, preset)
  t = {"d8": d8["time_s"][preset]["median"], "base": base["time_s"][preset]["median"],
       "r64": r64["time_s"][preset]["median"], "won": won["time_s"][preset]}
  f = {"d8": d8["flops"]["median"], "base": base["flops"]["median"],
       "r64": r64["flops"]["median"], "won": won["flops"]}
  if (any(p["reached"] for p in streams + routed[:-1] + small[:-1])
      or r64["reached"] != r64["seeds"] or tuned["target"]["reached"]
      or min(p["final"]["median"] for p in streams[1:]) < eight - 0.05
      or t["won"] <= t["base"]):
    raise Contradicted("many_workers_pydocs: the many-worker points moved")
  return "\n".join((
      bullet(
          f"**More random-stream workers do not help at all** (seeds "
          f"{streams[0]['seed_list'][0]}-{streams[0]['seed_list'][-1]}): the ensemble ends at "
          f"perplexity {span([p['final']['median'] for p in streams], _two)} (medians) from "
          f"N = {_n(streams[0]['point'])} to {_n(streams[-1]['point'])}, each worker alone "
          f"about {span(workers, lambda v: f'{v:.1f}')}. Averaging removes about "
          f"{workers[0] - eight:.1f} of perplexity by N = {_n(streams[0]['point'])} and "
          "nothing after."),
      bullet(
          f"**The tf-idf-routed experts do improve with N** and at N = {_n(r64['point'])} "
          "reach perplexity 12 in every seed "
          f"({listing([str(r['steps']) for r in r64_runs])} steps); up to "
          f"N = {_n(r32['point'])} they miss it in every seed "
          f"({_finals(_reported_runs(sub, r32['curve'], r32['point']), lambda v: f'{v:.1f}')} "
          f"at N = {_n(r32['point'])}). Against data-parallel at D = 8 on the docs grid that is "
          f"{t['r64'] / t['d8']:.1f}x slower at {f['r64'] / f['d8']:.0f}x the compute, and "
          f"against the small model on {base['devices']} devices "
          f"{t['r64'] / t['base']:.1f}x slower at {f['r64'] / f['base']:.0f}x the compute "
          f"(times on {preset}, pool build included)."),
      bullet(
          "**The small model's routed experts do not reach the target reliably** (seeds "
          f"{s64['seed_list'][0]}-{s64['seed_list'][-1]}): perplexity 12 is missed up to "
          f"N = {_n(s32['point'])} on every seed "
          f"({_finals(_reported_runs(sub, s32['curve'], s32['point']), lambda v: f'{v:.1f}')} "
          f"at N = {_n(s32['point'])}) and at N = {_n(s64['point'])} reached at step "
          f"{won['steps']} on seed {won['seed']} only, missed on seeds "
          f"{listing([str(r['seed']) for r in lost])} "
          f"({', '.join(_two(r['final']) for r in lost)}) and on the tuning seed "
          f"({tuned['final']['perplexity']:.2f}). Seed {won['seed']}'s run took {s(t['won'])} "
          f"with its pool build, at {f['won'] / 1e12:.1f} TFLOPs: {_against(t['won'], t['r64'])} "
          f"the big model's routed experts at N = {_n(r64['point'])} (their step is the micro "
          f"model's), {_against(t['won'], t['d8'])} data-parallel at D = 8 ({s(t['d8'])}), "
          f"{t['won'] / t['base']:.1f}x "
          f"slower than the strongest baseline, the small model on {base['devices']} devices "
          f"({s(t['base'])}, {f['base'] / 1e12:.2f} TFLOPs), at {f['won'] / f['base']:.0f}x "
          "its compute.")))


def _pool_s(name: str, curve: str, n: int) -> float:
  """The pool build a projection charges a routed point at N = n."""
  return next(p["pool_s"] for p in _projection(name)["points"]
              if p["curve"] == curve and _n(p["name"]) == str(n))


@template(REGIME, "resnet50_whatif_n8")
def resnet50_whatif_n8() -> str:
  """The projections' one-line verdict and the ResNet-50 what-if's win at N = 8, where the
  ratio is the two small models' measured steps."""
  v, charged = projected(), WHATIF + "_pools_charged"
  eth = row(WHATIF, method=SMALL_ROUTED, preset="eth10g", devices=8)
  eth_charged = row(charged, method=SMALL_ROUTED, preset="eth10g", devices=8)
  nvlink = row(WHATIF, method=SMALL_ROUTED, preset="nvlink", devices=8)
  base = projected_point(WHATIF, *eth["time_baseline"].split())
  experts = projected_point(WHATIF, SMALL_ROUTED, eth["method_point"])
  if not projection.wins(eth) or not projection.wins(eth_charged) or projection.wins(nvlink):
    raise Contradicted("resnet50_whatif_n8: the N = 8 experts' win on 10 GbE moved")
  pools = [r["pool_build_s"] for r in report.reported(
      [r for r in report.load_runs(os.path.join(RESULTS, "fashion_mnist"))
       if r["curve"] == SMALL_ROUTED and r["point"] == eth["method_point"]])]
  return paragraph(
      "The projections are regenerated from the finished cost-vs-time grids (seeds 1-3 at "
      "choices made on two tuning seeds; [cost_vs_time.md](cost_vs_time.md)), their steps "
      "priced at each grid's calibrated one-device step. On the measured steps no method "
      "point comes out ahead at any D on any preset. In the ResNet-50 what-if (pool builds "
      f"not charged) the small-model routed experts at N = {_n(eth['method_point'])} beat the "
      f"strongest baseline on 10 GbE ({x(eth['time_ratio'])}, {x(eth['time_range'][0])}-"
      f"{x(eth['time_range'][1])} over the seeds, against the small model at D = {base.devices}); on ib_xdr800 "
      f"({x(v['ib']['time_ratio'])}, {x(v['ib']['time_range'][0])}-"
      f"{x(v['ib']['time_range'][1])}) and nvlink ({x(nvlink['time_ratio'])}) they are within "
      f"the seeds' spread, {WORDS[eth['method_seeds']]} seeds. The what-if scales every "
      "point's step by its own measured FLOPs per device step and its collectives by its own "
      "parameter bytes, so the small-model baseline and the small-model experts share one "
      "assumption (a small model as efficient on an H100 as ResNet-50); on 10 GbE neither "
      "communicates while training, and the ratio is their measured steps' "
      f"({base.steps:g} against {experts.steps:g} to 85%). Charged with their pool builds as "
      f"measured on the 2-core machine (`{charged}.md`: Fashion-MNIST's 60,000 images, the "
      f"build as the grid charges it, {span(pools, lambda v: f'{v:.1f}')} s), the experts "
      f"take {s(eth_charged['method_time_s'])}: {x(eth_charged['time_ratio'])} on 10 GbE "
      f"against {eth_charged['baseline_time_s']:.2f} s, "
      f"{x(v['ib_charged']['time_ratio'])} on ib_xdr800. A build for ImageNet's 1.28M images "
      "would cost more (`experiments/results/bench/pools_scale.json` projects it).")


@template(REGIME, "resnet50_whatif")
def resnet50_whatif() -> str:
  """The ResNet-50 what-if's reading: the wins on 10 GbE, with and without the pool builds,
  and the closest points on the fast links."""
  v, charged, routed = projected(), WHATIF + "_pools_charged", "ensemble_pca_routed"
  eth = rows(WHATIF, method=SMALL_ROUTED, preset="eth10g")
  mid = [r for r in eth if 16 <= r["devices"] <= 64]
  pca = rows(WHATIF, method=routed, preset="eth10g")
  pca_won = [r for r in pca if projection.wins(r)]
  pca_lost = [r for r in pca if not projection.wins(r)]
  [pca_win] = {(r["method_point"], r["time_ratio"], tuple(r["time_range"])) for r in pca_won}
  streams = [r["time_ratio"] for r in rows(WHATIF, method="ensemble", preset="eth10g")]
  still = {}  # the small-model points that still win with their builds charged
  for r in _wins(charged, SMALL_ROUTED, "eth10g"):
    still.setdefault(_n(r["method_point"]), r["time_ratio"])
  pca_charged = [r["time_ratio"] for r in rows(charged, method=routed, preset="eth10g")]
  fast = [r["time_ratio"] for preset in ("nvlink", "ib_xdr800")
          for r in rows(WHATIF, method=SMALL_ROUTED, preset=preset) if r["devices"] > 8]
  nvlink = row(WHATIF, method=SMALL_ROUTED, preset="nvlink", devices=8)
  one = eth[0]["time_baseline"]
  if (not all(projection.wins(r) for r in eth) or _family(one.split()[0]) != "dp_small_model"
      or any(not r["time_baseline"].startswith("dp_small_model B") for r in eth[1:])
      or any(projection.wins(r) for r in rows(WHATIF, method="ensemble", preset="eth10g"))
      or any(projection.wins(r) for r in _projection(charged)["rows"]
             if r["method"] != SMALL_ROUTED)):
    raise Contradicted("resnet50_whatif: the 10 GbE baselines or wins moved")
  return bullet(
      f"**What-if ResNet-50** (`{WHATIF}.md`): slow links make data-parallel pay. On 10 GbE "
      "the strongest baseline is "
      + (f"the small model on one device (no communication) up to D = {eth[0]['devices']}"
         if one == "dp_small_model D1" else _baseline_name("fashion_mnist", one))
      + " and its data-parallel beyond, and **with the pool build left "
      "out** the small-model routed experts beat it at every D "
      f"({x(eth[0]['time_ratio'])} at N = {_n(eth[0]['method_point'])}, {span([r['time_ratio'] for r in mid])} at "
      f"N = {_n(mid[0]['method_point'])}-{_n(mid[-1]['method_point'])}, each above 1 over the seeds), the PCA-routed experts only at "
      f"N = {_n(pca_win[0])} ({x(pca_win[1])}, {x(pca_win[2][0])}-{x(pca_win[2][1])} over the "
      f"seeds; {span([r['time_ratio'] for r in pca_lost])} at "
      f"N = {_n(pca_lost[0]['method_point'])}-{_n(pca_lost[-1]['method_point'])}, "
      + ("within the spread" if all(within(r["time_range"]) for r in pca_lost) else
         "within the spread but at N = " + listing(sorted(
             {_n(r["method_point"]) for r in pca_lost if not within(r["time_range"])}, key=int))
         + ", below it over every seed")
      + f"); the random-stream ensemble stays below it ({span(streams)}). Charged with "
      f"the pool builds measured on the 2-core machine ({s(_pool_s(charged, routed, 8))} at "
      f"N = 8 to {s(_pool_s(charged, routed, 64))} at N = 64), only the small-model experts "
      "still win on 10 GbE ("
      + ", ".join(f"{x(r)} at N = {n}" for n, r in still.items()) +
      f"), the PCA-routed experts lose ({span(pca_charged)}); a pool for ImageNet's 1.28M "
      "images would cost more, not less. On nvlink and ib_xdr800 no method point wins: the "
      f"closest, the small-model routed experts at N = {_n(v['ib']['method_point'])} on "
      f"ib_xdr800 ({x(v['ib']['time_ratio'])} with their build left out, "
      f"{x(v['ib']['time_range'][0])}-{x(v['ib']['time_range'][1])} over the seeds; "
      f"{x(v['ib_charged']['time_ratio'])} charged; {x(nvlink['time_ratio'])} on nvlink), are "
      + ("within the spread" if within(v["ib"]["time_range"]) else "below 1x on every seed")
      + f"; past D = 8 they reach {span(fast)}.")


def held_rows(name: str, curve: str) -> list[dict]:
  """The projection `name` re-priced with `curve` held at its grid points (its critical-batch
  sweep's points left out), as `projection.project` holds a curve whose sweep has not run."""
  points = [projection.Point.from_json(p) for p in _projection(name)["points"]
            if not (p["curve"] == curve and p["name"].startswith("B"))]
  return projection.project(points)


@template(REGIME, "fashion_projection")
def fashion_projection() -> str:
  """Fashion-MNIST's projection: no win at any D; the small-model experts against the small
  model's data-parallel at D = 8 and beyond, and against it held at 8 devices; the other
  methods past D = 32."""
  name = "fashion_mnist"
  rs = _projection(name)["rows"]
  at8 = {r["preset"]: r for r in rows(name, method=SMALL_ROUTED, devices=8)}
  mid = [r for r in rows(name, method=SMALL_ROUTED) if 16 <= r["devices"] <= 64]
  top = row(name, method=SMALL_ROUTED, preset="nvlink", devices=64)
  best = projected_point(name, SMALL_ROUTED, top["method_point"])
  largest = max((p for p in _projection(name)["points"] if p["curve"] == "dp_small_model"),
                key=lambda p: p["devices"])
  sweep = {r["devices"]: r["baseline"] for r in rs if r["devices"] > 8}
  dp = [projected_point(name, *sweep[d].split()) for d in (16, 32, 64)]
  held = [r for r in held_rows(name, "dp_small_model") if r["method"] == SMALL_ROUTED]
  n64 = {r["preset"]: r for r in held if r["method_point"] == best.name and r["devices"] == 64}
  diloco = {r["preset"]: r for r in rows(name, method="diloco", devices=8)}
  late = {m: [r for r in rows(name, method=m) if r["devices"] >= 64]
          for m in ("diloco", "ensemble", "ensemble_pca_routed")}
  streams = [r["method_time_s"] for r in rows(name, method="ensemble", preset="nvlink")]
  pca_best = {r["method_point"] for r in late["ensemble_pca_routed"] if r["devices"] > 64}
  [ens_point] = {r["method_point"] for r in late["ensemble"]}
  unmatched = [r for r in rs if r["compute_ratio"] is None]  # no baseline as fast
  if (any(projection.wins(r) for r in rs)
      or any(r["compute_ratio"] is not None and r["compute_ratio"] >= 1 for r in rs)
      or any(projection.wins(r) or not within(r["time_range"]) for r in unmatched)
      or {_family_point(r["time_baseline"]) for r in at8.values()} != {"dp_small_model D8"}
      or any(r["compute_baseline"] and (
             not _family_point(r["compute_baseline"]).startswith("dp_small_model D")
             or int(r["compute_baseline"].split()[1][1:]) > 8) for r in at8.values())
      or [sweep[d] for d in (16, 32, 64)] != [f"dp_small_model B{b}" for b in (1024, 2048, 4096)]
      or {sweep[d] for d in sweep if d >= 64} != {sweep[64]} or len(pca_best) != 1
      or max(streams) > 1.1 * min(streams) or len({r["method_point"] for r in at8.values()}) != 1
      or sweep.get(largest["devices"]) == f"dp_small_model {largest['name']}"):
    raise Contradicted("fashion_projection: the projection's closest points or baselines moved")
  order = ("nvlink", "ib_xdr800", "eth10g")
  late_ratio = lambda m, k: span([r[k] for r in late[m]])
  win_ds = {}  # the device counts at which the held baseline loses, by preset
  for p in order:
    ds = tuple(sorted({r["devices"] for r in held if r["preset"] == p and projection.wins(r)}))
    if ds:
      win_ds.setdefault(ds, []).append(PRESET_NAMES[p])
  # the compute baseline at D = 8 by preset: the small model on as many devices as is cheapest
  cheapest, none_as_fast = {}, [PRESET_NAMES[p] for p in order if not at8[p]["compute_baseline"]]
  for p in order:
    if at8[p]["compute_baseline"]:
      cheapest.setdefault(int(at8[p]["compute_baseline"].split()[1][1:]),
                          []).append(PRESET_NAMES[p])
  bns = _bn_by_preset({p: [r["time_baseline"]] for p, r in at8.items()})
  compute_at8 = (f"against the small model on 8 devices ({bns})" if list(cheapest) == [8] else
                 f"against the small model on 8 devices ({bns}) in time and on "
                 + " and ".join(f"{d} on {listing(ps)}" for d, ps in sorted(cheapest.items()))
                 + " in compute") + (
      f" (on {listing(none_as_fast)} no baseline point is as fast at the median, so no "
      "compute ratio)" if none_as_fast else "")
  held_ratios = "; ".join(f"{_ranged((n64[p]['time_ratio'], n64[p]['time_range']))} on "
                          f"{PRESET_NAMES[p]}" for p in order)
  return bullet(
      f"**Fashion-MNIST** (`{name}.md`): **no method point beats the strongest baseline at "
      "any D.** The small-model routed experts come closest: at D = 8 "
      f"(N = {_n(at8['nvlink']['method_point'])}) "
      f"{' / '.join(_ranged((at8[p]['time_ratio'], at8[p]['time_range'])) for p in order)} "
      f"in time on {' / '.join(PRESET_NAMES[p] for p in order)} and "
      f"{span([r['compute_ratio'] for r in at8.values() if r['compute_ratio'] is not None])} "
      f"in compute {compute_at8} (their "
      "pool build's "
      f"{projected_point(name, SMALL_ROUTED, at8['nvlink']['method_point']).pool_flops / 1e9:.0f} "
      "GFLOP charged, as the grid's table charges it); beyond, their best point "
      f"(N = {_n(best.name)}: {top['method_time_s']:.2f} s, "
      f"{top['method_flops'] / 1e12:.2f} TFLOPs) meets the small model's data-parallel on "
      f"16-64 devices (section 1: {listing([f'{p.steps:g}' for p in dp])} steps at "
      f"B = {listing([_b(int(p.name[1:])) for p in dp])}), "
      f"{span([r['time_ratio'] for r in mid])} in time at their compute. Held at 8 devices "
      "(the projection's points without the small model's sweep), that baseline would let "
      "them come out ahead "
      + (" and ".join(f"on {listing(ps)} at D = {listed(ds)}" for ds, ps in win_ds.items())
         if win_ds else "nowhere")
      + f" (at N = {_n(best.name)}: {held_ratios} in time): the "
      "comparison turns on scaling the baseline as far as the method. DiLoCo "
      f"(H = {diloco['nvlink']['method_point'][1:]}) reaches "
      f"{' / '.join(x(diloco[p]['time_ratio']) for p in order)} at D = 8. In compute every "
      "method point spends more than a baseline point that is as fast, where one is. Past "
      "D = 8 the strongest baseline is the small model's data-parallel at "
      f"B = {listing([_b(int(p.name[1:])) for p in dp])} (D = 16, 32, 64; beyond, its "
      f"B = {_b(int(largest['name'][1:]))} on {largest['devices']} devices is slower, as is "
      "the big model's). Against it DiLoCo's "
      f"{late['diloco'][0]['method_devices']}-worker point falls to "
      f"{late_ratio('diloco', 'time_ratio')} in time, the ensemble's to "
      f"{late_ratio('ensemble', 'time_ratio')} in time and "
      f"{late_ratio('ensemble', 'compute_ratio')} in compute (N = {_n(ens_point)}), the "
      f"PCA-routed experts' to {late_ratio('ensemble_pca_routed', 'time_ratio')} "
      f"(N = {_n(next(iter(pca_best)))} their best past D = 64); random streams stay flat "
      "with N.")


@template(REGIME, "pydocs_projection")
def pydocs_projection() -> str:
  """The docs' projection: the small model on 4 devices strongest at every D, the methods'
  ratios up to D = 32 and from D = 64, the small-model experts' at N = 2 apart."""
  name, preset, small = "pydocs_gpt2", "ib_xdr800", "ensemble_tfidf_routed_small"
  rs = rows(name, preset=preset)
  [base] = {r["baseline"] for r in rs}
  others = [r for r in rs if r["method"] != small]
  upto = [r for r in others if r["devices"] <= 32]
  late = [r for r in others if r["devices"] >= 64 and r["method_point"] != next(
      q["method_point"] for q in upto if q["method"] == r["method"])]
  [late_point] = {(r["method"], r["method_point"], round(r["time_ratio"], 2),
                   round(r["compute_ratio"], 2)) for r in late}
  [near] = {(r["method_point"], r["time_baseline"], round(r["time_ratio"], 2),
             round(r["compute_ratio"], 2)) for r in rs if r["method"] == small}
  if (any(projection.wins(r) for r in _projection(name)["rows"])
      or min(r["devices"] for r in late) != 64 or late_point[0] != "ensemble_tfidf_routed"
      or near[1] != "dp_small_model D1"):
    raise Contradicted("pydocs_projection: the docs' projection moved")
  return bullet(
      f"**Python docs** (`{name}.md`): no method wins at any D. The small model on "
      f"{projected_point(name, *base.split()).devices} devices is the strongest baseline at every "
      f"D; on {preset} the methods' time ratios are {span([r['time_ratio'] for r in upto])} "
      f"and their compute ratios {span([r['compute_ratio'] for r in upto])} up to D = 32 "
      f"(from D = 64 the tf-idf-routed experts' fastest point is N = {_n(late_point[1])}: "
      f"{x(late_point[2])} in time, {x(late_point[3])} in compute), but for the small-model "
      f"tf-idf-routed experts at N = {_n(near[0])}: {x(near[2])} in time and {x(near[3])} in "
      "compute, against the small model on one device.")


@template(REGIME, "gpt2_small_whatif")
def gpt2_small_whatif() -> str:
  """The GPT-2 small what-if: the small-model experts at N = 2 within the spread, not past
  it, with and without their pool build; every other method's loss."""
  name, small = "pydocs_gpt2_whatif_gpt2_small", "ensemble_tfidf_routed_small"
  charged = name + "_pools_charged"
  v = projected()
  gpt, gpt_charged = v["gpt"], v["gpt_charged"]
  base = projected_point(name, *gpt["time_baseline"].split())
  experts = projected_point(name, small, gpt["method_point"])
  fast = projected_point(name, *gpt["compute_baseline"].split())
  fast_s = fast.time_s(costs.INTERCONNECTS["nvlink"])
  compute = {p: row(name, method=small, preset=p, devices=8) for p in report.PRESETS}
  others = {p: [r for r in rows(name, preset=p) if r["method"] != small]
            for p in ("nvlink", "eth10g")}
  closest = max(others["eth10g"], key=lambda r: r["time_ratio"])
  (lo, hi), (blo, bhi) = experts.steps_range, base.steps_range
  if (gpt["time_baseline"] != "dp_small_model D1" or max(lo, blo) > min(hi, bhi)
      or [p for p, r in compute.items() if r["compute_ratio"] is not None] != ["nvlink", "ib_xdr800"]
      or fast_s >= gpt["method_time_s"] or projection.wins(gpt_charged)
      or closest["method"] != "ensemble_tfidf_routed"
      or any(projection.wins(r) for rs in others.values() for r in rs)):
    raise Contradicted("gpt2_small_whatif: the what-if's closest point moved")
  return bullet(
      f"**What-if GPT-2 small** (`{name}.md`): **with the pool build left out**, the "
      f"small-model tf-idf-routed experts at N = {_n(gpt['method_point'])} come within the "
      f"seeds' spread of the strongest baseline, not past it: {x(gpt['time_ratio'])} in time "
      "at their compute (against the small model on one device; "
      f"{x(gpt['time_range'][0])}-{x(gpt['time_range'][1])} over the seeds, {base.steps:g} "
      f"against {experts.steps:g} median steps whose ranges overlap) and, on nvlink and "
      f"ib_xdr800, {x(gpt['compute_ratio'])} in compute at their time (against it on "
      f"{fast.devices} devices, which is faster: {s(fast_s)} against their "
      f"{s(gpt['method_time_s'])}; {x(gpt['compute_range'][0])}-{x(gpt['compute_range'][1])}). "
      "Charged with their pool build measured on the 2-core machine (median "
      f"{s(_pool_s(charged, small, int(_n(gpt['method_point']))))}, timed by the current "
      f"code; `{charged}.md`), they take {s(gpt_charged['method_time_s'])}: "
      f"{x(gpt_charged['time_ratio'])}. As in the ResNet-50 what-if, the small model's step "
      "is scaled by its FLOPs, so it is assumed as efficient per FLOP on an H100 as GPT-2 "
      "small; the baseline it beats is that same small model. Every other method loses: on "
      f"nvlink {span([r['time_ratio'] for r in others['nvlink']])} in time, on 10 GbE "
      f"{span([r['time_ratio'] for r in others['eth10g']])} "
      f"(tf-idf-routed N = {_n(closest['method_point'])} the closest, its pool build not charged). The "
      "ensemble's evaluations reduce one log-probability per worker and token, whatever the "
      "vocabulary; its one end-of-run reduction of the full logits (for the `logits` mode "
      "and the mixture's accuracy) is an evaluation, reported beside the critical path.")

@template(REGIME, "what_this_says")
def what_this_says() -> str:
  """The page's conclusion: the measured many-worker reading, then the projection's."""
  small, v, dp = small_model_beyond(), projected(), small_dp()
  n64, beyond, dp_steps = small["n64"], small["beyond"], small["dp_steps"]
  eth, eth_charged, closest = v["eth"], v["eth_charged"], v["closest"]
  routed_points, routed_ratios = v["routed_points"], v["routed_ratios"]
  ib, ib_charged, gpt, gpt_charged = v["ib"], v["ib_charged"], v["gpt"], v["gpt_charged"]
  measured = paragraph(
      "Measured: on both embedded workloads data-parallel training stops scaling within or "
      "at the edge of the 8-device grids, so the regime the claim needs is reached; the "
      "ensemble does not win in it. Beyond the knee both curves are flat, and the ensemble's "
      "is flat higher: random streams need two to three times data-parallel's steps whatever "
      "N, and routed experts, which do gain from more workers, need as few steps as "
      "data-parallel beyond its knee but pay a pool build on the critical path on top of "
      "them. The small model's routed experts, whose steps are cheaper, reach 85% in "
      f"{s(n64['method_time_s'])} at N = 64, where the small model's own data-parallel on "
      f"{beyond[0]['devices']}-{beyond[-1]['devices']} devices needs "
      f"{dp_steps[0]:g}-{dp_steps[-1]:g} steps ({beyond[0]['baseline_time_s']:.1f}-"
      f"{s(beyond[-1]['baseline_time_s'])}, modelled).")
  modelled = paragraph(
      "Modelled: on the measured models no method point beats the strongest baseline at any "
      f"D up to {max(projection.DEVICES):,} on any preset; the closest, Fashion-MNIST's "
      f"small-model routed experts, reach {span(closest)} in time at their compute (the small "
      f"model's data-parallel, measured to {dp['measured']} devices, gets faster to "
      f"{dp['fastest']} and no faster beyond). The only wins, above "
      "1 over the seeds' range, are in the ResNet-50 what-if on 10 GbE: the small-model "
      f"routed experts, {span(eth)} ({span(eth_charged) + ' with their build charged' if eth_charged else 'none with their build charged'}), "
      f"and the PCA-routed experts at N = {listing([_n(p) for p in routed_points])}, "
      f"{listing([x(v) for v in routed_ratios])} (none with their builds charged). Within "
      "the spread, no win: on ib_xdr800 the small-model routed experts at N = "
      f"{_n(ib['method_point'])}, {x(ib['time_ratio'])} ({x(ib['time_range'][0])}-{x(ib['time_range'][1])}; "
      f"{x(ib_charged['time_ratio'])} charged); in the GPT-2 small what-if the small-model "
      f"tf-idf-routed experts at N = {_n(gpt['method_point'])}, {x(gpt['time_ratio'])} in "
      f"time ({x(gpt['time_range'][0])}-{x(gpt['time_range'][1])}) and "
      f"{x(gpt['compute_ratio'])} in compute ({x(gpt['compute_range'][0])}-"
      f"{x(gpt['compute_range'][1])}; {x(gpt_charged['time_ratio'])} in time with their build "
      "charged). The claim's ~4x less time and ~3x less compute are not reproduced anywhere "
      "this codebase can measure or model.")
  return measured + "\n\n" + modelled


# ---- samplers.md ---------------------------------------------------------------------------

SAMPLERS = "docs/results/samplers.md"
SWEEPS = ("samplers", "samplers_pydocs")  # the samplers sweep's results, per workload
WHOLE = ("random", "disjoint")  # the streams over the whole training set


def pool_builder(run: dict) -> str:
  """The pool builder a run's config names ('none': a stream over the whole set). The one
  place that reads the config field."""
  return run["config"]["distill"]["builder"]


@functools.lru_cache(maxsize=None)
def sampler_summary(sweep: str) -> dict:
  """A samplers sweep's `summary.json`: per sampler, each column's mean, min and max over its
  seeds (what its table shows)."""
  with open(os.path.join(RESULTS, sweep, "summary.json")) as f:
    return json.load(f)


def sampler_runs(sweep: str, sampler: str) -> list[dict]:
  """A sampler's runs, seed by seed."""
  return _results(f"{sweep}/{sampler}/seed*/results.json")


def mean(sweep: str, sampler: str, column: str = "accuracy") -> float:
  """A sampler's mean over its seeds, as its table row shows it."""
  return sampler_summary(sweep)[sampler][column]["mean"]


def _setting(sweep: str, sampler: str, group: str, key: str):
  """A config value every run of a sampler shares."""
  [value] = {r["config"][group][key] for r in sampler_runs(sweep, sampler)}
  return value


def _headline(run: dict) -> str:
  """A run's headline aggregation (its table row's)."""
  return config_lib.aggregation_modes(run["config"])[0]


def _points(v: float, digits: int = 0) -> str:
  """An accuracy difference in points: 0.0048 -> '0.5' (one digit)."""
  return f"{100 * v:.{digits}f}"


def _percent(v: float, digits: int = 0) -> str:
  return f"{_points(v, digits)}%"


@template(SAMPLERS, "samplers_setup")
def samplers_setup() -> str:
  """The sweeps' machine and seeds: the same seeds for every sampler of both workloads."""
  seeds = {tuple(sorted(r["config"]["seed"] for r in sampler_runs(sweep, sampler)))
           for sweep in SWEEPS for sampler in sampler_summary(sweep)}
  if len(seeds) != 1:
    raise Contradicted(f"samplers_setup: the samplers ran on different seeds {sorted(seeds)}")
  [seeds] = seeds
  clock = [sampler_summary(sweep)[sampler]["wall_time_s"]
           for sweep in SWEEPS for sampler in sampler_summary(sweep)]
  if all(c["max"] < 1.1 * c["min"] for c in clock):
    raise Contradicted("samplers_setup: the host seconds no longer vary between seeds")
  return paragraph(
      "Machine: a 2-core CPU machine, shared with other runs while these ran (so the host "
      "seconds vary between seeds; the accuracies and step counts do not depend on it). "
      f"Seeds: {len(seeds)} per sampler ({', '.join(map(str, seeds))}); mean [min, max] "
      "over seeds.")


def _proxy_kind(run: dict) -> str:
  """The proxy a pool was chosen with (runs that predate the LiPT proxy name none: the
  standard proxies)."""
  return run["distill"]["proxy"].get("kind", "standard")


def _averaged_pools(sweep: str) -> list[str]:
  """The samplers that build a pool and average their workers' logits (no routing)."""
  return [s for s in sampler_summary(sweep)
          if all(pool_builder(r) != "none" and _headline(r) != "routed"
                 for r in sampler_runs(sweep, s))]


@template(SAMPLERS, "samplers_fashion")
def samplers_fashion() -> str:
  """The Fashion-MNIST readings: no averaged pool beats the whole set, what the hardest and
  easiest pools and the coresets lose, routing's win, and what a pool costs to build."""
  sweep = "samplers"
  acc = {s: mean(sweep, s) for s in sampler_summary(sweep)}
  pools = _averaged_pools(sweep)
  closest = max(pools, key=acc.get)
  lost = {s: acc["random"] - acc[s] for s in pools}
  fraction = _setting(sweep, "craig", "distill", "fraction")
  proxies = {kind: sorted({r["distill"]["proxy"]["accuracy"] for s in pools
                           for r in sampler_runs(sweep, s) if _proxy_kind(r) == kind})
             for kind in ("standard", "lipt")}
  workers = {s: [r["final"]["worker/accuracy_mean"] for r in sampler_runs(sweep, s)]
             for s in ("kmeans", "kmeans_routed")}
  pca = [r["distill"] for r in sampler_runs(sweep, "pca_routed")]
  proxied = [r for s in sampler_summary(sweep) for r in sampler_runs(sweep, s)
             if (r.get("distill") or {}).get("proxy")]
  builds = [r["distill"]["build_time_s"] for r in proxied]
  longer = sum(r["distill"]["build_time_s"] > r["train_time_s"] for r in proxied)
  [examples] = {r["data"]["train_examples"] for r in proxied}
  [workers_n] = {r["config"]["method"]["num_workers"] for s in WHOLE
                 for r in sampler_runs(sweep, s)}
  if (max(acc[s] for s in pools) >= min(acc[s] for s in WHOLE) or closest != "craig"
      or acc["el2n_easiest"] <= acc["el2n"]
      or abs(lost["gradmatch"] - lost["lipt_gradmatch"]) > 0.03
      or max(proxies["lipt"]) >= min(proxies["standard"]) or acc["kmeans"] >= acc["random"]
      or max(acc, key=acc.get) != "kmeans_routed" or workers["kmeans"] != workers["kmeans_routed"]
      or not acc["random"] < acc["pca_routed"] < acc["kmeans_routed"]
      or any(d["proxy"] for d in pca) or 2 * longer <= len(proxied) or workers_n != 4):
    raise Contradicted("samplers_fashion: a sampler's place in the table moved")
  return "\n".join((
      bullet("With logit averaging **no pool beats drawing from the whole training set** "
             "(`random`, and `disjoint` quarters)."),
      bullet(f"CRAIG's weighted {_percent(fraction)} coreset comes closest. Keeping the "
             f"*hardest* {_percent(fraction)} by EL2N or GraNd (per class) costs "
             f"{span([lost['el2n'], lost['grand']], _points)} points; keeping the *easiest* "
             f"{_percent(fraction)} instead (`el2n_easiest`, Sorscher et al.'s advice for small "
             f"kept fractions) recovers {_points(acc['el2n_easiest'] - acc['el2n'])} of "
             f"EL2N's {_points(lost['el2n'])} points."),
      bullet("GradMatch's coreset loses "
             f"{span([lost['gradmatch'], lost['lipt_gradmatch']], _points)} points, from the "
             "standard proxies and from Ro et al.'s souped, sparse, augmented proxy "
             "(`lipt_gradmatch`) alike. The sparse proxy scores "
             f"{span(proxies['lipt'], lambda v: _points(v, 1))}% in the "
             f"{WORDS[len(proxies['lipt'])]} seeds, against "
             f"{span(proxies['standard'], lambda v: _points(v, 1))}% for the standard proxies."),
      bullet("**Routing is what makes clustered pools work.** Each worker trained on one "
             "k-means cluster of proxy embeddings is a specialist "
             f"({_percent(mean(sweep, 'kmeans', 'worker_accuracy'))} alone), and logit "
             "averaging cannot combine them; routing each test image to the workers of its "
             "nearest clusters (c-BTM's softmax(-d^2/T) over the top "
             f"{_setting(sweep, 'kmeans_routed', 'distill', 'route_top_k')}) gives the best "
             "ensemble in the table. The workers are the same; only the aggregation differs."),
      bullet("The proxy is not what makes it work: `pca_routed` clusters the top "
             f"{_setting(sweep, 'pca_routed', 'distill', 'pca_dim')} principal components of "
             "the standardised pixels (no proxy trained) and routes the same way. It is "
             f"{_points(acc['kmeans_routed'] - acc['pca_routed'], 1)} points below the proxy's "
             f"routed experts and {_points(acc['pca_routed'] - acc['random'], 1)} points above "
             f"random streams, for a pool built in "
             f"{span([d['build_time_s'] for d in pca], _whole)} s of host time "
             f"and {span([d['build_flops'] / 1e12 for d in pca], _two)} TFLOPs (the pixel "
             "covariance)."),
      bullet("Building a proxy-based pool costs "
             f"{span([b / 60 for b in builds], _whole)} minutes of host time "
             f"(proxy training, scoring {examples:,} examples, selection): more than the "
             f"ensemble's own training in {longer} of its {len(proxied)} runs.")))


@template(SAMPLERS, "samplers_pydocs")
def samplers_pydocs() -> str:
  """The Python docs' readings: the clustered workers alone and mixed uniformly, routing's
  win and its pool's cost, and the two k-means rows' workers trained alike."""
  sweep = "samplers_pydocs"
  ppl = {s: mean(sweep, s, "perplexity") for s in sampler_summary(sweep)}
  alone = {s: mean(sweep, s, "worker_perplexity") for s in ("random", "kmeans")}
  routed = sampler_runs(sweep, "kmeans_routed")
  pairs = list(zip(sampler_runs(sweep, "kmeans"), routed))
  apart = max(abs(math.exp(a["final"]["worker/nll_mean"]) - math.exp(b["final"]["worker/nll_mean"]))
              for a, b in pairs)
  [workers] = {r["config"]["method"]["num_workers"] for r in routed}
  [windows] = {r["distill"]["pool_size"] for r in routed}
  if (alone["kmeans"] <= alone["random"] or ppl["kmeans"] < ppl["random"]
      or min(ppl, key=ppl.get) != "kmeans_routed" or any(r["distill"]["proxy"] for r in routed)
      or {_headline(a) for a, _ in pairs} != {"probs"} or apart > 0.1
      or any(a["config"]["seed"] != b["config"]["seed"]
             or a["distill"]["pool_sizes"] != b["distill"]["pool_sizes"] for a, b in pairs)):
    raise Contradicted("samplers_pydocs: a sampler's place in the table moved")
  return "\n".join((
      bullet("The c-BTM pools work as c-BTM says only with routing. Each worker trained on one "
             "tf-idf cluster of the byte-level windows is worse alone than a worker on random "
             f"windows (perplexity {_two(alone['kmeans'])} against {_two(alone['random'])}), "
             f"and mixing the {WORDS[workers]} experts uniformly is no better than random "
             f"streams ({_two(ppl['kmeans'])} against {_two(ppl['random'])})."),
      bullet("Routing each position to the experts of its prefix's "
             f"{WORDS[_setting(sweep, 'kmeans_routed', 'distill', 'route_top_k')]} nearest "
             "clusters (softmax(-d^2/T), T = "
             f"{_setting(sweep, 'kmeans_routed', 'distill', 'route_temperature'):g}) gives the "
             f"lowest perplexity ({_two(ppl['kmeans_routed'])}), for a pool the two k-means rows "
             "build in "
             f"{span([r['distill']['build_time_s'] for pair in pairs for r in pair], _whole)} s "
             "(tf-idf, a sparse SVD to "
             f"{_setting(sweep, 'kmeans_routed', 'distill', 'tfidf_dim')} dimensions, "
             f"balanced k-means of {windows / 1000:.0f}k windows; no proxy)."),
      bullet("`kmeans` and `kmeans_routed` build their pools and train their workers alike "
             "(same config, same seeds, clusters of the same sizes); the runs are not "
             "bit-identical, their workers' perplexities differ by up to "
             f"{_two(apart)} within a seed, and the two rows differ in the aggregation. The "
             "same pools on the cost-vs-time grid are the `ensemble_tfidf_routed` curve "
             "([cost_vs_time.md](cost_vs_time.md)).")))


# ---- lipt.md -------------------------------------------------------------------------------

LIPT = "docs/results/lipt.md"


def lipt_runs(phase: str) -> list[dict]:
  """The LiPT pipeline's runs of one phase (full, coreset, finetune), seed by seed."""
  return _results(f"lipt/seed*/{phase}/results.json")


@template(LIPT, "lipt_setup")
def lipt_setup() -> str:
  """The pipeline's machine and seeds: every run on one device, with the same warm-up and
  evaluation cadence."""
  runs = [r for phase in ("full", "coreset", "finetune") for r in lipt_runs(phase)]
  seeds = sorted({r["config"]["seed"] for r in runs})
  shared = {(r["num_devices"], r["config"]["optim"]["warmup_epochs"],
             r["config"]["eval"]["every_steps"]) for r in runs}
  if len(shared) != 1 or {devices for devices, _, _ in shared} != {1}:
    raise Contradicted(f"lipt_setup: the runs' devices, warm-up or evaluations {shared}")
  [(_, warmup, every)] = shared
  return paragraph(
      f"Machine: a 2-core CPU machine, one device. Seeds: {', '.join(map(str, seeds))}, every "
      f"seed with the same {warmup:g}-epoch warm-up and evaluations every {every} steps.")


@functools.lru_cache(maxsize=None)
def lipt_summary() -> tuple[dict, ...]:
  """The pipeline's `summary.json`: one row per seed, as its table shows it."""
  with open(os.path.join(RESULTS, "lipt", "summary.json")) as f:
    return tuple(json.load(f))


@template(LIPT, "lipt_readings")
def lipt_readings() -> str:
  """The pipeline's readings: the proxy's accuracy, the coreset's miss of the warm-up
  target, the fine-tuning's steps, and no speedup measured."""
  from experiments import lipt_pipeline

  rows, coreset = lipt_summary(), lipt_runs("coreset")
  runs = [r for phase in ("full", "coreset", "finetune") for r in lipt_runs(phase)]
  [(fraction, warm, budget)] = {(r["config"]["distill"]["fraction"], r["target"]["value"],
                                 r["step_budget"]) for r in coreset}
  [flops] = {r["flops_per_step"] for r in runs}
  [target] = {r["target"]["value"] for r in lipt_runs("finetune")}
  steps = [r["step_time_s"] for r in runs]
  speedups = [k for r in rows for k in r if "speedup" in k]
  if (any(r["target"]["reached"] or not r["distill"]["weighted"] for r in coreset)
      or None in [r[k] for r in rows for k in ("full_steps_to_warm", "finetune_steps")]
      or speedups or max(steps) < 1.5 * min(steps)):
    raise Contradicted("lipt_readings: a phase's outcome moved")
  published = lipt_pipeline.PUBLISHED
  return "\n".join((
      bullet("The merged sparse proxy reaches "
             f"{listing([_percent(r['distill']['proxy']['accuracy']) for r in coreset])} "
             "accuracy."),
      bullet(f"The model trained on its {_percent(fraction)} GradMatch coreset "
             f"({span([r['distill']['pool_size'] for r in coreset], lambda v: f'{v:,}')} "
             f"weighted examples) never reaches the {_percent(warm)} warm-up target in the "
             f"{budget:,}-step budget in any seed "
             f"({listing([_percent(r['final']['accuracy'], 1) for r in coreset])} at the "
             f"end). Full data reaches {_percent(warm)} in "
             f"{span([r['full_steps_to_warm'] for r in rows], str)} steps."),
      bullet(f"Fine-tuning the coreset model on full data reaches {_percent(target)} after "
             f"{span([r['finetune_steps'] for r in rows], str)} more steps (full data from "
             f"scratch: {span([r['full_steps_to_target'] for r in rows], str)})."),
      bullet("So **no speedup is measured**: the pre-training and end-to-end speedups are "
             "\"not reached\" in every seed, against Ro et al.'s "
             f"{published['pretraining_speedup']:g}x / {published['end_to_end_speedup']:g}x "
             "on CIFAR-10. On this small problem a "
             f"full-data step is as cheap as a coreset step ({flops / 1e9:.2f} GFLOPs each), "
             "and the build "
             f"({span([r['build_tflops'] for r in rows], _two)} TFLOPs) is never paid back."),
      bullet("The seconds are host time on a machine shared with other jobs for part of "
             f"these runs, and not comparable across seeds: the same step took "
             f"{span(steps, _two)} s across the {WORDS[len(steps)]} runs. The step counts do "
             "not depend on that.")))


# ---- how the routed pools' build times were taken ------------------------------------------

ROUTED_STUDIES = ("fashion_mnist", "many_workers", "pydocs_gpt2", "many_workers_pydocs")


def routed_runs() -> list[dict]:
  """Every seed and tuning run of the cost-vs-time studies that read a proxy-free routed
  pool (k-means of PCA'd pixels or of tf-idf), as {study, curve, point, run, distill}."""
  out = []
  for study in ROUTED_STUDIES:
    for pattern in ("*/*/seed*/results.json", "*/*/tune/*/results.json"):
      for path in sorted(glob.glob(os.path.join(RESULTS, study, pattern))):
        d = stored.load(path).get("distill") or {}
        if d.get("cached") and d.get("builder") == "kmeans" and d.get("proxy") is None:
          curve, name, *run = os.path.relpath(path, os.path.join(RESULTS, study)).split(os.sep)
          out.append({"study": study, "curve": curve, "point": name,
                      "run": "/".join(run[:-1]), "distill": d})
  return out


@template(METHODOLOGY, "pool_retiming")
def pool_retiming() -> str:
  """Which routed runs are priced at a re-timed pool build, where and how quietly it was
  timed, and which keep the build time their own run measured."""
  runs = routed_runs()
  retimed = [r for r in runs if r["distill"].get("retimed")]
  own = [r for r in runs if not r["distill"].get("retimed")]
  checks = collections.Counter(r["distill"]["retimed"].split(" (")[0] for r in retimed)
  hosts = [r["distill"]["retimed_on"] for r in retimed if r["distill"].get("retimed_on")]
  where = ""
  if hosts:
    cpus = sorted({record_lib.describe_host(h) for h in hosts})
    loads = [h["load_average_1min"] for h in hosts]
    where = (f"; {len(hosts)} of them timed on {listing(cpus)} at a 1-minute load average "
             f"of {span(loads, _two)}")
    if len(hosts) < len(retimed):
      where += f", {len(retimed) - len(hosts)} before the host was recorded"
  calibrated = sorted({record_lib.describe_host(stored.load(path).get("host") or {})
                       for study in ROUTED_STUDIES
                       for path in glob.glob(os.path.join(RESULTS, study, "calibration", "*",
                                                          "results.json"))})
  text = (f"The calibrations that price the four cost-vs-time studies were timed on "
          f"{listing(calibrated)}. "
          f"Of the {len(runs)} seed and tuning runs of these studies that "
          f"read a proxy-free routed pool, {len(retimed)} are priced at a re-timed build ("
          + listing([f"{n} {check}" for check, n in sorted(checks.items())]) + f"){where}.")
  if own:
    by_point = collections.defaultdict(list)
    for r in own:
      by_point[f"{r['study']}/{r['curve']}/{r['point']}"].append(r["run"])
    text += (f" The other {len(own)} take the build time their own run measured, beside "
             "its training: " + listing([f"{k} ({', '.join(v)})"
                                         for k, v in sorted(by_point.items())]) + ".")
  return bullet(text)
