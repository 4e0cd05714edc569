"""Every page and generated region of the docs is what its template renders from the
committed JSON.

experiments/docs_render.py renders the results pages whole and the generated regions of
hand-written pages (README.md's answers, a table of docs/benchmarks.md) from
experiments/results/ (reading results.json, never training) and compares them with the
pages, so a number edited by hand, or left stale after a rerun, fails here;
`python -m experiments.docs_render --write` puts every one back. Here the check runs on the
committed pages, and the write on altered copies of them.
"""
import glob
import json
import os
import re
import shutil

import pytest

from experiments import distillation_page, docs_data, docs_render
from tests.conftest import REPO, makefile_recipe

pytestmark = pytest.mark.docs

BENCHMARKS = "docs/benchmarks.md"  # the page of the loss-passes table these tests alter
LOSS_PASSES = "benchmarks_loss_passes"  # its region


@pytest.fixture(scope="module")
def pages():
  return docs_render.documentation()


def test_every_page_and_region_matches_the_committed_results(pages):
  errors = docs_render.mismatches()
  assert not errors, "\n".join(errors)


def _bump(row: str) -> str:
  """The row with its third cell's last digit changed."""
  cells = docs_data.cells(row)
  digit = re.search(r"\d(?=\D*$)", cells[2])
  cells[2] = cells[2][:digit.start()] + str((int(digit[0]) + 1) % 10) + cells[2][digit.end():]
  return "| " + " | ".join(cells) + " |"


def _region_page(name: str, body: str | None = None) -> str:
  """A page holding only region `name`, with `body` or its rendering."""
  body = docs_render.render_region(name) if body is None else body
  return f"<!-- generated: {name} -->\n{body}\n{docs_render.END}\n"


def _errors(pages: dict, name: str) -> list[str]:
  """The check's lines about region `name` (of the pages given alone)."""
  _, errors, stale = docs_render.check(pages)
  return [e for e in errors + stale if f", region {name}" in e]


def test_an_altered_number_is_caught():
  """The check can fail: a page holding the rendered loss-passes table passes, and the same
  with one digit changed (the first row's third cell) fails, naming the page, the region,
  the cell and the command that rewrites it (whatever the committed pages hold)."""
  rows = docs_render.render_region(LOSS_PASSES).split("\n")
  bad = "\n".join(rows[:2] + [_bump(rows[2])] + rows[3:])
  assert _errors({BENCHMARKS: _region_page(LOSS_PASSES)}, LOSS_PASSES) == []
  [error] = _errors({BENCHMARKS: _region_page(LOSS_PASSES, bad)}, LOSS_PASSES)
  assert error.startswith(f"{BENCHMARKS}, region {LOSS_PASSES} (lines 2-"), error
  assert docs_data.cells(_bump(rows[2]))[2] in error and docs_render.WRITE in error, error


def test_a_region_moved_to_another_page_is_not_found():
  """A region names its page: the right table on the wrong page fails, naming both pages."""
  errors = _errors({BENCHMARKS: "", "docs/usage.md": _region_page(LOSS_PASSES)}, LOSS_PASSES)
  assert any(e.startswith(f"docs/usage.md, region {LOSS_PASSES}: no template renders it")
             for e in errors), errors
  assert any(e.startswith(f"{BENCHMARKS}, region {LOSS_PASSES}: no `<!-- generated")
             for e in errors), errors


def _edit(text: str, name: str, edit) -> str:
  """The page with `edit(lines)` in place of region `name`'s lines."""
  lines = text.split("\n")
  start, end = docs_render.regions(text)[name]
  lines[start:end] = edit(lines[start:end])
  return "\n".join(lines)


def test_write_puts_back_the_pages_and_nothing_else(tmp_path, capsys, monkeypatch):
  """On copies of the pages with one digit of the loss-passes table altered, the check exits
  1 naming it; --write gives the committed pages back byte for byte, the check then exits 0
  and a second write changes nothing; an unknown flag exits 2."""
  shutil.copy(os.path.join(REPO, "README.md"), tmp_path)
  shutil.copytree(os.path.join(REPO, "docs"), tmp_path / "docs")
  monkeypatch.setattr(docs_render, "REPO", str(tmp_path))
  committed = docs_render.documentation()
  altered = _edit(committed[BENCHMARKS], LOSS_PASSES,
                  lambda rows: rows[:2] + [_bump(rows[2])] + rows[3:])
  with open(tmp_path / BENCHMARKS, "w", newline="") as f:
    f.write(altered)

  def run(*flags):
    code = docs_render.main(["docs_render", *flags])
    return code, capsys.readouterr().out

  code, out = run()
  assert code == 1 and f"{BENCHMARKS}, region {LOSS_PASSES} (lines" in out, out
  assert docs_render.documentation() == {**committed, BENCHMARKS: altered}  # only checked
  code, out = run("--write")
  assert code == 0 and out.startswith(f"wrote {BENCHMARKS}\n"), out
  assert docs_render.documentation() == committed
  code, out = run()
  assert code == 0, out
  code, out = run("--write")
  assert code == 0 and "wrote" not in out, out
  with pytest.raises(SystemExit) as exit_:
    run("--skip=throughput")
  assert exit_.value.code == 2


