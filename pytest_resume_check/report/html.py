"""The HTML report of a resume matrix: one self-contained file built from the JSON form of the cells
(``report.cell_json``). Its style and script are package data (``assets/report.css``,
``assets/report.js``) inlined into the page when it is rendered, with the timelines as inline SVG;
nothing is fetched from the network.

It holds a summary table, a heatmap per target (cases x kill points, coloured by verdict) and, for a
target with crash-consistency cells, one more (fault kinds x file operations of the save), and for each
failing cell its headline, the story of its runs, the rerun command and a timeline picture: the inputs
of the reference and of the resumed job per step (of the ledger the cell's first finding about inputs is
about, named when it is not the plain consumed one), the kills, the checkpoints resumed from, and the
inputs that were lost, duplicated, reordered or relabelled, each with its id on hover.

Marks, colours, labels, the legend and the summary columns of every status and verdict category come
from :data:`pytest_resume_check.categories.TABLE`; the per-entry marks, story and kill points come with
each cell's JSON. The heatmaps and tables are plain HTML. Timelines are drawn by the page's script from
compact JSON, only when a failing cell is opened, and only the steps around what went wrong are kept,
so a matrix of thousands of cells gives a file of a few hundred kilobytes that opens instantly.
Standard library only::

    from pytest_resume_check import html
    html.write_report(cells, "report.html", seed=1234)
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_resume_check import categories
from pytest_resume_check.categories import Category
from pytest_resume_check.judge import verdict
from pytest_resume_check.records import faults, kill_ids
from pytest_resume_check.records.cell_json import CellJson
from pytest_resume_check.records.names import OPT_JSON, OPT_SEED
from pytest_resume_check.report import known_findings, summary
from pytest_resume_check.report import text as report

#: Failing cells that get a timeline (unexpected failures first); the rest are listed by headline.
MAX_TIMELINES = 200
#: Failing cells listed at all; beyond this the report points at --resume-matrix-json.
MAX_LISTED = 2000
#: The first failing cell of each target is open (and drawn) when the page loads, for this many targets;
#: the others are drawn when opened. A target's further failing cells fold into one line.
OPEN_FIRST = 3
#: Steps kept in one timeline, and steps of context kept around the first and last interesting step.
MAX_STEPS = 40
CONTEXT_STEPS = 2
#: Inputs drawn per step and lane; more are summarised as "+N".
MAX_PER_STEP = 24

#: Set on <body data-render=...> by the page's script: "ok" once it has run without an error, else
#: "error: <message>". A headless browser test reads it back.
RENDER_OK = "ok"
RENDER_ERROR = "error"
#: Open the page with this fragment to draw every timeline at once (used by the browser test).
RENDER_ALL_HASH = "#render-all"

TITLE = "Resume matrix report"
#: How a timeline names the runs whose inputs it draws (the ``run`` of a ledger row, from 0), and the rows of
#: the reference's rest after a resumed run stopped early: they complete the job's ledger but are no run of
#: the cell (a two-run cell drew ``run 3``).
RUN_LABEL = "run {number}"
REMAINDER_LABEL = "reference (after the early stop at step {step})"
REMAINDER_LABEL_NO_STEP = "reference (after the early stop)"
#: Above a failing cell's timeline when it draws another ledger than the plain consumed one.
TIMELINE_OF = "The timeline draws the {title}."


def entry_categories() -> dict[str, Category]:
    """The categories the marks of ``verdict.entry_marks`` stand for, by mark (the marks of inputs in
    a timeline)."""
    names = {verdict.MARK_LOST: categories.LOST, verdict.MARK_DUPLICATED: categories.DUPLICATED,
             verdict.MARK_REORDERED: categories.REORDERED, verdict.MARK_EPOCH: categories.EPOCH}
    return {mark: categories.BY_NAME[name] for mark, name in names.items()}


def write_report(results: Sequence[CellJson], path: str | os.PathLike[str], seed: int | None = None) -> Path:
    """Write the HTML report of ``results`` (cell JSON dicts, as from ``report.cell_json``, optionally
    with a ``rerun`` command) to ``path`` and return it as a ``Path``. Parent folders are created."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, seed=seed), encoding="utf-8")
    return out


