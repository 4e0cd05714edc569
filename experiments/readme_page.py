"""README.md's generated regions: the first screen's answers, rendered from the committed JSON.

A page holds a rendered region between two marker lines,

  <!-- generated: NAME -->
  ...
  <!-- end -->

and experiments/docs_tables.py checks each against its renderer (the `prose` family) and
`--write` fills it: a number in such a paragraph cannot drift from the results. A renderer
is one function registered under its page and name; it reads only committed JSON and raises
`Contradicted` where the results no longer bear out its wording (a "no win" that became
one), so a rerun that changes the answer fails the check instead of rewording it.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import textwrap
from typing import Callable

from ensemble_jax import costs, report
from experiments import cost_vs_time_page, distillation_page, docs_render, projection, regime_page
from experiments import targets
from experiments import distillation_check as check
from experiments import docs_data as data
from experiments.distillation_page import DISTILLED, TAUGHT
from experiments.docs_data import Contradicted, grid
from experiments.sweeps import critical_batch as critical_batch_sweep

README = "README.md"
TEMPLATES: dict[str, tuple[str, Callable[[], str]]] = {}  # name -> (page, render)


def template(page: str, name: str):
  """Registers `render() -> Markdown` as the region `name` of `page`."""
  def register(render):
    if name in TEMPLATES:
      raise ValueError(f"template {name} registered twice")
    TEMPLATES[name] = (page, render)
    return render
  return register


KEEP = "\u00a0"  # joins "N = 8" and "6.3 s" while wrapping (textwrap splits on ASCII whitespace only)


def bullet(text: str) -> str:
  """A Markdown bullet wrapped at 90 columns, a number kept with its unit."""
  text = re.sub(r"(\w) = (\w)", rf"\1{KEEP}={KEEP}\2", " ".join(text.split()))
  text = re.sub(r"(\d) (s|ms|steps)\b", rf"\1{KEEP}\2", text)
  return textwrap.fill(text, 90, break_long_words=False, break_on_hyphens=False,
                       initial_indent="- ", subsequent_indent="  ").replace(KEEP, " ")


def x(v: float) -> str:
  return f"{v:.2f}x"


def s(v: float) -> str:
  return f"{v:.1f} s"


def span(values, fmt=x) -> str:
  """'a-b' over the values ('a' where they round alike)."""
  lo, hi = fmt(min(values)), fmt(max(values))
  return lo if lo == hi else f"{lo}-{hi}"


def rows(name: str, **match) -> list[dict]:
  """The projection `name`'s rows that match every key=value."""
  return [r for r in data.projection(name)["rows"] if all(r[k] == v for k, v in match.items())]


def row(name: str, **match) -> dict:
  [r] = rows(name, **match)
  return r


def projected_point(name: str, curve: str, point: str) -> projection.Point:
  """A point of the projection `name`, to price as it does."""
  return projection.Point.from_json(next(p for p in data.projection(name)["points"]
                                         if p["curve"] == curve and p["name"] == point))


def knee(summary: dict) -> dict:
  """Where data-parallel stops scaling (`critical_batch.stops_halving`)."""
  return critical_batch_sweep.stops_halving(summary["rows"])


def _n(point_name: str) -> str:
  return point_name.split("_")[0][1:]


def _workers(sub: str, curve: str, n: int) -> dict:
  """A grid's point of `curve` at N = n workers."""
  return next(p for p in grid(sub) if p["curve"] == curve and _n(p["point"]) == str(n))


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
  dp_points = {p["name"]: p for p in data.projection("fashion_mnist")["points"]
               if p["curve"] == "dp_small_model"}
  return {"n64": n64, "beyond": beyond,
          "dp_steps": [dp_points[r["time_baseline"].split()[1]]["steps"] for r in beyond]}


def small_dp() -> dict:
  """The small model's data-parallel in the projection: the most devices it was measured on
  and those of its fastest point."""
  points = [p for p in data.projection("fashion_mnist")["points"] if p["curve"] == "dp_small_model"]
  return {"measured": max(p["devices"] for p in points),
          "fastest": min(points, key=lambda p: p["steps"] * p["device_step_s"])["devices"]}