def _projection_commands() -> list[list[str]]:
  """The argv of each `experiments.projection` command of the Makefile's `projection`
  target, as written (continuation lines joined)."""
  return [line.split()[1:] for line in makefile_recipe("projection").splitlines()
          if "-m experiments.projection" in line]


def test_make_projection_reproduces_the_committed_projection(tmp_path):
  """Every table and JSON `make projection` writes is the committed one, byte for byte,
  regenerated from the committed results into a scratch folder (without the figures,
  `--nofigures`: their bytes depend on matplotlib's version)."""
  import subprocess
  import sys

  from tests.conftest import subprocess_env

  commands = _projection_commands()
  assert len(commands) >= 4, commands  # the parser found the target's commands
  committed = os.path.join(docs_data.RESULTS, "projection")
  written = set()
  for argv in commands:
    assert argv[:2] == ["-m", "experiments.projection"], argv
    proc = subprocess.run([sys.executable, *argv, f"--out={tmp_path}", "--nofigures"],
                          cwd=REPO, capture_output=True, text=True, env=subprocess_env(1),
                          timeout=300)
    assert proc.returncode == 0, (argv, proc.stderr[-2000:])
  for path in sorted(glob.glob(os.path.join(tmp_path, "*"))):
    name = os.path.basename(path)
    written.add(name)
    with open(path) as mine, open(os.path.join(committed, name)) as theirs:
      assert mine.read() == theirs.read(), (
          f"experiments/results/projection/{name} is not what `make projection` writes "
          "from the committed results: run `make projection` and commit its files")
  stale = {os.path.basename(p) for p in glob.glob(os.path.join(committed, "*"))
           if not p.endswith(".png")} - written
  assert not stale, f"committed projection files no command writes: {sorted(stale)}"


@pytest.mark.parametrize("grid", ["fashion_mnist", "pydocs_gpt2", "many_workers",
                                  "many_workers_pydocs", "one_device_h200/fashion_mnist"])
def test_the_report_reproduces_each_committed_table(grid):
  """Each cost-vs-time grid's committed table.md is what `python -m ensemble_jax.report
  experiments/results/<grid>` writes from its committed results (its figures, whose bytes
  depend on matplotlib's version, are not compared)."""
  from ensemble_jax import report

  results = os.path.join(docs_data.RESULTS, grid)
  with open(os.path.join(results, "table.md")) as theirs:
    assert report.table_md(results, report.load_runs(results)) == theirs.read(), (
        f"experiments/results/{grid}/table.md is not what the report writes: run "
        f"`python -m ensemble_jax.report experiments/results/{grid}` and commit it")


def _region(pages, name, body):
  """The pages with generated region `name` holding `body`."""
  page = docs_render.REGIONS[name][0]
  return {**pages, page: _edit(pages[page], name, lambda _: body.split("\n"))}


def test_every_template_has_its_region_and_each_region_a_template(pages):
  """Each region docs_render renders sits in its page, and renders byte for byte."""
  for name, (page, _) in docs_render.REGIONS.items():
    start, end = docs_render.regions(pages[page])[name]
    assert pages[page].split("\n")[start:end] == docs_render.render_region(name).split("\n")
  assert not docs_render.check(pages)[1] and not docs_render.check(pages)[2]


@pytest.mark.parametrize("name", sorted(docs_render.REGIONS))
def test_a_number_changed_in_a_generated_region_fails(pages, name):
  """One digit changed anywhere in a generated region fails the check; re-wrapping alone
  is also caught (byte for byte), and --write's rendering puts the page back."""
  page = docs_render.REGIONS[name][0]
  start, end = docs_render.regions(pages[page])[name]
  body = "\n".join(pages[page].split("\n")[start:end])
  digit = re.search(r"\d", body)
  bumped = body[:digit.start()] + str((int(digit[0]) + 1) % 10) + body[digit.end():]
  [error] = _errors(_region(pages, name, bumped), name)
  assert "!= from the results" in error, error
  [error] = _errors(_region(pages, name, " ".join(body.split())), name)
  assert "wrapped otherwise" in error, error
  written, errors, _ = docs_render.check(_region(pages, name, bumped))
  assert not errors and written == pages


