"""The HTML report: one self-contained file with heatmaps per target (kill points, and crash-consistency
cells apart), a summary table, and a timeline per failing cell that marks lost and duplicated inputs;
every status and category of ``categories.TABLE`` shown with its mark, colour and label; escaped
everywhere, and small for 1,200 cells. A real browser drawing pages of real runs:
tests/engine/test_html_report_in_a_browser.py."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

from report_cells import (
    PAYLOAD,
    STATE_HEADLINE,
    STORY,
    cell,
    crash_cell,
    crash_matrix,
    duplicated_cell,
    embedded_timelines,
    every_status_cells,
    ledger,
    lost_cell,
    state_cell,
    synthetic_matrix,
    two_rank_cell,
)

from pytest_resume_check import categories
from pytest_resume_check.judge import verdict
from pytest_resume_check.records.faults import MODE_POWER
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.report import html, summary


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.text = tag, dict(attrs), parent, ""
        self.classes = set((self.attrs.get("class") or "").split())


class Dom(HTMLParser):
    """Every element of a page with its attributes, text (its own and its children's) and parent."""

    VOID = {"meta", "input", "br", "img", "link"}

    def __init__(self, page):
        super().__init__(convert_charrefs=True)
        self.nodes, self.open = [], []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.open[-1] if self.open else None)
        self.nodes.append(node)
        if tag not in self.VOID:
            self.open.append(node)

    def handle_endtag(self, tag):
        while self.open and self.open.pop().tag != tag:
            pass

    def handle_data(self, data):
        for node in self.open:
            node.text += data

    def find(self, tag, *classes):
        return [n for n in self.nodes if n.tag == tag and n.classes >= set(classes)]


def heatmaps(page):
    """``(kind, title, column labels, row labels, [(status, title)])`` of each heatmap, in page order."""
    out = []
    for div in re.findall(r'<div class="hm" data-kind="\w+">.*?</table></div></div>', page, re.S):
        kind = re.search(r'data-kind="(\w+)"', div).group(1)
        title = re.sub(r"<[^>]+>", "", re.search(r"<h3>(.*?)</h3>", div).group(1))
        columns = re.findall(r'<th class="k"><span>([^<]*)</span></th>', div)
        rows = [re.findall(r'<th class="row">([^<]*)</th>', tr) for tr in re.findall(r"<tr>(.*?)</tr>", div)[1:]]
        squares = re.findall(r'<td class="s-(\w+)" title="([^"]*)">', div)
        out.append((kind, title, columns, rows, squares))
    return out


# -- structure -----------------------------------------------------------------------------------------

def test_report_is_one_self_contained_file(tmp_path):
    path = html.write_report([lost_cell(), cell(kill=KillSpec(2))], tmp_path / "sub" / "report.html", seed=5)
    assert path == tmp_path / "sub" / "report.html" and path.is_file()
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Nothing to fetch: no linked files, no remote URLs (the SVG namespace is a name, not a request).
    assert not re.search(r"<link|\ssrc=|@import|url\(", page)
    assert re.findall(r"https?://[^\s\"'<]+", page) == ["http://www.w3.org/2000/svg"]
    assert "seed 5" in page and "--resume-matrix-seed=5" in page


def test_style_and_script_are_package_data_inlined_into_the_page():
    assets = resources.files("pytest_resume_check.report") / "assets"
    script, style = (assets / "report.js").read_text(encoding="utf-8"), (assets / "report.css").read_text()
    page = html.render([lost_cell()])
    assert f"<script>{script}</script>" in page
    assert re.search(r"<style>(.*?)</style>", page, re.S).group(1).startswith(style)
    # The module holds neither: no script or style sheet in Python strings.
    source = Path(html.__file__).read_text()
    assert "addEventListener" not in source and "box-sizing" not in source


def test_heatmap_has_one_coloured_square_per_cell():
    cells = [cell(kill=KillSpec(1)), lost_cell(kill=KillSpec(2)), duplicated_cell(kill=KillSpec(3)),
             lost_cell(kill=KillSpec(4), xfail_reason="known"), cell(kill=KillSpec(5), xfail_reason="was known"),
             cell(target="other", kill=KillSpec(1))]
    page = html.render(cells)
    maps = heatmaps(page)
    assert [(kind, title.split()[0]) for kind, title, *_ in maps] == [("kills", "other"), ("kills", "t")]
    squares = [s for *_, sq in maps for s in sq]
    assert sorted(s for s, _ in squares) == sorted(["PASSED", "LOST", "DUPLICATED", "XFAIL", "XPASS", "PASSED"])
    assert maps[1][2] == ["1", "2", "3", "4", "5"]
    titles = dict(squares)
    assert titles["XFAIL"].endswith("(expected: known)")
    # A failing square links to its cell's timeline.
    assert re.search(r'<td class="s-LOST" title="[^"]*"><a href="#cell-\d+">L</a></td>', page)


