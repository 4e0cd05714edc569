"""Distribution matching against the literature, on Fashion-MNIST, before any grid uses it.

  python -m experiments.distillation_check --ipc=1,10,50 \
      --out=experiments/results/distillation/<machine>/results.json

The field's protocol (Zhao & Bilen 2021, 2023): the 3-block ConvNet of width 128 (instance
norm, ReLU, average pooling), `--models` of them trained from scratch on each set for
1,000 epochs (SGD 0.01, momentum 0.9, weight decay 5e-4, x0.1 at half, DSA per example),
test accuracy on the 10,000 test images. Beside each distilled set: random real images at
the same count per class (the field's baseline) and the whole training set; the published
figures beside those. Distillation runs `--iterations` (the paper's 20,000) unless
`--budget_s` caps its wall clock first; the set is evaluated along the way (`--eval_at`),
so the table shows how far the curve is from flattening. Every row is written to `--out`
as it lands (a partial file is a true record of what ran).
"""
from __future__ import annotations

import json
import os
import platform
import time

import jax
import numpy as np
from absl import flags

from experiments import cli

# The DSA paper's ConvNet table, Fashion-MNIST (Zhao & Bilen, ICML 2021, Table 1; the
# same numbers in VICO-UoE/DatasetCondensation's README). Distribution matching's paper
# has no Fashion-MNIST row.
PUBLISHED = {"random": {"1": 51.4, "10": 73.8, "50": 82.5},
             "dc": {"1": 70.5, "10": 82.3, "50": 83.6},
             "dsa": {"1": 70.6, "10": 84.6, "50": 88.7},
             "whole": 93.5}
# How each published column was evaluated, as the papers' reference code runs it
# (VICO-UoE/DatasetCondensation main.py: `--method DSA` trains each model 1,000 epochs under
# DSA; `--method DC` takes `utils.get_daparam`'s augmentation, none for Fashion-MNIST's
# ConvNet, and then 300 epochs; 20 models (`--num_eval`) on each of 5 distillations
# (`--num_exp`)). The random column is the DC paper's baseline, evaluated as DC's.
PUBLISHED_EVALUATION = {"random": {"epochs": 300, "augment": "none"},
                        "dc": {"epochs": 300, "augment": "none"},
                        "dsa": {"epochs": 1000, "augment": "dsa"},
                        "models": 20, "distillations": 5}

FLAGS = flags.FlagValues()
flags.DEFINE_list("ipc", ["1", "10", "50"], "images per class of each distilled set",
                  flag_values=FLAGS)
flags.DEFINE_list("rows", ["whole", "random", "dm"], "which rows to measure",
                  flag_values=FLAGS)
flags.DEFINE_integer("iterations", 20_000, "distillation iterations (the paper's 20,000)",
                     flag_values=FLAGS)
flags.DEFINE_integer("real_per_class", 256, "real images per class and iteration",
                     flag_values=FLAGS)
flags.DEFINE_list("eval_at", ["0", "500", "1000", "2000", "5000", "10000", "20000"],
                  "iterations at which the set is evaluated (and at its last)",
                  flag_values=FLAGS)
flags.DEFINE_float("budget_s", 0.0, "per set: stop distilling after this many seconds "
                   "of distillation (0: run every iteration)", flag_values=FLAGS)
flags.DEFINE_integer("models", 5, "evaluation models per set", flag_values=FLAGS)
flags.DEFINE_integer("eval_epochs", 1000, "epochs of each evaluation model on a set",
                     flag_values=FLAGS)
flags.DEFINE_integer("whole_epochs", 20, "epochs of the whole-training-set row",
                     flag_values=FLAGS)
flags.DEFINE_integer("width", 128, "the ConvNet's width", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "the distillation's and the random rows' seed",
                     flag_values=FLAGS)
flags.DEFINE_integer("chunk", 100, "iterations per compiled call", flag_values=FLAGS)
flags.DEFINE_string("data_dir", "", "Fashion-MNIST's idx files (default: the fetch cache)",
                    flag_values=FLAGS)
flags.DEFINE_string("out", "experiments/results/distillation/results.json",
                    "the results file, rewritten as each row lands", flag_values=FLAGS)
flags.DEFINE_list("table", [], "print the tables of these results files (merged, in order) "
                  "and measure nothing", flag_values=FLAGS)

# The committed check: an H200's two calls (the second finished the 50-per-class set).
COMMITTED = ["experiments/results/distillation/h200/run1.json",
             "experiments/results/distillation/h200/run2.json"]
