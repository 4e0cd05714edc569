"""The docs rendered from the committed JSON: a Jinja2 template (docs/templates/) filled from
a context built from it; wording lives in the template, numbers in the context.

  python -m experiments.docs_render [--write]

`PAGES` are rendered whole (docs/results/NAME.md, from NAME.md.j2); `REGIONS` inside
hand-written pages, between `<!-- generated: NAME -->` and `<!-- end -->`, from NAME.md.j2.
Without --write: a line per page or region that differs from its rendering (or is unknown
or missing), exit status 1; --write puts each rendering in place."""
from __future__ import annotations

import functools
import glob
import os
import re
import textwrap
from typing import Callable

import jinja2
from absl import flags

from experiments import (cli, cost_vs_time_page, distillation_page, docs_data, lipt_page,
                         methodology_page, one_device_page, regime_page, samplers_page,
                         targets)
from experiments.docs_data import REPO
TEMPLATES = os.path.join(REPO, "docs", "templates")
WRITE = "python -m experiments.docs_render --write"
BEGIN = re.compile(r"^<!-- generated: ([\w.-]+) -->$")
END = "<!-- end -->"

# page (relative to the repository) -> (its template, the function building its context)
PAGES: dict[str, tuple[str, Callable[[], dict]]] = {
    f"docs/results/{name}.md": (f"{name}.md.j2", build) for name, build in (
        ("targets", targets.page_context), ("cost_vs_time", cost_vs_time_page.context),
        ("regime", regime_page.context), ("samplers", samplers_page.context),
        ("lipt", lipt_page.context), ("distillation", distillation_page.context),
        ("one_device", one_device_page.context))}
# region -> (its page, the function building its context); its template is NAME.md.j2
REGIONS: dict[str, tuple[str, Callable[[], dict]]] = {
    # README.md's answers, in the results pages' own words (docs/templates/_macros.j2)
    "readme_answer": ("README.md", lambda: {**cost_vs_time_page.context(), **regime_page.context(),
                                            "ladders": targets.page_context()["workloads"]}),
    "readme_grids": ("README.md", cost_vs_time_page.context),
    "readme_regime": ("README.md", lambda: {**regime_page.context(),
                                            "one_device": one_device_page.context()}),
    "readme_distilled": ("README.md", lambda: {"d": distillation_page.answer()}),
    **{name: ("docs/methodology.md", build) for name, build in methodology_page.REGIONS.items()},
    # GPT-2 small on one H200, before and after each change to the loss (script run_2.sh)
    "benchmarks_loss_passes": ("docs/benchmarks.md", lambda: {
        run: docs_data.load_json(f"bench/h200/cross_entropy/throughput_2_{run}.json")
        for run in ("old", "mid", "new")}),
}


def _pct(x: float | None, digits: int = 1) -> str:
  return "-" if x is None else f"{100 * x:.{digits}f}%"


KEEP = "\u00a0"  # joins "N = 8" and "6.3 s" in a wrap (textwrap splits on ASCII spaces only)


def _bullet(text: str) -> str:
  """A Markdown bullet wrapped at 90 columns, a number kept with its unit, and its newline."""
  text = re.sub(r"(\w) = (\w)", rf"\1{KEEP}={KEEP}\2", " ".join(text.split()))
  text = re.sub(r"(\d) (s|ms|steps)\b", rf"\1{KEEP}\2", text)
  return textwrap.fill(text, 90, break_long_words=False, break_on_hyphens=False,
                       initial_indent="- ", subsequent_indent="  ").replace(KEEP, " ") + "\n"


def environment() -> jinja2.Environment:
  """Templates fail on any name the context lacks (StrictUndefined), never render blanks."""
  env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                           undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                           trim_blocks=True, lstrip_blocks=True)
  env.filters.update(
      pct=_pct, bullet=_bullet, ratio=lambda x: "-" if x is None else f"{x:.2f}x",
      # a target: 85.0%, or a perplexity's 12; a measured metric: 90.14%, or 11.53
      rung=lambda x, metric: _pct(x) if metric in (None, "accuracy") else f"{x:g}",
      final=docs_data.final_text)
  env.globals["verdicts"] = targets.VERDICTS  # every page words a ratio with them
  return env


def render_template(template: str, context: dict) -> str:
  return environment().get_template(template).render(**context)


def render(page: str) -> str:
  return render_template(PAGES[page][0], PAGES[page][1]())


