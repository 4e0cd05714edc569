"""Where the ensemble could win: a projection to 1024 devices, modelled from measured pieces.

  python -m experiments.projection [--workload=fashion_mnist] [--out=DIR]

Measured (committed results.json of the cost-vs-time grid, medians over the seeds the
tables report, of the points that reached the target in every one): each point's steps to target, its calibrated device step
and XLA FLOPs per device step, its pool build time, and the collectives its compiled
programs hold (results.json `cost.modelled.collectives`, read from the optimized HLO: kind,
operand bytes, replica-group size, executions per step / eval / outer step / run) with the
evals and outer steps it took to the target. Beyond the grid's largest data-parallel D
(and the small model's, `dp_small_model`, where its sweep exists: CRITICAL_BATCH_WORKLOADS),
the critical-batch sweep's DP steps to target at each global batch B (`--critical_batch`,
its summary.json: the median over seeds where every seed reached the target), run at the
grid's per-device batch b: D = B / b devices (the steps to target at global batch B do not
depend on how B is split); past its largest B, DP is held at its best measured point:
exact past its critical batch, and in DP's disfavour if its steps would still fall. Other cost-vs-time sweeps on the same workload
(`--also`, e.g. the many-worker ensembles) add their points to the curves of the same name;
a point the grid already has (same curve and name, the same config) is read from the grid.

Modelled, for D = 8 .. 1024 devices and each interconnect preset (`ensemble_jax.costs`):
  * every point's compute: steps x FLOPs per step + the pool build's FLOPs, as the grids'
    `flops_to_target`.
  * every point: pool build + steps x device step + each recorded training collective's
    alpha-beta time (`costs.collective_time`) x its executions to the target; evaluations
    are off the critical path for every method (`costs.EVALUATION_RULE`). A point runs at its
    measured device count; it is never assumed to take fewer steps on more devices.
  * a single-model curve at D: its fastest point on at most D devices. The strongest
    baseline at D is the fastest single-model curve.
  * a critical-batch DP point at global batch B: D = B / b devices at the grid DP's
    per-device batch b and device step (the sweep's own split, with the step scaled by
    its per-device batch, only where b does not divide B), and one ring all-reduce of the
    fp32 gradient per step over its D devices: its runs normalise BatchNorm per device
    (ghost batch norm), so no statistic is reduced (`CRITICAL_BATCH_NORM`,
    `data_parallel_step`: a grid DP point is priced as its step compiled, with the
    BatchNorm it trained with).
  * an ensemble / DiLoCo curve at D: its fastest point with N <= D.
Ratios at matched budgets, as the grid tables' (`ensemble_jax.report.matched`): the
method's point at D against every single-model point on at most D devices; time ratio =
the baselines' fastest time within the point's compute / the point's time, compute ratio
= the baselines' cheapest compute within the point's time / the point's compute, each
naming the baseline point compared. > 1: the method's point is better at its own budget;
None: no baseline point is that cheap (time) or that fast (compute), a win too.

What-ifs (`--what_if=resnet50|gpt2_small`): the same measured step counts and collective
counts, with the device step, FLOPs per step and parameter bytes of ResNet-50 (batch 256 x
224^2) or GPT-2 small (16 x 1024 tokens) as measured on one H100
(`experiments/results/bench/h100/`), the collectives of the programs that exchange
parameters or gradients (train step, DiLoCo's sync and deployable model, the soup) scaled
by the parameter ratio, and those of the program that reduces logits (`output_programs`:
the eval program, or a language-model ensemble's final aggregation, whose evaluations
reduce only target log-probabilities) by the output-width ratio (ImageNet's 1,000
classes, GPT-2's 50,257 tokens against the workload's 10 classes or 256 bytes; the eval
set itself is kept): how the
answer moves when a step is big and an all-reduce is 100 MB or 500 MB. Pool
building is not charged in a what-if (the small workload's build time says nothing about a
big dataset's), which favours the routed experts; `--charge_pools` charges it as measured
on the small workload's host (`<workload>_whatif_<model>_pools_charged.md`). The
step counts are the small workload's, not the big model's: a labelled what-if, not a
prediction. Each point keeps its size relative to the full-size data-parallel model (the
small-model baseline stays as much smaller).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import statistics

from absl import flags

from ensemble_jax import config_lib, costs, report
from experiments import cli

DEVICES = tuple(2 ** k for k in range(3, 11))  # 8 .. 1024
# Each workload's critical-batch sweeps (under experiments/results/critical_batch/), by the
# single-model curve each extends beyond the grid's D: data-parallel's, and the small
# model's where its sweep exists (a missing sweep is said in the sources: the curve is held
# at its best measured point).
CRITICAL_BATCH_WORKLOADS = {
    "fashion_mnist": {"data_parallel": "fashion", "dp_small_model": "fashion_small_model"},
    "pydocs_gpt2": {"data_parallel": "pydocs"}}
# Output widths (classes, or the vocabulary of a language model): the eval program's
# collectives (logits, per-class metric sums) grow with it, not with the parameters.
OUTPUT_WIDTH = {"fashion_mnist": 10, "pydocs_gpt2": 256,  # Fashion's classes; bytes
                "resnet50": 1000, "gpt2_small": 50257}  # ImageNet's classes; GPT-2's BPE
BENCH = "experiments/results/bench/h100/throughput.json"
EVAL_PROGRAMS = ("eval", "final_eval")  # what evaluates; every other program's collectives
# carry parameters or gradients


@dataclasses.dataclass(frozen=True)
class Point:
  """One measured grid point: the medians of its reported seeds."""
  curve: str
  name: str
  method: str
  devices: int  # DP: devices (global batch = per-device batch x devices); else workers
  steps: float  # to target
  device_step_s: float
  flops_per_device_step: float
  param_bytes: float  # one model's fp32 parameters (what-ifs scale the collectives by it)
  pool_s: float = 0.0
  pool_flops: float = 0.0  # the pool build's FLOPs (distill.build_flops), as the grids charge
  batch_per_device: int = 0  # examples (windows) one device or worker steps on
  collectives: tuple[costs.ProgramCollective, ...] = ()  # what its programs exchange
  units: tuple[tuple[str, float], ...] = ()  # (unit, executions to the target): eval, ...
  seeds: int = 1  # the seed runs whose median `steps` is
  steps_range: tuple[float, float] = ()  # (min, max) over those seeds; () : steps alone
  batchnorm: str = "synchronised"  # its runs' config.method.batchnorm

  @classmethod
  def from_json(cls, d: dict) -> "Point":
    """A point as the projection's JSON holds it (`dataclasses.asdict`)."""
    return cls(**{**d, "units": tuple(map(tuple, d["units"])),
                  "steps_range": tuple(d["steps_range"]),
                  "collectives": tuple(costs.ProgramCollective(**c) for c in d["collectives"])})

  def at(self, steps: float) -> "Point":
    """The point at another seed's steps (its spread: `steps_range`)."""
    return dataclasses.replace(self, steps=steps)

  def communication_s(self, link: costs.Interconnect) -> float:
    """Every training collective's time x its executions to the target; evaluations are
    off the critical path (`costs.EVALUATION_RULE`), as in the grids' tables."""
    units = {"step": self.steps, "run": 1.0, **dict(self.units)}
    return sum(costs.split_count(c, units)[0] * c.seconds(link) for c in self.collectives)

  def time_s(self, link: costs.Interconnect) -> float:
    return self.pool_s + self.steps * self.device_step_s + self.communication_s(link)

  def flops(self) -> float:
    """Training compute to the target plus the pool build's, as the grids'
    `flops_to_target` (`costs.summary`) charges it."""
    return self.steps * self.devices * self.flops_per_device_step + self.pool_flops