# The grid's reduced protocol on this 2-core host (fewer evaluation models and epochs).
REDUCED = "experiments/results/distillation/cpu_reduced/results.json"


def _device() -> str:
  d = jax.devices()[0]
  return f"{d.platform}: {getattr(d, 'device_kind', '')} x {jax.device_count()}"


def measure(ipcs, rows, out: str, *, iterations: int, real_per_class: int, eval_at,
            budget_s: float, models: int, eval_epochs: int, whole_epochs: int, width: int,
            seed: int, chunk: int, data_dir: str = "") -> dict:
  from ensemble_jax.data import images as images_lib
  from ensemble_jax.distill import synthetic

  train, test = images_lib.load_fashion_mnist_idx(data_dir)
  dm = synthetic.DistributionMatching(iterations=iterations, real_per_class=real_per_class,
                                      width=width)
  ev = synthetic.Evaluation(models=models, epochs=eval_epochs, width=width)
  record = {"protocol": {"distillation": {"method": "distribution_matching",
                                          "iterations": iterations,
                                          "real_per_class": real_per_class, "lr": dm.lr,
                                          "momentum": dm.momentum, "init": dm.init,
                                          "embedding": f"ConvNet-{dm.depth} width {width}",
                                          "budget_s": budget_s, "seed": seed},
                         "evaluation": {"models": models, "epochs": eval_epochs,
                                        "whole_epochs": whole_epochs, "lr": ev.lr,
                                        "batch_size": ev.batch_size, "augment": "dsa"}},
            "device": _device(), "jax": jax.__version__, "host": platform.node(),
            "published": PUBLISHED, "random": {}, "dm": {}}

  def write():
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w") as f:
      json.dump(record, f, indent=1)
    os.replace(out + ".tmp", out)

  def evaluate(images, labels, key, protocol=ev):
    r = synthetic.evaluate(images, labels, test.images, test.labels, key, protocol, dm.dsa, dm)
    print(f"  {100 * r['mean']:.2f} +- {100 * r['std']:.2f} ({r['train_time_s']:.0f} s)",
          flush=True)
    return r

  key = jax.random.key(seed)
  if "whole" in rows:
    print(f"whole training set, {whole_epochs} epochs", flush=True)
    record["whole"] = evaluate(train.images, train.labels, jax.random.fold_in(key, 1),
                               synthetic.Evaluation(models=models, epochs=whole_epochs,
                                                    width=width))
    write()
  pool, counts = synthetic.class_pool(train.images, train.labels, 10)
  rng = np.random.default_rng(seed)
  for ipc in ipcs:
    if "random" in rows:
      print(f"random real, {ipc} per class", flush=True)
      images = np.concatenate([pool[c, rng.choice(counts[c], ipc, replace=False)]
                               for c in range(10)])
      labels = np.repeat(np.arange(10, dtype=np.int32), ipc)
      record["random"][str(ipc)] = evaluate(images, labels, jax.random.fold_in(key, 100 + ipc))
      write()
    if "dm" in rows:
      cfg = synthetic.DistributionMatching(images_per_class=ipc, iterations=iterations,
                                           real_per_class=real_per_class, width=width)
      entry = record["dm"][str(ipc)] = {"curve": [], "loss": []}
      mesh = jax.make_mesh((1,), ("worker",), devices=jax.devices()[:1])
      clock = {"distil_s": 0.0, "t": time.perf_counter()}

      def on_chunk(it, loss_N, state, ipc=ipc, entry=entry, clock=clock):
        if it:
          entry["loss"].append([it, float(loss_N[0])])
        entry["iterations"] = it
        over = budget_s > 0 and time.perf_counter() - clock["t"] >= budget_s
        if it in eval_at or it == iterations or over:
          clock["t0"] = time.perf_counter()
          images = np.asarray(state["images"][0]).reshape((-1,) + pool.shape[2:])
          print(f"distribution matching, {ipc} per class, iteration {it}", flush=True)
          r = evaluate(images, np.repeat(np.arange(10, dtype=np.int32), ipc),
                       jax.random.fold_in(key, 1000 * ipc + it))
          entry["curve"].append({"iteration": it, **r})
          clock["t"] += time.perf_counter() - clock["t0"]  # evaluation is not distillation
          write()
        return over

      result = synthetic.distil(cfg, mesh, pool[None], counts[None], np.int32([seed]),
                                chunk=chunk, checkpoint_every=max(eval_at + [iterations]),
                                on_chunk=on_chunk)
      entry.update(iterations=result["iterations"], distil_time_s=result["time_s"],
                   s_per_iteration=result["time_s"] / max(result["iterations"], 1),
                   flops_per_iteration=result["flops_per_iteration"])
      write()
  return record


