"""Data-parallel's critical batch: steps to a target vs global batch B, with the gradient
noise scale B_simple measured alongside (McCandlish et al., 2018).

  python -m experiments.sweeps.critical_batch --workload=fashion \
      [--workdir=experiments/results/critical_batch/fashion] [--seeds=0,1,2] \
      [--grid=full|smoke] [--batches=64,128,...]

DP at D devices with 64 examples each is trained as one model at global batch B = 64 D,
the D devices' parts as D microbatches (`config.train.microbatches = D`): the same math as
D devices, one after another, and memory for one device's part only. BatchNorm therefore
normalises over each simulated device's 64 examples at every B (ghost batch norm, as in
Shallue et al., 2018), so B changes nothing but the batch. Every point with D >= 2 also
records the noise scale (`config.train.noise_scale`: small batch one device's 64, big batch
B); results.json's `noise_scale.b_simple_at_target` is read at the eval that reached the
target.

Each point's budget is the workload's example budget or `min_steps` steps, whichever is
more (large batches need a floor of steps), warm-up a fixed fraction of it, an eval every
1% of it (every step at most), `train.stop_at_target` on. The learning rate is tuned per B
by the cost-vs-time sweep's one rule (`experiments/sweeps/tuning.py`, the config's `tune`:
x{1/2, 1, 2} the workload's scaled rate on seed 0, extended while the best sits at an
edge; fewest steps to target wins), tuning-before-seeds and seeds outermost as there, with
one warm start: B's first grid also holds the factor the next smaller B chose. The
configured rate grows as sqrt(B), which past the critical batch overshoots (measured, the
docs at B = 2,048: x1/2 and x1 took 260 and 240 steps, where B = 1,024 reached the target
in 124 at x1/4, a factor the plain grid never tries), and the steps-vs-rate curve is too
flat and noisy up there for the edge rule alone to walk down to it. The warm start only
adds runs, so DP is tuned at least as well as by the plain rule. Runs that can no longer
be chosen stop early (`tune.stop_losers`: the warm-start factor trains first; a later run
that has not reached the target by the first eval at or past its steps stops there), which
leaves the choice as full runs would. A seed run trained at
other values than a retuned point's choice moves to `B<B>/superseded/` and runs again.
Runs live in `<workdir>/B<B>/tune/lr<value>/` (tuning, seed 0) and `<workdir>/B<B>/seed<k>/`
(seed 0's is the chosen tuning run, copied); `B<B>/tuning.json` records the grid, the
choice and the tuning compute. A run whose results.json exists is read back, a
half-finished one resumes from its checkpoint. Afterwards `summary.json`, `table.md` and
`critical_batch.png` (steps to target vs B, log-log, the perfect-scaling line,
McCandlish's S = S_min (1 + B_crit / B) fitted, and B_simple marked) are written from
whatever runs exist (before the seeds run, a tuned B's chosen tuning run stands for its
seed 0); `--report_only` writes them without training, e.g. while the sweep runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib
import json
import math
import os
import statistics

import ml_collections

from ensemble_jax import config_lib
from ensemble_jax import optim as optim_lib
from ensemble_jax import run as run_lib
from experiments import sweeps
from experiments.sweeps import tuning


@dataclasses.dataclass(frozen=True)
class Workload:
  """One critical-batch workload: a config variant and the sweep's rules for it."""
  config_module: str  # experiments.configs.<name>: get_config(variant)
  variant: str
  per_device: int  # examples per simulated device (and per microbatch): D = B / per_device
  batches: tuple[int, ...]  # global batches B
  budget_examples: int  # each point trains max(budget_examples / B, min_steps) steps
  min_steps: int
  warmup_fraction: float = 0.05  # of the point's own budget
  evals_per_budget: int = 100  # an eval every budget / this steps (at least every step)
  # a checkpoint every budget / this steps: a run cut off (a session's end, SIGKILL) loses at
  # most that much (docs B = 8,192: 25 steps, ~5 minutes here)
  checkpoints_per_budget: int = 16
  tune: tuple = ()  # (config key, value) overrides of the config's `tune`


