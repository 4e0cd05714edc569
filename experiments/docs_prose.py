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
answer fails the check instead of rewording it.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import re
import statistics
import textwrap
from typing import Callable

from ensemble_jax import costs, report, stored
from experiments import projection, rerun_plan
from experiments.sweeps import critical_batch as critical_batch_sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "experiments", "results")
README = "README.md"
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


def listing(items: list[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


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
  """Where data-parallel stops scaling (`critical_batch.stops_halving`)."""
  return critical_batch_sweep.stops_halving(summary["rows"])


def device_step(sub: str, curve: str, name: str) -> float:
  """The calibrated device step that prices a grid point's runs."""
  [step] = {r["cost"]["modelled"]["device_step_time_s"]
            for r in _results(f"{sub}/{curve}/{name}/seed*/results.json")}
  return step


def projected_point(name: str, curve: str, point: str) -> projection.Point:
  """A point of the projection `name`, to price as it does."""
  return projection.Point.from_json(next(p for p in _projection(name)["points"]
                                         if p["curve"] == curve and p["name"] == point))


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
  """The first screen's reading of the two grids (a Jinja2 template, cost_vs_time.md's
  context: the closest points and the strongest baselines by `targets.closest`)."""
  from experiments import cost_vs_time_page, docs_render
  return docs_render.render_template("readme_grids.md.j2",
                                     cost_vs_time_page.context()).rstrip("\n")


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
      "steps, each curve's fastest point at each device count against the baselines at its "
      "own compute and its own time): "
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


@template(README, "readme_regime")
def readme_regime() -> str:
  """The first screen's regime, many-worker, projection and one-GPU bullets."""
  return "\n".join((_critical_batch_bullet(), _many_workers_bullet(), _projection_bullet(),
                    _one_gpu_bullet()))


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


# ---- baselines by name ---------------------------------------------------------------------


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
  """The first screen's distilled-data bullet: the literature check (what was compared with
  what), one set's charged compute, and the best matched time ratio of the Fashion-MNIST
  grid's distilled points and of the Python docs' taught ones, charged and amortised."""
  from experiments import distillation_check as check

  lit = check.load([os.path.join(REPO, p) for p in check.COMMITTED])
  published = check.PUBLISHED_EVALUATION
  with open(os.path.join(REPO, check.BENCH)) as f:
    cases = json.load(f)
  iterations, real = check.grid_protocol()
  base = point("fashion_mnist", *report.verdict(list(grid("fashion_mnist")))["strongest"].split())
  one_set = iterations * check.iteration_flops(cases, real) / base["flops"]["median"]
  distilled, taught = _distilled(), _taught()

  def best(pts: list[dict], curves, what: str) -> str:
    b = _distilled_best(pts, curves)
    if "ahead" in b or "time" in b and b["time"][1][0] > 1:
      raise Contradicted(f"readme_distilled: {what} beats the strongest baseline")
    if "time" not in b:
      return f"{what}: none reaches the target on every seed"
    t = b["time"]
    return f"{what} {x(t[0])} ({x(t[1][0])}-{x(t[1][1])})"

  ratios = [best(list(grid("fashion_mnist")), DISTILLED, "charged"),
            best(distilled["whatif"], [c + report.AMORTISED for c in DISTILLED],
                 "amortised, a what-if,")]
  kd = [best(taught["grid"], TAUGHT, "charged"),
        best(taught["whatif"], [c + report.AMORTISED for c in TAUGHT], "amortised")]
  return bullet(
      f"**Synthetic distilled data** (distribution matching): {100 * lit['dm']['10']['curve'][-1]['mean']:.1f}% "
      f"on Fashion-MNIST at 10 images per class ({lit['protocol']['evaluation']['models']} "
      f"models on one distillation), where the DSA paper publishes "
      f"{lit['published']['dsa']['10']}% ({published['models']} models x "
      f"{published['distillations']} distillations; no distribution-matching figure is "
      f"published for Fashion-MNIST). Charged, one worker's set at the grid's {iterations} "
      f"iterations costs {one_set:.0f}x the strongest baseline's compute to the target. Best "
      f"matched time ratios, none a win: the grid's distilled points "
      f"{' and '.join(ratios)}; the Python docs' knowledge-distilled points {' and '.join(kd)}: "
      "[docs/results/distillation.md](docs/results/distillation.md).")


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
