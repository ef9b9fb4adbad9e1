"""The HTML report: one self-contained file with a heatmap per target, a summary table, and a timeline
per failing cell that marks lost and duplicated inputs; escaped everywhere, small for 1,200 cells,
and drawn without a script error by a real browser (headless Chromium, where it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_resume_check import html, summary

PAYLOAD = '</script><img src=x onerror="alert(1)">&amp; <b>'
CHROMIUM = shutil.which("chromium")
PRELOAD = ("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.loop:warm_up")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def ledger(steps, take=2, n=8, run_of=lambda step: 0):
    """``[id, step, epoch, run]`` rows of a loop taking ``take`` of ``n`` inputs per step, in order."""
    rows = []
    for i in range(steps * take):
        step = i // take + 1
        rows.append([i % n, step, i // n, run_of(step)])
    return rows


def cell(target="t", case="c", mode="auto", kill="ckpt1", passed=True, categories=(), headline="PASSED",
         reference=None, composite=None, resumed_from=(), xfail_reason=None, **extra):
    runs = [{"outcome": "killed", "exitcode": -9, "seconds": 0.1}, {"outcome": "done", "exitcode": 0, "seconds": 0.2}]
    return {"target": target, "case": {"id": case}, "case_id": case, "resume_mode": mode, "kill": kill,
            "passed": passed, "xfail_reason": xfail_reason, "categories": list(categories), "headline": headline,
            "resumed_from": list(resumed_from), "reference": reference or [], "composite": composite or [],
            "runs": runs, **extra}


def lost_cell(headline="LOST 2 inputs after resume from step_1: ids 2, 3", **kw):
    """Killed after checkpoint 1; the resumed run skips ids 2 and 3 (a buffered tail not saved)."""
    ref = ledger(4)
    comp = [r for r in ref if r[1] == 1] + [[i, s, 0, 1] for i, s in ((4, 2), (5, 2), (6, 3), (7, 3))]
    return cell(passed=False, categories=["LOST"], headline=headline, reference=ref, composite=comp,
                resumed_from=[1], **kw)


def duplicated_cell(**kw):
    """Killed after checkpoint 1; the resumed run takes ids 0 and 1 again."""
    ref = ledger(4)
    comp = [r for r in ref if r[1] == 1] + [[i, s + 1, 0, 1] for i, s in ((0, 1), (1, 1), (2, 2), (3, 2))]
    return cell(passed=False, categories=["DUPLICATED"], headline="DUPLICATED 2 inputs: ids 0, 1",
                reference=ref, composite=comp, resumed_from=[1], **kw)


def synthetic_matrix(n_cells=1200, failing_every=4, steps=60):
    """A large matrix: 3 targets x 4 cases x 2 resume modes x 50 kill points; every 4th cell fails."""
    cells = []
    kills = [f"ckpt{k}" for k in range(1, 46)] + [f"ckpt{k}+1" for k in range(0, 4)] + ["ckpt1,ckpt40+1"]
    for t in range(3):
        for c in range(4):
            for mode in ("auto", "path"):
                for kill in kills:
                    index = len(cells)
                    if index % failing_every:
                        cells.append(cell(f"target{t}", f"case{c}", mode, kill))
                        continue
                    ref = ledger(steps, take=4, n=40)
                    at = max(1, int(kill.split(",")[0][4:].partition("+")[0]))  # the checkpoint resumed from
                    comp = [r for r in ref if r[1] <= at] + [[r[0], r[1], r[2], 1] for r in ref if r[1] > at + 1]
                    cells.append(cell(f"target{t}", f"case{c}", mode, kill, passed=False, categories=["LOST"],
                                      headline=f"LOST 4 inputs after resume from step_{at}",
                                      reference=ref, composite=comp, resumed_from=[at],
                                      rerun=f"pytest --resume-matrix-cell=target{t}[case{c}-{mode}-{kill}]"))
    assert len(cells) == n_cells
    return cells


def embedded_timelines(page):
    """The JSON the page's script draws from, decoded."""
    match = re.search(r'<script type="application/json" id="timelines">(.*?)</script>', page, re.S)
    assert match, "no embedded timeline data"
    return json.loads(match.group(1))