def render(results: Sequence[CellJson], seed: int | None = None) -> str:
    """The whole HTML document as a string."""
    cells = sorted(results, key=summary.cell_name)
    # Unexpected failures first (those fail the build), then target by target in heatmap order.
    targets = {t: i for i, t in enumerate(dict.fromkeys(c["target"] for c in cells))}
    failing = sorted((c for c in cells if not c["passed"] or categories.fails(c)), key=lambda c: (
        not categories.fails(c), targets[c["target"]], summary.is_crash_cell(c), c["case_id"], c["resume_mode"],
        summary.cell_sort_key(c)))
    listed = failing[:MAX_LISTED]
    with_timeline = listed[:MAX_TIMELINES]
    anchors = {summary.cell_name(c): f"cell-{i}" for i, c in enumerate(listed)}
    marks = {m: {"name": c.name, "meaning": c.meaning, "colour": c.colour, "dark": c.dark}
             for m, c in entry_categories().items()}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(TITLE)}</title>",
        f"<style>{_css()}</style></head>",
        '<body data-render="pending">',
        _header(cells, failing, seed),
        _summary_table(cells),
        _heatmaps(cells, anchors),
        _failures(listed, len(failing), len(with_timeline), anchors, seed),
        f'<script type="application/json" id="marks">{_script_json(marks)}</script>',
        f'<script type="application/json" id="timelines">{_script_json([timeline(c) for c in with_timeline])}'
        "</script>",
        f"<script>{_asset('report.js')}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _css() -> str:
    """The page's style: ``assets/report.css`` and a colour rule per status and category of the table
    (``.s-NAME`` for heatmaps, legends and tags; ``.sq.m-MARK`` for the timeline legend)."""
    rules = [f".s-{c.name}{{background:{c.colour};color:{'#fff' if c.dark else '#1b1b1f'}}}"
             for c in categories.TABLE]
    rules += [f".sq.m-{m}{{background:{c.colour};border-color:{c.colour}}}" for m, c in entry_categories().items()]
    rules.append(f".line.state{{background:{categories.BY_NAME[categories.STATE_DIVERGED].colour}}}")
    return _asset("report.css") + "\n".join(rules) + "\n"


def _asset(name: str) -> str:
    """A file of the package's ``assets`` folder (package data, also in a wheel or zip install)."""
    text = (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"assets/{name} would end its inline element early")
    return text


# -- cells -------------------------------------------------------------------------------------------

def _rerun(cell: CellJson, seed: int | None) -> str:
    return str(cell.get("rerun") or report.rerun_command(summary.cell_name(cell), seed))


# -- timelines: the data the page's script draws ------------------------------------------------------

