r"""Data-parallel's critical batch: steps to a target vs global batch B, with B_simple alongside.

  python -m experiments.sweeps.critical_batch --workload=fashion --seeds=1,2,3
  python -m experiments.sweeps.critical_batch --workload=pydocs --seeds=1,2,3
  python -m experiments.sweeps.critical_batch --config=experiments/configs/<file>.py \
      --workdir=DIR [--seeds=1,2,3] [--grid=full|smoke] [--batches=64,128,...] [--report_only]

The grid is the config file's `critical_batch_grid(name)`; any config file with one runs
here (`--workload=fashion|pydocs` name the embedded fashion_mnist.py and pydocs_gpt2.py).
It writes, under --workdir (default experiments/results/critical_batch/<workload>):
`B<B>/tune/lr<value>/` and `B<B>/tuning.json`, `B<B>/seed<k>/`, then summary.json, table.md
and critical_batch.png (steps to target vs B, McCandlish's S = S_min (1 + B_crit / B)
fitted, B_simple marked). Resumable: a finished run is read back, a half-finished one
resumes from its checkpoint; `--report_only` writes the report from the finished runs and
trains nothing. Like the cost-vs-time study, it checks every B first and refuses a workdir
of another study unless --start_over (experiments/sweeps/study.py). The committed grids trained ~10 h (Fashion-MNIST, B = 64 .. 16,384), ~4 h
(its small model, to 8,192) and ~13.5 h (the Python docs, B = 64 .. 8,192) on 2 CPU cores,
tuning included; `smoke`, seconds.

The rules every point follows: docs/methodology.md.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import math
import os
import statistics
import types

import ml_collections
from absl import flags

from ensemble_jax import config_lib, report, stored, validation
from ensemble_jax import optim as optim_lib
from ensemble_jax import run as run_lib
from experiments import cli, sweeps
from experiments.configs import WORKLOAD_CONFIGS
from experiments.sweeps import study, tuning


@dataclasses.dataclass(frozen=True)
class Workload:
  """One critical-batch grid: a config file's `critical_batch_grid(name)`, read."""
  module: types.ModuleType  # the config file: get_config(variant)
  variant: str
  per_device: int  # examples per simulated device (and per microbatch): D = B / per_device
  batches: tuple[int, ...]  # global batches B
  budget_examples: int  # each point trains max(budget_examples / B, min_steps) steps
  min_steps: int
  warmup_fraction: float = 0.05  # of the point's own budget
  evals_per_budget: int = 100  # an eval every budget / this steps (at least every step)
  checkpoints_per_budget: int = 16  # a run cut off loses at most budget / this steps
  overrides: dict = dataclasses.field(default_factory=dict)  # {dotted config key: value}


def load_workload(config: str, grid: str = "full") -> Workload:
  """The `grid` of `config`: a --workload name or a config file's path."""
  path = WORKLOAD_CONFIGS.get(config, config)
  module = sweeps.load_config_module(path)
  if not hasattr(module, "critical_batch_grid"):
    raise SystemExit(f"error: {path} defines no critical_batch_grid(name); see "
                     "experiments/configs/fashion_mnist.py for one")
  spec = dict(module.critical_batch_grid(grid))
  spec["batches"] = tuple(spec["batches"])
  return Workload(module=module, **spec)


# The embedded workloads' full grids, by --workload name.
WORKLOADS = {name: load_workload(name) for name in WORKLOAD_CONFIGS}


def budget_steps(w: Workload, batch: int) -> int:
  """The point's step budget: `budget_examples` at batch B, at least `min_steps` (large
  batches need a floor of steps)."""
  return max(math.ceil(w.budget_examples / batch), w.min_steps)