def test_kill_point_columns_come_in_order_from_the_structured_kills():
    kills = [(KillSpec(1), KillSpec(7, 1)), (KillSpec(3, 1),), (KillSpec(0, 2),), (KillSpec(3),), (KillSpec(1),)]
    cells = [cell(kill=k) for k in kills]
    (_, _, columns, _, _), = heatmaps(html.render(cells))
    assert columns == ["1", "3", "0+2", "3+1", "1,7+1"]


def test_a_distributed_kind_gets_heatmap_rows_of_its_own():
    kills = [(KillSpec(3),), (KillSpec(3, 0, rank=1),), (KillSpec(2, 1, signal="term", grace=2.0),)]
    (_, _, columns, rows, squares), = heatmaps(html.render([cell(kill=k) for k in kills]))
    assert columns == ["3", "2+1"] and rows == [["c", "auto", ""], ["c", "auto", "term2"], ["c", "auto", "rank1"]]
    assert len(squares) == 3  # the kill of rank 1 alone does not hide the kill of every rank at step 3


def test_a_cell_without_structured_kills_keeps_its_kill_id_as_its_column():
    old = {**cell(kill=KillSpec(2)), "kills": []}
    (_, _, columns, _, _), = heatmaps(html.render([cell(kill=KillSpec(1)), old]))
    assert columns == ["1", "ckpt2"]
    assert summary.grid([cell(kill=KillSpec(1)), old])[1].split() == ["1", "ckpt2"]  # the terminal grid too


def test_summary_counts_failures_expected_failures_and_categories():
    cells = [cell(kill=KillSpec(1)), lost_cell(kill=KillSpec(2)), duplicated_cell(kill=KillSpec(3)),
             lost_cell(kill=KillSpec(4), xfail_reason="known")]
    page = html.render(cells, seed=1)
    table = re.search(r'<table class="summary">.*?</table>', page, re.S).group(0)
    head = re.findall(r"<th[^>]*>([^<]*)</th>", table.split("<tbody>")[0])
    row = re.findall(r"<t[dh][^>]*>([^<]*)</t[dh]>", table.split("<tbody>")[1])
    assert dict(zip(head, row)) == {"target": "t", "cells": "4", "failing": "2", "pass": "1",
                                    "expected failure": "1", "lost": "1", "duplicated": "1"}
    assert 'class="verdict v-FAILED"' in page


def test_a_passing_matrix_says_so():
    page = html.render([cell(kill=KillSpec(k)) for k in range(1, 5)])
    assert "No cell failed." in page and 'class="verdict v-PASSED"' in page
    assert embedded_timelines(page) == []


def test_each_failing_cell_has_headline_story_and_rerun_command():
    page = html.render([lost_cell(rerun="pytest '--resume-matrix-cell=t[c-auto-ckpt1]' --resume-matrix-seed=3")])
    details = re.search(r'<details class="failure".*?</details>', page, re.S).group(0)
    assert "LOST 2 inputs after resume from step_1: ids 2, 3" in details
    assert f'<p class="runs">{STORY.replace(">", "&gt;")}</p>' in details  # the cell's own story
    rerun = "pytest &#x27;--resume-matrix-cell=t[c-auto-ckpt1]&#x27; --resume-matrix-seed=3"
    assert f"rerun: <code>{rerun}</code>" in details


def test_failing_cells_fold_per_target_with_the_first_one_open():
    cells = [lost_cell(target="a", kill=KillSpec(k)) for k in (3, 1, 2)] + [duplicated_cell(target="b")]
    cells.append(lost_cell(target="c", xfail_reason="known"))
    page = html.render(cells)
    groups = re.findall(r'<div class="group"><h3>(\w+) <span class="meta">([^<]+)</span>', page)
    assert groups == [("a", "3 failing cells"), ("b", "1 failing cell"), ("c", "1 expected failure")]
    opened = re.findall(r'<details class="failure" id="[^"]+" data-t="\d+" data-search="([^"]+)" open>', page)
    assert [o.split("[")[0] for o in opened] == ["a", "b", "c"]
    assert opened[0].startswith("a[c-auto-ckpt1]")  # the earliest kill point first, as in the heatmap
    assert "2 more failing cells of a</summary>" in page


def test_cells_without_a_rerun_command_get_one_built_from_the_seed():
    page = html.render([lost_cell()], seed=42)
    assert "pytest --resume-matrix --resume-matrix-seed=42 &#x27;--resume-matrix-cell=t[c-auto-ckpt1]&#x27;" in page