def timeline(cell: CellJson) -> dict[str, Any]:
    """The compact picture data of one failing cell.

    ``ref``/``res``: groups ``[step, run, epoch, ids, marks, hidden]`` of the reference and resumed
    (composite) ledgers, one per (step, run, epoch) in ledger order, restricted to the shown steps;
    ``lanes``: ``[label, groups]`` per lane drawn, in a multi-rank cell one per rank of each ledger
    (``reference r0``, ``reference r1``, ``resumed r0``, ...; rows carry the rank as a fifth item);
    ``kills``: ``[run, checkpoint step, kill step, description]``; ``resumed``: the step each later run
    restored; ``lo``/``hi``: the shown steps; ``last``: the last step of the reference; ``ran``: each
    run's outcome; ``labels``: the name of each ``run`` a row can carry (:func:`run_labels`); ``ledger``:
    which ledger the rows are (None for a cell JSON that does not say) and ``others``: the other ledgers
    the cell's findings are about (:func:`ledgers_shown`).
    """
    reference = [list(r) for r in cell.get("reference") or []]
    composite = [list(r) for r in cell.get("composite") or []]
    ref_marks, comp_marks = _entry_marks(cell, reference, composite)
    ledger, others = ledgers_shown(cell)
    kill_points = summary.kills_of(cell)
    kills = [[run, k.checkpoint_step, k.kill_step, k.describe()] for run, k in enumerate(kill_points)]
    resumed = [int(s) for s in cell.get("resumed_from") or []]
    last = max((int(r[1]) for r in reference + composite), default=0)
    interesting = [int(r[1]) for r, m in zip(reference, ref_marks) if m != verdict.MARK_OK]
    interesting += [int(r[1]) for r, m in zip(composite, comp_marks) if m != verdict.MARK_OK]
    interesting += [s + 1 for s in resumed] + [k.kill_step for k in kill_points]
    state = cell.get("state_diverged")
    if state:
        interesting.append(int(state))
    interesting = [s for s in interesting if s >= 1] or ([1] if last else [])
    lo = max(1, min(interesting, default=1) - CONTEXT_STEPS)
    hi = min(max(last, max(interesting, default=1)), max(interesting, default=1) + CONTEXT_STEPS)
    hi = min(hi, lo + MAX_STEPS - 1)
    ref, res = _groups(reference, ref_marks, lo, hi), _groups(composite, comp_marks, lo, hi)
    return {
        "cell": summary.cell_name(cell),
        "ref": ref,
        "res": res,
        "lanes": _rank_lanes(reference, ref_marks, composite, comp_marks, lo, hi) or [["reference", ref],
                                                                                      ["resumed", res]],
        "kills": kills,
        "resumed": resumed,
        "lo": lo,
        "hi": hi,
        "last": last,
        "ran": [str(r.get("outcome", "")) for r in cell.get("runs") or []],
        "labels": run_labels(cell, composite),
        "state": _state_line(cell),
        "ledger": ledger,
        "others": others,
    }


def ledgers_shown(cell: CellJson) -> tuple[str | None, list[str]]:
    """The ledger a cell's ``reference`` and ``composite`` are (None in a cell JSON of format 1, which does not
    say), and the other ledgers its findings are about, in their order."""
    ledger = cell.get("ledger")
    about = (f.get("ledger") for f in cell.get("findings") or [] if isinstance(f, Mapping))
    others = [str(kind) for kind in dict.fromkeys(about) if kind and kind != ledger]
    return (str(ledger) if ledger else None), others


def run_labels(cell: CellJson, composite: Sequence[Sequence[Any]]) -> list[str]:
    """The name of each ``run`` index the rows of ``composite`` carry: ``run 1``, ``run 2``, ...; rows past the
    cell's runs are the reference's rest after a resumed run stopped early (:data:`REMAINDER_LABEL`)."""
    runs = cell.get("runs") or []
    labels = [RUN_LABEL.format(number=i + 1) for i in range(len(runs))]
    beyond = [row for row in composite if int(row[3]) >= len(runs)]
    if beyond:
        stop = next((r.get("converged_step") for r in runs if r.get("converged_step") is not None), None)
        if stop is None and runs and runs[-1].get("outcome") == "converged":  # a JSON file from before the field
            stop = min(int(row[1]) for row in beyond) - 1
        label = REMAINDER_LABEL.format(step=stop) if stop is not None else REMAINDER_LABEL_NO_STEP
        labels += [label] * (max(int(row[3]) for row in beyond) + 1 - len(labels))
    return labels


def _state_line(cell: CellJson) -> list[Any] | None:
    """``[step, colour, text]`` of the step where the training state first differs, if it does."""
    step = cell.get("state_diverged")
    if not step:
        return None
    name = categories.STATE_DIVERGED
    text = next((str(f.get("headline")) for f in cell.get("findings") or []
                 if isinstance(f, Mapping) and f.get("category") == name), name)
    return [int(step), categories.BY_NAME[name].colour, text]


