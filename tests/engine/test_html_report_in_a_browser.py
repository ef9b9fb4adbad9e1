"""The HTML report of real runs, and in a real browser: planted bugs run through the engine show their lost and
duplicated inputs on the page, and headless Chromium (where it is installed) draws every timeline, every
status and category, crash cells, rank lanes and a 1,200-cell report without a script error. The page's own
tests, from cell JSON built by hand: tests/unit/test_html_report.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from report_cells import (
    PAYLOAD,
    STATE_HEADLINE,
    crash_matrix,
    embedded_timelines,
    every_status_cells,
    lost_cell,
    synthetic_matrix,
    two_rank_cell,
)

from pytest_resume_check import categories
from pytest_resume_check.judge import verdict
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.report import html, summary

CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


# -- the real thing: planted bugs through the engine -----------------------------------------------------

@pytest.fixture(scope="module")
def planted_cells(tmp_path_factory):
    """Cell JSON of real runs: a dropped buffer tail (LOST) and a tail read twice (DUPLICATED)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from pytest_resume_check.builtin import loop
    from pytest_resume_check.cells.matrix import Cell
    from pytest_resume_check.engine import Engine
    from pytest_resume_check.report import text as report
    from pytest_resume_check.targets import resume_target

    engine = Engine(tmp_path_factory.mktemp("html-engine"), seed=7, hang_timeout=20)
    case = {"id": "take2", "take": 2}
    cells = []
    runs = [(loop.loop_drop_buffer, (KillSpec(1),)), (loop.loop_buffer_and_reread, (KillSpec(1),)),
            (loop.loop_buffer_and_reread, (KillSpec(1), KillSpec(5, 1))), (loop.correct_loop, (KillSpec(3),))]
    for fn, kills in runs:
        target = resume_target(fn, name=fn.__name__, steps=loop.total_steps, boundaries=loop.epoch_boundaries,
                               preload=loop.PRELOAD)
        cells.append(report.cell_json(engine.run_cell(Cell(target, case, "auto", kills, loop.total_steps(case)))))
    return cells


@pytest.mark.slow
def test_planted_failures_show_lost_and_duplicated_inputs(planted_cells):
    drop, reread, reread_twice, correct = planted_cells
    assert correct["passed"] and not drop["passed"] and not reread["passed"]
    page = html.render(planted_cells, seed=7)
    timelines = embedded_timelines(page)
    assert len(timelines) == 3  # one per failing cell, none for the passing one
    by_name = {t["cell"]: t for t in timelines}

    lost = by_name[summary.cell_name(drop)]
    assert [(i, m) for g in lost["ref"] for i, m in zip(g[3], g[4]) if m != verdict.MARK_OK] == [(2, "L"), (3, "L")]
    dup = by_name[summary.cell_name(reread)]
    assert {i for g in dup["res"] for i, m in zip(g[3], g[4]) if m == "D"} >= {2, 3}
    twice = by_name[summary.cell_name(reread_twice)]
    assert len(twice["resumed"]) == 2 and [k[0] for k in twice["kills"]] == [0, 1]
    assert summary.cell_name(drop) in page and drop["headline"] in page
    assert drop["story"].replace(">", "&gt;") in page


# -- a real browser ----------------------------------------------------------------------------------------

def chromium(tmp_path, url, *args):
    """Run headless Chromium on ``url`` and return its stdout."""
    profile = tmp_path / "chromium-profile"
    done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rendered_dom(tmp_path, path):
    """The DOM after the page's script ran with every timeline drawn."""
    return chromium(tmp_path, path.as_uri() + html.RENDER_ALL_HASH, "--dump-dom")


def render_state(dom):
    return re.search(r'<body data-render="([^"]*)"', dom).group(1)


NO_CHROMIUM = "chromium is not installed (Debian: apt-get install chromium)"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)