def point_config(w: Workload, batch: int, seed: int):
  """One (B, seed) run at the workload's scaled learning rate (tuning scales it).

  DP at D = B / per_device devices is trained as one model at global batch B, the D
  devices' parts as D microbatches (`train.microbatches`): the same math as D devices, one
  after another, in one device's memory. BatchNorm thus normalises over each simulated
  device's examples at every B (ghost batch norm, as in Shallue et al., 2018), so B
  changes nothing but the batch. With D >= 2 the run also records the gradient noise
  scale (`train.noise_scale`: small batch one device's part, big batch B). The run stops
  at the target, warms up a fraction of its own budget and evaluates every
  1 / evals_per_budget of it; the grid's overrides come last.
  """
  config = w.module.get_config(w.variant)
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
  for key, value in w.overrides.items():
    config_lib.set_dotted(config, key, value)
  validation.validate(config)
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


def run(config: str, workdir: str, seeds: list[int], grid: str = "full",
        batches: list[int] | None = None, start_over: bool = False) -> dict[str, int]:
  """Tunes every B's learning rate, then trains every seed not finished yet.

  `config` is a --workload name or a config file's path; `batches` a subset of its grid's.
  Every B is tuned on seed tune.seed before any other seed trains, small B first (the
  warm start needs the smaller B's choice), by the cost-vs-time sweep's rule
  (`tuning.tune`); then seeds outermost, so an interrupted sweep has whole seeds of every
  B. A seed run at other values than its B's choice moves to `B<B>/superseded/` before any
  seed trains, and runs again (`tuning.ready_seeds`). Writes the summary, table and figure
  of every B finished under `workdir`; returns the run counts (`study.COUNTS`, as the
  cost-vs-time sweep's). Every B is checked and the workdir must hold this study or none
  before anything trains (`study.check_points`, `study.check_workdir`; `start_over` moves
  another aside).
  """
  w = load_workload(config, grid)
  batches = list(batches or w.batches)
  for b in batches:
    if b % w.per_device:
      raise SystemExit(f"error: batch {b} is not a multiple of the per-device {w.per_device}")
  configs = study.check_points({f"B{b}": functools.partial(point_config, w, b, 0)
                                for b in w.batches}, [f"B{b}" for b in batches], seeds)
  study.check_workdir(workdir, study.identity(config, grid, None, configs), start_over)
  study.say_holdings(workdir, [f"B{b}" for b in sorted(batches)])
  counts = dict.fromkeys(study.COUNTS, 0)
  tuned = {}
  for batch in sorted(batches):  # every B tuned before any other seed trains, small B first
    base = point_config(w, batch, seed=0)
    base.seed = base.tune.seed
    previous, warm_start = _warm_start(workdir, w, batch, tuned)
    chosen, record = tuning.tune(base, _point_dir(workdir, batch), lambda c, run_dir:
                                 study.counted(counts, "tuning_runs", run_dir, lambda: (
                                     tuning.train_run(c, run_dir, counts, "tuning_runs"))),
                                 warm_start=warm_start)
    if previous is not None:
      record["warm_start_from_batch"] = previous
    tuned[batch] = chosen, record
    tuning.write_record(_point_dir(workdir, batch), record)
  for batch, (chosen, record) in tuned.items():
    tuning.ready_seeds(chosen, record, _point_dir(workdir, batch), seeds, counts)
  for seed in seeds:  # seeds outermost: an interrupted sweep has whole seeds of every B
    for batch, (chosen, record) in tuned.items():
      run_dir = os.path.join(_point_dir(workdir, batch), f"seed{seed}")
      study.counted(counts, "trained", run_dir, lambda: tuning.run_seed(
          chosen, record, _point_dir(workdir, batch), seed, counts))
  write_report(summarize(workdir, w), workdir)  # every B finished there, not only these
  return counts


def _warm_start(workdir: str, w: Workload, batch: int,
                tuned: dict) -> tuple[int | None, dict[str, float]]:
  """(B', {key: factor}): the next smaller batch B' of the workload and the factors of the
  configured rates it chose, which B's first grid holds too (None, {} at the smallest B).
  Read from this sweep's tuning or B''s tuning.json.

  The configured rate grows as sqrt(B) (or B), which past the critical batch overshoots,
  and the steps-vs-rate curve is too flat and noisy up there for the edge rule alone to
  walk down to the right factor (the docs at B = 2,048: x1/2 and x1 took 260 and 240
  steps, where B = 1,024 reached the target in 124 at x1/4, a factor the plain grid never
  tries). The warm start only adds runs, so DP is tuned at least as well as by the plain
  rule.
  """
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