# -- structure -----------------------------------------------------------------------------------------

def test_report_is_one_self_contained_file(tmp_path):
    path = html.write_report([lost_cell(), cell(kill="ckpt2")], tmp_path / "sub" / "report.html", seed=5)
    assert path == tmp_path / "sub" / "report.html" and path.is_file()
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Nothing to fetch: no linked files, no remote URLs (the SVG namespace is a name, not a request).
    assert not re.search(r"<link|\ssrc=|@import|url\(", page)
    assert re.findall(r"https?://[^\s\"'<]+", page) == ["http://www.w3.org/2000/svg"]
    assert "seed 5" in page and "--resume-matrix-seed=5" in page


def test_heatmap_has_one_coloured_square_per_cell(tmp_path):
    cells = [cell(kill="ckpt1"), lost_cell(kill="ckpt2"), duplicated_cell(kill="ckpt3"),
             lost_cell(kill="ckpt4", xfail_reason="known"), cell(kill="ckpt5", xfail_reason="was known"),
             cell(target="other", kill="ckpt1")]
    page = html.render(cells)
    squares = re.findall(r'<td class="s-(\w+)" title="([^"]*)">', page)
    assert sorted(s for s, _ in squares) == sorted(["PASSED", "LOST", "DUPLICATED", "XFAIL", "XPASS", "PASSED"])
    assert len(re.findall(r'<div class="hm"><h3>', page)) == 2  # one heatmap per target
    titles = dict((s, t) for s, t in squares)
    assert titles["XFAIL"].endswith("(expected: known)")
    # A failing square links to its cell's timeline.
    assert re.search(r'<td class="s-LOST" title="[^"]*"><a href="#cell-\d+">L</a></td>', page)


def test_summary_counts_failures_expected_failures_and_categories():
    cells = [cell(kill="ckpt1"), lost_cell(kill="ckpt2"), duplicated_cell(kill="ckpt3"),
             lost_cell(kill="ckpt4", xfail_reason="known")]
    page = html.render(cells, seed=1)
    table = re.search(r'<table class="summary">.*?</table>', page, re.S).group(0)
    head = re.findall(r"<th>([^<]*)</th>", table.split("<tbody>")[0])
    row = re.findall(r"<t[dh][^>]*>([^<]*)</t[dh]>", table.split("<tbody>")[1])
    assert dict(zip(head, row)) == {"target": "t", "cells": "4", "pass": "1", "failing": "2",
                                    "expected failures": "1", "fixed": "", "lost": "1", "duplicated": "1"}
    assert 'class="verdict v-FAILED"' in page


def test_a_passing_matrix_says_so():
    page = html.render([cell(kill=f"ckpt{k}") for k in range(1, 5)])
    assert "No cell failed." in page and 'class="verdict v-PASSED"' in page
    assert embedded_timelines(page) == []


def test_each_failing_cell_has_headline_runs_and_rerun_command():
    page = html.render([lost_cell(rerun="pytest '--resume-matrix-cell=t[c-auto-ckpt1]' --resume-matrix-seed=3")])
    details = re.search(r'<details class="failure".*?</details>', page, re.S).group(0)
    assert "LOST 2 inputs after resume from step_1: ids 2, 3" in details
    assert "run 1: killed after 0.10 s → run 2 (resumed from step 1): done after 0.20 s" in details
    rerun = "pytest &#x27;--resume-matrix-cell=t[c-auto-ckpt1]&#x27; --resume-matrix-seed=3"
    assert f"rerun: <code>{rerun}</code>" in details


