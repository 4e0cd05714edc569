"""Cost vs time to a target, from results.json files: Markdown tables and PNGs.

  python -m ensemble_jax.report RESULTS_DIR [--out=RESULTS_DIR]

A run lives in `RESULTS_DIR/<curve>/<point>/seed<k>/results.json` (what the sweep writes);
its seeds are averaged into one point of its curve. Each point is the training compute
spent until the target was first reached (y: XLA FLOPs x steps, measured) against the
critical-path time to it on the cluster the run stands for (x: modelled from the measured
device step time and the collectives of the method's compiled programs, per interconnect
preset; see `ensemble_jax.costs`). Files written before the `ib800` preset was renamed
`ib_xdr800` are read under the new name. Points where some seed missed the target are
drawn hollow and left out of the ratios.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics

from ensemble_jax import config_lib, costs

BASELINE = "data_parallel"
PRESETS = tuple(costs.INTERCONNECTS)


def load_runs(results_dir: str) -> list[dict]:
  runs = []
  for path in sorted(glob.glob(os.path.join(results_dir, "*", "*", "seed*", "results.json"))):
    with open(path) as f:
      r = json.load(f)
    curve, point, _ = os.path.relpath(os.path.dirname(path), results_dir).split(os.sep)
    t, cost = r["target"], r["cost"]
    runs.append({
        "curve": curve, "point": point, "method": r["method"], "seed": r["config"]["seed"],
        "devices": cost["modelled"]["devices"],
        "reached": bool(t["reached"]),
        "steps": cost["measured"]["steps_to_target"],
        "flops": cost["measured"]["flops_to_target"],
        "time_s": {costs.RENAMED_PRESETS.get(k, k): v
                   for k, v in cost["modelled"]["critical_path_s"].items()},
        "host_time_s": t["reached_time_s"] if t["reached"] else r["train_time_s"],
        "target": f"{t['metric']} {'<=' if t['metric'] in config_lib.LOWER_IS_BETTER else '>='} "
                  f"{t['value']}",
        "final": r["final"].get(t["metric"]),
    })
  return runs


def _spread(values: list[float]) -> dict:
  lo, hi = min(values), max(values)
  # fmean of equal floats can land an ulp outside them (a negative error bar for matplotlib)
  return {"mean": min(max(statistics.fmean(values), lo), hi), "min": lo, "max": hi}


def points(runs: list[dict]) -> list[dict]:
  """One point per (curve, point): its seeds' mean, min and max."""
  groups: dict[tuple, list] = {}
  for r in runs:
    groups.setdefault((r["curve"], r["point"]), []).append(r)
  out = []
  for (curve, point), rs in sorted(groups.items()):
    out.append({
        "curve": curve, "point": point, "devices": rs[0]["devices"], "seeds": len(rs),
        "reached": sum(r["reached"] for r in rs),
        "steps": _spread([r["steps"] for r in rs]),
        "flops": _spread([r["flops"] for r in rs]),
        "time_s": {p: _spread([r["time_s"][p] for r in rs]) for p in PRESETS},
        "host_time_s": _spread([r["host_time_s"] for r in rs]),
        "final": _spread([r["final"] for r in rs]),
    })
  return out