def test_unknown_and_missing_regions_are_reported(pages):
  """A region no template renders and a template without its region each fail, and --write
  does not hide them."""
  name = "readme_regime"
  page = docs_render.REGIONS[name][0]
  renamed = {**pages, page: pages[page].replace(f"<!-- generated: {name} -->",
                                                "<!-- generated: no_such_template -->")}
  errors = docs_render.check(renamed)[1]
  assert any(e.startswith(f"{page}, region no_such_template: no template") for e in errors)
  assert any(e.startswith(f"{page}, region {name}: no `<!-- generated") for e in errors)
  assert docs_render.check(docs_render.check(renamed)[0])[1] == errors, "write hid them"


def _distilled_study(tmp_path, speedup: float) -> str:
  """A copy of the Fashion-MNIST grid's baselines with the small-model routed experts' N = 8
  seed runs posing as a distilled curve (a synthetic pool whose build is charged), their
  training `speedup` times faster than measured."""
  results = tmp_path / "results"
  src = os.path.join(REPO, "experiments", "results", "fashion_mnist")
  for curve in ("data_parallel", "dp_short_schedule", "dp_small_model",
                "data_parallel_sync_bn", "dp_small_model_sync_bn"):
    shutil.copytree(os.path.join(src, curve), results / "fashion_mnist" / curve)
  for path in glob.glob(os.path.join(src, "ensemble_pca_routed_small", "N8_L235", "seed*",
                                     "results.json")):
    with open(path) as f:
      r = json.load(f)
    build_s, build_flops = 300.0, 1e14
    modelled, measured = r["cost"]["modelled"], r["cost"]["measured"]
    pool_s = r["distill"]["build_time_s"]
    for preset, t in modelled["critical_path_s"].items():
      modelled["critical_path_s"][preset] = (t - pool_s) / speedup + build_s
    measured["flops_to_target"] = ((measured["flops_to_target"] - r["distill"]["build_flops"])
                                   / speedup + build_flops)
    r["distill"] = {**r["distill"], "build_time_s": build_s, "build_flops": build_flops,
                    "distillation": {"method": "distribution_matching"}}
    out = results / "fashion_mnist" / "ensemble_distilled" / "N8_L235" / os.path.basename(
        os.path.dirname(path)) / "results.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(r))
  return str(results)


def _taught_study(tmp_path, teacher_s: float, speedup: float) -> str:
  """A copy of the Python docs grid with its ensemble N = 4 seed runs posing as the
  knowledge-distilled curve: a teacher of `teacher_s` charged, training `speedup` faster."""
  results = tmp_path / "results"
  src = os.path.join(REPO, "experiments", "results", "pydocs_gpt2")
  shutil.copytree(src, results / "pydocs_gpt2")
  for path in glob.glob(os.path.join(src, "ensemble", "N4_L600", "seed*", "results.json")):
    with open(path) as f:
      r = json.load(f)
    modelled, measured = r["cost"]["modelled"], r["cost"]["measured"]
    modelled["critical_path_s"] = {p: t / speedup + teacher_s
                                   for p, t in modelled["critical_path_s"].items()}
    modelled["teacher_s"] = dict.fromkeys(modelled["critical_path_s"], teacher_s)
    measured["teacher_flops"] = 1e12
    measured["flops_to_target"] += 1e12
    out = results / "pydocs_gpt2_kd" / "ensemble_kd" / "N4_L600" / os.path.basename(
        os.path.dirname(path)) / "results.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(r))
  return str(results)


def test_the_kd_table_reads_the_taught_curve_and_cannot_call_a_charged_win_a_loss(
    tmp_path, monkeypatch):
  """distillation.md's knowledge-distillation rows are the taught points found beside the
  full grid's baselines, each ratio worded by targets.verdict_word: a planted charged win
  reads "beats", a loss "behind", whatever the template says around them."""
  for teacher_s, speedup, verdict in ((120.0, 1.0, "behind"), (0.0, 50.0, "beats")):
    monkeypatch.setattr(docs_data, "RESULTS", _taught_study(tmp_path / str(speedup),
                                                             teacher_s, speedup))
    study = distillation_page.study(distillation_page.taught(), lambda p: teacher_s)
    [row] = study["rows"]
    assert (row["curve"], row["point"], row["seed_list"]) == ("ensemble_kd", "N4_L600",
                                                             [1, 2, 3]), row
    assert row["reused_s"] == teacher_s and row["charged"]["verdict"] == verdict, row
    assert study["best_charged"]["verdict"] == verdict, study["best_charged"]
    assert study["waiting"] == ["ensemble_kd N2_L1200", "ensemble_kd N8_L300"], study