def _entry_marks(cell: CellJson, reference: list[list[Any]], composite: list[list[Any]]) -> tuple[str, str]:
    """The cell's ``marks`` when it carries them for these ledgers, else computed as the verdict does."""
    marks = cell.get("marks") or {}
    ref, comp = marks.get("reference"), marks.get("composite")
    if isinstance(ref, str) and isinstance(comp, str) and (len(ref), len(comp)) == (len(reference), len(composite)):
        return ref, comp
    return verdict.entry_marks(reference, composite)


def _rank_lanes(reference: list[list[Any]], ref_marks: str, composite: list[list[Any]], comp_marks: str, lo: int,
                hi: int) -> list[list[Any]]:
    """The lanes of a multi-rank picture: reference and resumed, one per rank (empty when the rows carry no
    rank: one lane per ledger then)."""
    ranks = sorted({int(r[4]) for r in reference + composite if len(r) > 4})
    lanes: list[list[Any]] = []
    for name, rows, marks in (("reference", reference, ref_marks), ("resumed", composite, comp_marks)):
        for rank in ranks:
            keep = [i for i, r in enumerate(rows) if len(r) > 4 and int(r[4]) == rank]
            lanes.append([f"{name} r{rank}", _groups([rows[i] for i in keep], "".join(marks[i] for i in keep), lo, hi)])
    return lanes