def render_region(name: str) -> str:
  """A region's body, without the newline before its `<!-- end -->`."""
  return render_template(name + ".md.j2", REGIONS[name][1]()).removesuffix("\n")


@functools.lru_cache(maxsize=None)
def _rendered(template: str, build: Callable[[], dict]) -> str:
  """Once per process: the tests check many edited copies of the pages against one JSON."""
  return render_template(template, build())


def regions(text: str) -> dict[str, tuple[int, int]]:
  """Each generated region of a page: name -> the slice of its lines between its markers."""
  lines, out, name = text.split("\n"), {}, None
  for i, line in enumerate(lines):
    if (m := BEGIN.match(line)) and name is None:
      name, start = m[1], i + 1
    elif line == END and name is not None:
      out[name] = (start, i)
      name = None
  return out


def _first_difference(mine: list[str], rendered: list[str]) -> str:
  """Where a region first differs from its rendering, word by word."""
  a, b = " ".join(mine).split(), " ".join(rendered).split()
  i = next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
  return "the same words, wrapped otherwise" if a == b else (
      f"{' '.join(a[max(0, i - 4):i + 4])!r} != from the results "
      f"{' '.join(b[max(0, i - 4):i + 4])!r}")


def documentation() -> dict[str, str | None]:
  """README.md, docs/**/*.md and PAGES (None where missing), by path, byte for byte."""
  paths = {"README.md", *PAGES, *(os.path.relpath(p, REPO) for p in glob.glob(
      os.path.join(REPO, "docs", "**", "*.md"), recursive=True))}
  pages = dict.fromkeys(sorted(paths))
  for path in pages:
    if os.path.exists(os.path.join(REPO, path)):
      with open(os.path.join(REPO, path), newline="") as f:
        pages[path] = f.read()
  return pages


def check(pages: dict[str, str | None]) -> tuple[dict[str, str | None], list[str], list[str]]:
  """The pages given (path -> text) as a write leaves them, the errors a write cannot fix (a
  region unknown or missing), and a line per page or region that differs."""
  out, errors, stale = dict(pages), [], []
  for page, (template, build) in PAGES.items():
    if page in pages and (text := _rendered(template, build)) != pages[page]:
      stale.append(f"{page}: not what {template} renders from the committed JSON; "
                   f"run `{WRITE}`")
      out[page] = text
  for page, text in pages.items():
    errors += [f"{page}, region {name}: no template renders it here; name it in "
               "experiments/docs_render.py's REGIONS or remove its markers"
               for name in regions(text or "") if REGIONS.get(name, (None,))[0] != page]
  for name, (page, build) in REGIONS.items():
    where = regions(out[page] or "").get(name) if page in pages else ()
    if where is None:
      errors.append(f"{page}, region {name}: no `<!-- generated: {name} -->` ... `{END}` "
                    f"lines; put them where it goes and run `{WRITE}`")
    if not where:
      continue
    lines = out[page].split("\n")
    body = _rendered(name + ".md.j2", build).removesuffix("\n").split("\n")
    if lines[where[0]:where[1]] != body:
      stale.append(f"{page}, region {name} (lines {where[0] + 1}-{where[1]}) reads "
                   f"{_first_difference(lines[where[0]:where[1]], body)}; run `{WRITE}`")
      lines[where[0]:where[1]] = body
      out[page] = "\n".join(lines)
  return out, errors, stale


def mismatches(pages=None) -> list[str]:
  """`check`'s errors and differences for `pages` (paths; default all)."""
  _, errors, stale = check({p: t for p, t in documentation().items()
                            if pages is None or p in pages})
  return errors + stale


FLAGS = flags.FlagValues()
flags.DEFINE_bool("write", False, "write every page and region instead of checking it",
                  flag_values=FLAGS)


def main(argv: list[str]) -> int:
  cli.parse(FLAGS, argv, __doc__)
  pages = documentation()
  written, errors, stale = check(pages)
  for path, text in written.items():
    if FLAGS.write and text != pages[path]:
      with open(os.path.join(REPO, path), "w", newline="") as f:
        f.write(text)
      print(f"wrote {path}")
  for error in errors + ([] if FLAGS.write else stale):
    print(error)
  if not errors and not stale:
    print("every page and region is what its template renders from the committed JSON")
  return 1 if errors or stale and not FLAGS.write else 0


if __name__ == "__main__":
  cli.run(main)