def projected() -> dict:
  """The projection's verdict: no win on the measured models, the what-ifs' wins on 10 GbE
  and their points within the spread."""
  for name in ("fashion_mnist", "pydocs_gpt2"):
    if any(projection.wins(r) for r in data.projection(name)["rows"]):
      raise Contradicted(f"a method point wins in the projection {name}")
  closest = [r["time_ratio"] for r in rows("fashion_mnist", method=SMALL_ROUTED)]
  if max(closest) < max(r["time_ratio"] or 0 for r in data.projection("fashion_mnist")["rows"]):
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
      projection.wins(r) for r in data.projection(WHATIF)["rows"] if r["preset"] != "eth10g"):
    raise Contradicted("the ResNet-50 what-if's wins moved")
  for r in (out["ib"], out["gpt"]):
    if projection.wins(r):
      raise Contradicted("a within-the-spread point now wins")
  return out


# ---- README.md -----------------------------------------------------------------------------

@template(README, "readme_answer")
def readme_answer() -> str:
  """The first screen's headline: every grid's verdict, the projection's, the ladder's
  unmeasured rungs (a Jinja2 template)."""
  return docs_render.render_template("readme_answer.md.j2", {
      **cost_vs_time_page.context(), **regime_page.context(),
      "ladder": targets.context("fashion_mnist")}).rstrip("\n")


@template(README, "readme_targets")
def readme_targets() -> str:
  """The first screen's answer at every target up to the ceiling (a Jinja2 template)."""
  return docs_render.render_template("readme_targets.md.j2",
                                     targets.context("fashion_mnist")).rstrip("\n")

@template(README, "readme_grids")
def readme_grids() -> str:
  """The first screen's reading of the two grids (a Jinja2 template, cost_vs_time.md's
  context: the closest points and the strongest baselines by `targets.closest`)."""
  return docs_render.render_template("readme_grids.md.j2",
                                     cost_vs_time_page.context()).rstrip("\n")


def _critical_batch_bullet() -> str:
  """Where data-parallel stops scaling: the knee and the fits of the critical-batch sweeps."""
  fashion, small, docs = (data.critical_batch(w) for w in ("fashion", "fashion_small_model", "pydocs"))
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
  fashion = data.critical_batch("fashion")
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
      [r for r in report.load_runs(os.path.join(data.RESULTS, H200)) if r["curve"] == SMALL_ROUTED])]
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


@template(README, "readme_distilled")
def readme_distilled() -> str:
  """The first screen's distilled-data bullet: the literature check (what was compared with
  what), one set's charged compute, and the best matched time ratio of the Fashion-MNIST
  grid's distilled points and of the Python docs' taught ones, charged and amortised."""
  lit = check.load([os.path.join(data.REPO, p) for p in check.COMMITTED])
  published = check.PUBLISHED_EVALUATION
  with open(os.path.join(data.REPO, check.BENCH)) as f:
    cases = json.load(f)
  iterations, real = check.grid_protocol()
  strongest = report.verdict(list(grid("fashion_mnist")))["strongest"]
  base = data.point("fashion_mnist", *strongest.split())
  one_set = iterations * check.iteration_flops(cases, real) / base["flops"]["median"]
  distilled, taught = distillation_page.distilled(), distillation_page.taught()

  def best(pts: list[dict], curves, what: str) -> str:
    t = targets.best_matched(pts, curves, "time")
    if t and t["range"][0] > 1 or any(r["ahead"] for c in curves for p in report.PRESETS
                                      for r in report.matched(pts, c, p)):
      raise Contradicted(f"readme_distilled: {what} beats the strongest baseline")
    if t is None:
      return f"{what}: none reaches the target on every seed"
    return f"{what} {x(t['ratio'])} ({x(t['range'][0])}-{x(t['range'][1])})"

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