def fit_rows(rows: list[dict]) -> dict | None:
  """The knee fitted to the rows with a median over reported seeds: a row the tuning run
  alone stands for (it won the choice, so its steps are biased low) is left out, as the
  projection leaves it out."""
  return fit_critical_batch([(r["batch"], r["median_steps"]) for r in rows
                             if report.reported_batch(r)])


def _measured(rows: list[dict]) -> list[dict]:
  return [r for r in rows if r["median_steps"] is not None]


def stops_halving(rows: list[dict]) -> dict:
  """The row past which no larger batch halves its steps (perfect scaling would halve them
  at every doubling): where data-parallel stops turning devices into proportionally fewer
  steps, the knee."""
  measured = _measured(rows)
  return next(r for i, r in enumerate(measured)
              if all(2 * q["median_steps"] > r["median_steps"] for q in measured[i + 1:]))


def stops_falling(rows: list[dict]) -> dict:
  """The row past which no larger batch takes fewer steps on every seed than this row's
  fewest (their seed ranges overlap or lie above): where the steps stop falling beyond the
  seeds' spread. The largest row measured where they still fall there."""
  measured = _measured(rows)
  return next(r for i, r in enumerate(measured)
              if all(q["max_steps"] >= r["min_steps"] for q in measured[i + 1:]))


