"""Every results table in the docs is what its generator writes from the committed JSON.

The tables are regenerated from experiments/results/ (reading results.json, never
training) and compared with the copy in the page that holds them (README.md or a page of
docs/), so a number edited by hand, or left stale after a rerun, fails here with the
command that regenerates it and the page to paste it into.
"""
import glob
import json
import os
import re

import pytest

from ensemble_jax import record, report
from experiments import lipt_pipeline, many_workers_table
from experiments.sweeps import critical_batch, samplers
from tests.conftest import REPO

RESULTS = os.path.join(REPO, "experiments", "results")
# Every anchor is (page, heading or line prefix): the tables sit after that line of that
# page (a path relative to the repository), before its next heading.
COST_VS_TIME = "docs/results/cost_vs_time.md"
REGIME = "docs/results/regime.md"
ONE_DEVICE = "docs/results/one_device.md"
# (page, heading) -> (the cost-vs-time sweep's results directory, how many of its report's
# tables the page holds: the points, the matched ratios to the strongest baseline, their
# best-over-budgets summary, the budgets and tuning per point and per curve; the
# per-baseline tables stay in table.md).
REPORT_TABLES = {
    (COST_VS_TIME, "## Fashion-MNIST, target"): ("fashion_mnist", 5),
    (COST_VS_TIME, "## Python docs (byte-level GPT-2"): ("pydocs_gpt2", 5),
    (ONE_DEVICE, "## Fashion-MNIST on one NVIDIA H200"): ("one_device_h200/fashion_mnist", 1),
}
# the schedule-length check (report.schedule_check) per cost-vs-time results directory
SCHEDULE_TABLES = {"fashion_mnist": (COST_VS_TIME, "### Does the schedule's length move a point?"),
                   "pydocs_gpt2": (COST_VS_TIME, "### The schedule's length on the Python docs")}
# the critical-batch sweep's table per workload
CRITICAL_BATCH_TABLES = {"fashion": (REGIME, "### Fashion-MNIST's critical batch"),
                         "pydocs": (REGIME, "### The Python docs' critical batch")}
# the many-worker sweeps' tables
MANY_WORKER_TABLES = {"fashion": (REGIME, "### Many workers on Fashion-MNIST"),
                      "pydocs": (REGIME, "### Many workers on the Python docs")}
SAMPLER_PAGE = "docs/results/samplers.md"  # each table follows samplers.WORKLOADS' caption
LIPT_TABLE = ("docs/results/lipt.md", "LiPT pipeline on Fashion-MNIST")


def documentation() -> dict[str, str]:
  """README.md and every page under docs/, by path relative to the repository."""
  paths = ["README.md"] + sorted(
      os.path.relpath(p, REPO)
      for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
  pages = {}
  for path in paths:
    with open(os.path.join(REPO, path)) as f:
      pages[path] = f.read()
  return pages


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


def _tables_after(pages: dict[str, str], anchor: tuple[str, str],
                  count: int) -> list[list[str]]:
  """The first `count` tables after the line starting with anchor's prefix in anchor's
  page, before the next heading ([] without the page or the line)."""
  page, prefix = anchor
  lines = pages.get(page, "").splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith(prefix)), None)
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


def _compare(name: str, command: str, mine: list[str], generated: list[str],
             anchor: tuple[str, str]) -> list[str]:
  """Differences between a documented table and the generated one. The page may keep a
  subset of the generated columns (by header name); every row and kept cell must match."""
  page, prefix = anchor
  fix = f"regenerate with `{command}` and paste it into {page} after `{prefix}`"
  if not mine:
    return [f"{name}: table not found in {page} after `{prefix}`; {fix}"]
  header = [_header_name(c) for c in _cells(mine[0])]
  full = [_header_name(c) for c in _cells(generated[0])]
  missing = [h for h in header if h not in full]
  if missing:
    return [f"{name}: {page} columns {missing} are not among the generated {full}; {fix}"]
  # every column (names may repeat, one group per curve), else the kept ones by name
  keep = list(range(len(full))) if header == full else [full.index(h) for h in header]
  mine_rows = [_cells(r) for r in mine[2:]]
  generated_rows = [[_cells(r)[i] for i in keep] for r in generated[2:]]
  if len(mine_rows) != len(generated_rows):
    keys_mine, keys_generated = [r[:2] for r in mine_rows], [r[:2] for r in generated_rows]
    return [f"{name}: {page} has {len(mine_rows)} rows, the results give "
            f"{len(generated_rows)} (only in {page}: "
            f"{[k for k in keys_mine if k not in keys_generated]}, only in the results: "
            f"{[k for k in keys_generated if k not in keys_mine]}); {fix}"]
  return [f"{name}: {page} row {m} != from the results {g}; {fix}"
          for m, g in zip(mine_rows, generated_rows) if m != g]


def _report_tables(pages: dict[str, str]) -> list[str]:
  errors = []
  for anchor, (sub, count) in REPORT_TABLES.items():
    generated = _tables(report.table(report.load_runs(os.path.join(RESULTS, sub))))[:count]
    mine = _tables_after(pages, anchor, len(generated))
    for i, block in enumerate(generated):
      errors += _compare(f"cost vs time {sub} (table {i + 1})",
                         f"python -m ensemble_jax.report experiments/results/{sub}",
                         mine[i] if i < len(mine) else [], block, anchor)
  return errors


