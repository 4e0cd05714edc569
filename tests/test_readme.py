"""Every results table in the README is what its generator writes from the committed JSON.

The tables are regenerated from experiments/results/ (reading results.json, never
training) and compared with the README's copy, so a number edited by hand, or left stale
after a rerun, fails here with the command that regenerates it.
"""
import glob
import json
import os
import re

import pytest

from ensemble_jax import report, train
from experiments import lipt_pipeline, many_workers_table
from experiments.sweeps import critical_batch, samplers
from tests.conftest import REPO

RESULTS = os.path.join(REPO, "experiments", "results")
# README heading (prefix) -> (the cost-vs-time sweep's results directory, how many of its
# report's tables the README holds: the points, the matched ratios to the strongest
# baseline, their best-over-budgets summary, and for a grid run under issue 13's rules its
# budgets and tuning per point and per curve; the per-baseline tables stay in table.md).
REPORT_TABLES = {
    "### Fashion-MNIST, target": ("fashion_mnist", 5),
    "### Python docs (byte-level GPT-2": ("pydocs_gpt2", 5),
}
# Issue 16's section: the critical-batch sweep's table per workload (README line it follows).
CRITICAL_BATCH_TABLES = {"fashion": "**1. Data-parallel's critical batch",
                         "pydocs": "The Python docs (`--workload=pydocs`"}
# the many-worker sweeps' tables in the README (the line each follows)
MANY_WORKER_TABLES = {"fashion": "**2. Many-worker ensembles",
                      "pydocs": "The Python docs have the same grid"}


def _blocks(lines: list[str]) -> list[list[str]]:
  """The Markdown tables among `lines`, each the list of its rows."""
  blocks, current = [], []
  for line in lines + [""]:
    if line.startswith("|"):
      current.append(line)
    elif current:
      blocks.append(current)
      current = []
  return blocks


def _tables(text: str) -> list[list[str]]:
  return _blocks(text.splitlines())


def _tables_after(readme: str, anchor: str, count: int) -> list[list[str]]:
  """The first `count` tables after the line starting with `anchor`, before the next
  heading ([] without the anchor)."""
  lines = readme.splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith(anchor)), None)
  if start is None:
    return []
  end = next((i for i in range(start + 1, len(lines)) if re.match(r"#{1,6} ", lines[i])),
             len(lines))
  return _blocks(lines[start + 1:end])[:count]


def _cells(row: str) -> list[str]:
  return [c.strip() for c in row.strip().strip("|").split("|")]


def _header_name(cell: str) -> str:
  # The README names the one preset it keeps "time to target, ib_xdr800 (s)";
  # report.table writes every preset as "time ib_xdr800 (s)".
  return re.sub(r"^time to target, (\w+) \(s\)$", r"time \1 (s)", cell)


def _compare(name: str, command: str, mine: list[str], generated: list[str]) -> list[str]:
  """Differences between a README table and the generated one. The README may keep a
  subset of the generated columns (by header name); every row and kept cell must match."""
  fix = f"regenerate with `{command}` and paste it into README.md"
  if not mine:
    return [f"{name}: table not found in README.md; {fix}"]
  header = [_header_name(c) for c in _cells(mine[0])]
  full = [_header_name(c) for c in _cells(generated[0])]
  missing = [h for h in header if h not in full]
  if missing:
    return [f"{name}: README columns {missing} are not among the generated {full}; {fix}"]
  # every column (names may repeat, one group per curve), else the kept ones by name
  keep = list(range(len(full))) if header == full else [full.index(h) for h in header]
  mine_rows = [_cells(r) for r in mine[2:]]
  generated_rows = [[_cells(r)[i] for i in keep] for r in generated[2:]]
  if len(mine_rows) != len(generated_rows):
    keys_mine, keys_generated = [r[:2] for r in mine_rows], [r[:2] for r in generated_rows]
    return [f"{name}: README has {len(mine_rows)} rows, the results give "
            f"{len(generated_rows)} (only in README: "
            f"{[k for k in keys_mine if k not in keys_generated]}, only in the results: "
            f"{[k for k in keys_generated if k not in keys_mine]}); {fix}"]
  return [f"{name}: README row {m} != from the results {g}; {fix}"
          for m, g in zip(mine_rows, generated_rows) if m != g]


def _report_tables(readme: str) -> list[str]:
  errors = []
  for anchor, (sub, count) in REPORT_TABLES.items():
    generated = _tables(report.table(report.load_runs(os.path.join(RESULTS, sub))))[:count]
    mine = _tables_after(readme, anchor, len(generated))
    for i, block in enumerate(generated):
      errors += _compare(f"cost vs time {sub} (table {i + 1})",
                         f"python -m ensemble_jax.report experiments/results/{sub}",
                         mine[i] if i < len(mine) else [], block)
  return errors