def load(paths) -> dict:
  """One record from the results files of several calls (in order): rows measured later
  fill what earlier calls left, and each set's curve is the union of its evaluations."""
  merged = None
  for path in paths:
    with open(path) as f:
      r = json.load(f)
    if merged is None:
      merged = r
      continue
    merged["random"].update(r["random"])
    merged.setdefault("whole", r.get("whole"))
    for ipc, entry in r["dm"].items():
      mine = merged["dm"].setdefault(ipc, {"curve": [], "loss": []})
      done = {c["iteration"] for c in mine["curve"]}
      mine["curve"] = sorted(mine["curve"] + [c for c in entry["curve"]
                                              if c["iteration"] not in done],
                             key=lambda c: c["iteration"])
      for key in ("distil_time_s", "s_per_iteration", "flops_per_iteration"):
        if entry.get(key) is not None:
          mine[key] = entry[key]
  return merged


def _pct(r) -> str:
  return f"{100 * r['mean']:.1f} ± {100 * r['std']:.1f}" if r else "not run"


def table(record: dict) -> str:
  """Markdown: per images per class, test accuracy (mean ± std over the evaluation models)
  of random real images and of the distilled set at its last evaluation, the published
  figures beside them; then the whole training set."""
  pub = record["published"]
  ipcs = sorted({int(k) for k in list(record["random"]) + list(record["dm"])})
  lines = ["| images per class | random real | published random | distribution matching "
           "| at iteration | published DSA | published DC |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for ipc in ipcs:
    k = str(ipc)
    curve = record["dm"].get(k, {}).get("curve") or []
    last = curve[-1] if curve else None
    at = f"{last['iteration']:,}" if last else "-"
    lines.append(f"| {ipc} | {_pct(record['random'].get(k))} | {pub['random'].get(k, 'n/a')} "
                 f"| {_pct(last)} | {at} "
                 f"| {pub['dsa'].get(k, 'n/a')} | {pub['dc'].get(k, 'n/a')} |")
  whole = record.get("whole")
  if whole:
    epochs = record["protocol"]["evaluation"]["whole_epochs"]
    lines.append(f"| all (about 6,000) | {_pct(whole)} ({epochs} epochs) | {pub['whole']} "
                 f"| | | | |")
  return "\n".join(lines) + "\n"


def curve_table(record: dict) -> str:
  """Markdown: the distilled sets' test accuracy against distillation iterations."""
  ipcs = sorted(record["dm"], key=int)
  iterations = sorted({c["iteration"] for k in ipcs for c in record["dm"][k]["curve"]})
  lines = ["| iteration | " + " | ".join(f"{k} per class" for k in ipcs) + " |",
           "| --- |" + " --- |" * len(ipcs)]
  for it in iterations:
    cells = []
    for k in ipcs:
      point = next((c for c in record["dm"][k]["curve"] if c["iteration"] == it), None)
      cells.append(_pct(point) if point else "-")
    lines.append(f"| {it:,} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def loss_table(record: dict) -> str:
  """Markdown: the matching loss (mean over each chunk's iterations and the classes)
  against distillation iterations, and its ratio to the last."""
  ipcs = sorted(record["dm"], key=int)
  losses = {k: dict((int(it), v) for it, v in record["dm"][k]["loss"]) for k in ipcs}
  iterations = sorted({it for k in ipcs for it in losses[k]})
  lines = ["| iteration | " + " | ".join(f"{k} per class: loss | / last" for k in ipcs) + " |",
           "| --- |" + " --- | --- |" * len(ipcs)]
  for it in iterations:
    cells = []
    for k in ipcs:
      last = losses[k][max(losses[k])]
      cells += ([f"{losses[k][it]:.1f}", f"{losses[k][it] / last:.2f}"] if it in losses[k]
                else ["-", "-"])
    lines.append(f"| {it:,} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


BENCH = "experiments/results/bench/distill.json"


def iteration_flops(cases: list[dict], real_per_class: int) -> float:
  """One set's distillation iteration at `real_per_class` (XLA's count, one worker), from
  experiments/bench/distill.py's cases."""
  [flops] = {c["flops_per_iteration_per_worker"] for c in cases
             if c["workers"] == 1 and c["real_per_class"] == real_per_class}
  return flops


def cost_table(cases: list[dict], baseline: dict, protocols: dict) -> str:
  """Markdown: one worker's distillation at each protocol, charged as the method must be,
  beside the strongest baseline's whole training to the target (its seed medians).

  `cases`: experiments/bench/distill.py's (FLOPs per iteration, XLA on CPU, per real
  images per class); `baseline`: report.points' entry of the strongest baseline;
  `protocols`: name -> (iterations, real images per class)."""
  steps, total = baseline["steps"]["median"], baseline["flops"]["median"]
  per_step = total / steps / baseline["devices"]
  name = f"{baseline['curve']} {baseline['point']}"
  lines = ["| protocol | iterations | real per class | GFLOP per iteration | one set (TFLOP) "
           f"| one set / {name}'s compute to target | iterations / its {steps} steps "
           f"| an iteration / its device step ({per_step / 1e9:.2f} GFLOP) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for protocol, (iterations, real) in protocols.items():
    per_iteration = iteration_flops(cases, real)
    one_set = iterations * per_iteration
    lines.append(f"| {protocol} | {iterations:,} | {real} | {per_iteration / 1e9:.0f} | "
                 f"{one_set / 1e12:,.0f} | {one_set / total:,.0f}x | {iterations / steps:.1f}x | "
                 f"{per_iteration / per_step:,.0f}x |")
  return "\n".join(lines) + "\n"


def grid_protocol() -> tuple[int, int]:
  """(iterations, real images per class) of the Fashion-MNIST grid's distilled curves."""
  from experiments.configs import fashion_mnist

  grid = fashion_mnist.sweep_grid("full")["ensemble_distilled"]
  overrides = next(iter(grid.values()))[1]
  return overrides["distill.iterations"], overrides["distill.real_per_class"]


def time_table(cases: list[dict]) -> str:
  """Markdown: the measured time of a distillation iteration on this host, per case of
  experiments/bench/distill.py (workers stacked on one device, unrolled on CPU), and what
  one set's distillation (N sets' stacked) takes at the grid's iterations."""
  iterations, _ = grid_protocol()
  lines = ["| distiller | workers stacked | real per class | s per iteration | s per worker "
           f"| load average | the grid's {iterations} iterations (min) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for c in cases:
    if c.get("s_per_iteration") is None or c["s_per_iteration"] != c["s_per_iteration"]:
      continue  # FLOPs only
    lines.append(f"| {c.get('distiller', 'distribution_matching')} | {c['workers']} | "
                 f"{c['real_per_class']} | {c['s_per_iteration']:.2f} | "
                 f"{c['s_per_iteration_per_worker']:.2f} | {c['load_average']:.1f} | "
                 f"{iterations * c['s_per_iteration'] / 60:.0f} |")
  return "\n".join(lines) + "\n"


def committed_cost_table(root: str = ".") -> str:
  """`cost_table` of the committed benchmark, the committed study's strongest baseline and
  the two protocols: the papers' and the Fashion-MNIST grid's distilled curves'."""
  import os

  from ensemble_jax import report

  with open(os.path.join(root, BENCH)) as f:
    cases = json.load(f)
  pts = report.points(report.load_runs(os.path.join(root, "experiments/results/fashion_mnist")))
  strongest = report.verdict(pts)["strongest"]
  [baseline] = [p for p in pts if f"{p['curve']} {p['point']}" == strongest]
  protocols = {"the papers'": (PROTOCOL_ITERATIONS, PROTOCOL_REAL),
               "the grid's distilled curves'": grid_protocol()}
  return cost_table(cases, baseline, protocols)


PROTOCOL_ITERATIONS, PROTOCOL_REAL = 20_000, 256


def main(argv) -> int:
  cli.parse(FLAGS, argv, __doc__)
  if FLAGS.table:
    record = load(FLAGS.table)
    print(table(record) + "\n" + curve_table(record) + "\n" + loss_table(record))
    return 0
  measure([int(i) for i in FLAGS.ipc], FLAGS.rows, FLAGS.out, iterations=FLAGS.iterations,
          real_per_class=FLAGS.real_per_class, eval_at=[int(i) for i in FLAGS.eval_at],
          budget_s=FLAGS.budget_s, models=FLAGS.models, eval_epochs=FLAGS.eval_epochs,
          whole_epochs=FLAGS.whole_epochs, width=FLAGS.width, seed=FLAGS.seed,
          chunk=FLAGS.chunk, data_dir=FLAGS.data_dir)
  record = load([FLAGS.out])
  print(table(record) + "\n" + curve_table(record))
  return 0


if __name__ == "__main__":
  cli.run(main)
