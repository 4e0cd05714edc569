"""Every results table and generated paragraph in the docs, from the committed JSON: checked
or written.

  python -m experiments.docs_tables [--write] [--skip=throughput,...] [--docs=DIR]

Each table of README.md and docs/ that this registry names is what its generator writes
from experiments/results/ (reading results.json, never training). The check prints each
table that differs, one line with its fix, and exits 1. `--write` puts every regenerated
table in place: a page keeps its header row and alignment row as written and the columns
it chose (by header name, in its order); every line outside its tables stays as it is.
The paragraphs that quote numbers sit between `<!-- generated: NAME -->` and
`<!-- end -->` lines, rendered by experiments/readme_page.py (the `prose` family): checked
and written the same way. `--skip` leaves families alone (a sweep still running).
tests/test_readme.py runs the check.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
from typing import Callable

from absl import flags

from experiments import cli, readme_page
from experiments.bench import throughput
from experiments.docs_data import REPO, RESULTS, cells, tables

WRITE = "python -m experiments.docs_tables --write"
BEGIN = re.compile(r"^<!-- generated: ([\w.-]+) -->$")
END = "<!-- end -->"

# Every anchor is (page, heading or line prefix): the table is the first after that line of
# that page (a path relative to the repository), before its next heading. The results
# pages' tables are rendered whole with their pages (experiments/docs_render.py).
# step benchmarks on an accelerator: anchor -> the (code, --out file) pairs of one table
_CROSS_ENTROPY = "bench/h200/cross_entropy/throughput_2_"
THROUGHPUT_TABLES = {
    ("docs/benchmarks.md", "### The loss's passes over the logits"): [
        ("before", _CROSS_ENTROPY + "old.json"),
        ("backward as one fusion", _CROSS_ENTROPY + "mid.json"),
        ("and the argmax gives the shift", _CROSS_ENTROPY + "new.json")]}


@dataclasses.dataclass(frozen=True)
class Table:
  """A documented table: the first table after `anchor`, as its generator writes it."""
  name: str
  anchor: tuple[str, str]
  command: str  # prints this table alone
  rows: list[str]  # header, alignment, body


def documentation(root: str = REPO) -> dict[str, str]:
  """README.md and every page under docs/, by path relative to `root`, byte for byte."""
  paths = ["README.md"] + sorted(
      os.path.relpath(p, root)
      for p in glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
  pages = {}
  for path in paths:
    with open(os.path.join(root, path), newline="") as f:
      pages[path] = f.read()
  return pages


def _span(lines: list[str], table: Table) -> tuple[int, int] | None:
  """Where `table` sits among a page's lines, [first, last + 1): the first table after its
  anchor's line, before the next heading (None without the line or the table)."""
  start = next((i for i, line in enumerate(lines) if line.startswith(table.anchor[1])), None)
  if start is None:
    return None
  first = None
  for i in range(start + 1, len(lines) + 1):
    line = lines[i] if i < len(lines) else ""
    if first is None and re.match(r"#{1,6} ", line):
      return None
    if line.startswith("|"):
      first = i if first is None else first
    elif first is not None:
      return first, i
  return None


def _kept(mine: list[str], generated: list[str]) -> list[int] | None:
  """The generated columns the page keeps, in its order, by name. A name that repeats (one
  group of columns per curve) is read from the group the page puts it in: the first such
  column after the generated column of the last name before it that does not repeat (the
  group's own, e.g. "PCA-routed: steps to 85%"). None for a name not found so."""
  full = cells(generated[0])
  kept, group = [], -1
  for h in cells(mine[0]):
    where = [j for j, g in enumerate(full) if g == h]
    if len(where) == 1:
      kept.append(group := where[0])
      continue
    after = [j for j in where if j > group and j not in kept]
    if not after:
      return None
    kept.append(after[0])
  return kept


