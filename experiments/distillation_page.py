"""docs/results/distillation.md's context: the distiller against the published table, what a
synthetic set costs charged, and the grids' distilled and knowledge-distilled points, from
committed JSON only. `python -m experiments.distillation_page` draws its figure."""
from __future__ import annotations

import json
import os
import statistics

from absl import app

from ensemble_jax import report
from experiments import distillation_check as check
from experiments import docs_data as data
from experiments import one_device_page, targets
from experiments.configs import fashion_mnist, pydocs_gpt2

REPO = data.REPO
FIGURE = "experiments/results/distillation/distillation.png"
DISTILLED = ("ensemble_distilled", "ensemble_distilled_warm")


def _baseline_runs(runs: list[dict]) -> list[dict]:
  baselines = report.baseline_curves(report.points(runs))
  return [r for r in runs if r["curve"] in baselines]


def _study(pts: list[dict], runs: list[dict], base: list[dict], curves, planned: dict) -> dict:
  """A study's `curves`' points, all its points (`grid`), the amortised what-if's beside the
  `base` runs' (`whatif`), and the points `planned` ({curve: points}) has with no seed yet."""
  ran = {(p["curve"], p["point"]) for p in pts}
  return {"points": [p for p in pts if p["curve"] in curves], "grid": pts, "runs": runs,
          "whatif": report.points(base + report.amortised(runs)),
          "waiting": sorted(f"{c} {q}" for c, qs in planned.items() for q in qs
                            if (c, q) not in ran)}


def distilled() -> dict:
  """The Fashion-MNIST grid's distilled curves (`_study`)."""
  runs = report.load_runs(os.path.join(data.RESULTS, "fashion_mnist"))
  return _study(list(data.grid("fashion_mnist")), runs, _baseline_runs(runs), DISTILLED,
                {c: fashion_mnist.sweep_grid("full")[c] for c in DISTILLED})


def taught() -> dict:
  """The Python docs' knowledge-distilled curve (`pydocs_gpt2_kd`) beside its grid's baselines."""
  base = _baseline_runs(report.load_runs(os.path.join(data.RESULTS, "pydocs_gpt2")))
  kd = report.load_runs(os.path.join(data.RESULTS, "pydocs_gpt2_kd"))  # none before it runs
  return _study(report.points(base + kd), kd, base, ("ensemble_kd",), pydocs_gpt2.sweep_grid("kd"))


def _protocol(paths: list[str]) -> dict:
  """A committed check (`distillation_check.load`): its record, protocol and tables."""
  record = check.load([os.path.join(REPO, p) for p in paths])
  return {"record": record, **record["protocol"], "table": check.table(record).rstrip("\n"),
          "curve": check.curve_table(record).rstrip("\n")}


def literature() -> dict:
  """The H200 check (the papers' protocol) beside the published columns, per images per
  class: the distilled set's last evaluation beside DC's and DSA's."""
  lit = _protocol(check.COMMITTED)
  dm, pub = lit["record"]["dm"], lit["record"]["published"]
  rows = [{"ipc": int(ipc), "dm": 100 * dm[ipc]["curve"][-1]["mean"], "dsa": pub["dsa"][ipc],
           "dc": pub["dc"][ipc], "s_per_iteration": dm[ipc].get("s_per_iteration")}
          for ipc in sorted(dm, key=int)]
  return {**lit, "rows": rows, "by_ipc": {r["ipc"]: r for r in rows},
          "device": lit["record"]["device"], "published_evaluation": check.PUBLISHED_EVALUATION}


def reduced() -> dict:
  """The grid's reduced protocol (CPU): its set, its evaluation and its loss curve."""
  red = _protocol([check.REDUCED])
  return {**red, "loss": check.loss_table(red["record"]).rstrip("\n")}


def one_set() -> dict:
  """One worker's set at the grid's protocol, in FLOPs, over the strongest baseline's."""
  with open(os.path.join(REPO, check.BENCH)) as f:
    cases = json.load(f)
  iterations, real = check.grid_protocol()
  strongest = report.verdict(list(data.grid("fashion_mnist")))["strongest"]
  base = data.point("fashion_mnist", *strongest.split())
  return {"cases": cases, "iterations": iterations, "real": real, "strongest": strongest,
          "strongest_name": data.point_name(*strongest.split()),
          "one_set": iterations * check.iteration_flops(cases, real) / base["flops"]["median"]}


