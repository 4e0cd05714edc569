"""The README and docs/ hold together: every relative link resolves inside the repository,
every anchor names a heading of its page, and no page speaks of the project's own history.

Links outside the repository (say `../shared/DESIGN.md`) resolve on the machine that wrote
them and nowhere else, so they fail here even when the file exists.
"""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, makefile_recipe

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# a path in a code span that climbs out of its page's folder, `../shared/DESIGN.md`
CODE_PATH = re.compile(r"`(\.\./[^`\s]+)`")
# Words a user cannot act on: the project's issue numbers and working sessions, and a
# machine named as "this host" instead of once per page by what it is.
HISTORY = re.compile(r"\bissues? \d+|\(issue|\bsessions?\b|\bthis host\b", re.I)
README_MAX_LINES = 200


def _pages() -> list[str]:
  return [os.path.join(REPO, "README.md")] + sorted(
      glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def _prose(text: str) -> str:
  """The page without its fenced code blocks (a link-like string there is code)."""
  return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
  with open(path) as f:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", _prose(f.read()), flags=re.M)}


def broken_links(path: str, text: str) -> list[str]:
  """Each relative link of `text` (the page at `path`) that leaves the repository, names
  no file, or names an anchor its page lacks."""
  errors = []
  root = os.path.realpath(REPO)
  prose = _prose(text)
  for target in LINK.findall(prose) + CODE_PATH.findall(prose):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
      continue
    file_part, _, anchor = target.partition("#")
    resolved = (os.path.realpath(os.path.join(os.path.dirname(path), file_part))
                if file_part else os.path.realpath(path))
    where = f"{os.path.relpath(path, REPO)}: ({target})"
    if os.path.commonpath([root, resolved]) != root:
      errors.append(f"{where} leads outside the repository")
    elif not os.path.exists(resolved):
      errors.append(f"{where} names no file")
    elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
      errors.append(f"{where} names no heading of {os.path.relpath(resolved, REPO)}")
  return errors


def test_there_are_docs_pages():
  assert len(_pages()) >= 8, _pages()


@pytest.mark.parametrize("path", _pages(), ids=lambda p: os.path.relpath(p, REPO))
def test_every_relative_link_resolves_inside_the_repository(path):
  with open(path) as f:
    errors = broken_links(path, f.read())
  assert not errors, "\n".join(errors)


def test_a_link_outside_the_repository_fails():
  page = os.path.join(REPO, "README.md")
  text = ("See [the design](../shared/DESIGN.md), [methods](docs/nowhere.md), "
          "[rules](docs/methodology.md#no-such-heading), [ok](docs/methodology.md) "
          "and `../shared/DESIGN.md` for the architecture.")
  errors = broken_links(page, text)
  assert len(errors) == 4, errors
  assert "outside the repository" in errors[0]  # whether or not that file exists
  assert "names no file" in errors[1] and "no heading" in errors[2]
  assert "outside the repository" in errors[3]


@pytest.mark.parametrize("path", _pages(), ids=lambda p: os.path.relpath(p, REPO))
def test_no_page_speaks_of_the_projects_history(path):
  with open(path) as f:
    found = [(i + 1, m.group(0)) for i, line in enumerate(f.read().splitlines())
             for m in HISTORY.finditer(line)]
  assert not found, f"{os.path.relpath(path, REPO)}: {found}"


def test_the_readme_reads_in_five_minutes():
  with open(os.path.join(REPO, "README.md")) as f:
    lines = f.read().splitlines()
  assert len(lines) <= README_MAX_LINES, len(lines)
  first_screen = "\n".join(lines[:50])
  assert "![" in first_screen, "the first screen shows a figure"


def _collected(*args: str) -> int:
  """How many tests pytest collects from tests/ (with `args`, those it selects)."""
  out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", *args, "tests"], cwd=REPO,
                       capture_output=True, text=True, check=True).stdout
  return int(re.search(r"^(\d+)(?:/\d+)? tests? collected", out, re.M).group(1))


def test_the_readme_counts_the_tests_make_runs():
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  whole = re.search(r"whole test suite \((\d+) tests", readme)
  fast = re.search(r"the unit tier only \((\d+) tests\)", readme)
  assert whole and fast, "README's `make test` / `make test-fast` rows lost their counts"
  # the tiers `make test` and `make test-fast` select, read from the Makefile's rules
  tiers = re.search(r'-m "([^"]+)"', makefile_recipe("test")).group(1)
  assert int(whole.group(1)) == _collected("-m", tiers), "README: `make test`'s count is stale"
  tier = re.search(r'-m "([^"]+)"', makefile_recipe("test-fast")).group(1)
  assert int(fast.group(1)) == _collected("-m", tier), "README: `make test-fast`'s count is stale"


# A row of the README's "Reproduce" table: its make target, its results folders, its time.
REPRODUCE_ROW = re.compile(r"^\| `make ([\w-]+)` \| ([^|]+) \|[^|]+\| about (\d+(?:\.\d+)?) h\b",
                           re.M)


def recorded_hours(folders: list[str]) -> float:
  """The run times the results.json files under `folders` record, pool builds included
  (`distill.build_time_s`, outside a run's `wall_time_s`), summed, in hours; runs moved to
  a `superseded/` folder are left out (a rerun does not train them)."""
  total = 0.0
  for folder in folders:
    for path in glob.glob(os.path.join(REPO, folder, "**", "results.json"), recursive=True):
      if f"{os.sep}superseded{os.sep}" not in path:
        with open(path) as f:
          results = json.load(f)
        total += results["wall_time_s"] + (results.get("distill") or {}).get("build_time_s", 0)
  return total / 3600


def _folders(cell: str) -> list[str]:
  """`experiments/results/a/`, `b/` -> both paths (the later ones beside the first)."""
  first, *others = re.findall(r"`([^`]+/)`", cell)
  return [first] + [os.path.join(os.path.dirname(first.rstrip("/")), o) for o in others]


def test_the_readme_times_each_rerun_as_its_results_record():
  """Each "about N h" of the README's Reproduce table is the time the committed results
  under that row's folders record (to 10%, or half an hour), so a rerun that grows a sweep
  cannot leave its documented time behind."""
  with open(os.path.join(REPO, "README.md")) as f:
    rows = REPRODUCE_ROW.findall(f.read())
  assert {"sweep-fashion", "critical-batch", "many-workers"} <= {r[0] for r in rows}, rows
  for target, cell, hours in rows:
    folders = _folders(cell)
    recorded = recorded_hours(folders)
    assert recorded > 0, (target, folders)
    assert abs(float(hours) - recorded) <= max(0.5, 0.1 * recorded), (
        f"README: `make {target}` says about {hours} h; its results record {recorded:.1f} h")