# -- one table of verdicts ------------------------------------------------------------------------------

def status_class(node):
    """``NAME`` of a node's ``s-NAME`` class (None without one)."""
    return next((c[2:] for c in node.classes if c.startswith("s-")), None)


def test_every_status_and_category_has_a_legend_entry_a_colour_and_a_summary_column():
    page = html.render(every_status_cells())
    dom = Dom(page)
    style = "".join(n.text for n in dom.find("style"))
    rules = {name: (bg, fg) for name, bg, fg in re.findall(r"\.s-(\w+)\{background:([^;]+);color:([^}]+)\}", style)}
    legend, = [p for p in dom.find("p", "legend") if "tl" not in p.classes]
    keys = {status_class(sw): sw for sw in dom.find("span", "sw") if sw.parent.parent is legend}
    squares = {status_class(td): td.text for td in dom.find("td") if "heat" in td.parent.parent.parent.classes}
    summary_head = [th.text for th in dom.find("th") if th.parent.parent.tag == "thead"
                    and "summary" in th.parent.parent.parent.classes]
    for c in categories.TABLE:
        assert rules[c.name] == (c.colour, "#fff" if c.dark else "#1b1b1f"), c.name
        key = keys[c.name]
        assert key.text == c.mark and key.parent.text == c.mark + c.label, c.name
        assert key.parent.attrs["title"] == c.meaning, c.name
        assert squares[c.name] == c.mark, c.name
        assert c.label in summary_head, c.name
    # Inputs in timelines are marked with the same categories' colours and labels.
    timeline_keys = [n for n in dom.find("span", "sq") if n.parent.parent.classes >= {"legend", "tl"}]
    for m, c in html.entry_categories().items():
        assert f".sq.m-{m}{{background:{c.colour};border-color:{c.colour}}}" in style
        assert any(n.classes == {"sq", f"m-{m}"} and n.parent.text == c.label for n in timeline_keys)
    marks = json.loads(re.search(r'<script type="application/json" id="marks">(.*?)</script>', page).group(1))
    assert {m: (v["name"], v["colour"]) for m, v in marks.items()} == {
        m: (c.name, c.colour) for m, c in html.entry_categories().items()}


def test_the_page_follows_the_table(monkeypatch):
    """No copy of the table in the report: a colour, label or mark changed there changes the page."""
    table = tuple(dataclasses.replace(c, colour="#123456", label="gone missing", mark="Q")
                  if c.name == categories.LOST else c for c in categories.TABLE)
    monkeypatch.setattr(categories, "TABLE", table)
    monkeypatch.setattr(categories, "BY_NAME", {c.name: c for c in table})
    page = html.render([lost_cell()])
    assert ".s-LOST{background:#123456;color:#fff}" in page
    assert '<span class="sw s-LOST">Q</span>gone missing</span>' in page
    assert re.search(r'<td class="s-LOST" title="[^"]*"><a href="#cell-0">Q</a></td>', page)
    assert ">gone missing</th>" in page
    assert ".sq.m-L{background:#123456;border-color:#123456}" in page  # inputs keep the verdict's mark L
    for name in ("LABELS", "COLOURS", "DARK", "classify", "status"):
        assert not hasattr(html, name)


# -- crash consistency -----------------------------------------------------------------------------------

def test_crash_consistency_cells_get_their_own_heatmap():
    cells = crash_matrix()
    page = html.render(cells)
    (k_kind, _, k_columns, k_rows, k_squares), (c_kind, c_title, c_columns, c_rows, c_squares) = heatmaps(page)
    assert (k_kind, c_kind) == ("kills", "crash")
    # Kill points only among kill-point columns; the faults of the save have a table of their own.
    assert k_columns == ["1", "2", "3", "4"] and k_rows == [["c", "auto"]]
    assert len(k_squares) == 4 and not any("save3" in title for _, title in k_squares)
    assert c_title.startswith("t crash consistency: 17 cells")
    assert c_columns == ["0", "1", "2", "3", "4", "5"]
    assert [row[-1] for row in c_rows] == ["kill", "power", "torn", "eio", "enospc", "enospc+"]
    assert {tuple(row[:2]) for row in c_rows} == {("c", "3")}
    assert len(c_squares) == 17
    assert sorted(s for s, _ in c_squares if s != "PASSED") == ["SILENT_IO_ERROR", "STALE_RESUME"]
    # The row of power faults has its failing square at op 2, linked to its entry.
    power = re.findall(r"<tr><th class=\"row\">c</th><th class=\"row\">3</th><th class=\"row\">power</th>(.*?)</tr>",
                       page)[0]
    assert re.findall(r"<td class=\"([^\"]+)\"", power) == ["s-PASSED", "none", "s-STALE_RESUME", "none", "none",
                                                            "s-PASSED"]
    assert re.search(r'<td class="s-STALE_RESUME" title="t\[c-auto-save3op2:power\]: STALE_RESUME: planted">'
                     r'<a href="#cell-\d+">S</a>', page)


