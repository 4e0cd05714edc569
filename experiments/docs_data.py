"""What the docs' page contexts share: the committed results' loaders, a point's name, and
the Markdown tables a generator prints. Reads committed JSON only, never trains."""
from __future__ import annotations

import functools
import glob
import json
import os
import re
import statistics

from ensemble_jax import report, stored

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "experiments", "results")


def load_json(*path: str) -> dict:
  """A committed JSON file, its path under experiments/results/."""
  with open(os.path.join(RESULTS, *path)) as f:
    return json.load(f)


@functools.lru_cache(maxsize=None)
def critical_batch(workload: str) -> dict:
  """A critical-batch sweep's `summary.json` (fashion, fashion_small_model, pydocs)."""
  return load_json("critical_batch", workload, "summary.json")


@functools.lru_cache(maxsize=None)
def tuning(sub: str, curve: str, name: str) -> dict:
  """A grid point's `tuning.json`: its tuning seeds, axes and runs."""
  return load_json(sub, curve, name, "tuning.json")


@functools.lru_cache(maxsize=None)
def grid(sub: str) -> tuple[dict, ...]:
  """A cost-vs-time grid's points (`report.points`, seeds 1-3)."""
  return tuple(report.points(report.load_runs(os.path.join(RESULTS, sub))))


def point(sub: str, curve: str, name: str) -> dict:
  return next(p for p in grid(sub) if p["curve"] == curve and p["point"] == name)


def results(pattern: str) -> list[dict]:
  """The runs (`report.read_run`) whose results.json match `pattern` under results/."""
  return [report.read_run(path) for path in sorted(glob.glob(os.path.join(RESULTS, pattern)))]


def stored_runs(pattern: str) -> list[dict]:
  """The results.json (`stored.load`) that match `pattern` under results/, by path."""
  return [stored.load(path) for path in sorted(glob.glob(os.path.join(RESULTS, pattern)))]


def final_text(x: float | None, metric: str | None) -> str:
  """A measured metric as every page and figure prints it: 90.14% (accuracy), 11.53 (a
  perplexity); '-' for none."""
  if x is None:
    return "-"
  return f"{100 * x:.2f}%" if metric in (None, "accuracy") else f"{x:.2f}"


def spread(values) -> dict:
  return {"median": statistics.median(values), "min": min(values), "max": max(values)}


PRESET_NAMES = {"nvlink": "nvlink", "ib_xdr800": "ib_xdr800", "eth10g": "10 GbE"}
CURVE_NAMES = {  # how the prose names a curve
    "ensemble": "random streams", "ensemble_tfidf_routed": "tf-idf-routed experts",
    "dp_small_model": "the small model",
    "dp_small_model_sync_bn": "the small model (synchronised BatchNorm)",
    "data_parallel_sync_bn": "data-parallel (synchronised BatchNorm)",
    "ensemble_pca_routed_small": "small-model PCA-routed experts",
    "ensemble_tfidf_routed_small": "small-model tf-idf-routed experts",
    "ensemble_pca_routed": "PCA-routed experts", "data_parallel": "data-parallel",
    "dp_wide_model": "the wider model (width 16)", "ensemble_distilled": "distilled sets",
    "ensemble_distilled_warm": "distilled warm start",
    "ensemble_kd": "knowledge-distilled ensemble"}


def point_name(curve: str, point: str) -> str:
  """A point as the docs name it, one name per thing: 'small-model PCA-routed experts, N = 4'
  (N4_L469: the steps left out), 'the small model at D = 8 (synchronised BatchNorm)',
  'data-parallel at D = 8, 2 epochs' (D8_E2: a fixed length said)."""
  family = curve.removesuffix("_sync_bn")  # its BatchNorm said last
  size, *rest = point.split("_")
  where = f" at D = {size[1:]}" if size[0] == "D" else f", {size[0]} = {size[1:]}"
  length = "".join(f", {r[1:]} epoch{'' if r[1:] == '1' else 's'}" for r in rest
                   if r.startswith("E"))
  bn = " (synchronised BatchNorm)" if family != curve else ""
  return f"{CURVE_NAMES.get(family, family.replace('_', '-'))}{where}{bn}{length}"


def model_name(config: dict) -> str:
  m = config["model"]
  return f"{m['name']} width {m['width']}" if m["name"].startswith("resnet") else m["name"]


def cells(row: str) -> list[str]:
  return [c.strip() for c in row.strip().strip("|").split("|")]


def tables(text: str) -> list[list[str]]:
  """The Markdown tables of `text`, each as its lines."""
  return [b.rstrip("\n").split("\n") for b in re.findall(r"(?m)(?:^\|.*\n)+", text + "\n")]
