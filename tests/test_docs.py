"""The README and docs/ hold together: every relative link resolves inside the repository,
every anchor names a heading of its page, and no page speaks of the project's own history.

Links outside the repository (say `../shared/DESIGN.md`) resolve on the machine that wrote
them and nowhere else, so they fail here even when the file exists.
"""
import glob
import json
import os
import re

import pytest

from tests.conftest import REPO, makefile_recipe

pytestmark = pytest.mark.docs

# a path in a code span that climbs out of its page's folder, `../shared/DESIGN.md`
CODE_PATH = re.compile(r"`(\.\./[^`\s]+)`")
# Words a user cannot act on: the project's issue numbers and working sessions, and a
# machine named as "this host" instead of once per page by what it is.
HISTORY = re.compile(r"\bissues? \d+|\(issue|\bsessions?\b|\bthis host\b", re.I)
README_MAX_LINES = 200


def _pages() -> list[str]:
  return [os.path.join(REPO, "README.md")] + sorted(
      glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def _parse(text: str):
  """The page's block tokens, as a CommonMark parser (markdown-it-py) reads it: what a
  reader's renderer shows, not what a regex guesses (a fence closed with text after it runs
  on, swallowing the headings below it)."""
  from markdown_it import MarkdownIt

  return MarkdownIt("commonmark").parse(text)


def _inline_children(tokens):
  return [child for t in tokens if t.type == "inline" for child in t.children or ()]


def _prose_targets(text: str) -> list[str]:
  """The link and image targets outside code, and the paths in code spans that climb out
  of the page's folder (`../shared/DESIGN.md`)."""
  targets = []
  for child in _inline_children(_parse(text)):
    if child.type == "link_open":
      targets.append(child.attrGet("href"))
    elif child.type == "image":
      targets.append(child.attrGet("src"))
    elif child.type == "code_inline":
      targets += CODE_PATH.findall(f"`{child.content}`")
  return targets


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def headings(text: str) -> list[str]:
  """The page's headings as rendered text (code spans without their backticks)."""
  tokens = _parse(text)
  return ["".join(c.content for c in tokens[i + 1].children or ())
          for i, t in enumerate(tokens) if t.type == "heading_open"]


def _anchors(path: str) -> set[str]:
  with open(path) as f:
    return {slug(h) for h in headings(f.read())}


def bad_fences(text: str) -> list[str]:
  """Each code fence a CommonMark reader does not close where its writer meant to: a line
  inside it that starts with the fence's own run of backticks (a closing fence with text
  after it, which CommonMark reads as code), or a fence left open to the page's end."""
  lines = text.splitlines()
  errors = []
  for t in _parse(text):
    if t.type != "fence":
      continue
    start, end = t.map
    run = re.match(r" {0,3}(`{3,}|~{3,})", lines[start]).group(1)
    closing = re.compile(r" {0,3}" + re.escape(run) + re.escape(run[0]) + r"*\s*$")
    for i in range(start + 1, end):
      if lines[i].lstrip().startswith(run) and not closing.match(lines[i]):
        errors.append(f"line {i + 1}: text after a closing fence: {lines[i].strip()!r}")
    if not closing.match(lines[end - 1]) or end - 1 == start:
      errors.append(f"line {start + 1}: a fence never closed")
  return errors


def broken_links(path: str, text: str) -> list[str]:
  """Each relative link of `text` (the page at `path`) that leaves the repository, names
  no file, or names an anchor its page lacks."""
  errors = []
  root = os.path.realpath(REPO)
  for target in _prose_targets(text):
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
    elif anchor and resolved.endswith(".md"):
      known = _anchors(resolved) if resolved != os.path.realpath(path) else {
          slug(h) for h in headings(text)}
      if anchor not in known:
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
def test_every_page_parses_as_commonmark_with_its_fences_closed(path):
  """Every fence closes on a line of its own backticks. Fails on docs/usage.md as it was
  (a closing fence followed by "`cifar10` and `fashion_mnist` work the same", which
  CommonMark reads as code, swallowing the heading "Your own images" and its prose)."""
  with open(path) as f:
    errors = bad_fences(f.read())
  assert not errors, f"{os.path.relpath(path, REPO)}: " + "; ".join(errors)


def test_a_fence_closed_with_text_after_it_swallows_the_headings_below():
  text = "# Page\n\n[up](#page) [down](#below)\n\n```bash\nmake x\n``` and more\n\n## Below\n"
  assert headings(text) == ["Page"]  # CommonMark: "## Below" is code
  assert bad_fences(text) == ["line 7: text after a closing fence: '``` and more'",
                              "line 5: a fence never closed"]
  page = os.path.join(REPO, "docs", "usage.md")
  assert broken_links(page, text) == [
      "docs/usage.md: (#below) names no heading of docs/usage.md"]
  fixed = text.replace("``` and more", "```\n\nand more")
  assert headings(fixed) == ["Page", "Below"] and not bad_fences(fixed)
  assert not broken_links(page, fixed)
  # a heading's anchor is its rendered text: code spans lose their backticks
  assert [slug(h) for h in headings("## The `cost` block\n")] == ["the-cost-block"]


@pytest.mark.parametrize("path", _pages(), ids=lambda p: os.path.relpath(p, REPO))
def test_no_page_speaks_of_the_projects_history(path):
  with open(path) as f:
    found = [(i + 1, m.group(0)) for i, line in enumerate(f.read().splitlines())
             for m in HISTORY.finditer(line)]
  assert not found, f"{os.path.relpath(path, REPO)}: {found}"


# What once happened to a point, where a page should state what the JSON holds (issue 70,
# item 13): no rendered results page nor the README says these, wrapped or not.
HISTORY_PHRASES = ("not yet run", "former choice", "once died", "the old", "once they have run",
                   "not yet re-run", "is open")
RESULTS_MAX_LINES = 1_000  # docs/results/ in all: the answer, its figures and its tables


def _results_pages() -> list[str]:
  return sorted(glob.glob(os.path.join(REPO, "docs", "results", "*.md")))


def history_phrases(text: str) -> list[str]:
  """The HISTORY_PHRASES in `text`, its lines joined (a phrase wrapped across two counts)."""
  joined = " ".join(text.split()).lower()
  return [p for p in HISTORY_PHRASES if re.search(rf"\b{re.escape(p)}\b", joined)]


def test_a_wrapped_history_phrase_is_found():
  assert history_phrases("seeds 1-3 once they\nhave run; the older runs") == ["once they have run"]
  assert history_phrases("the threshold is opened") == []


@pytest.mark.parametrize("path", [os.path.join(REPO, "README.md")] + _results_pages(),
                         ids=lambda p: os.path.relpath(p, REPO))
def test_no_results_page_tells_a_points_history(path):
  with open(path) as f:
    found = history_phrases(f.read())
  assert not found, f"{os.path.relpath(path, REPO)} says {found}: state what the JSON holds"


def test_the_results_pages_fit_in_a_thousand_lines():
  counts = {}
  for path in _results_pages():
    with open(path) as f:
      counts[os.path.basename(path)] = len(f.read().splitlines())
  assert sum(counts.values()) <= RESULTS_MAX_LINES, counts


def test_the_readme_reads_in_five_minutes():
  with open(os.path.join(REPO, "README.md")) as f:
    lines = f.read().splitlines()
  assert len(lines) <= README_MAX_LINES, len(lines)
  first_screen = "\n".join(lines[:50])
  assert "![" in first_screen, "the first screen shows a figure"


def test_the_readme_times_the_ensemble_smoke_run_beside_the_smoke_run():
  """The quick start's `:smoke` row quotes its `,ensemble` form's time and accuracy too
  (a newcomer's second command), the accuracies to the digits every CPU gives (0.732 and
  0.735 where one once quoted 0.736; fails on ef8466c2), and the ensemble in a workdir of
  its own (the smoke run's refuses it). Fails on 75ab1a7, which quoted the smoke run's
  only."""
  with open(os.path.join(REPO, "README.md")) as f:
    row = next(line for line in f if line.startswith("| `python -m ensemble_jax.main ...:smoke`"))
  what, when = row.split(" | ")[1:3]
  assert re.search(r"add `,ensemble` for 4 workers .*final accuracy about 0\.\d+", what), what
  assert not re.search(r"accuracy 0\.\d{3}", what), what
  assert re.search(r"add `,ensemble` .*`--workdir=(?!/tmp/smoke`)", what), what
  assert re.search(r"^\d+ s; `,ensemble` \d+ s \(measured at load average [\d.]+", when), when


class _Selected:
  """A pytest plugin: how many tests its session selects."""
  count = None

  def pytest_collection_finish(self, session):
    self.count = len(session.items)


def _collected(tier: str) -> int:
  """How many tests pytest collects from tests/ with `-m tier`, collected in this process:
  under `make test` each worker has imported every test module (xdist collects the whole
  suite in each), so the collection reads them from sys.modules (0.4 s of CPU), where a
  fresh pytest process imported them all again (12 s each)."""
  selected = _Selected()
  code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:faulthandler",
                      f"--rootdir={REPO}", "-c", os.path.join(REPO, "pytest.ini"), "-m", tier,
                      os.path.join(REPO, "tests")], plugins=[selected])
  assert code == pytest.ExitCode.OK and selected.count is not None, code
  return selected.count