def load_points(results_dir: str) -> list[Point]:
  """Every grid point whose reported seeds all reached the target, their medians (the
  seeds the tables report: `ensemble_jax.report.reported`)."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for path in sorted(glob.glob(os.path.join(results_dir, "*", "*", "seed*", "results.json"))):
    curve, name = os.path.relpath(path, results_dir).split(os.sep)[:2]
    groups.setdefault((curve, name), []).append(report.read_run(path))
  points = []
  for (curve, name), every in sorted(groups.items()):
    runs = report.reported(every, report.result_seeds)
    if not all(r["target"]["reached"] for r in runs):
      continue
    r = runs[0]
    communication = costs.recorded_communication(r)
    if communication is None:
      raise SystemExit(f"error: {results_dir}/{curve}/{name} predates the compiled-collective "
                       "record (results.json cost.modelled.collectives); re-run its sweep")
    modelled = [x["cost"]["modelled"] for x in runs]
    counts = [costs.units_to(x["target"]["reached_step"], x) for x in runs]
    devices = modelled[0]["devices"]
    points.append(Point(
        curve=curve, name=name, method=r["method"], devices=devices,
        steps=statistics.median(x["target"]["reached_step"] for x in runs),
        device_step_s=statistics.median(m["device_step_time_s"] for m in modelled),
        # XLA's count of the whole step (all devices / workers), per modelled device
        flops_per_device_step=r["flops_per_step"] / max(devices, 1),
        param_bytes=4.0 * r.get("num_params", r.get("num_params_per_worker", 0)),
        pool_s=statistics.median((x.get("distill") or {}).get("build_time_s", 0.0)
                                 for x in runs),
        pool_flops=statistics.median((x.get("distill") or {}).get("build_flops", 0.0)
                                     for x in runs),
        batch_per_device=r["config"]["train"]["batch_size"] // (
            devices if r["method"] == "data_parallel" else 1),
        collectives=communication.collectives,
        # steps and the run: the point's own (`Point.communication_s`)
        units=tuple((u, statistics.median(c[u] for c in counts))
                    for u in costs.UNITS if u not in ("step", "run")),
        seeds=len(runs),
        steps_range=(min(x["target"]["reached_step"] for x in runs),
                     max(x["target"]["reached_step"] for x in runs)),
        batchnorm=r["config"]["method"]["batchnorm"]))
  return points


def join(grid: list[Point], others: list[Point]) -> list[Point]:
  """`others` (another sweep's points on the same workload) added to the curves of their
  names; a (curve, point) the grid already has stays the grid's."""
  have = {(p.curve, p.name) for p in grid}
  return grid + [p for p in others if (p.curve, p.name) not in have]


# How the critical-batch runs normalise BatchNorm: over each simulated device's examples
# (ghost batch norm: D microbatches on one device stand for D devices), so on their
# cluster a step all-reduces the gradients alone. A grid point's is its runs'
# (`Point.batchnorm`, config.method.batchnorm).
CRITICAL_BATCH_NORM = "per_device"


def data_parallel_step(template: Point, devices: int, batch_norm: str
                       ) -> tuple[costs.ProgramCollective, ...]:
  """One data-parallel step's collectives for `template`'s model on `devices` devices, with
  BatchNorm `batch_norm` (config_lib.BATCHNORMS). One rule, the collectives as compiled:
  the template's compiled step (its recorded per-step collectives) on `devices` where it
  trained with that BatchNorm; per_device from a synchronised template, its step without
  the statistics' reductions (no BatchNorm collective), the fp32 gradients' one
  all-reduce. A per-device template has no synchronised step to read: ValueError."""
  if batch_norm not in config_lib.BATCHNORMS:
    raise ValueError(f"batch_norm {batch_norm!r}: choose one of {config_lib.BATCHNORMS}")
  if batch_norm == template.batchnorm:
    return tuple(dataclasses.replace(c, group_size=devices) for c in template.collectives
                 if c.per == "step")
  if batch_norm == "per_device":
    return (costs.ProgramCollective("per-device BatchNorm DP step", "step", "all-reduce",
                                    int(template.param_bytes), devices, 1),)
  raise ValueError(f"{template.curve}/{template.name} trained with per-device BatchNorm: no "
                   "compiled synchronised step to price")


def critical_batch_points(summary: dict, grid: list[Point],
                          curve: str = "data_parallel") -> list[Point]:
  """The critical-batch sweep's DP points beyond the largest D of the grid's `curve` (a
  data-parallel curve: data_parallel, or dp_small_model from the small model's sweep; see
  the module docstring for what each is charged)."""
  template = max((p for p in grid if p.curve == curve), key=lambda p: p.devices,
                 default=None)
  if template is None:
    return []
  per_device = template.batch_per_device or summary["per_device"]
  points = []
  for row in summary["rows"]:
    # The steps to target at global batch B do not depend on how B is split: run B at the
    # grid's per-device batch (its step, measured); the sweep's own split, its step scaled
    # linearly in the batch, only where the grid's per-device batch does not divide B.
    if row["batch"] % per_device == 0:
      d, scale = row["batch"] // per_device, 1.0
    else:
      d, scale = row["devices"], summary["per_device"] / per_device
    if d <= template.devices or not report.reported_batch(row):
      continue
    step = data_parallel_step(template, d, CRITICAL_BATCH_NORM)
    evals = tuple(dataclasses.replace(c, group_size=d) for c in template.collectives
                  if c.per == "eval")
    steps = row["median_steps"]
    points.append(Point(
        curve=curve, name=f"B{row['batch']}", method="data_parallel", devices=d,
        steps=steps, device_step_s=template.device_step_s * scale,
        flops_per_device_step=template.flops_per_device_step * scale,
        param_bytes=template.param_bytes, batch_per_device=row["batch"] // d,
        collectives=(*step, *evals), units=(("eval", row["evals_to_target"]),),
        seeds=row["seeds_reached"],
        steps_range=(row.get("min_steps", steps), row.get("max_steps", steps)),
        batchnorm=CRITICAL_BATCH_NORM))
  return points


def _row(p: Point, link: costs.Interconnect) -> dict:
  """A point's time and compute at its median steps, and at its fewest and most over the
  seeds (its evaluations and pool at their medians)."""
  lo, hi = (p.at(s) for s in (p.steps_range or (p.steps, p.steps)))
  return {"point": p.name, "curve": p.curve, "seeds": p.seeds, "devices": p.devices,
          "steps": p.steps, "time_s": p.time_s(link), "flops": p.flops(),
          "time_range_s": (lo.time_s(link), hi.time_s(link)),
          "flops_range": (lo.flops(), hi.flops()),
          "communication_s": p.communication_s(link)}


def fastest(points: list[Point], devices: int, link: costs.Interconnect) -> dict | None:
  """A curve's fastest point on at most `devices` devices: the point, its devices and
  steps, its time, compute and communication."""
  rows = [_row(p, link) for p in points if p.devices <= devices]
  return min(rows, key=lambda r: r["time_s"], default=None)


def matched(point: dict, baselines: list[dict]) -> dict:
  """`point` (a `fastest` row) against the baseline points (rows of every single-model
  curve) at its own budget, as `ensemble_jax.report.matched` compares the grid's points:
  the baselines' fastest time within the point's compute / the point's time, and their
  cheapest compute within the point's time / the point's compute, each with the baseline
  point compared ('curve point'); (None, None) where no baseline point is that cheap
  (fast)."""
  cheap = [b for b in baselines if b["flops"] <= point["flops"]]
  fast = [b for b in baselines if b["time_s"] <= point["time_s"]]
  t = min(cheap, key=lambda b: (b["time_s"], b["flops"]), default=None)
  c = min(fast, key=lambda b: (b["flops"], b["time_s"]), default=None)
  def spread(b: dict, key: str) -> tuple[float, float]:  # as report.seed_range
    return b[key][0] / point[key][1], b[key][1] / point[key][0]

  # where no baseline is as cheap (fast) at the medians, is one within the seeds' spread?
  near_cheap = any(b["flops_range"][0] <= point["flops_range"][1] for b in baselines)
  near_fast = any(b["time_range_s"][0] <= point["time_range_s"][1] for b in baselines)
  return {"time_ratio": None if t is None else t["time_s"] / point["time_s"],
          "time_range": ("within the spread" if near_cheap else None) if t is None
                        else spread(t, "time_range_s"),
          "time_baseline": None if t is None else f"{t['curve']} {t['point']}",
          "compute_ratio": None if c is None else c["flops"] / point["flops"],
          "compute_range": ("within the spread" if near_fast else None) if c is None
                           else spread(c, "flops_range"),
          "compute_baseline": None if c is None else f"{c['curve']} {c['point']}"}


def wins(row: dict) -> bool:
  """The method's point beats the strongest baseline at its own budget: no baseline point
  is both as fast and as cheap (either ratio above 1 over the whole range of the seeds'
  steps, or no baseline that cheap / fast). A ratio whose seed range holds 1 is within
  the spread: no win."""
  def won(kind: str) -> bool:
    spread = row[f"{kind}_range"]
    if row[f"{kind}_ratio"] is None:  # no baseline that cheap (fast), unless within the spread
      return spread is None
    return spread[0] > 1

  return won("time") or won("compute")


def output_programs(p: Point) -> set[str]:
  """The programs of `p` whose collectives carry logits, which grow with the output width.

  A language-model ensemble reduces its logits once, at the end (`final_eval`); its
  evaluations reduce one log-probability per worker and target, whatever the vocabulary.
  Where a point has no `final_eval`, its eval program carries them (a classifier's, or
  results read before evaluations reduced only their target's inputs)."""
  programs = {c.program for c in p.collectives}
  return {"final_eval"} if "final_eval" in programs else {"eval"}


def what_if(points: list[Point], model: str, outputs: int, bench_path: str = BENCH,
            charge_pools: bool = False) -> list[Point]:
  """The same step counts with a big model's H100-measured step, FLOPs and bytes, each point
  scaled by its own size relative to the full-size data-parallel model (so the small-model
  baseline stays proportionally small). Collectives scale with what they carry: the eval
  program's with the output width (`outputs`, the measured workload's, against the big
  model's), every other program's with the parameters. The pool builds are left out, or,
  with `charge_pools`, charged as measured (the small workload's, on its host)."""
  with open(bench_path) as f:
    rows = [r for r in json.load(f) if r["model"] == model
            and r.get("attention") in (None, "fused") and r.get("vocab") in (None, 50257)]
  if not rows:
    raise SystemExit(f"error: no {model} row in {bench_path}; run experiments/bench/throughput.py")
  row = rows[0]
  ref = next(p for p in points if p.curve == "data_parallel")
  wider = OUTPUT_WIDTH[model] / outputs
  out = []
  for p in points:
    flops = p.flops_per_device_step / ref.flops_per_device_step
    size = p.param_bytes / ref.param_bytes
    param_bytes = 4.0 * row["params"] * size
    logits = output_programs(p)

    def scale(program: str) -> float:
      if program in EVAL_PROGRAMS:  # an evaluation's target log-probabilities: kept
        return wider if program in logits else 1.0
      return param_bytes / p.param_bytes

    collectives = tuple(dataclasses.replace(c, bytes=int(c.bytes * scale(c.program)))
                        for c in p.collectives)
    out.append(dataclasses.replace(p, device_step_s=row["step_s"] * flops,
                                   flops_per_device_step=row["flops_per_step_analytic"] * flops,
                                   param_bytes=param_bytes,
                                   pool_s=p.pool_s if charge_pools else 0.0,
                                   pool_flops=p.pool_flops if charge_pools else 0.0,
                                   collectives=collectives))
  return out


def project(points: list[Point], devices=DEVICES, presets=None) -> list[dict]:
  """One row per (method curve, D, preset): the method's fastest point on at most D
  devices against every single-model point on at most D devices at that point's budget
  (`matched`), with the strongest baseline's fastest point at D beside it."""
  presets = presets or costs.INTERCONNECTS
  baselines = sorted({p.curve for p in points if p.method == "data_parallel"})
  methods = sorted({p.curve for p in points} - set(baselines))
  rows = []
  for name, link in presets.items():
    for d in devices:
      base = [_row(p, link) for p in points if p.curve in baselines and p.devices <= d]
      if not base:
        continue
      b_row = min(base, key=lambda r: r["time_s"])
      for m in methods:
        m_row = fastest([p for p in points if p.curve == m], d, link)
        if m_row is None:
          continue
        rows.append({
            "preset": name, "devices": d, "method": m, "method_point": m_row["point"],
            "method_devices": m_row["devices"], "method_seeds": m_row["seeds"],
            "method_time_s": m_row["time_s"], "method_flops": m_row["flops"],
            "baseline": f"{b_row['curve']} {b_row['point']}",
            "baseline_devices": b_row["devices"], "baseline_seeds": b_row["seeds"],
            "baseline_time_s": b_row["time_s"], "baseline_flops": b_row["flops"],
            **matched(m_row, base)})
  return rows


def _ratio(value, against, none: str, spread=None) -> str:
  if value is None:
    return none + (f" ({spread}: a seed's is)" if isinstance(spread, str) else "")
  if spread is None:
    return f"{value:.2f}x (vs {against})"
  within = ", within the spread" if spread[0] <= 1 <= spread[1] else ""
  return f"{value:.2f}x [{spread[0]:.2f}, {spread[1]:.2f}{within}] (vs {against})"


def table(rows: list[dict], title: str) -> str:
  lines = [title, "",
           "Each method's fastest point on at most D devices, against every single-model "
           "point on at most D devices at the point's own budget: time ratio = the "
           "baselines' fastest time within the point's compute / the point's time; compute "
           "ratio = the baselines' cheapest compute within the point's time / the point's "
           "compute; > 1: the method's point is better; in brackets its range over the "
           "seeds' steps (the baseline's fewest against the point's most, and the other way "
           "round; 'within the spread' where it holds 1: no win); the baseline point "
           "compared named. "
           "The strongest baseline (the fastest single-model point on at most D devices) is "
           "shown beside.", "",
           "| method | preset | D | strongest baseline (devices used; seeds) | its time s | "
           "method point (seeds) | method time s | method TFLOPs | time ratio at the "
           "point's compute | compute ratio at the point's time |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['method']} | {r['preset']} | {r['devices']} | {r['baseline']} "
                 f"({r['baseline_devices']}; {r['baseline_seeds']}) | "
                 f"{r['baseline_time_s']:.3g} | {r['method_point']} ({r['method_seeds']}) | "
                 f"{r['method_time_s']:.3g} | {r['method_flops'] / 1e12:.2f} | "
                 f"{_ratio(r['time_ratio'], r['time_baseline'], 'no baseline as cheap', r['time_range'])} | "
                 f"{_ratio(r['compute_ratio'], r['compute_baseline'], 'no baseline as fast', r['compute_range'])} |")
  pairs = sorted({(r["method"], r["preset"]) for r in rows})
  lines += ["", "Where each method's point beats the strongest baseline at its own budget "
            "(a ratio above 1 over its whole seed range: no baseline point both as fast and "
            "as cheap; smallest D, if any):", ""]
  for m, preset in pairs:
    ds = [r["devices"] for r in rows if r["method"] == m and r["preset"] == preset
          and wins(r)]
    lines.append(f"- {m}, {preset}: " + (f"from D = {min(ds)}" if ds else "never up to D = "
                                          f"{max(r['devices'] for r in rows)}"))
  return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str, title: str, labelled: str = "ib_xdr800") -> None:
  """The two ratios vs D, one colour per method and one line style per preset; on the
  time panel each `labelled` line names its method point wherever the point changes."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from ensemble_jax import report

  fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharex=True)
  labels = []
  for i, (m, preset) in enumerate(sorted({(r["method"], r["preset"]) for r in rows})):
    mine = [r for r in rows if r["method"] == m and r["preset"] == preset]
    style = {"color": f"C{sorted({r['method'] for r in rows}).index(m)}",
             "ls": ["-", "--", ":"][sorted({r['preset'] for r in rows}).index(preset) % 3]}
    for ax, key in zip(axes, ("time_ratio", "compute_ratio")):
      # None: no baseline point that cheap (fast), a win off the scale: a triangle on top
      ax.plot([r["devices"] for r in mine],
              [math.nan if r[key] is None else r[key] for r in mine], marker="o", ms=3,
              label=f"{m}, {preset}", **style)
      off = [r["devices"] for r in mine if r[key] is None]
      if off:
        ax.plot(off, [0.97] * len(off), marker="^", ls="none", color=style["color"],
                transform=ax.get_xaxis_transform(), clip_on=False)
    if preset == labelled:
      labels += [(r["devices"], r["time_ratio"], r["method_point"], style["color"])
                 for j, r in enumerate(mine) if r["time_ratio"] is not None
                 and (j == 0 or r["method_point"] != mine[j - 1]["method_point"])]
  for ax, what, budget in zip(axes, ("time", "compute"), ("compute", "time")):
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    report.plain_log_ticks(ax)
    ax.set_xlabel("devices D")
    ax.set_ylabel(f"{what} to target: baseline / method,\nat the method point's {budget}",
                  fontsize=8)
  axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
  notes = [[f"labels: the method's point on {labelled}"] if labels else [], []]
  for ax, key, note, what in zip(axes, ("time_ratio", "compute_ratio"), notes,
                                 ("cheap", "fast")):
    if any(r[key] is None for r in rows):
      note.append(f"triangles on top: no baseline that {what}")
    ax.set_title("; ".join(note), fontsize=8)
  fig.suptitle(title + "\nMODELLED from measured steps: each method's fastest point on <= D "
               "devices against every single-model point on <= D devices, at the point's "
               "own budget; > 1: the method wins", fontsize=9)
  fig.tight_layout()
  report.label_points(axes[0], labels)
  fig.savefig(path, dpi=110)
  plt.close(fig)


FLAGS = flags.FlagValues()
flags.DEFINE_string("workload", "fashion_mnist", "the cost-vs-time grid's results directory "
                    "under --results", flag_values=FLAGS)
flags.DEFINE_string("results", "experiments/results", "where the grids' results are",
                    flag_values=FLAGS)
flags.DEFINE_string("what_if", "", "resnet50 | gpt2_small", flag_values=FLAGS)
flags.DEFINE_bool("charge_pools", False, "with --what_if: the pool builds charged as measured "
                  "on the small workload's host (the what-if leaves them out otherwise)",
                  flag_values=FLAGS)
flags.DEFINE_string("critical_batch", None, "data-parallel's critical-batch sweep's workdir "
                    "(default: experiments/results/critical_batch/<fashion|pydocs>; the small "
                    "model's, fashion_small_model, extends dp_small_model); skipped, and "
                    "said, if it has no summary", flag_values=FLAGS)
flags.DEFINE_string("also", "", "comma-separated results directories of other cost-vs-time "
                    "sweeps on this workload whose points join their curves (e.g. "
                    "experiments/results/many_workers)", flag_values=FLAGS)
flags.DEFINE_string("out", "experiments/results/projection", "where the tables and figures go",
                    flag_values=FLAGS)
flags.DEFINE_bool("figures", True, "draw the figure beside the table and JSON (--nofigures: "
                  "the table and JSON only)", flag_values=FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  grid_dir = os.path.join(FLAGS.results, FLAGS.workload)
  points = load_points(grid_dir)
  if not points:
    print(f"error: no finished grid points under {grid_dir}")
    return 2
  sources = [f"grid {grid_dir}: {len(points)} points reached the target in every seed"]
  for extra in filter(None, FLAGS.also.split(",")):
    if not os.path.isdir(extra):
      sources.append(f"no results at {extra} (--also): projected without them")
      continue
    joined = join(points, load_points(extra))
    sources.append(f"{extra}: {len(joined) - len(points)} more points")
    points = joined
  critical_dirs = {curve: os.path.join("experiments/results/critical_batch", name)
                   for curve, name in CRITICAL_BATCH_WORKLOADS.get(FLAGS.workload, {}).items()}
  if FLAGS.critical_batch:
    critical_dirs["data_parallel"] = FLAGS.critical_batch
  for curve, critical_dir in critical_dirs.items():
    summary_path = os.path.join(critical_dir, "summary.json")
    if not os.path.exists(summary_path):
      sources.append(f"no critical-batch summary at {summary_path}: {curve} beyond the "
                     "grid's D is held at its best measured point")
      continue
    with open(summary_path) as f:
      extended = critical_batch_points(json.load(f), points, curve)
    grid_bn = "/".join(sorted({p.batchnorm for p in points if p.curve == curve}))
    points += extended
    sources.append(f"{summary_path}: {curve} at D = "
                   f"{', '.join(str(p.devices) for p in extended)} beyond the grid (BatchNorm "
                   f"{CRITICAL_BATCH_NORM}, one gradient all-reduce per step; the "
                   f"grid's DP: BatchNorm {grid_bn}, its compiled step)"
                   if extended else f"{summary_path}: no point beyond the grid's D ({curve} "
                   "beyond it is held at its best measured point)")
  if FLAGS.charge_pools and not FLAGS.what_if:
    print("error: --charge_pools is for a --what_if (the measured projection charges them)")
    return 2
  label = FLAGS.workload + (f"_whatif_{FLAGS.what_if}" if FLAGS.what_if else "") + (
      "_pools_charged" if FLAGS.charge_pools else "")
  if FLAGS.what_if:
    points = what_if(points, FLAGS.what_if, OUTPUT_WIDTH[FLAGS.workload],
                     charge_pools=FLAGS.charge_pools)
  rows = project(points)
  os.makedirs(FLAGS.out, exist_ok=True)
  title = (f"Projection, {FLAGS.workload}" + (f", what-if {FLAGS.what_if} (H100 step, measured "
                                             "step counts of the small workload)"
                                             if FLAGS.what_if else "")
           + (", pool builds charged as measured on the small workload's host"
              if FLAGS.charge_pools else ""))
  text = table(rows, title + "\n\nFrom: " + "; ".join(sources) + ".")
  with open(os.path.join(FLAGS.out, f"{label}.md"), "w") as f:
    f.write(text)
  with open(os.path.join(FLAGS.out, f"{label}.json"), "w") as f:
    json.dump({"modelled": True, "sources": sources,
               "points": [dataclasses.asdict(p) for p in points],
               "rows": rows}, f, indent=1)
  if FLAGS.figures:
    plot(rows, os.path.join(FLAGS.out, f"{label}.png"), title)
  print(text)
  return 0


if __name__ == "__main__":
  cli.run(main)