def test_a_crash_cell_timeline_says_where_in_the_save_it_was_killed():
    stale = crash_cell(MODE_POWER, 2, passed=False, categories=["STALE_RESUME"], headline="STALE_RESUME: planted",
                       reference=ledger(4), composite=ledger(4), resumed_from=[1])
    t = html.timeline(stale)
    assert t["kills"] == [[0, 3, 3, "killed with power loss at file operation 2 of the save of step 3"]]


# -- timelines -----------------------------------------------------------------------------------------

def test_lost_inputs_are_marked_in_the_reference_lane():
    t = html.timeline(lost_cell())
    marked = [(i, m) for g in t["ref"] for i, m in zip(g[3], g[4]) if m != verdict.MARK_OK]
    assert marked == [(2, verdict.MARK_LOST), (3, verdict.MARK_LOST)]
    assert all(set(g[4]) == {verdict.MARK_OK} for g in t["res"])
    assert t["kills"] == [[0, 1, 1, KillSpec(1).describe()]] and t["resumed"] == [1]


def test_duplicated_inputs_are_marked_in_the_resumed_lane_at_their_second_occurrence():
    t = html.timeline(duplicated_cell())
    marked = [(g[0], i, m) for g in t["res"] for i, m in zip(g[3], g[4]) if m != verdict.MARK_OK]
    assert marked == [(2, 0, verdict.MARK_DUPLICATED), (2, 1, verdict.MARK_DUPLICATED)]
    assert [g[1] for g in t["res"]] == [0, 1, 1]  # the run each step of the resumed job came from


def test_timeline_draws_the_cells_marks_and_computes_them_only_when_absent():
    lost = lost_cell()
    planted = {"reference": "D" * len(lost["reference"]), "composite": "R" * len(lost["composite"])}
    t = html.timeline({**lost, "marks": planted})
    assert {m for g in t["ref"] for m in g[4]} == {"D"} and {m for g in t["res"] for m in g[4]} == {"R"}
    without = {k: v for k, v in lost.items() if k != "marks"}
    assert html.timeline(without) == html.timeline(lost)


def test_a_state_divergence_is_marked_at_its_step_with_its_headline():
    t = html.timeline(state_cell())
    colour = categories.BY_NAME[categories.STATE_DIVERGED].colour
    assert t["state"] == [3, colour, STATE_HEADLINE]
    assert html.timeline(lost_cell())["state"] is None
    assert t["lo"] <= 3 <= t["hi"]


def test_timeline_keeps_only_the_steps_around_the_failure():
    ref = ledger(500, take=2, n=100)
    comp = [r for r in ref if r[1] != 300] + [[999, 300, 5, 1]]
    t = html.timeline(cell(passed=False, categories=["LOST"], kill=KillSpec(299), reference=ref, composite=comp,
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
                    xfail_reason=f"known {PAYLOAD}", rerun=f"pytest {PAYLOAD}", story=f"run 1: {PAYLOAD}")
    bad["reference"][2][0] = PAYLOAD  # an id
    bad["reference"][3][0] = "a&b"
    page = html.render([bad], seed=1)
    assert PAYLOAD not in page
    assert "<img" not in page and "<b>" not in page
    assert "&lt;/script&gt;&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp; &lt;b&gt;" in page
    # Exactly the page's three script elements; the embedded JSON cannot close its element early.
    assert page.count("</script>") == 3
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


def test_a_multi_rank_timeline_has_a_lane_per_rank_of_each_ledger():
    t = html.timeline(two_rank_cell())
    assert [lane[0] for lane in t["lanes"]] == ["reference r0", "reference r1", "resumed r0", "resumed r1"]
    lanes = dict(t["lanes"])
    # Rank 1's own inputs 3 and 5 are lost; it took 2 and 4 (rank 0's) again.
    assert [(i, m) for g in lanes["reference r1"] for i, m in zip(g[3], g[4]) if m != verdict.MARK_OK] == \
        [(3, "L"), (5, "L")]
    assert [(i, m) for g in lanes["resumed r1"] for i, m in zip(g[3], g[4]) if m != verdict.MARK_OK] == \
        [(2, "D"), (4, "D")]
    assert [lane[0] for lane in html.timeline(lost_cell())["lanes"]] == ["reference", "resumed"]
