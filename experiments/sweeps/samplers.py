r"""Which distilled sequence helps? The ensemble at fixed N and L, one run per sampler and seed.

  python -m experiments.sweeps.samplers --workload=fashion --seeds=0,1,2
  python -m experiments.sweeps.samplers --workload=pydocs --seeds=0,1,2
      [--workdir=DIR] [--grid=full|smoke] [--samplers=random,kmeans,...]

Writes `<sampler>/seed<k>/`, `pools/`, summary.json and table.md under the workdir (default
experiments/results/samplers, or samplers_pydocs). Resumable: a finished run is read back.
The committed runs took ~4.5 h (Fashion-MNIST, pool builds included) and ~1 h (the Python
docs) on 2 CPU cores; `smoke`, seconds.

A "sampler" here is a row's name: `random` and `disjoint` set `method.sampler`, the others
`distill.builder` (the pool builder).

The rules every point follows: docs/methodology.md.
"""
from __future__ import annotations

import glob
import json
import math
import os
import statistics

from absl import flags

from ensemble_jax import config_lib, stored
from ensemble_jax import run as run_lib
from experiments import cli, sweeps
from experiments.configs import fashion_mnist, pydocs_gpt2

FRACTION = 0.2
SAMPLERS = {
    # the whole training set: bagging, and a partition into N shards
    "random": {"method.sampler": "random"},
    "disjoint": {"method.sampler": "disjoint"},
    # pools of FRACTION, the hardest examples per class by a proxy's scores
    "el2n": {"distill.builder": "el2n"},
    "grand": {"distill.builder": "grand"},
    # the whole set in balanced clusters of proxy embeddings, one per worker
    "kmeans": {"distill.builder": "kmeans"},
    # weighted coresets of FRACTION per class on closed-form bias gradients
    "craig": {"distill.builder": "craig"},
    "gradmatch": {"distill.builder": "gradmatch"},
    # the same k-means pools, each test example's logits weighted by its cluster distances
    # (softmax(-d^2/T) over its nearest clusters)
    "kmeans_routed": {"distill.builder": "kmeans", "method.aggregation": "routed,logits,probs"},
    # the same routing, clusters of the pixels' top principal components: no proxy to train
    "pca_routed": {"distill.builder": "kmeans", "distill.embedding": "pca",
                   "method.aggregation": "routed,logits,probs"},
    # Ro et al.'s proxy (shared init, disjoint shards, crop+flip, SNIP-sparse, souped)
    "lipt_gradmatch": {"distill.builder": "gradmatch", "distill.proxy": "lipt"},
    # Sorscher et al.: at small kept fractions the easiest examples beat the hardest
    "el2n_easiest": {"distill.builder": "el2n", "distill.keep": "easiest"},
}
TEXT_SAMPLERS = {  # c-BTM: balanced k-means of the windows' tf-idf, one cluster per worker
    "random": {"method.sampler": "random"},
    "kmeans": {"distill.builder": "kmeans"},
    "kmeans_routed": {"distill.builder": "kmeans", "method.aggregation": "routed,probs,logits"},
}
WORKLOADS = {  # workload: (its samplers, default workdir, table caption)
    "fashion": (SAMPLERS, "experiments/results/samplers",
                f"Fashion-MNIST, ensemble N=4 x L=200 (ResNet-18 width 8, 64 per step), pools "
                f"of {FRACTION:.0%} from 2 width-4 proxies x 150 steps"),
    "pydocs": (TEXT_SAMPLERS, "experiments/results/samplers_pydocs",
               "Python docs, ensemble N=4 x L=400 (GPT-2 tiny, 16 x 128 tokens per step), "
               "perplexity on all validation windows; pools: tf-idf (SVD to 64) balanced "
               "k-means"),
}


def get_config(sampler: str, seed: int, workdir: str, grid: str, workload: str = "fashion"):
  """The ensemble at N = 4 (L = 200 for images, 400 for text), evaluated once at the end on
  the whole eval split; the sampler's overrides last.

  Image pools come from 2 proxies of width 4 trained 150 steps each, one pool per seed (a
  pool depends on it); its build time and FLOPs count as the run's (`_row`).
  """
  text = workload == "pydocs"
  module = pydocs_gpt2 if text else fashion_mnist
  c = module.get_config("ensemble,tiny" if grid == "smoke" else "ensemble,sweep")
  c.seed = seed
  c.method.num_workers, c.method.steps_per_worker = 4, 400 if text else 200
  c.eval.every_steps, c.eval.num_examples = 0, 0  # once, at the end, the whole eval split
  c.train.stop_at_target = False  # the whole budget: each sampler's accuracy at equal compute
  # The warm-up every committed row of this sweep used (0.02 epoch = 19 steps of 4 x 64 on
  # Fashion-MNIST, 30 steps on the docs), not the cost-vs-time grid's fraction of the budget.
  c.optim.warmup_fraction = 0.0
  if text:
    c.optim.warmup_steps = 30
  else:
    c.optim.warmup_epochs = 0.02
  c.distill.cache_dir = os.path.join(workdir, "pools")
  if not text:  # image pools: a fraction, chosen with proxies
    c.distill.fraction = FRACTION
    c.distill.proxy_models, c.distill.proxy_steps, c.distill.proxy_width = 2, 150, 4
  if grid == "smoke":
    c.mesh = [("worker", 2), ("data", -1)]
    c.method.num_workers, c.method.steps_per_worker = 2, 4
    c.data.train_examples, c.eval.num_examples = 256, 32 if text else 128
    c.distill.proxy_steps, c.distill.proxy_width, c.distill.tfidf_dim = 2, 2, 8
  for key, value in WORKLOADS[workload][0][sampler].items():
    config_lib.set_dotted(c, key, value)
  return c