def cost() -> dict:
  """`one_set`, and an iteration's time beside a training step's on this CPU and the H200."""
  c = one_set()
  [h200] = [r for r in one_device_page.context()["rows"]
            if (r["curve"], r["point"]) == ("data_parallel", "B64")]
  # the calibrated device step that prices the strongest baseline's runs
  [cpu_step] = {r["cost"]["modelled"]["device_step_time_s"] for r in data.results(
      f"fashion_mnist/{c['strongest'].replace(' ', '/')}/seed*/results.json")}
  return {**c, "cpu_step_s": cpu_step,
          "cpu_iteration_s": next(x["s_per_iteration"] for x in c["cases"]
                                  if x["workers"] == 1 and x["real_per_class"] == c["real"]),
          "h200_step_ms": h200["step_ms"], "h200_step_name": h200["name"],
          "table": check.committed_cost_table(REPO).rstrip("\n"),
          "time_table": check.time_table(c["cases"]).rstrip("\n")}


def _ratio(rows: list[dict], point: str, kind: str) -> dict:
  """A point's matched `kind` ratio ({ratio, range, verdict}), its margin where no baseline
  is within its budget (`report.beyond`: `margin`, `ahead` where that holds on every seed),
  or why it has neither."""
  [row] = [r for r in rows if r["point"] == point]
  if row[kind] is not None:
    (ratio, _), spread = row[kind], row[f"{kind}_range"]
  elif kind in row["margin"]:
    ratio, _, spread = row["margin"][kind]
  else:  # it missed the target on some seed, or no baseline reached it
    return {"ratio": None, "verdict": targets.verdict_word(None, None),
            "why": row["why"] or "no baseline reached the target"}
  ahead = kind in row["ahead"]
  return {"ratio": ratio, "range": list(spread), "kind": kind, "margin": row[kind] is None,
          "ahead": ahead, "verdict": "beats" if ahead else targets.verdict_word(ratio, spread)}


def _best(rows: list[dict], key: str) -> dict | None:
  """The best `key` ratio of the rows (one ahead of every baseline first); None: all missed."""
  best = max((r for r in rows if r[key]["ratio"] is not None),
             key=lambda r: (r[key].get("ahead", False), r[key]["ratio"]), default=None)
  return best and {**best[key], "name": best["name"]}


def study(s: dict, reused) -> dict:
  """A `_study`'s points, charged and amortised on 10 GbE, each ratio with its verdict, and
  the best of each; `reused(point)`: what amortising leaves out, in seconds."""
  rows = []
  for p in s["points"]:
    charged = report.matched(s["grid"], p["curve"], "eth10g")
    amortised = report.matched(s["whatif"], p["curve"] + report.AMORTISED, "eth10g")
    [a] = [q for q in s["whatif"] if q["curve"] == p["curve"] + report.AMORTISED
           and q["point"] == p["point"]]
    rows.append({**p, "name": data.point_name(p["curve"], p["point"]),
                 "final": p["final"]["median"], "reused_s": reused(p),
                 "charged_s": p["time_s"]["eth10g"]["median"],
                 "amortised_s": a["time_s"]["eth10g"]["median"],
                 "charged": _ratio(charged, p["point"], "time"),
                 "amortised": _ratio(amortised, p["point"], "time"),
                 "amortised_compute": _ratio(amortised, p["point"], "compute")})
  return {"rows": rows, "waiting": s["waiting"], "best_charged": _best(rows, "charged"),
          "best_amortised": _best(rows, "amortised")}