def test_the_readme_counts_the_tests_make_runs():
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  whole = re.search(r"whole test suite \((\d+) tests", readme)
  fast = re.search(r"the unit tier only \((\d+) tests\)", readme)
  assert whole and fast, "README's `make test` / `make test-fast` rows lost their counts"
  # the tiers `make test` and `make test-fast` select, read from the Makefile's rules
  tiers = [re.search(r'-m "([^"]+)"', makefile_recipe(target)).group(1)
           for target in ("test", "test-fast")]
  assert int(whole.group(1)) == _collected(tiers[0]), "README: `make test`'s count is stale"
  assert int(fast.group(1)) == _collected(tiers[1]), "README: `make test-fast`'s count is stale"


# A row of the README's "Reproduce" table: its make target, its results folders, its time.
REPRODUCE_ROW = re.compile(r"^\| `make ([\w-]+)` \| ([^|]+) \|[^|]+\| about (\d+(?:\.\d+)?) h\b",
                           re.M)


def recorded_hours(folders: list[str]) -> float:
  """The run times the results.json files under `folders` record, pool builds included
  (`distill.build_time_s`, outside a run's `wall_time_s`), summed, in hours; runs moved to
  a `superseded/` folder are left out (a rerun does not train them), and so is the tuning
  seed's `seed<k>/` record, a copy of the chosen tuning run (counted once, under tune/)."""
  total = 0.0
  for folder in folders:
    for path in glob.glob(os.path.join(REPO, folder, "**", "results.json"), recursive=True):
      if f"{os.sep}superseded{os.sep}" in path:
        continue
      with open(path) as f:
        results = json.load(f)
      copied = (os.path.basename(os.path.dirname(path)).startswith("seed")
                and (results.get("tuning") or {}).get("seed") == results["config"]["seed"])
      if not copied:
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