def _row(r: dict) -> dict:
  """One run's table row: the headline aggregation's metric (accuracy for images,
  perplexity for text), the workers' mean, and the costs including the pool's."""
  distill = r.get("distill") or {}
  headline = r["ensemble"][config_lib.aggregation_modes(r["config"])[0]]
  if r["config"]["task"] == "lm":
    metric = {"perplexity": headline["perplexity"],
              "worker_perplexity": math.exp(r["final"]["worker/nll_mean"])}
  else:
    metric = {"accuracy": headline["accuracy"],
              "worker_accuracy": r["final"]["worker/accuracy_mean"]}
  return {
      **metric, "nll": headline["nll"],
      "pool_size": distill.get("pool_size", _train_size(r["data"])),
      "build_time_s": distill.get("build_time_s", 0.0),
      "wall_time_s": r["wall_time_s"] + distill.get("build_time_s", 0.0),
      "tflops": r["cost"]["measured"]["flops"] / 1e12,
  }


def _train_size(data: dict) -> int:
  """Training examples (images) or windows (text) the run drew from."""
  return data.get("train_examples_used", data.get("train_examples", data.get("train_windows")))


def summarize(runs: dict[str, list[dict]]) -> tuple[dict, str]:
  summary = {}
  for sampler, rows in runs.items():
    summary[sampler] = {k: {"mean": statistics.fmean(r[k] for r in rows),
                            "min": min(r[k] for r in rows), "max": max(r[k] for r in rows)}
                        for k in rows[0]}
    summary[sampler]["seeds"] = len(rows)
  metric = "perplexity" if any("perplexity" in s for s in summary.values()) else "accuracy"
  short = {"accuracy": "acc", "perplexity": "perplexity"}[metric]
  lines = [f"| sampler | seeds | ensemble {short} (headline aggregation) | workers' mean "
           f"{short} | pool size | pool build s | wall s incl. build | TFLOPs incl. build |",
           "|---|---|---|---|---|---|---|---|"]
  digits = 4 if metric == "accuracy" else 2
  for sampler, s in summary.items():
    def cell(k, digits):
      return (f"{s[k]['mean']:.{digits}f} [{s[k]['min']:.{digits}f}, "
              f"{s[k]['max']:.{digits}f}]")
    lines.append(f"| {sampler} | {s['seeds']} | {cell(metric, digits)} | "
                 f"{cell('worker_' + metric, digits)} | {s['pool_size']['mean']:.0f} | "
                 f"{cell('build_time_s', 1)} | {cell('wall_time_s', 1)} | "
                 f"{cell('tflops', 2)} |")
  return summary, "\n".join(lines) + "\n"


def run(workdir: str, seeds: list[int], grid: str = "full",
        samplers: list[str] | None = None, workload: str = "fashion") -> dict:
  """Trains the (sampler, seed) runs not finished yet, then summarises every finished run
  under the workdir (also those of other invocations, e.g. more seeds of some samplers)."""
  known, _, caption = WORKLOADS[workload]
  unknown = sorted(set(samplers or ()) - set(known))
  if unknown:
    raise ValueError(f"samplers {unknown} unknown for workload {workload!r}; choose from "
                     f"{list(known)}")
  for seed in seeds:  # seeds outermost: an interrupted sweep has whole seeds
    for sampler in samplers or list(known):
      # read back if finished (`resume.finished_results`), else trained or resumed
      run_lib.train_and_evaluate(get_config(sampler, seed, workdir, grid, workload),
                                 os.path.join(workdir, sampler, f"seed{seed}"))
  runs: dict[str, list[dict]] = {}
  for sampler in known:
    for seed_dir in sorted(glob.glob(os.path.join(workdir, sampler, "seed*"))):
      path = os.path.join(seed_dir, run_lib.RESULTS_FILE)
      if os.path.exists(path):
        runs.setdefault(sampler, []).append(_row(stored.load(path)))
  summary, text = summarize(runs)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(f"{caption}; mean [min, max] over seeds; measured on one 2-core host.\n\n"
            + text)
  return summary


FLAGS = flags.FlagValues()
flags.DEFINE_enum("workload", "fashion", list(WORKLOADS), "whose ensemble and samplers",
                  flag_values=FLAGS)
flags.DEFINE_string("workdir", "", "default: the workload's results directory",
                    flag_values=FLAGS)
flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds", flag_values=FLAGS)
flags.DEFINE_enum("grid", "full", ["full", "smoke"], "full, or smoke (seconds)",
                  flag_values=FLAGS)
flags.DEFINE_string("samplers", "", "comma-separated subset of the workload's: " + "; ".join(
    f"{w}: {','.join(v[0])}" for w, v in WORKLOADS.items()), flag_values=FLAGS)
sweeps.define_flags(FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  sweeps.use_compile_cache(FLAGS.compile_cache)
  workdir = FLAGS.workdir or WORKLOADS[FLAGS.workload][1]
  run(workdir, [int(s) for s in FLAGS.seeds.split(",")], FLAGS.grid,
      [s for s in FLAGS.samplers.split(",") if s] or None, FLAGS.workload)
  with open(os.path.join(workdir, "table.md")) as f:
    print(f.read())
  return 0


if __name__ == "__main__":
  cli.run(main)
