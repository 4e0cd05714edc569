"""docs/results/samplers.md's context: each sampler's ensemble against random streams, seed
by seed, and the sweeps' tables, from the committed runs (experiments/results/samplers*/)."""
from __future__ import annotations

import glob
import os
import statistics

from ensemble_jax import stored
from experiments import targets
from experiments.docs_data import REPO, tables
from experiments.sweeps import samplers

REFERENCE = "random"  # a stream over the whole training set: every pool's comparison
LABELS = {"fashion": "Fashion-MNIST", "pydocs": "The Python docs"}


def against_reference(rows: dict[int, dict], reference: dict[int, dict], metric: str) -> dict:
  """A sampler's ensemble over the reference's, seed by seed (above 1 better: accuracy over
  accuracy, the reference's perplexity over the sampler's), and its verdict."""
  seeds = sorted(set(rows) & set(reference))
  ratios = [reference[s][metric] / rows[s][metric] if metric == "perplexity"
            else rows[s][metric] / reference[s][metric] for s in seeds]
  ratio, rng = statistics.median(ratios), (min(ratios), max(ratios))
  return {"ratio": ratio, "range": rng, "seeds": len(seeds),
          "verdict": targets.verdict_word(ratio, rng)}


def workload(name: str) -> dict:
  known, workdir, _ = samplers.WORKLOADS[name]
  runs = {}  # {sampler: {seed: its table row (samplers._row)}} of the committed runs
  for sampler in known:
    for path in sorted(glob.glob(os.path.join(REPO, workdir, sampler, "seed*", "results.json"))):
      run = stored.load(path)
      runs.setdefault(sampler, {})[run["config"]["seed"]] = samplers._row(run)
  metric = "perplexity" if "perplexity" in next(iter(runs[REFERENCE].values())) else "accuracy"
  with open(os.path.join(REPO, workdir, "table.md")) as f:
    caption = f.readline().strip()  # the sweep's caption, as it wrote its table
  return {"label": LABELS[name], "metric": metric, "caption": caption,
          "table": tables(samplers.summarize({s: list(r.values()) for s, r in runs.items()})[1])[0],
          "best": (min if metric == "perplexity" else max)(runs, key=lambda s: statistics.fmean(
              r[metric] for r in runs[s].values())),
          "compared": {s: against_reference(rows, runs[REFERENCE], metric)
                       for s, rows in runs.items() if s != REFERENCE},
          "seeds": sorted({s for rows in runs.values() for s in rows})}


def context() -> dict:
  return {"reference": REFERENCE, "workloads": [workload(w) for w in samplers.WORKLOADS]}