def step_pricing() -> dict:
  """The curves the distilled curves' steps are priced like (`cost.price_like`), how many
  of their runs' prices hold the augmentation of their synthetic examples, and its timed
  factors (`cost_vs_time.augment_factor`'s record)."""
  runs = [r for c in DISTILLED for r in data.stored_runs(f"fashion_mnist/{c}/*/seed*/results.json")]
  factors = ("fashion_mnist", "calibration", "augment_factors.json")
  timed = os.path.exists(os.path.join(data.RESULTS, *factors))
  return {"runs": len(runs), "factors": list(data.load_json(*factors).values()) if timed else [],
          "augmented": sum("augmentation's cost" in r["cost"]["modelled"]["device_step_model"]
                           for r in runs),
          "like": sorted({r["config"]["cost"]["price_like"].split("/")[0] for r in runs
                          if r["config"]["cost"].get("price_like")})}


def answer() -> dict:
  """What the page opens with, README.md's distilled region too (`_macros.j2`'s distilled)."""
  return {"literature": literature(), "cost": one_set(),
          "distilled": study(distilled(), lambda p: None),
          "taught": study(taught(), lambda p: None)}


def context() -> dict:
  grid, kd, lit = distilled(), taught(), literature()
  teacher = {(r["curve"], r["point"]): r["teacher_s"]["eth10g"] for r in kd["runs"]}
  return {"literature": lit, "reduced": reduced(), "cost": cost(),
          "distilled": study(grid, lambda p: statistics.median(  # every seed's build
              r["pool_build_s"] for r in grid["runs"]
              if (r["curve"], r["point"]) == (p["curve"], p["point"]))),
          "taught": study(kd, lambda p: teacher[(p["curve"], p["point"])]),
          "kd_target": next(r["target_value"] for r in kd["runs"]),
          "target": grid["runs"][0]["target_value"],
          "step_pricing": step_pricing(), "figure": FIGURE}


def plot(ctx: dict, path: str) -> None:
  """Left: the distilled sets' test accuracy along the distillation, the published DSA and
  DC figures dashed. Right: each distilled and taught point's matched time ratio on 10 GbE,
  charged and amortised (median, seeds' range), the 1x line."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  lit = ctx["literature"]["record"]
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
  for i, ipc in enumerate(sorted(lit["dm"], key=int)):
    color, curve = f"C{i}", lit["dm"][ipc]["curve"]
    left.errorbar([max(c["iteration"], 1) for c in curve], [100 * c["mean"] for c in curve],
                  yerr=[100 * c["std"] for c in curve], marker="o", color=color,
                  label=f"{ipc} per class")
    left.axhline(lit["published"]["dsa"][ipc], color=color, ls="--", lw=0.8)
    left.axhline(lit["published"]["dc"][ipc], color=color, ls=":", lw=0.8)
  left.set(xscale="log", xlabel="distillation iterations (0 at 1)", ylabel="test accuracy (%)")
  left.set_title("dashed: published DSA, dotted: published DC", fontsize=8)
  left.legend(fontsize=7)
  rows, labels = ctx["distilled"]["rows"] + ctx["taught"]["rows"], []
  for x, row in enumerate(rows):
    for kind, marker, color, shift in (("charged", "o", "C0", -0.15),
                                       ("amortised", "s", "C1", 0.15)):
      r = row[kind]
      if r["ratio"] is not None:
        right.errorbar([x + shift], [r["ratio"]], fmt=marker, capsize=3, color=color,
                       yerr=[[r["ratio"] - r["range"][0]], [r["range"][1] - r["ratio"]]],
                       label=kind if kind not in right.get_legend_handles_labels()[1] else None)
    if row["charged"]["ratio"] is None:
      right.text(x, 1.0, " missed", rotation=90, va="top", ha="center", fontsize=7)
    short = {"ensemble_distilled_warm": "warm"}.get(row["curve"], row["curve"][9:])
    labels.append(f"{short}\n{row['point'].split('_')[0]}")
  right.axhline(1.0, color="black", lw=0.8, ls="--")
  right.set(yscale="log", ylabel="matched time ratio, 10 GbE")
  right.set_xticks(range(len(rows)), labels, fontsize=6)
  report.plain_log_ticks(right, "y")
  right.legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=120, metadata={"Software": None})
  plt.close(fig)


if __name__ == "__main__":
  app.run(lambda argv: plot(context(), os.path.join(REPO, FIGURE)))