def _schedule_tables(pages: dict[str, str]) -> list[str]:
  errors = []
  for sub, anchor in SCHEDULE_TABLES.items():
    generated = _tables(report.schedule_check(os.path.join(RESULTS, sub)))
    mine = _tables_after(pages, anchor, 1)
    errors += _compare(f"schedule check {sub}", f"python -m ensemble_jax.report "
                       f"experiments/results/{sub} (its table.md's last table)",
                       mine[0] if mine else [], generated[0] if generated else [], anchor)
  return errors


def _sampler_table(workload: str) -> list[str]:
  """What samplers.run writes under its table's caption, read back without training."""
  known, workdir, _ = samplers.WORKLOADS[workload]
  runs = {}
  for sampler in known:
    for path in sorted(glob.glob(os.path.join(RESULTS, os.path.relpath(
        workdir, "experiments/results"), sampler, "seed*", record.RESULTS_FILE))):
      with open(path) as f:
        runs.setdefault(sampler, []).append(samplers._row(json.load(f)))
  [generated] = _tables(samplers.summarize(runs)[1])
  return generated


def _sampler_tables(pages: dict[str, str]) -> list[str]:
  errors = []
  for workload, (_, _, caption) in samplers.WORKLOADS.items():
    generated = _sampler_table(workload)
    anchor = (SAMPLER_PAGE, caption)
    mine = _tables_after(pages, anchor, 1)
    errors += _compare(f"samplers {workload}",
                       f"python -m experiments.sweeps.samplers --workload={workload}",
                       mine[0] if mine else [], generated, anchor)
  return errors


def _lipt_table(pages: dict[str, str]) -> list[str]:
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
  mine = _tables_after(pages, LIPT_TABLE, 1)
  return _compare("lipt", command, mine[0] if mine else [], generated, LIPT_TABLE)


def _regime_tables(pages: dict[str, str]) -> list[str]:
  """Each workload's critical batch, and the many-worker runs per seed."""
  errors = []
  for workload, anchor in CRITICAL_BATCH_TABLES.items():
    w = critical_batch.WORKLOADS[workload]
    summary = critical_batch.summarize(os.path.join(RESULTS, "critical_batch", workload), w)
    [generated] = _tables(critical_batch.table(summary))
    mine = _tables_after(pages, anchor, 1)
    errors += _compare(f"critical batch {workload}",
                       f"python -m experiments.sweeps.critical_batch --workload={workload} "
                       "--report_only", mine[0] if mine else [], generated, anchor)
  for workload, anchor in MANY_WORKER_TABLES.items():
    w = many_workers_table.WORKLOADS[workload]
    [generated] = _tables(many_workers_table.table(many_workers_table.load(
        os.path.join(REPO, w.workdir)), workload))
    mine = _tables_after(pages, anchor, 1)
    errors += _compare(f"many workers {workload}",
                       f"python -m experiments.many_workers_table --workload={workload}",
                       mine[0] if mine else [], generated, anchor)
  return errors


def mismatches(pages: dict[str, str]) -> list[str]:
  """Every documented table that differs from its regeneration, one line each."""
  return (_report_tables(pages) + _schedule_tables(pages) + _sampler_tables(pages)
          + _lipt_table(pages) + _regime_tables(pages))


@pytest.fixture(scope="module")
def pages():
  return documentation()


def test_documented_tables_match_the_committed_results(pages):
  errors = mismatches(pages)
  assert not errors, "\n".join(errors)


def test_an_altered_number_is_caught():
  """The check can fail: a page holding the regenerated table passes, and the same with
  one digit changed fails, naming the table, its page and its command (whatever the
  committed pages hold)."""
  caption, generated = samplers.WORKLOADS["fashion"][2], _sampler_table("fashion")
  good = caption + "\n\n" + "\n".join(generated) + "\n"
  cells = _cells(generated[2])  # the first sampler's row; its ensemble cell's last digit
  digit = re.search(r"\d(?=\D*$)", cells[2])
  cells[2] = cells[2][:digit.start()] + str((int(digit[0]) + 1) % 10) + cells[2][digit.end():]
  bad = good.replace(generated[2], "| " + " | ".join(cells) + " |")

  def fashion_errors(text):
    return [e for e in _sampler_tables({SAMPLER_PAGE: text})
            if e.startswith("samplers fashion")]

  assert fashion_errors(good) == []
  [error] = fashion_errors(bad)
  assert f"{SAMPLER_PAGE} row" in error and "--workload=fashion" in error, error


def test_a_table_moved_to_another_page_is_not_found():
  """The anchors name a page: the right table on the wrong page fails, naming the page."""
  caption, generated = samplers.WORKLOADS["fashion"][2], _sampler_table("fashion")
  text = caption + "\n\n" + "\n".join(generated) + "\n"
  errors = [e for e in _sampler_tables({"docs/usage.md": text})
            if e.startswith("samplers fashion")]
  assert errors and f"not found in {SAMPLER_PAGE}" in errors[0], errors