def _compare(table: Table, mine: list[str]) -> list[str]:
  """Differences between the page's copy of `table` and the generated one; every row and
  kept cell must match."""
  page, prefix = table.anchor
  name, generated = table.name, table.rows
  if not mine:
    return [f"{name}: table not found in {page} after `{prefix}`; put `{table.command}`'s "
            "table there"]
  keep = _kept(mine, generated)
  if keep is None:
    return [f"{name}: {page} has columns not among the generated "
            f"{cells(generated[0])}; keep only those (`{table.command}` prints them)"]
  fix = f"`{WRITE}` rewrites it (this table alone: `{table.command}`)"
  mine_rows = [cells(r) for r in mine[2:]]
  generated_rows = [[cells(r)[i] for i in keep] for r in generated[2:]]
  if len(mine_rows) != len(generated_rows):
    keys_mine, keys_generated = [r[:2] for r in mine_rows], [r[:2] for r in generated_rows]
    return [f"{name}: {page} has {len(mine_rows)} rows, the results give "
            f"{len(generated_rows)} (only in {page}: "
            f"{[k for k in keys_mine if k not in keys_generated]}, only in the results: "
            f"{[k for k in keys_generated if k not in keys_mine]}); {fix}"]
  return [f"{name}: {page} row {m} != from the results {g}; {fix}"
          for m, g in zip(mine_rows, generated_rows) if m != g]


def _throughput_tables() -> list[Table]:
  out = []
  for anchor, runs in THROUGHPUT_TABLES.items():
    pairs = [(label, os.path.join(RESULTS, path)) for label, path in runs]
    command = "python -m experiments.bench.throughput --table=" + ",".join(
        f"'{label}'=experiments/results/{path}" for label, path in runs)
    [rows] = tables(throughput.table(pairs))
    out.append(Table(f"throughput {anchor[1]}", anchor, command, rows))
  return out


# Each family of tables (a name for --skip) and how it is regenerated.
FAMILIES: dict[str, Callable[[], list[Table]]] = {"throughput": _throughput_tables}
PROSE = "prose"  # the family of readme_page's regions, checked and written apart


def regenerate(skip=()) -> list[Table]:
  """Every documented table but the skipped families'."""
  return [t for family, generate in FAMILIES.items() if family not in skip for t in generate()]


def regions(text: str) -> dict[str, tuple[int, int]]:
  """Each generated region of a page: name -> (first line, last line + 1) of its body, the
  lines between its markers (the page split on "\\n")."""
  lines, out, name = text.split("\n"), {}, None
  for i, line in enumerate(lines):
    if (m := BEGIN.match(line)) and name is None:
      name, start = m[1], i + 1
    elif line == END and name is not None:
      out[name] = (start, i)
      name = None
  return out


def _first_difference(mine: list[str], rendered: list[str]) -> str:
  """Where a region first differs from its rendering, word by word (a re-wrap alone reads
  'the same words, wrapped otherwise')."""
  a, b = " ".join(mine).split(), " ".join(rendered).split()
  i = next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
  if a == b:
    return "the same words, wrapped otherwise"
  return (f"{' '.join(a[max(0, i - 4):i + 4])!r} != from the results "
          f"{' '.join(b[max(0, i - 4):i + 4])!r}")


@functools.lru_cache(maxsize=None)
def _rendered(render: Callable[[], str]) -> tuple[str, ...]:
  """A region's lines, rendered once per process: the committed JSON it reads does not
  change under a check (the docs tests check many edited copies of the pages against it)."""
  return tuple(render().split("\n"))