def test_the_distilled_bullet_reads_the_grid_and_cannot_call_a_win_a_loss(tmp_path,
                                                                          monkeypatch):
  """The README's distilled-data bullet and distillation.md read the distilled points they
  find, charged and amortised, and word them in one macro by the one verdict rule: a planted
  amortised win reads a win in both, a level point level, with its ratio."""
  from experiments import targets

  for speedup, verdict in ((1.2, "level"), (3.0, "beats")):  # 1.2: level with the small model D8
    monkeypatch.setattr(docs_data, "RESULTS", _distilled_study(tmp_path / str(speedup),
                                                                speedup))
    docs_data.grid.cache_clear()
    try:
      study = distillation_page.study(distillation_page.distilled(), lambda p: 300.0)
      [row] = [r for r in study["rows"] if r["point"] == "N8_L235"]
      assert (row["curve"], row["reached"], row["seeds"]) == ("ensemble_distilled", 3, 3), row
      assert row["amortised"]["verdict"] == verdict, row
      best = study["best_amortised"]
      assert best["verdict"] == verdict, best
      text = " ".join(docs_render.render_region("readme_distilled").split())
      amortised = text[text.index("not charged): "):].split(". ")[0]
      assert targets.VERDICTS[verdict] in amortised, amortised
      assert best["ratio"] is None or f"{best['ratio']:.2f}x" in amortised, amortised
    finally:
      docs_data.grid.cache_clear()


def test_the_headline_says_no_only_where_no_grid_and_no_projection_beats():
  """README's first bold line is rendered from the verdicts (readme_answer.md.j2): a planted
  grid win or a win at a rung of either workload's ladder turns its "no" into "in part", a
  what-if win alone does not; each ladder is worded in its own metric."""
  from experiments import docs_render, targets

  def grid(verdict):
    return {"name": "G", "target": ["accuracy >= 0.85"], "reading": {"verdict": verdict}}

  def ladder(name, metric, above=(), **by_verdict):
    return {"workload_name": name, "metric": metric, "single": None,
            "by_verdict": {**{k: [] for k in targets.VERDICTS}, **by_verdict},
            "pending": {"total": 4, "count": 1, "baselines": 0}, "above_single": list(above)}

  def context(verdict, what_if_beats=1, rung_beats=(), rung_unopposed=(), text_beats=()):
    return {"grids": [grid("behind"), grid(verdict)], "verdicts": targets.VERDICTS,
            "max_devices": 1024,
            "projections": [{"name": "p", "what_if": False, "beats": 0},
                            {"name": "w", "what_if": True, "beats": what_if_beats}],
            "ladders": [ladder("Images", "accuracy", above=[0.915], unmeasured=[0.9],
                               beats=list(rung_beats), unopposed=list(rung_unopposed)),
                        ladder("Text", "perplexity", behind=[14.0], beats=list(text_beats))]}

  render = lambda c: docs_render.render_template("readme_answer.md.j2", c)
  assert render(context("level")).startswith("**The answer so far: no.")
  assert "borrow an H100's step" in render(context("level"))
  assert render(context("beats")).startswith("**The answer so far: in part.")
  assert "H100" not in render(context("level", what_if_beats=0))
  at_rung = render(context("level", rung_beats=[0.88]))
  assert at_rung.startswith("**The answer so far: in part.") and "beats it at 88.0%" in at_rung
  # a rung only a method point reaches (above every baseline's reach) is a win too
  alone = render(context("level", rung_unopposed=[0.915]))
  assert alone.startswith("**The answer so far: in part.")
  assert ("reached by a method point and by no baseline point at 91.5% (above the single "
          "model's ceiling)") in alone
  # a win above the single model's ceiling says what bought it; one below it does not
  assert "bought with capacity (the ensemble's parameters)" in alone
  assert "capacity" not in at_rung
  high = render(context("level", rung_beats=[0.88, 0.915]))
  assert "beats it at 88.0%, 91.5% (above the single model's ceiling)" in high
  assert "bought with capacity" in high
  assert "was trained to 90.0%" in at_rung and "to none" not in render(
      {**context("level"), "ladders": [ladder("Images", "accuracy")]})
  text = render(context("level", text_beats=[11.0]))
  assert text.startswith("**The answer so far: in part.")
  assert "Text (the single model's ceiling not measured yet" in text
  assert "beats it at 11; behind on every seed at 14." in text
