"""Cost vs time to a target, from results.json files: a Markdown table and a PNG.

  python -m ensemble_jax.report RESULTS_DIR [--out=RESULTS_DIR]

Each run is one point: training time until its target was first reached (x) against the
compute spent until then (y, FLOPs from XLA = flops_per_step x steps). Runs that never
reached the target are listed with their totals and drawn hollow. Times are measured on
the host that ran them (see each run's `cost.measured.where`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os


def load_runs(results_dir: str) -> list[dict]:
  runs = []
  for path in sorted(glob.glob(os.path.join(results_dir, "**", "results.json"), recursive=True)):
    with open(path) as f:
      r = json.load(f)
    t = r["target"]
    reached = bool(t["reached"])
    steps = t["reached_step"] if reached else r["steps"]
    runs.append({
        "run": os.path.relpath(os.path.dirname(path), results_dir),
        "method": r["method"],
        "workers": r.get("num_workers", 1),
        "seed": r["config"]["seed"],
        "reached": reached,
        "time_s": t["reached_time_s"] if reached else r["train_time_s"],
        "flops": (r["flops_per_step"] or 0.0) * steps,
        "metric": f"{t['metric']} {'<=' if t['metric'] in ('nll', 'perplexity') else '>='} "
                  f"{t['value']}",
        "final": r["final"].get(t["metric"]),
    })
  return runs


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
  """The points no other point beats in both time and cost, sorted by time."""
  front, best_cost = [], float("inf")
  for time_s, flops in sorted(points):
    if flops < best_cost:
      front.append((time_s, flops))
      best_cost = flops
  return front


def table(runs: list[dict]) -> str:
  lines = ["| run | method | workers | seed | target | reached | time to target (s) | "
           "TFLOPs to target | final |", "|---|---|---|---|---|---|---|---|---|"]
  for r in runs:
    lines.append(f"| {r['run']} | {r['method']} | {r['workers']} | {r['seed']} | {r['metric']} "
                 f"| {'yes' if r['reached'] else 'no'} | {r['time_s']:.1f} | "
                 f"{r['flops'] / 1e12:.2f} | {r['final']:.4f} |")
  by_method: dict[str, list] = {}
  for r in runs:
    if r["reached"]:
      by_method.setdefault(r["method"], []).append((r["time_s"], r["flops"]))
  if by_method:
    lines += ["", "| method | fastest time to target (s) | cheapest TFLOPs to target | "
              "Pareto points |", "|---|---|---|---|"]
    for method, points in sorted(by_method.items()):
      lines.append(f"| {method} | {min(p[0] for p in points):.1f} | "
                   f"{min(p[1] for p in points) / 1e12:.2f} | {len(pareto(points))} |")
  return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: str, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4.5))
  for i, method in enumerate(sorted({r["method"] for r in runs})):
    color = f"C{i}"
    mine = [r for r in runs if r["method"] == method]
    done = [r for r in mine if r["reached"]]
    ax.scatter([r["time_s"] for r in done], [r["flops"] / 1e12 for r in done], color=color,
               label=method)
    ax.scatter([r["time_s"] for r in mine if not r["reached"]],
               [r["flops"] / 1e12 for r in mine if not r["reached"]], facecolors="none",
               edgecolors=color)
    front = pareto([(r["time_s"], r["flops"]) for r in done])
    if len(front) > 1:
      ax.plot([p[0] for p in front], [p[1] / 1e12 for p in front], color=color)
  ax.ticklabel_format(useOffset=False, style="plain")
  ax.set_xlabel("training time to target (s, measured)")
  ax.set_ylabel("training compute to target (TFLOPs, XLA)")
  ax.set_title(title, fontsize=9)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("results_dir")
  p.add_argument("--out", default="", help="where table.md and cost_vs_time.png go")
  args = p.parse_args(argv)
  runs = load_runs(args.results_dir)
  if not runs:
    print(f"error: no results.json under {args.results_dir}")
    return 2
  out = args.out or args.results_dir
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table(runs))
  metrics = sorted({r["metric"] for r in runs})
  plot(runs, os.path.join(out, "cost_vs_time.png"),
       f"cost vs time to target ({', '.join(metrics)}); hollow: not reached")
  print(table(runs))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