def test_failing_cells_fold_per_target_with_the_first_one_open():
    cells = [lost_cell(target="a", kill=f"ckpt{k}") for k in (3, 1, 2)] + [duplicated_cell(target="b")]
    cells.append(lost_cell(target="c", xfail_reason="known"))
    page = html.render(cells)
    groups = re.findall(r'<div class="group"><h3>(\w+) <span class="meta">([^<]+)</span>', page)
    assert groups == [("a", "3 failing cells"), ("b", "1 failing cell"), ("c", "1 expected failure")]
    opened = re.findall(r'<details class="failure" id="[^"]+" data-t="\d+" data-search="([^"]+)" open>', page)
    assert [o.split("[")[0] for o in opened] == ["a", "b", "c"]
    assert opened[0].startswith("a[c-auto-ckpt1]")  # the earliest kill point first, as in the heatmap
    assert "2 more failing cells of a</summary>" in page


def test_html_module_needs_only_the_standard_library():
    code = ("import sys; before = set(sys.modules); import pytest_resume_check.html; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = set(json.loads(out.stdout.replace("'", '"')))
    assert "pytest" not in new and "_pytest" not in new
    assert new - {"pytest_resume_check"} <= set(sys.stdlib_module_names)


def test_cells_without_a_rerun_command_get_one_built_from_the_seed():
    page = html.render([lost_cell()], seed=42)
    assert "pytest --resume-matrix --resume-matrix-seed=42 &#x27;--resume-matrix-cell=t[c-auto-ckpt1]&#x27;" in page


# -- timelines -----------------------------------------------------------------------------------------

def test_lost_inputs_are_marked_in_the_reference_lane():
    t = html.timeline(lost_cell())
    marked = [(i, m) for g in t["ref"] for i, m in zip(g[3], g[4]) if m != html.OK]
    assert marked == [(2, html.LOST), (3, html.LOST)]
    assert all(set(g[4]) == {html.OK} for g in t["res"])
    assert t["kills"] == [[0, 1, 1]] and t["resumed"] == [1]


def test_duplicated_inputs_are_marked_in_the_resumed_lane_at_their_second_occurrence():
    t = html.timeline(duplicated_cell())
    marked = [(g[0], i, m) for g in t["res"] for i, m in zip(g[3], g[4]) if m != html.OK]
    assert marked == [(2, 0, html.DUPLICATED), (2, 1, html.DUPLICATED)]
    assert [g[1] for g in t["res"]] == [0, 1, 1]  # the run each step of the resumed job came from


@pytest.mark.parametrize(("composite", "ref_marks", "comp_marks"), [
    ([[0, 1, 0, 0], [1, 1, 0, 0], [2, 2, 0, 0], [3, 2, 0, 0]], "....", "...."),
    ([[0, 1, 0, 0], [1, 1, 0, 0], [3, 2, 0, 1], [2, 2, 0, 1]], "....", "..RR"),
    ([[0, 1, 0, 0], [1, 1, 0, 0], [2, 2, 1, 1], [3, 2, 0, 1]], "..E.", "..E."),
    ([[0, 1, 0, 0], [1, 1, 0, 0], [1, 2, 0, 1], [3, 2, 0, 1]], "..L.", "..D."),
])
def test_classify_marks_each_entry_as_the_verdict_counts_it(composite, ref_marks, comp_marks):
    reference = [[0, 1, 0, 0], [1, 1, 0, 0], [2, 2, 0, 0], [3, 2, 0, 0]]
    assert html.classify(reference, composite) == (ref_marks, comp_marks)


def test_timeline_keeps_only_the_steps_around_the_failure():
    ref = ledger(500, take=2, n=100)
    comp = [r for r in ref if r[1] != 300] + [[999, 300, 5, 1]]
    t = html.timeline(cell(passed=False, categories=["LOST"], kill="ckpt299", reference=ref, composite=comp,
                           resumed_from=[299]))
    assert (t["lo"], t["hi"], t["last"]) == (299 - html.CONTEXT_STEPS, 300 + html.CONTEXT_STEPS, 500)
    assert {g[0] for g in t["ref"] + t["res"]} == set(range(t["lo"], t["hi"] + 1))


def test_timeline_caps_inputs_per_step():
    ref = [[i, 1, 0, 0] for i in range(100)] + [[i, 2, 0, 0] for i in range(100, 110)]
    comp = ref[:100] + [[i, 2, 0, 1] for i in range(100, 109)]
    t = html.timeline(cell(passed=False, categories=["LOST"], reference=ref, composite=comp, resumed_from=[1]))
    first = t["ref"][0]
    assert len(first[3]) == html.MAX_PER_STEP and first[5] == 100 - html.MAX_PER_STEP


def test_a_verdict_without_ledgers_still_gets_its_entry():
    crashed = cell(passed=False, categories=["CRASHED"], headline="CRASHED: run 2 of 2 exited with code 3")
    page = html.render([crashed])
    assert "CRASHED: run 2 of 2 exited with code 3" in page
    assert embedded_timelines(page)[0]["ref"] == []


# -- escaping ------------------------------------------------------------------------------------------

def test_ids_headlines_and_names_are_escaped_everywhere():
    bad = lost_cell(target=f"t{PAYLOAD}", case=f"c{PAYLOAD}", headline=f"LOST {PAYLOAD}",
                    xfail_reason=f"known {PAYLOAD}", rerun=f"pytest {PAYLOAD}")
    bad["reference"][2][0] = PAYLOAD  # an id
    bad["reference"][3][0] = "a&b"
    page = html.render([bad], seed=1)
    assert PAYLOAD not in page
    assert "<img" not in page and "<b>" not in page
    assert "&lt;/script&gt;&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp; &lt;b&gt;" in page
    # Exactly the page's two script elements; the embedded JSON cannot close its element early.
    assert page.count("</script>") == 2
    ids = [i for g in embedded_timelines(page)[0]["ref"] for i in g[3]]
    assert PAYLOAD in ids and "a&b" in ids


# -- size ----------------------------------------------------------------------------------------------

def test_1200_cells_give_a_small_file_with_capped_timelines(tmp_path):
    cells = synthetic_matrix()
    path = html.write_report(cells, tmp_path / "big.html", seed=1)
    page = path.read_text()
    size = path.stat().st_size
    failing = sum(1 for c in cells if not c["passed"])
    assert failing == 300
    assert size < 600_000, f"{size} bytes for 1,200 cells"
    assert len(embedded_timelines(page)) == html.MAX_TIMELINES
    assert len(re.findall(r'<details class="failure"', page)) == html.MAX_TIMELINES
    assert f"{failing - html.MAX_TIMELINES} more failing cells (no timeline)" in page
    assert len(re.findall(r'<td class="s-', page)) == len(cells)
    # Ledgers stay out of the page except around each failure.
    shown = [t["hi"] - t["lo"] + 1 for t in embedded_timelines(page)]
    assert max(shown) <= html.MAX_STEPS and sorted(shown)[len(shown) // 2] <= 2 * html.CONTEXT_STEPS + 2


# -- the real thing: planted bugs through the engine -----------------------------------------------------

@pytest.fixture(scope="module")
def planted_cells(tmp_path_factory):
    """Cell JSON of real runs: a dropped buffer tail (LOST) and a tail read twice (DUPLICATED)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from pytest_resume_check import report
    from pytest_resume_check.builtin import loop
    from pytest_resume_check.matrix import Cell
    from pytest_resume_check.run import KillSpec
    from pytest_resume_check.scenario import Engine
    from pytest_resume_check.targets import resume_target

    engine = Engine(tmp_path_factory.mktemp("html-engine"), seed=7, hang_timeout=20)
    case = {"id": "take2", "take": 2}
    cells = []
    runs = [(loop.loop_drop_buffer, (KillSpec(1),)), (loop.loop_buffer_and_reread, (KillSpec(1),)),
            (loop.loop_buffer_and_reread, (KillSpec(1), KillSpec(5, 1))), (loop.correct_loop, (KillSpec(3),))]
    for fn, kills in runs:
        target = resume_target(fn, name=fn.__name__, steps=loop.total_steps, boundaries=loop.epoch_boundaries,
                               preload=PRELOAD)
        cells.append(report.cell_json(engine.run_cell(Cell(target, case, "auto", kills, loop.total_steps(case)))))
    return cells


def test_planted_failures_show_lost_and_duplicated_inputs(planted_cells):
    drop, reread, reread_twice, correct = planted_cells
    assert correct["passed"] and not drop["passed"] and not reread["passed"]
    page = html.render(planted_cells, seed=7)
    timelines = embedded_timelines(page)
    assert len(timelines) == 3  # one per failing cell, none for the passing one
    by_name = {t["cell"]: t for t in timelines}

    lost = by_name[summary.cell_name(drop)]
    assert [(i, m) for g in lost["ref"] for i, m in zip(g[3], g[4]) if m != html.OK] == [(2, "L"), (3, "L")]
    dup = by_name[summary.cell_name(reread)]
    assert {i for g in dup["res"] for i, m in zip(g[3], g[4]) if m == "D"} >= {2, 3}
    twice = by_name[summary.cell_name(reread_twice)]
    assert len(twice["resumed"]) == 2 and [k[0] for k in twice["kills"]] == [0, 1]
    assert summary.cell_name(drop) in page and drop["headline"] in page


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


NO_CHROMIUM = "chromium is not installed (Debian: apt-get install chromium)"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)


@needs_chromium
def test_chromium_draws_every_timeline_without_a_script_error(tmp_path, planted_cells):
    cells = [*planted_cells, lost_cell(target=f"t{PAYLOAD}", headline=f"LOST {PAYLOAD}")]
    cells[-1]["reference"][2][0] = PAYLOAD
    path = html.write_report(cells, tmp_path / "report.html", seed=7)
    dom = rendered_dom(tmp_path, path)
    assert re.search(r'<body data-render="([^"]*)"', dom).group(1) == html.RENDER_OK
    svgs = re.findall(r'<svg [^>]*class="timeline"', dom)
    assert len(svgs) == len(embedded_timelines(path.read_text())) == 4
    assert dom.count('class="in m-L"') >= 2 and dom.count('class="in m-D"') >= 2
    # The id went in as text: Chromium serialises it escaped, and no element came out of it.
    assert "id &lt;/script&gt;&lt;img src=x" in dom and "<img" not in dom

    png = tmp_path / "report.png"
    chromium(tmp_path, path.as_uri(), f"--screenshot={png}", "--window-size=1400,1000")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


@needs_chromium
def test_chromium_renders_the_1200_cell_report(tmp_path):
    path = html.write_report(synthetic_matrix(), tmp_path / "big.html", seed=1)
    dom = rendered_dom(tmp_path, path)
    assert re.search(r'<body data-render="([^"]*)"', dom).group(1) == html.RENDER_OK
    assert len(re.findall(r'<svg [^>]*class="timeline"', dom)) == html.MAX_TIMELINES


def test_the_page_reports_a_script_error_on_its_body(tmp_path):
    """The marker the browser tests read is not vacuous: a broken timeline turns it into an error."""
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    page = html.render([lost_cell()])
    page = page.replace('id="timelines">[', 'id="timelines">[null,', 1)
    path = Path(tmp_path / "broken.html")
    path.write_text(page.replace("if (drawn[i] || !data[i]) { return; }", "if (drawn[i]) { return; }"))
    dom = chromium(tmp_path, path.as_uri() + html.RENDER_ALL_HASH, "--dump-dom")
    assert re.search(r'<body data-render="([^"]*)"', dom).group(1).startswith(html.RENDER_ERROR)