def _powers(lo: int, hi: int) -> tuple[int, ...]:
  return tuple(lo * 2**i for i in range(int(math.log2(hi // lo)) + 1))


# Tuning runs that can no longer be chosen stop early (same choice, less compute). Turned on
# during the docs' B = 4,096 tuning (its x2 and x1/16 stopped); the runs before ran in full.
STOP_LOSERS = (("tune.stop_losers", True),)
WORKLOADS = {
    # fashion_mnist.py `sweep`: ResNet-18 width 8, target 85% on 2,000 test images; budget
    # 2 epochs (its DP curve's), at least 200 steps.
    "fashion": Workload("experiments.configs.fashion_mnist", "sweep", 64, _powers(64, 16384),
                        budget_examples=120_000, min_steps=200, tune=STOP_LOSERS),
    # pydocs_gpt2.py `sweep`: GPT-2 tiny, 128-byte windows, target perplexity 12; budget
    # its D = 1 run's 1,200 x 16 windows, at least 400 steps: B = 64 needs ~190 and more
    # windows barely cut that (the grid's DP: 172 steps at 64, 157 at 128), so a 200-step
    # floor (measured: B = 128 ended at perplexity 13.8 at its best rate) left no room.
    "pydocs": Workload("experiments.configs.pydocs_gpt2", "sweep", 64, _powers(64, 8192),
                       budget_examples=19_200, min_steps=400, tune=STOP_LOSERS),
}
# The sweep's own test: seconds on 8 fake CPU devices (fashion_mnist.py `smoke`).
SMOKE = Workload("experiments.configs.fashion_mnist", "smoke", 8, (8, 16), budget_examples=32,
                 min_steps=4, evals_per_budget=2, checkpoints_per_budget=2,
                 tune=(("tune.factors", (1.0, 2.0)), ("tune.max_extensions", 0)) + STOP_LOSERS)


def workload_for(name: str, grid: str) -> Workload:
  if grid == "smoke":
    return SMOKE
  if grid != "full":
    raise SystemExit(f"error: unknown --grid={grid!r}; choose full or smoke")
  return WORKLOADS[name]


def budget_steps(w: Workload, batch: int) -> int:
  return max(math.ceil(w.budget_examples / batch), w.min_steps)


def point_config(w: Workload, batch: int, seed: int):
  """One (B, seed) run at the workload's scaled learning rate (tuning scales it): D = B /
  per_device devices as D microbatches."""
  config = importlib.import_module(w.config_module).get_config(w.variant)
  devices = batch // w.per_device
  steps = budget_steps(w, batch)
  config.seed = seed
  config.train.batch_size = batch
  config.train.microbatches = devices
  config.train.noise_scale = devices > 1  # two batch sizes: one device's and B
  config.train.num_epochs, config.train.num_steps = 0.0, steps
  config.train.stop_at_target = True
  config.optim.warmup_fraction = w.warmup_fraction
  config.eval.every_steps = max(1, steps // w.evals_per_budget)
  config.checkpoint.every_steps = max(1, steps // w.checkpoints_per_budget)
  # D devices split the eval batch too: the workload's, rounded up to a multiple of D (the
  # last batch is padded and masked, so the metrics are the same).
  config.eval.batch_size = math.ceil(config.eval.batch_size / devices) * devices
  config.cost.devices = devices
  for key, value in w.tune:
    config_lib.set_dotted(config, key, value)
  config_lib.validate(config)
  return config


def _point_dir(workdir: str, batch: int) -> str:
  return os.path.join(workdir, f"B{batch}")


def _load(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _steps_to_target(results: dict) -> int | None:
  return results["target"]["reached_step"] if results["target"]["reached"] else None


def run(workload: str, workdir: str, seeds: list[int], grid: str = "full",
        batches: list[int] | None = None) -> dict[str, int]:
  """Tunes every B's learning rate on seed tune.seed, then trains every seed not finished
  yet (seeds outermost); writes the summary, table and figure; returns the run counts
  (`tuning_runs`, `trained`, `from_tuning`, `skipped`, `diverged`, as the cost-vs-time
  sweep's)."""
  w = workload_for(workload, grid)
  batches = list(batches or w.batches)
  for b in batches:
    if b % w.per_device:
      raise SystemExit(f"error: batch {b} is not a multiple of the per-device {w.per_device}")
  counts = dict.fromkeys(("tuning_runs", "trained", "from_tuning", "skipped", "diverged"), 0)
  tuned = {}
  for batch in sorted(batches):  # every B tuned before any other seed trains, small B first
    base = point_config(w, batch, seed=0)
    base.seed = base.tune.seed
    previous, warm_start = _warm_start(workdir, w, batch, tuned)
    chosen, record = tuning.tune(base, _point_dir(workdir, batch), lambda c, run_dir:
                                 tuning.train_run(c, run_dir, counts, "tuning_runs"),
                                 warm_start=warm_start)
    if previous is not None:
      record["warm_start_from_batch"] = previous
    tuned[batch] = chosen, record
    tuning.write_record(_point_dir(workdir, batch), record)
  for seed in seeds:  # seeds outermost: an interrupted sweep has whole seeds of every B
    for batch, (chosen, record) in tuned.items():
      tuning.run_seed(chosen, record, _point_dir(workdir, batch), seed, counts)
  write_report(summarize(workdir, w), workdir)  # every B finished there, not only these
  return counts


def _warm_start(workdir: str, w: Workload, batch: int,
                tuned: dict) -> tuple[int | None, dict[str, float]]:
  """(B', {key: factor}): the next smaller batch B' of the workload and the factors of the
  configured rates it chose, which B's first grid holds too (None, {} at the smallest B).
  Read from this sweep's tuning or B''s tuning.json."""
  smaller = [b for b in w.batches if b < batch]
  if not smaller:
    return None, {}
  previous = max(smaller)
  record = (tuned[previous][1] if previous in tuned else
            _load(os.path.join(_point_dir(workdir, previous), tuning.TUNING_FILE)))
  if record is None:
    raise SystemExit(f"error: B = {batch}'s tuning starts from the rate B = {previous} chose, "
                     f"and {_point_dir(workdir, previous)} has no {tuning.TUNING_FILE}: add "
                     f"{previous} to --batches (its finished runs are read back, not retrained)")
  return previous, {a["key"]: a["chosen"] / a["base"] for a in record["axes"]}


def fit_critical_batch(points: list[tuple[int, float]]) -> dict | None:
  """McCandlish et al.'s S(B) = S_min (1 + B_crit / B), least squares in 1 / B:
  S = S_min + (S_min B_crit) / B. None with fewer than 2 points or a non-positive fit."""
  if len(points) < 2:
    return None
  xs = [1.0 / b for b, _ in points]
  ys = [s for _, s in points]
  mx, my = statistics.fmean(xs), statistics.fmean(ys)
  sxx = sum((x - mx)**2 for x in xs)
  if sxx == 0:
    return None
  slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
  s_min = my - slope * mx
  if s_min <= 0 or slope <= 0:
    return None
  return {"s_min": s_min, "b_crit": slope / s_min}


def summarize(workdir: str, w: Workload) -> dict:
  """Per B of `w` finished under `workdir` (so a sweep over some B adds rows): the chosen
  learning rate, steps to target per seed, B_simple; the fitted knee."""
  rows, first_run = [], None  # first_run: any run's results, for the target's name
  for batch in w.batches:
    record = _load(os.path.join(_point_dir(workdir, batch), tuning.TUNING_FILE))
    if record is None:
      continue
    runs = {}
    for path in sorted(glob.glob(os.path.join(_point_dir(workdir, batch), "seed*",
                                              run_lib.RESULTS_FILE))):
      runs[int(os.path.basename(os.path.dirname(path)).removeprefix("seed"))] = _load(path)
    if record["seed"] not in runs:  # seeds not started yet: the tuning seed is the chosen run
      chosen = _load(os.path.join(_point_dir(workdir, batch), record["chosen_run"],
                                  run_lib.RESULTS_FILE))
      if chosen is not None:
        runs[record["seed"]] = chosen
    if not runs:
      continue
    steps = {s: _steps_to_target(r) for s, r in runs.items()}
    reached = [v for v in steps.values() if v is not None]
    noise = [r["noise_scale"].get("b_simple_at_target") for r in runs.values()
             if "noise_scale" in r]
    noise = [v for v in noise if v is not None and math.isfinite(v)]
    first = next(iter(runs.values()))
    first_run = first_run or first
    rows.append({
        "batch": batch, "devices": batch // w.per_device,
        "microbatches": first["config"]["train"]["microbatches"],
        "lr_factor": record["axes"][0]["chosen"] / record["axes"][0]["base"],
        "lr_at_edge": record["axes"][0]["at_edge"],
        "tuning_runs": record["compute"]["runs"],
        "tuning_flops": record["compute"]["flops"],
        "peak_learning_rate": _peak_lr(first["config"]),
        "step_budget": first["step_budget"],
        "steps_to_target": {str(s): v for s, v in sorted(steps.items())},
        "seeds": len(runs), "seeds_reached": len(reached),
        "median_steps": statistics.median(reached) if len(reached) == len(runs) else None,
        "min_steps": min(reached) if reached else None,
        "max_steps": max(reached) if reached else None,
        "b_simple_at_target": statistics.median(noise) if noise else None,
        # the evals a run took to its target (the projection charges their collectives)
        "evals_to_target": (statistics.median(
            r["cost"]["modelled"]["units_to_target"]["eval"] for r in runs.values())
            if len(reached) == len(runs) else None),
        "step_time_s": statistics.median(r["step_time_s"] for r in runs.values()),
    })
  measured = [(r["batch"], r["median_steps"]) for r in rows if r["median_steps"] is not None]
  noise = [r["b_simple_at_target"] for r in rows if r["b_simple_at_target"] is not None]
  target = (f"{first_run['target']['metric']} {first_run['target']['value']}" if first_run
            else "")
  return {"target": target,
          "tuning_rule": tuning.rule(True, dict(w.tune).get("tune.stop_losers", False)),
          "per_device": w.per_device, "rows": rows,
          "fit": fit_critical_batch(measured),
          "b_simple": statistics.median(noise) if noise else None,
          "note": ("steps to target: median over seeds, only where every seed reached it; "
                   "B_simple: median over batches of the per-B median at the target eval")}


def _peak_lr(config: dict) -> float:
  return optim_lib.peak_learning_rate(ml_collections.ConfigDict(config["optim"]),
                                      config["train"]["batch_size"])


def table(summary: dict) -> str:
  fit = summary["fit"]
  lines = [f"Target: {summary['target']}. DP at D = B / {summary['per_device']} devices, "
           "simulated as D microbatches. Steps to target: median over seeds (min-max); "
           "'-' where a seed missed it.", "",
           "| B | D | lr x (tuned) | peak lr | steps to target | perfect scaling "
           "| B_simple at target |",
           "|---|---|---|---|---|---|---|"]
  base = next((r for r in summary["rows"] if r["median_steps"] is not None), None)
  for r in summary["rows"]:
    if r["median_steps"] is not None:
      steps = f"{r['median_steps']:g} ({r['min_steps']}-{r['max_steps']}, {r['seeds']} seeds)"
    else:
      steps = f"- ({r['seeds_reached']}/{r['seeds']} seeds reached)"
    ideal = (f"{base['median_steps'] * base['batch'] / r['batch']:.1f}" if base else "-")
    noise = f"{r['b_simple_at_target']:.0f}" if r["b_simple_at_target"] is not None else "-"
    factor = f"{r['lr_factor']:g}" + (" (edge)" if r["lr_at_edge"] else "")
    lines.append(f"| {r['batch']} | {r['devices']} | {factor} | "
                 f"{r['peak_learning_rate']:.3g} | {steps} | {ideal} | {noise} |")
  lines.append("")
  if fit:
    lines.append(f"Fitted S(B) = S_min (1 + B_crit / B): S_min = {fit['s_min']:.1f} steps, "
                 f"B_crit = {fit['b_crit']:.0f}.")
  if summary["b_simple"] is not None:
    lines.append(f"Gradient noise scale B_simple (measured, McCandlish et al. 2018): "
                 f"{summary['b_simple']:.0f}.")
  return "\n".join(lines) + "\n"


def figure(summary: dict, path: str) -> None:
  """Steps to target vs B on log-log axes, each point labelled with its device count."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from ensemble_jax import report

  rows = [r for r in summary["rows"] if r["median_steps"] is not None]
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  labels = []
  if rows:
    bs = [r["batch"] for r in rows]
    med = [r["median_steps"] for r in rows]
    err = [[m - r["min_steps"] for m, r in zip(med, rows)],
           [r["max_steps"] - m for m, r in zip(med, rows)]]
    seeds = max(r["seeds"] for r in rows)
    ax.errorbar(bs, med, yerr=err, fmt="o-", color="C0", capsize=3,
                label="data-parallel (median, min-max over seeds)" if seeds > 1
                else "data-parallel (one seed)")
    labels = [(b, m, f"D{r['devices']}", "C0") for b, m, r in zip(bs, med, rows)]
    ax.plot(bs, [med[0] * bs[0] / b for b in bs], "--", color="gray",
            label="perfect scaling")
    if fit := summary["fit"]:
      grid = [bs[0] * (bs[-1] / bs[0])**(i / 50) for i in range(51)]
      ax.plot(grid, [fit["s_min"] * (1 + fit["b_crit"] / b) for b in grid], ":", color="C1",
              label=f"S_min (1 + B_crit / B), B_crit = {fit['b_crit']:.0f}")
  if summary["b_simple"] is not None:
    ax.axvline(summary["b_simple"], color="C3", alpha=0.7,
               label=f"B_simple = {summary['b_simple']:.0f} (measured)")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  report.plain_log_ticks(ax)
  ax.set_xlabel(f"global batch B (D = B / {summary['per_device']} devices)")
  ax.set_ylabel("steps to target")
  ax.set_title(f"Data-parallel's critical batch ({summary['target']})")
  ax.legend(fontsize=8)
  fig.tight_layout()
  report.label_points(ax, labels)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(summary: dict, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(table(summary))
  figure(summary, os.path.join(workdir, "critical_batch.png"))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workload", default="fashion", choices=sorted(WORKLOADS))
  p.add_argument("--workdir", default="",
                 help="default experiments/results/critical_batch/<workload>")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--grid", default="full", help="full | smoke")
  p.add_argument("--batches", default="", help="comma-separated subset of global batches")
  p.add_argument("--report_only", action="store_true",
                 help="write summary.json, table.md and the figure from the finished runs "
                 "(e.g. while the sweep runs); train nothing")
  args = sweeps.parse_args(p, argv)
  workdir = args.workdir or os.path.join("experiments", "results", "critical_batch",
                                         args.workload)
  batches = [int(b) for b in args.batches.split(",") if b] or None
  if args.report_only:
    w = workload_for(args.workload, args.grid)
    write_report(summarize(workdir, w), workdir)
    print(open(os.path.join(workdir, "table.md")).read())
    return 0
  counts = run(args.workload, workdir, [int(s) for s in args.seeds.split(",")], args.grid,
               batches)
  print(open(os.path.join(workdir, "table.md")).read())
  print(f"critical_batch: {counts}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