def _sampler_table(workload: str) -> list[str]:
  """What samplers.run writes under its table's caption, read back without training."""
  known, workdir, _ = samplers.WORKLOADS[workload]
  runs = {}
  for sampler in known:
    for path in sorted(glob.glob(os.path.join(RESULTS, os.path.relpath(
        workdir, "experiments/results"), sampler, "seed*", train.RESULTS_FILE))):
      with open(path) as f:
        runs.setdefault(sampler, []).append(samplers._row(json.load(f)))
  [generated] = _tables(samplers.summarize(runs)[1])
  return generated


def _sampler_tables(readme: str) -> list[str]:
  errors = []
  for workload, (_, _, caption) in samplers.WORKLOADS.items():
    generated = _sampler_table(workload)
    mine = _tables_after(readme, caption, 1)
    errors += _compare(f"samplers {workload}",
                       f"python -m experiments.sweeps.samplers --workload={workload}",
                       mine[0] if mine else [], generated)
  return errors


def _lipt_table(readme: str) -> list[str]:
  workdir = os.path.join(RESULTS, "lipt")
  seeds = sorted(int(os.path.basename(d)[4:]) for d in glob.glob(os.path.join(workdir, "seed*")))
  command = "python -m experiments.lipt_pipeline --workdir=experiments/results/lipt"
  if not seeds:
    return [f"lipt: no seed*/ results under experiments/results/lipt; run `{command}`"]
  for seed in seeds:  # lipt_pipeline.measure would train a missing phase
    for phase in ("full", "coreset", "finetune"):
      if not os.path.exists(os.path.join(workdir, f"seed{seed}", phase, "results.json")):
        return [f"lipt: seed{seed}/{phase}/results.json is not committed; run `{command}`"]
  [generated] = _tables(lipt_pipeline.table([lipt_pipeline.measure(s, workdir)
                                             for s in seeds]))
  mine = _tables_after(readme, "LiPT pipeline on Fashion-MNIST", 1)
  return _compare("lipt", command, mine[0] if mine else [], generated)


def _regime_tables(readme: str) -> list[str]:
  """Issue 16's: each workload's critical batch, and the many-worker runs per seed."""
  errors = []
  for workload, anchor in CRITICAL_BATCH_TABLES.items():
    w = critical_batch.WORKLOADS[workload]
    summary = critical_batch.summarize(os.path.join(RESULTS, "critical_batch", workload), w)
    [generated] = _tables(critical_batch.table(summary))
    mine = _tables_after(readme, anchor, 1)
    errors += _compare(f"critical batch {workload}",
                       f"python -m experiments.sweeps.critical_batch --workload={workload} "
                       "--report_only", mine[0] if mine else [], generated)
  for workload, anchor in MANY_WORKER_TABLES.items():
    w = many_workers_table.WORKLOADS[workload]
    [generated] = _tables(many_workers_table.table(many_workers_table.load(
        os.path.join(REPO, w.workdir)), workload))
    mine = _tables_after(readme, anchor, 1)
    errors += _compare(f"many workers {workload}",
                       f"python -m experiments.many_workers_table --workload={workload}",
                       mine[0] if mine else [], generated)
  return errors


def mismatches(readme: str) -> list[str]:
  """Every README table that differs from its regeneration, one line each."""
  return (_report_tables(readme) + _sampler_tables(readme) + _lipt_table(readme)
          + _regime_tables(readme))


@pytest.fixture(scope="module")
def readme():
  with open(os.path.join(REPO, "README.md")) as f:
    return f.read()


def test_readme_tables_match_the_committed_results(readme):
  errors = mismatches(readme)
  assert not errors, "\n".join(errors)


def test_an_altered_number_is_caught():
  """The check can fail: a README holding the regenerated table passes, and the same with
  one digit changed fails, naming the table and its command (whatever the README holds)."""
  caption, generated = samplers.WORKLOADS["fashion"][2], _sampler_table("fashion")
  good = caption + "\n\n" + "\n".join(generated) + "\n"
  cells = _cells(generated[2])  # the first sampler's row; its ensemble cell's last digit
  digit = re.search(r"\d(?=\D*$)", cells[2])
  cells[2] = cells[2][:digit.start()] + str((int(digit[0]) + 1) % 10) + cells[2][digit.end():]
  bad = good.replace(generated[2], "| " + " | ".join(cells) + " |")

  def fashion_errors(text):
    return [e for e in _sampler_tables(text) if e.startswith("samplers fashion")]

  assert fashion_errors(good) == []
  [error] = fashion_errors(bad)
  assert "README row" in error and "--workload=fashion" in error, error