def _groups(rows: list[list[Any]], marks: str, lo: int, hi: int) -> list[list[Any]]:
    groups: list[list[Any]] = []
    drawn: Counter = Counter()  # inputs drawn per step, over all groups of the step
    for row, mark in zip(rows, marks):
        ident, step, epoch, run = row[0], int(row[1]), int(row[2]), int(row[3])
        if not lo <= step <= hi:
            continue
        if not groups or groups[-1][:3] != [step, run, epoch]:
            groups.append([step, run, epoch, [], "", 0])
        group = groups[-1]
        if drawn[step] < MAX_PER_STEP:
            drawn[step] += 1
            group[3].append(ident if isinstance(ident, (int, str)) else str(ident))
            group[4] += mark
        else:
            group[5] += 1
    return groups


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` survives literally."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# -- HTML parts ---------------------------------------------------------------------------------------

def _header(cells: Sequence[CellJson], failing: Sequence[CellJson], seed: int | None) -> str:
    unexpected = sum(1 for c in failing if categories.fails(c))  # an XPASS fails, as pytest counts it
    fixed = sum(1 for c in cells if categories.status(c) == categories.XPASS)
    expected = sum(1 for c in cells if categories.status(c) == categories.XFAIL)
    facts = [f"{len(cells)} cells", f"{unexpected} failing", f"{expected} expected failures"]
    if fixed:
        facts.append(f"of the failing, {fixed} {categories.BY_NAME[categories.XPASS].label}")
    if seed is not None:
        facts.append(f"seed {seed} (rerun with {OPT_SEED}={seed})")
    verdict_text = "FAILED" if unexpected else "PASSED"
    return (f'<header><h1>{escape(TITLE)} <span class="verdict v-{verdict_text}">{verdict_text}</span></h1>'
            f'<p class="meta">{escape(" · ".join(facts))}</p>'
            '<nav><a href="#summary">Summary</a> <a href="#heatmaps">Heatmaps</a> '
            '<a href="#failures">Failing cells</a></nav></header>')


def _summary_table(cells: Sequence[CellJson]) -> str:
    """Per target: cells, failing cells, then a column per status and category of the table that occurs
    (statuses count cells, categories count the unexpected failures that have them)."""
    per_target: dict[str, Counter] = {}
    for c in cells:
        counts = per_target.setdefault(c["target"], Counter())
        st = categories.status(c)
        counts["cells"] += 1
        if st in categories.STATUSES:
            counts[st] += 1
        else:
            counts["failing"] += 1
            counts.update(set(c.get("categories") or [st]))
    totals = sum(per_target.values(), Counter())
    columns = [c for c in categories.TABLE if c.name == categories.PASSED or totals[c.name]]
    rows = [_summary_row(escape(t), counts, columns) for t, counts in per_target.items()]
    if len(rows) > 1:
        rows.append(_summary_row("<b>all</b>", totals, columns))
    head = "".join(f'<th title="{escape(c.meaning)}">{escape(c.label)}</th>' for c in columns)
    return ('<section id="summary"><h2>Summary</h2><div class="scroll"><table class="summary"><thead><tr>'
            f"<th>target</th><th>cells</th><th>failing</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"
            '</table></div><p class="note">Status columns count cells; category columns count the unexpected '
            "failures, and a cell can fail with more than one category.</p></section>")


def _summary_row(name: str, counts: Counter, columns: Sequence[Category]) -> str:
    def num(n: int, cls: str) -> str:
        return f'<td class="n {cls}">{n}</td>' if n else '<td class="n"></td>'

    tds = "".join(num(counts[c.name], f"s-{c.name}") for c in columns)
    return f"<tr><th>{name}</th><td class=\"n\">{counts['cells']}</td>{num(counts['failing'], 'bad')}{tds}</tr>"


def _legend() -> str:
    items = "".join(f'<span class="key" title="{escape(c.meaning)}"><span class="sw s-{c.name}">{escape(c.mark)}'
                    f"</span>{escape(c.label)}</span>" for c in categories.TABLE)
    return f'<p class="legend">{items}</p>'


def _heatmaps(cells: Sequence[CellJson], anchors: Mapping[str, str]) -> str:
    out = ['<section id="heatmaps"><h2>Heatmaps</h2>',
           "<p class=\"note\">One row per case and resume mode, one column per kill point: <code>3</code> "
           "killed right after the checkpoint of step 3, <code>3+1</code> one unsaved step later, "
           "<code>1,7+1</code> killed twice. Crash-consistency cells have a heatmap of their own: one row per "
           "fault (kill, power loss, torn file, I/O error) and one column per file operation of the save. "
           "Hover a cell for its verdict; click a failing one for its timeline.</p>", _legend(), '<div class="hms">']
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in cells if c["target"] == target]
        plain = [c for c in mine if not summary.is_crash_cell(c)]
        crash = [c for c in mine if summary.is_crash_cell(c)]
        if plain:
            out.append(_kill_heatmap(target, plain, anchors))
        if crash:
            out.append(_crash_heatmap(target, crash, anchors))
    out.append("</div></section>")
    return "\n".join(out)


def _kill_heatmap(target: str, cells: Sequence[CellJson], anchors: Mapping[str, str]) -> str:
    """Cases and resume modes x kill points; the cells of a distributed kind (``rank1``, ``term2``, ``ws1``)
    get rows of their own, as in the terminal grid."""
    columns = list(dict.fromkeys(summary.column(c) for c in sorted(cells, key=summary.cell_sort_key)))
    kinds = any(summary.kind_of(c) for c in cells)
    rows: dict[tuple[str, ...], dict[Any, CellJson]] = {}
    for c in sorted(cells, key=lambda c: bool(summary.kind_of(c))):
        row = (c["case_id"], c["resume_mode"]) + ((summary.kind_of(c),) if kinds else ())
        rows.setdefault(row, {})[summary.column(c)] = c
    title = f'{escape(target)} <span class="meta">{len(cells)} cells</span>'
    heads = ("case", "resume") + (("kind",) if kinds else ())
    return _heat_table("kills", title, heads, rows, [(k, k) for k in columns], anchors)


def _crash_heatmap(target: str, cells: Sequence[CellJson], anchors: Mapping[str, str]) -> str:
    """Crash-consistency cells: (case, saved step, fault kind) x file operation of the save."""
    fault = summary.fault_of

    def row_order(c: CellJson) -> tuple[Any, ...]:  # kills, then power loss and torn files, then errors
        f = fault(c)
        return (c["case_id"], f.step, f.mode == faults.MODE_ERROR, f.mode != faults.MODE_CRASH, kill_ids.fault_kind(f))

    rows: dict[tuple[str, ...], dict[Any, CellJson]] = {}
    for c in sorted(cells, key=row_order):
        rows.setdefault((c["case_id"], str(fault(c).step), summary.crash_row(c)), {})[fault(c).op] = c
    ops = sorted({fault(c).op for c in cells}, key=lambda op: -1 if op is None else op)
    title = (f'{escape(target)} <span class="meta">crash consistency: {len(cells)} cells, columns are file '
             "operations of the save</span>")
    return _heat_table("crash", title, ("case", "save", "fault"), rows, [(op, str(op)) for op in ops], anchors)


def _heat_table(kind: str, title: str, row_heads: Sequence[str], rows: Mapping[tuple[str, ...], Mapping[Any, Any]],
                columns: Sequence[tuple[Any, str]], anchors: Mapping[str, str]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in row_heads)
    head += "".join(f'<th class="k"><span>{escape(label)}</span></th>' for _, label in columns)
    body = []
    for row, by_column in rows.items():
        ths = "".join(f'<th class="row">{escape(v)}</th>' for v in row)
        tds = "".join(_heat_cell(by_column[k], anchors) if k in by_column else '<td class="none"></td>'
                      for k, _ in columns)
        body.append(f"<tr>{ths}{tds}</tr>")
    return (f'<div class="hm" data-kind="{kind}"><h3>{title}</h3><div class="scroll"><table class="heat">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div></div>")


def _heat_cell(cell: CellJson, anchors: Mapping[str, str]) -> str:
    st = categories.status(cell)
    name = summary.cell_name(cell)
    text = name + ": " + ("passed" if st == categories.PASSED else categories.headline(cell))
    if cell.get("xfail_reason"):
        text += f" (expected: {cell['xfail_reason']})"
    mark = escape(categories.mark(st))
    anchor = anchors.get(name)
    inner = f'<a href="#{anchor}">{mark}</a>' if anchor else mark
    return f'<td class="s-{escape(st)}" title="{escape(text)}">{inner}</td>'


def _failures(listed: Sequence[CellJson], total: int, drawn: int, anchors: Mapping[str, str],
              seed: int | None) -> str:
    out = ['<section id="failures"><h2>Failing cells</h2>']
    if not listed:
        out.append('<p class="note">No cell failed.</p></section>')
        return "\n".join(out)
    out.append('<p class="tools"><input id="filter" type="search" placeholder="filter by name or headline" '
               'aria-label="filter failing cells"> <button id="open-all" type="button">draw all</button></p>')
    out.append(_timeline_legend())
    # Drawn cells, grouped by target (unexpected failures, then expected ones): the first cell of a
    # group is shown, the rest fold into one line, so a target with hundreds of failures stays short.
    groups: dict[tuple[bool, str], list[int]] = {}
    for i in range(min(drawn, len(listed))):
        groups.setdefault((bool(listed[i].get("xfail_reason")), listed[i]["target"]), []).append(i)
    for g, ((expected, target), indices) in enumerate(groups.items()):
        kind = "expected failure" if expected else "failing cell"
        out.append(f'<div class="group"><h3>{escape(target)} <span class="meta">{len(indices)} {kind}'
                   f'{"s" if len(indices) != 1 else ""}</span></h3>')
        items = [_failure(listed[i], anchors[summary.cell_name(listed[i])], i,
                          g < OPEN_FIRST and i == indices[0], seed) for i in indices]
        out.append(items[0])
        if len(items) > 1:
            out.append(f'<details class="more"><summary>{len(items) - 1} more {kind}s of {escape(target)}'
                       f"</summary>{''.join(items[1:])}</details>")
        out.append("</div>")
    rest = []
    for cell in listed[drawn:]:
        name = summary.cell_name(cell)
        rest.append(f'<tr id="{anchors[name]}"><td><code>{escape(name)}</code></td>'
                    f"<td>{escape(categories.headline(cell))}{_known(cell)}</td>"
                    f"<td><code>{escape(_rerun(cell, seed))}</code></td></tr>")
    if rest:
        out.append(f"<h3>{len(rest)} more failing cells (no timeline)</h3><div class=\"scroll\"><table "
                   f"class=\"rest\"><thead><tr><th>cell</th><th>headline</th><th>rerun</th></tr></thead><tbody>"
                   f"{''.join(rest)}</tbody></table></div>")
    if total > len(listed):
        out.append(f'<p class="note">{total - len(listed)} further failing cells are not listed; '
                   f"<code>{OPT_JSON}</code> has them all.</p>")
    out.append("</section>")
    return "\n".join(out)


def _failure(cell: CellJson, anchor: str, index: int, is_open: bool, seed: int | None) -> str:
    name = summary.cell_name(cell)
    st = categories.status(cell)
    cats = "".join(_tag(k) for k in cell.get("categories") or [])
    expected = ""
    if cell.get("xfail_reason"):
        expected = f'<p class="expected">expected failure: {escape(str(cell["xfail_reason"]))}</p>'
    story = f'<p class="runs">{escape(str(cell["story"]))}</p>' if cell.get("story") else ""
    title = report.evidence_title(*ledgers_shown(cell))
    shown = f'<p class="note ledger">{escape(TIMELINE_OF.format(title=title))}</p>' if title else ""
    search = escape(f"{name} {categories.headline(cell)}".lower())
    return (f'<details class="failure" id="{anchor}" data-t="{index}" data-search="{search}"'
            f'{" open" if is_open else ""}><summary><span class="sw s-{escape(st)}">'
            f"{escape(categories.mark(st))}</span> <code>{escape(name)}</code> {cats}"
            f'<span class="headline">{escape(categories.headline(cell))}</span>{_known(cell)}</summary>'
            f'<div class="body">{expected}{story}'
            f'<p class="rerun">rerun: <code>{escape(_rerun(cell, seed))}</code></p>{shown}'
            f'<div class="timeline" data-t="{index}"><p class="note">opening this cell draws its timeline '
            "(needs JavaScript)</p></div></div></details>")


def _known(cell: CellJson) -> str:
    """The line under the headline of a cell whose failure is a framework's known bug (docs/findings.md)."""
    known = cell.get("known_finding")
    return f'<span class="known">{escape(known_findings.line(known))}</span>' if isinstance(known, Mapping) else ""


def _tag(name: str) -> str:
    meaning = categories.BY_NAME[name].meaning if name in categories.BY_NAME else ""
    return f'<span class="tag s-{escape(name)}" title="{escape(meaning)}">{escape(name)}</span>'


def _timeline_legend() -> str:
    marks = "".join(f'<span class="key" title="{escape(c.meaning)}"><span class="sq m-{m}"></span>'
                    f"{escape(c.label)}</span>" for m, c in entry_categories().items())
    return ('<p class="legend tl">Timelines: one column per step, inputs top to bottom in the order taken. '
            '<span class="key"><span class="sq e0"></span><span class="sq e1"></span>input (epoch 0, 1 ...)</span>'
            f'{marks}<span class="key"><span class="line kill"></span>kill</span>'
            '<span class="key"><span class="line resume"></span>checkpoint resumed from</span>'
            '<span class="key"><span class="band"></span>steps redone after a kill</span>'
            '<span class="key"><span class="line state"></span>training state first differs</span>'
            " Hover an input for its id.</p>")