def summarize(workdir: str, w: Workload) -> dict:
  """Per B of `w` finished under `workdir` (so a sweep over some B adds rows): the chosen
  learning rate, steps to target per seed, B_simple; the fitted knee.

  Before a B's seeds run, its chosen tuning run stands for its seed 0; once other seeds ran,
  the tuning seed is left out of the medians (its run won the choice). B_simple is each
  run's `noise_scale.b_simple_at_target`, read at the eval that reached the target. The
  tuning rule is the one the rows' tuning records state (the fullest: the first B has no
  warm start), the grid's before any B is tuned.
  """
  rows, first_run = [], None  # first_run: any run's results, for the target's name
  rules = []  # per row: the rule its tuning record states
  for batch in w.batches:
    record = _load(os.path.join(_point_dir(workdir, batch), tuning.TUNING_FILE))
    if record is None:
      continue
    runs = {}
    for path in sorted(glob.glob(os.path.join(_point_dir(workdir, batch), "seed*",
                                              run_lib.RESULTS_FILE))):
      runs[int(os.path.basename(os.path.dirname(path)).removeprefix("seed"))] = stored.load(path)
    if record["seed"] not in runs:  # seeds not started yet: the tuning seed is the chosen run
      chosen = os.path.join(_point_dir(workdir, batch), record["chosen_run"],
                            run_lib.RESULTS_FILE)
      if os.path.exists(chosen):
        runs[record["seed"]] = stored.load(chosen)
    if not runs:
      continue
    every_seed = {s: _steps_to_target(r) for s, r in runs.items()}
    runs = dict(report.reported(list(runs.items()), seeds=lambda run: (run[0], record["seed"])))
    steps = {s: every_seed[s] for s in runs}
    reached = [v for v in steps.values() if v is not None]
    noise = [r["noise_scale"].get("b_simple_at_target") for r in runs.values()
             if "noise_scale" in r]
    noise = [v for v in noise if v is not None and math.isfinite(v)]
    first = next(iter(runs.values()))
    first_run = first_run or first
    rules.append(record["rule"])
    rows.append({
        "batch": batch, "devices": batch // w.per_device,
        "microbatches": first["config"]["train"]["microbatches"],
        "lr_factor": record["axes"][0]["chosen"] / record["axes"][0]["base"],
        "lr_at_edge": record["axes"][0]["at_edge"],
        # the schedule's length chosen (a fraction of step_budget); 1 where not tuned
        "schedule_fraction": record["chosen"].get(config_lib.SCHEDULE_FRACTION, 1.0),
        "tuning_runs": record["compute"]["runs"],
        "tuning_flops": record["compute"]["flops"],
        "peak_learning_rate": _peak_lr(first["config"]),
        "step_budget": budget_steps(w, batch),  # the point's; a run spans its fraction
        "steps_to_target": {str(s): v for s, v in sorted(steps.items())},
        "tuning_seed_steps": every_seed.get(record["seed"]),
        "seeds": len(runs), "seeds_reached": len(reached),
        # no other seed has run yet: the row is the tuning run, which won the choice
        "tuning_seed_only": set(runs) == {record["seed"]},
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
  noise = _b_simple_readings(rows)
  target = (f"{first_run['target']['metric']} {first_run['target']['value']}" if first_run
            else "")
  return {"target": target,
          # as the records state it (the fullest one: the first B has no warm start), so
          # that records tuned by an earlier rule are not described by today's
          "tuning_rule": (max(rules, key=len) if rules else
                          tuning.rule(True, w.overrides.get("tune.stop_losers", False))),
          "per_device": w.per_device, "rows": rows,
          "fit": fit_rows(rows),
          "b_simple": statistics.median(noise) if noise else None,
          "note": ("steps to target: median over the seeds other than the tuning seed (all "
                   "seeds before others ran), only where every one reached it; "
                   "B_simple: median over batches of the per-B median at the target eval")}


def _peak_lr(config: dict) -> float:
  return optim_lib.peak_learning_rate(ml_collections.ConfigDict(config["optim"]),
                                      config["train"]["batch_size"])


def table(summary: dict) -> str:
  fit = summary["fit"]
  lines = [f"Target: {summary['target']}. DP at D = B / {summary['per_device']} devices, "
           "simulated as D microbatches. Schedule: the tuned fraction of the step budget "
           "the run and its learning-rate schedule span. Steps to target: median over the "
           "seeds other than the tuning seed (min-max), the tuning run where no other seed has "
           "run yet (so marked); '-' where a seed missed it.", "",
           "| B | D | lr x (tuned) | peak lr | schedule (steps) | steps to target "
           "| perfect scaling | B_simple at target |",
           "|---|---|---|---|---|---|---|---|"]
  base = next((r for r in summary["rows"] if r["median_steps"] is not None), None)
  for r in summary["rows"]:
    seeds = ("the tuning seed only" if r.get("tuning_seed_only") else
             f"{r['seeds']} seed{'s' if r['seeds'] != 1 else ''}")
    if r["median_steps"] is None:
      steps = f"- ({r['seeds_reached']}/{r['seeds']} seeds reached)"
    elif r["seeds"] == 1:
      steps = f"{r['median_steps']:g} ({seeds})"
    else:
      steps = f"{r['median_steps']:g} ({r['min_steps']}-{r['max_steps']}, {seeds})"
    ideal = (f"{base['median_steps'] * base['batch'] / r['batch']:.1f}" if base else "-")
    noise = f"{r['b_simple_at_target']:.0f}" if r["b_simple_at_target"] is not None else "-"
    factor = f"{r['lr_factor']:g}" + (" (edge)" if r["lr_at_edge"] else "")
    fraction = r.get("schedule_fraction", 1.0)
    schedule = f"{fraction:g} x {r['step_budget']} = {round(fraction * r['step_budget'])}"
    lines.append(f"| {r['batch']} | {r['devices']} | {factor} | "
                 f"{r['peak_learning_rate']:.3g} | {schedule} | {steps} | {ideal} | {noise} |")
  lines.append("")
  if fit:
    alone = any(r.get("tuning_seed_only") for r in summary["rows"])
    lines.append(f"Fitted S(B) = S_min (1 + B_crit / B): S_min = {fit['s_min']:.1f} steps, "
                 f"B_crit = {fit['b_crit']:.0f}"
                 + (" (without the rows the tuning seed alone stands for)." if alone else "."))
  if summary["b_simple"] is not None:
    low, high, read = _b_simple_spread(summary)
    lines.append(f"Gradient noise scale B_simple (measured at the target eval, McCandlish et "
                 f"al. 2018): {summary['b_simple']:.0f}, the median of the per-B medians "
                 f"{low:,.0f}-{high:,.0f} ({read} of {len(summary['rows'])} batches read one; "
                 "none where the estimated |G|^2 was not positive).")
  return "\n".join(lines) + "\n"


def _b_simple_readings(rows: list[dict]) -> list[float]:
  """The per-B medians of B_simple at the target, of the rows that read one."""
  return [r["b_simple_at_target"] for r in rows if r["b_simple_at_target"] is not None]


def _b_simple_spread(summary: dict) -> tuple[float, float, int]:
  """(lowest, highest, how many) of the per-B medians of B_simple at the target."""
  noise = _b_simple_readings(summary["rows"])
  return min(noise), max(noise), len(noise)


def figure(summary: dict, path: str) -> None:
  """Steps to target vs B on log-log axes, each point labelled with its device count."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

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
    low, high, _ = _b_simple_spread(summary)
    ax.axvline(summary["b_simple"], color="C3", alpha=0.7,
               label=f"B_simple = {summary['b_simple']:.0f} (measured; per B {low:,.0f}-"
                     f"{high:,.0f})")
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


FLAGS = flags.FlagValues()
flags.DEFINE_enum("workload", "fashion", sorted(WORKLOAD_CONFIGS), "an embedded workload's "
                  "config file, by name", flag_values=FLAGS)
flags.DEFINE_string("config", None, "a config file with a critical_batch_grid(name), instead "
                    "of --workload", flag_values=FLAGS)
flags.DEFINE_string("workdir", "", "default experiments/results/critical_batch/<workload>; "
                    "required with --config", flag_values=FLAGS)
flags.DEFINE_string("seeds", "1,2,3", "comma-separated seeds reported (tune.seed, 0, chooses the "
                    "tuned values; its run stays in tune/)", flag_values=FLAGS)
flags.DEFINE_string("grid", "full", "a grid the config's critical_batch_grid() knows: full | "
                    "smoke (fashion_mnist.py also small_model)", flag_values=FLAGS)
flags.DEFINE_string("batches", "", "comma-separated subset of global batches",
                    flag_values=FLAGS)
flags.DEFINE_bool("start_over", False, "the workdir holds another study: move its records "
                  "to <workdir>.previous (nothing is deleted) and start this one",
                  flag_values=FLAGS)
flags.DEFINE_bool("report_only", False, "write summary.json, table.md and the figure from the "
                  "finished runs (e.g. while the sweep runs); train nothing", flag_values=FLAGS)
sweeps.define_flags(FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  sweeps.use_compile_cache(FLAGS.compile_cache)
  if FLAGS.config is not None and FLAGS["workload"].present:
    raise SystemExit("error: --config and --workload both name the config: give one")
  if FLAGS.config is not None and not FLAGS.workdir:
    raise SystemExit("error: --config needs --workdir")
  config = FLAGS.config or FLAGS.workload
  workdir = FLAGS.workdir or os.path.join("experiments", "results", "critical_batch",
                                          FLAGS.workload)
  counts = None
  if FLAGS.report_only:
    write_report(summarize(workdir, load_workload(config, FLAGS.grid)), workdir)
  else:
    code, counts = study.guarded(workdir, lambda: run(
        config, workdir, [int(s) for s in FLAGS.seeds.split(",")], FLAGS.grid,
        [int(b) for b in FLAGS.batches.split(",") if b] or None, FLAGS.start_over))
    if code:
      return code
  with open(os.path.join(workdir, "table.md")) as f:
    print(f.read())
  if counts is not None:
    print(study.counts_line(counts))
  return 0


if __name__ == "__main__":
  cli.run(main)