def test_the_readme_times_the_kd_sweep_as_recorded_to_a_tenth_of_an_hour():
  """`make sweep-pydocs-kd` records well under an hour, where the half-hour tolerance above
  let "about 0.25 h for N = 2 and 4 (N = 8 not run yet)" stand for its three points'
  recorded 0.44 h: its row gives the recorded time to a tenth of an hour, nothing not run."""
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  [(cell, hours)] = [(c, h) for t, c, h in REPRODUCE_ROW.findall(readme) if t == "sweep-pydocs-kd"]
  row = next(line for line in readme.splitlines() if line.startswith("| `make sweep-pydocs-kd`"))
  assert "not run" not in row, row
  assert float(hours) == round(recorded_hours(_folders(cell)), 1), (hours, row)


@pytest.mark.parametrize("grid, heading", [("fashion_mnist", "## Fashion-MNIST:"),
                                           ("pydocs_gpt2", "## Python docs (byte-level")])
def test_the_device_steps_the_docs_quote_are_the_ones_that_price_the_runs(grid, heading):
  """cost_vs_time.md said 0.090 s and 0.033 s for the Python docs' models while every
  committed run there is priced at 0.0879 s and 0.0382 s (a later calibration): each
  device step the page shows as pricing a grid's points (its calibration table) is one its
  runs record, and every one they record is shown."""
  from ensemble_jax import report
  results = os.path.join(REPO, "experiments", "results", grid)
  used = [r["device_step_s"] for r in report.calibrations(
      results, os.path.join(results, "calibration")) if r["runs"]]
  with open(os.path.join(REPO, "docs", "results", "cost_vs_time.md")) as f:
    text = f.read()
  assert heading in text
  rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
          if line.startswith(f"| experiments/results/{grid} |")]
  quoted = {float(r[3]) for r in rows if not r[-1].startswith("none")}
  assert quoted == {round(u, 4) for u in used}, (quoted, used)