@pytest.mark.slow
@needs_chromium
def test_chromium_draws_every_timeline_without_a_script_error(tmp_path, planted_cells):
    cells = [*planted_cells, lost_cell(target=f"t{PAYLOAD}", headline=f"LOST {PAYLOAD}")]
    cells[-1]["reference"][2][0] = PAYLOAD
    path = html.write_report(cells, tmp_path / "report.html", seed=7)
    dom = rendered_dom(tmp_path, path)
    assert render_state(dom) == html.RENDER_OK
    svgs = re.findall(r'<svg [^>]*class="timeline"', dom)
    assert len(svgs) == len(embedded_timelines(path.read_text())) == 4
    assert dom.count('class="in m-L"') >= 2 and dom.count('class="in m-D"') >= 2
    # The id went in as text: Chromium serialises it escaped, and no element came out of it.
    assert "id &lt;/script&gt;&lt;img src=x" in dom and "<img" not in dom

    png = tmp_path / "report.png"
    chromium(tmp_path, path.as_uri(), f"--screenshot={png}", "--window-size=1400,1000")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


@pytest.mark.slow
@needs_chromium
def test_chromium_renders_a_page_with_every_category_and_crash_cells(tmp_path):
    cells = every_status_cells() + [{**c, "target": "crashy"} for c in crash_matrix()]
    path = html.write_report(cells, tmp_path / "every.html", seed=3)
    dom = rendered_dom(tmp_path, path)
    assert render_state(dom) == html.RENDER_OK
    drawn = len(re.findall(r'<svg [^>]*class="timeline"', dom))
    # Every failing cell is drawn: the unexpected and expected failures, and an XPASS (it fails too).
    failing = sum(1 for c in cells if not c["passed"] or categories.fails(c))
    assert drawn == len(embedded_timelines(path.read_text())) == failing
    marks = html.entry_categories()
    for m in (verdict.MARK_LOST, verdict.MARK_DUPLICATED):  # lost and duplicated inputs in their colours
        assert re.search(rf'<rect [^>]*fill="{marks[m].colour}"[^>]*class="in m-{m}"', dom), marks[m].name
    assert dom.count('data-kind="crash"') == 1 and dom.count('data-kind="kills"') == 2
    # The STATE_DIVERGED cell's timeline marks the step where the state first differs.
    assert dom.count('<g class="state">') == 1 and STATE_HEADLINE in dom


@pytest.mark.slow
@needs_chromium
def test_chromium_renders_the_1200_cell_report(tmp_path):
    path = html.write_report(synthetic_matrix(), tmp_path / "big.html", seed=1)
    dom = rendered_dom(tmp_path, path)
    assert render_state(dom) == html.RENDER_OK
    assert len(re.findall(r'<svg [^>]*class="timeline"', dom)) == html.MAX_TIMELINES


@pytest.mark.slow
def test_the_page_reports_a_script_error_on_its_body(tmp_path):
    """The marker the browser tests read is not vacuous: a broken timeline turns it into an error."""
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    page = html.render([lost_cell()])
    page = page.replace('id="timelines">[', 'id="timelines">[null,', 1)
    path = Path(tmp_path / "broken.html")
    broken = page.replace("if (drawn[i] || !data[i]) { return; }", "if (drawn[i]) { return; }")
    assert broken != page
    path.write_text(broken)
    dom = chromium(tmp_path, path.as_uri() + html.RENDER_ALL_HASH, "--dump-dom")
    assert render_state(dom).startswith(html.RENDER_ERROR)


@pytest.mark.slow
@needs_chromium
def test_chromium_draws_the_rank_lanes(tmp_path):
    path = html.write_report([two_rank_cell()], tmp_path / "ranks.html", seed=1)
    dom = rendered_dom(tmp_path, path)
    assert render_state(dom) == html.RENDER_OK
    for label in ("reference r0", "reference r1", "resumed r0", "resumed r1"):
        assert f">{label}</text>" in dom