def _prose(pages: dict[str, str], skip=()) -> tuple[dict[str, str], list[str], list[str]]:
  """The pages with every generated paragraph (readme_page) rendered in its region; the
  regions that are unknown, missing or contradicted by the results; and those that differ
  from their rendering (which a write fixes), one line each."""
  if PROSE in skip:
    return pages, [], []
  pages, errors, stale = dict(pages), [], []
  for page, text in pages.items():
    for name in regions(text):
      if readme_page.TEMPLATES.get(name, (None,))[0] != page:
        errors.append(f"prose {name}: {page} holds a generated region no template of "
                      f"experiments/readme_page.py renders for it")
  for name, (page, render) in readme_page.TEMPLATES.items():
    where = regions(pages.get(page, "")).get(name)
    if where is None:
      errors.append(f"prose {name}: no `<!-- generated: {name} -->` ... `{END}` "
                    f"region in {page}; put one where the paragraph goes and run `{WRITE}`")
      continue
    try:
      rendered = list(_rendered(render))
    except readme_page.Contradicted as e:
      errors.append(f"prose {name}: the results contradict its template's wording ({e}); "
                    "rewrite the template in docs/templates/")
      continue
    lines = pages[page].split("\n")
    mine = lines[where[0]:where[1]]
    if mine != rendered:
      stale.append(f"prose {name}: {page} (lines {where[0] + 1}-{where[1]}) reads "
                   f"{_first_difference(mine, rendered)}; `{WRITE}` rewrites it")
      lines[where[0]:where[1]] = rendered
      pages[page] = "\n".join(lines)
  return pages, errors, stale


def _mine(pages: dict[str, str], table: Table) -> tuple[list[str], tuple[int, int] | None]:
  """A page's lines (joined with "\\n" they give it back byte for byte) and where `table`
  sits among them."""
  lines = pages.get(table.anchor[0], "").split("\n")
  return lines, _span(lines, table)


def mismatches(pages: dict[str, str], skip=()) -> list[str]:
  """Every documented table and region that differs from its regeneration, one line each."""
  errors = []
  for table in regenerate(skip):
    lines, span = _mine(pages, table)
    errors += _compare(table, lines[span[0]:span[1]] if span else [])
  _, prose_errors, stale = _prose(pages, skip)
  return errors + prose_errors + stale


def write(pages: dict[str, str], skip=()) -> tuple[dict[str, str], list[str]]:
  """The pages with every documented table and region regenerated, and those that could not
  be written (not found, unknown columns, contradicted)."""
  pages, errors = dict(pages), []
  for table in regenerate(skip):
    lines, span = _mine(pages, table)
    mine = lines[span[0]:span[1]] if span else []
    keep = _kept(mine, table.rows) if mine else None
    if keep is None:
      errors += _compare(table, mine)
      continue
    lines[span[0]:span[1]] = mine[:2] + (
        table.rows[2:] if keep == list(range(len(cells(table.rows[0])))) else
        ["| " + " | ".join(cells(r)[i] for i in keep) + " |" for r in table.rows[2:]])
    pages[table.anchor[0]] = "\n".join(lines)
  pages, prose_errors, _ = _prose(pages, skip)  # a stale region is written, not an error
  return pages, errors + prose_errors


FLAGS = flags.FlagValues()
flags.DEFINE_bool("write", False, "rewrite every documented table from the results",
                  flag_values=FLAGS)
flags.DEFINE_list("skip", [], f"families to leave alone: {', '.join(FAMILIES)}, {PROSE}",
                  flag_values=FLAGS)
flags.DEFINE_string("docs", REPO, "the folder holding README.md and docs/ (the results are "
                    "always this repository's)", flag_values=FLAGS)
flags.register_validator("skip", lambda skip: set(skip) <= {*FAMILIES, PROSE},
                         f"--skip takes families among {', '.join(FAMILIES)}, {PROSE}",
                         flag_values=FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  pages = documentation(FLAGS.docs)
  if FLAGS.write:
    written, errors = write(pages, FLAGS.skip)
    for path, text in written.items():
      if text != pages[path]:
        with open(os.path.join(FLAGS.docs, path), "w", newline="") as f:
          f.write(text)
        print(f"wrote {path}")
  else:
    errors = mismatches(pages, FLAGS.skip)
  for error in errors:
    print(error)
  if not errors:
    skipped = f" (skipped: {', '.join(FLAGS.skip)})" if FLAGS.skip else ""
    print(f"every documented table matches experiments/results/{skipped}")
  return 1 if errors else 0


if __name__ == "__main__":
  cli.run(main)
