"""Results pages rendered whole: a Markdown template (docs/templates/, Jinja2) filled from a
context built from the committed JSON. Wording lives in the template, numbers in the context.

  python -m experiments.docs_render [--write]

Without --write it checks: every page is what its template renders today, else one line per
page with the fix, exit status 1. tests/test_targets.py runs the check.
"""
from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import Callable

import jinja2
from absl import app, flags

from experiments import (cost_vs_time_page, distillation_page, lipt_page, methodology_page,
                         one_device_page, regime_page, samplers_page, targets)
from experiments.docs_data import REPO
TEMPLATES = os.path.join(REPO, "docs", "templates")
WRITE = "python -m experiments.docs_render --write"

# page (relative to the repository) -> (its template, the function building its context)
PAGES: dict[str, tuple[str, Callable[[], dict]]] = {
    "docs/results/targets.md": ("targets.md.j2", targets.page_context),
    "docs/results/cost_vs_time.md": ("cost_vs_time.md.j2", cost_vs_time_page.context),
    "docs/methodology.md": ("methodology.md.j2", methodology_page.context),
    "docs/results/regime.md": ("regime.md.j2", regime_page.context),
    "docs/results/samplers.md": ("samplers.md.j2", samplers_page.context),
    "docs/results/lipt.md": ("lipt.md.j2", lipt_page.context),
    "docs/results/distillation.md": ("distillation.md.j2", distillation_page.context),
    "docs/results/one_device.md": ("one_device.md.j2", one_device_page.context),
}


def _pct(x: float | None, digits: int = 1) -> str:
  return "-" if x is None else f"{100 * x:.{digits}f}%"


def _rung(x: float, metric: str | None) -> str:
  """A target as the pages write it: 85.0% (accuracy), 12 (perplexity)."""
  return _pct(x) if metric in (None, "accuracy") else f"{x:g}"


def _final(x: float, metric: str | None) -> str:
  """A measured metric: 90.14% (accuracy), 11.53 (perplexity)."""
  return _pct(x, 2) if metric in (None, "accuracy") else f"{x:.2f}"


def _ratio(x: float | None) -> str:
  return "-" if x is None else f"{x:.2f}x"


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
  env.filters.update(pct=_pct, rung=_rung, final=_final, ratio=_ratio, bullet=_bullet)
  return env


def render_template(template: str, context: dict) -> str:
  return environment().get_template(template).render(**context)


def render(page: str) -> str:
  template, build = PAGES[page]
  return render_template(template, build())


def mismatches(pages=None) -> list[str]:
  """One line per page that differs from its rendering (or is missing)."""
  out = []
  for page in pages or PAGES:
    path = os.path.join(REPO, page)
    text = open(path).read() if os.path.exists(path) else None
    if text != render(page):
      out.append(f"{page}: not what {PAGES[page][0]} renders from the committed JSON; "
                 f"run `{WRITE}`")
  return out


FLAGS = flags.FLAGS
flags.DEFINE_bool("write", False, "write every page instead of checking it")


def main(argv) -> int:
  del argv
  if FLAGS.write:
    for page in PAGES:
      with open(os.path.join(REPO, page), "w") as f:
        f.write(render(page))
      print(f"wrote {page}")
    return 0
  errors = mismatches()
  for e in errors:
    print(e, file=sys.stderr)
  return 1 if errors else 0


if __name__ == "__main__":
  app.run(main)