def pareto(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
  """The points no other point beats in both time and cost, sorted by time."""
  front, best_cost = [], float("inf")
  for time_s, flops in sorted(pts):
    if flops < best_cost:
      front.append((time_s, flops))
      best_cost = flops
  return front


def ratios(pts: list[dict], curve: str, preset: str) -> dict:
  """`curve` against data-parallel, frontier to frontier, on the seed means of the points
  that always reached the target.

  At each DP point's compute c_p: DP's fastest time at compute <= c_p over `curve`'s
  fastest time at compute <= c_p (time ratio at fixed compute); at each DP point's time
  t_p: DP's cheapest compute at time <= t_p over `curve`'s (compute ratio at fixed time).
  The best of each over the DP points is reported with the point's name ("up to"). Above
  1, `curve` is better; None where no point of `curve` is within the budget.
  """
  def done(name):
    return [(p["time_s"][preset]["mean"], p["flops"]["mean"], p["point"]) for p in pts
            if p["curve"] == name and p["reached"] == p["seeds"]]

  base, mine = done(BASELINE), done(curve)
  time_ratio = compute_ratio = None
  for t_p, c_p, name in base:
    dp_time = min(t for t, c, _ in base if c <= c_p)
    faster = [t for t, c, _ in mine if c <= c_p]
    if faster and (time_ratio is None or dp_time / min(faster) > time_ratio[0]):
      time_ratio = (dp_time / min(faster), name)
    dp_compute = min(c for t, c, _ in base if t <= t_p)
    cheaper = [c for t, c, _ in mine if t <= t_p]
    if cheaper and (compute_ratio is None or dp_compute / min(cheaper) > compute_ratio[0]):
      compute_ratio = (dp_compute / min(cheaper), name)
  return {"time_at_fixed_compute": time_ratio, "compute_at_fixed_time": compute_ratio,
          "fastest_s": min((t for t, _, _ in mine), default=None),
          "cheapest_flops": min((c for _, c, _ in mine), default=None)}


def _fmt(s: dict, scale: float = 1.0, digits: int = 1) -> str:
  return (f"{s['mean'] / scale:.{digits}f} [{s['min'] / scale:.{digits}f}, "
          f"{s['max'] / scale:.{digits}f}]")


def table(runs: list[dict]) -> str:
  pts = points(runs)
  targets = sorted({r["target"] for r in runs})
  lines = [f"Target: {', '.join(targets)}. Measured on this host: steps to target, XLA FLOPs, "
           "host train time, one device's step (cost.device_step_time_s: a calibration run "
           "timed apart; else host step / D). Modelled: the critical-path time on D devices "
           "= steps x device step + the collectives of the method's compiled programs per "
           "interconnect preset (runs without them: one ring all-reduce per step or outer "
           "step, labelled legacy) + pool building (ensemble_jax/costs.py). Each cell: "
           "mean [min, max] over seeds.", "",
           "| curve | point | D | seeds reached | steps to target | TFLOPs to target | "
           + " | ".join(f"time {p} (s)" for p in PRESETS) + " | host train s | final |",
           "|---|---|---|---|---|---|" + "---|" * len(PRESETS) + "---|---|"]
  for p in pts:
    lines.append(f"| {p['curve']} | {p['point']} | {p['devices']} | {p['reached']}/{p['seeds']} "
                 f"| {_fmt(p['steps'], digits=0)} | {_fmt(p['flops'], 1e12, 2)} | "
                 + " | ".join(_fmt(p["time_s"][q]) for q in PRESETS)
                 + f" | {_fmt(p['host_time_s'])} | {_fmt(p['final'], digits=4)} |")
  curves = sorted({p["curve"] for p in pts} - {BASELINE})
  if any(p["curve"] == BASELINE for p in pts) and curves:
    lines += ["", f"Against {BASELINE}, frontier to frontier (ratios > 1: the curve is "
              "better; the best ratio over the DP points' budgets, the point named):", "",
              "| curve | preset | fastest time (s) | cheapest TFLOPs | time ratio at fixed "
              "compute | compute ratio at fixed time |", "|---|---|---|---|---|---|"]
    for curve in curves:
      for preset in PRESETS:
        r = ratios(pts, curve, preset)
        def show(x):
          return "none within budget" if x is None else f"{x[0]:.2f}x (vs {x[1]})"
        fastest = "-" if r["fastest_s"] is None else f"{r['fastest_s']:.1f}"
        cheapest = "-" if r["cheapest_flops"] is None else f"{r['cheapest_flops'] / 1e12:.2f}"
        lines.append(f"| {curve} | {preset} | {fastest} | {cheapest} | "
                     f"{show(r['time_at_fixed_compute'])} | {show(r['compute_at_fixed_time'])} |")
  return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: str, preset: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  pts = points(runs)
  fig, ax = plt.subplots(figsize=(6.5, 4.8))
  for i, curve in enumerate(sorted({p["curve"] for p in pts})):
    color, mine = f"C{i}", [p for p in pts if p["curve"] == curve]
    for p in mine:
      t, c = p["time_s"][preset], p["flops"]
      full = p["reached"] == p["seeds"]
      ax.errorbar(t["mean"], c["mean"] / 1e12,
                  xerr=[[t["mean"] - t["min"]], [t["max"] - t["mean"]]],
                  yerr=[[(c["mean"] - c["min"]) / 1e12], [(c["max"] - c["mean"]) / 1e12]],
                  fmt="o", color=color, mfc=color if full else "none", ms=5, capsize=2,
                  label=curve if p is mine[0] else None)
    front = pareto([(p["time_s"][preset]["mean"], p["flops"]["mean"]) for p in mine
                    if p["reached"] == p["seeds"]])
    ax.plot([f[0] for f in front], [f[1] / 1e12 for f in front], color=color, lw=1)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel(f"time to target on D devices (s; modelled from measured steps, {preset})")
  ax.set_ylabel("training compute to target (TFLOPs, XLA)")
  targets = ", ".join(sorted({r["target"] for r in runs}))
  ax.set_title(f"cost vs time to {targets}; interconnect {preset}\n"
               "mean and min-max over seeds; hollow: some seed missed the target",
               fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write(results_dir: str, out: str) -> str:
  runs = load_runs(results_dir)
  if not runs:
    raise FileNotFoundError(f"no results.json under {results_dir}")
  os.makedirs(out, exist_ok=True)
  text = table(runs)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text)
  for preset in PRESETS:
    plot(runs, os.path.join(out, f"cost_vs_time_{preset}.png"), preset)
  return text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("results_dir")
  p.add_argument("--out", default="", help="where table.md and the PNGs go")
  args = p.parse_args(argv)
  try:
    print(write(args.results_dir, args.out or args.results_dir))
  except FileNotFoundError as e:
    print(f"error: {e}")
    return 2
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
