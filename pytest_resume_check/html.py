"""The HTML report of a resume matrix: one self-contained file (inline CSS, JavaScript and SVG; nothing
is fetched from the network) built from the JSON form of the cells (``report.cell_json``).

It holds a summary table, a heatmap per target (cases x kill points, coloured by verdict), and for each
failing cell its headline, the story of its runs, the rerun command and a timeline picture: the inputs
of the reference and of the resumed job per step, the kills, the checkpoints resumed from, and the
inputs that were lost, duplicated, reordered or relabelled, each with its id on hover.

The heatmaps and tables are plain HTML. Timelines are drawn by the page's script from compact JSON,
only when a failing cell is opened, and only the steps around what went wrong are kept, so a matrix of
thousands of cells gives a file of a few hundred kilobytes that opens instantly. Standard library only::

    from pytest_resume_check import html
    html.write_report(cells, "report.html", seed=1234)
"""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from pytest_resume_check import summary
from pytest_resume_check.matrix import parse_kill_id

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

#: Marks of one ledger entry in a timeline.
OK, LOST, DUPLICATED, REORDERED, EPOCH = ".", "L", "D", "R", "E"

#: Verdict statuses of a cell (its first category, or one of these) and how the page shows them.
STATUS_PASSED, STATUS_XFAIL, STATUS_XPASS = "PASSED", "XFAIL", "XPASS"
LABELS = {
    "PASSED": "pass",
    "XFAIL": "expected failure",
    "XPASS": "fixed (xfail passed)",
    "LOST": "lost",
    "DUPLICATED": "duplicated",
    "REORDERED": "reordered",
    "EPOCH": "epoch",
    "RESUME_ERROR": "resume error",
    "CRASHED": "crashed",
    "HUNG": "hung",
    "NONDETERMINISTIC": "nondeterministic",
    "PROTOCOL": "protocol",
}
COLOURS = {
    "PASSED": "#cfe9cf",
    "XFAIL": "#c9c9d6",
    "XPASS": "#ffd54f",
    "LOST": "#d62728",
    "DUPLICATED": "#ff7f0e",
    "REORDERED": "#9467bd",
    "EPOCH": "#b5a800",
    "RESUME_ERROR": "#8c564b",
    "CRASHED": "#333333",
    "HUNG": "#17becf",
    "NONDETERMINISTIC": "#e377c2",
    "PROTOCOL": "#7f7f7f",
}
#: Statuses drawn with white text on their colour.
DARK = {"LOST", "REORDERED", "RESUME_ERROR", "CRASHED", "PROTOCOL"}

#: Set on <body data-render=...> by the page's script: "ok" once it has run without an error, else
#: "error: <message>". A headless browser test reads it back.
RENDER_OK = "ok"
RENDER_ERROR = "error"
#: Open the page with this fragment to draw every timeline at once (used by the browser test).
RENDER_ALL_HASH = "#render-all"

TITLE = "Resume matrix report"


def status(cell: Mapping[str, Any]) -> str:
    """``PASSED``, ``XFAIL``, ``XPASS`` or the cell's first failing category."""
    if cell.get("xfail_reason"):
        return STATUS_XPASS if cell["passed"] else STATUS_XFAIL
    if cell["passed"]:
        return STATUS_PASSED
    return cell["categories"][0] if cell.get("categories") else "PROTOCOL"


def write_report(results: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], seed: int | None = None) -> Path:
    """Write the HTML report of ``results`` (cell JSON dicts, as from ``report.cell_json``, optionally
    with a ``rerun`` command) to ``path`` and return it as a ``Path``. Parent folders are created."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, seed=seed), encoding="utf-8")
    return out


def render(results: Sequence[Mapping[str, Any]], seed: int | None = None) -> str:
    """The whole HTML document as a string."""
    cells = sorted(results, key=summary.cell_name)
    # Unexpected failures first (those fail the build), then target by target in heatmap order.
    targets = list(dict.fromkeys(c["target"] for c in cells))
    failing = sorted((c for c in cells if not c["passed"]), key=lambda c: (
        bool(c.get("xfail_reason")), targets.index(c["target"]), c["case_id"], c["resume_mode"], _kill_key(c["kill"])))
    listed = failing[:MAX_LISTED]
    with_timeline = listed[:MAX_TIMELINES]
    anchors = {summary.cell_name(c): f"cell-{i}" for i, c in enumerate(listed)}
    timelines = [timeline(c) for c in with_timeline]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(TITLE)}</title>",
        f"<style>{_CSS}</style></head>",
        '<body data-render="pending">',
        _header(cells, failing, seed),
        _summary_table(cells),
        _heatmaps(cells, anchors),
        _failures(listed, len(failing), len(with_timeline), anchors, seed),
        f'<script type="application/json" id="timelines">{_script_json(timelines)}</script>',
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


# -- timelines: the data the page's script draws ------------------------------------------------------

def classify(reference: Sequence[Sequence[Any]], composite: Sequence[Sequence[Any]]) -> tuple[str, str]:
    """Marks for each entry of both ledgers (rows ``[id, step, epoch, run]``), one character each.

    Entries are matched by (id, epoch) as the verdict does. A reference entry without a match is
    ``LOST``; a composite entry beyond the reference's count is ``DUPLICATED``; unmatched pairs that
    agree on the id differ only in their epoch label (``EPOCH``). When nothing is missing or extra,
    composite entries that stand where the reference has another input are ``REORDERED``.
    """
    ref_keys = [(_key(r[0]), r[2]) for r in reference]
    comp_keys = [(_key(r[0]), r[2]) for r in composite]
    ref_missing = _beyond(ref_keys, Counter(comp_keys))
    comp_extra = _beyond(comp_keys, Counter(ref_keys))
    relabel = (Counter(k[0] for k, m in zip(ref_keys, ref_missing) if m)
               & Counter(k[0] for k, x in zip(comp_keys, comp_extra) if x))
    ref_marks = _mark(ref_keys, ref_missing, Counter(relabel), LOST)
    comp_marks = _mark(comp_keys, comp_extra, Counter(relabel), DUPLICATED)
    if ref_marks.strip(OK) or comp_marks.strip(OK):
        return ref_marks, comp_marks
    order = "".join(REORDERED if i >= len(ref_keys) or k != ref_keys[i] else OK for i, k in enumerate(comp_keys))
    return ref_marks, order


def _key(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _beyond(keys: list[tuple[Any, Any]], available: Counter) -> list[bool]:
    """For each key in order: is this occurrence beyond what ``available`` holds of it?"""
    seen: Counter = Counter()
    out = []
    for k in keys:
        seen[k] += 1
        out.append(seen[k] > available[k])
    return out


def _mark(keys: list[tuple[Any, Any]], flagged: list[bool], relabel: Counter, mark: str) -> str:
    out = []
    for (ident, _), flag in zip(keys, flagged):
        if not flag:
            out.append(OK)
        elif relabel[ident] > 0:
            relabel[ident] -= 1
            out.append(EPOCH)
        else:
            out.append(mark)
    return "".join(out)


def timeline(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The compact picture data of one failing cell.

    ``ref``/``res``: groups ``[step, run, epoch, ids, marks, hidden]`` of the reference and resumed
    (composite) ledgers, one per (step, run, epoch) in ledger order, restricted to the shown steps;
    ``kills``: ``[run, checkpoint step, kill step]``; ``resumed``: the step each later run restored;
    ``lo``/``hi``: the shown steps; ``last``: the last step of the reference; ``ran``: each run's outcome.
    """
    reference = [list(r) for r in cell.get("reference") or []]
    composite = [list(r) for r in cell.get("composite") or []]
    ref_marks, comp_marks = classify(reference, composite)
    kills = _kills(cell.get("kill", ""))
    resumed = [int(s) for s in cell.get("resumed_from") or []]
    steps = [int(r[1]) for r in reference + composite]
    last = max(steps, default=0)
    interesting = [int(r[1]) for r, m in zip(reference, ref_marks) if m != OK]
    interesting += [int(r[1]) for r, m in zip(composite, comp_marks) if m != OK]
    interesting += [s + 1 for s in resumed] + [k[2] for k in kills]
    interesting = [s for s in interesting if s >= 1] or ([1] if last else [])
    lo = max(1, min(interesting, default=1) - CONTEXT_STEPS)
    hi = min(max(last, max(interesting, default=1)), max(interesting, default=1) + CONTEXT_STEPS)
    hi = min(hi, lo + MAX_STEPS - 1)
    return {
        "cell": summary.cell_name(cell),
        "ref": _groups(reference, ref_marks, lo, hi),
        "res": _groups(composite, comp_marks, lo, hi),
        "kills": kills,
        "resumed": resumed,
        "lo": lo,
        "hi": hi,
        "last": last,
        "ran": [str(r.get("outcome", "")) for r in cell.get("runs") or []],
    }


def _kills(kill_id: str) -> list[list[int]]:
    try:
        specs = parse_kill_id(kill_id)
    except (ValueError, AttributeError):
        return []
    return [[run, k.checkpoint_step, k.kill_step] for run, k in enumerate(specs)]


def _groups(rows: list[list[Any]], marks: str, lo: int, hi: int) -> list[list[Any]]:
    groups: list[list[Any]] = []
    drawn: Counter = Counter()  # inputs drawn per step, over all groups of the step
    for (ident, step, epoch, run), mark in zip(rows, marks):
        step, epoch, run = int(step), int(epoch), int(run)
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

def _header(cells: Sequence[Mapping[str, Any]], failing: Sequence[Mapping[str, Any]], seed: int | None) -> str:
    unexpected = sum(1 for c in failing if not c.get("xfail_reason"))
    fixed = sum(1 for c in cells if status(c) == STATUS_XPASS)
    facts = [f"{len(cells)} cells", f"{unexpected} failing", f"{len(failing) - unexpected} expected failures"]
    if fixed:
        facts.append(f"{fixed} fixed (xfail passed)")
    if seed is not None:
        facts.append(f"seed {seed} (rerun with --resume-matrix-seed={seed})")
    verdict = "FAILED" if unexpected or fixed else "PASSED"
    return (f'<header><h1>{escape(TITLE)} <span class="verdict v-{verdict}">{verdict}</span></h1>'
            f'<p class="meta">{escape(" · ".join(facts))}</p>'
            '<nav><a href="#summary">Summary</a> <a href="#heatmaps">Heatmaps</a> '
            '<a href="#failures">Failing cells</a></nav></header>')


def _summary_table(cells: Sequence[Mapping[str, Any]]) -> str:
    # Only the categories that occur: a passing matrix gets a narrow table.
    seen = {k for c in cells if not c["passed"] and not c.get("xfail_reason") for k in c.get("categories") or []}
    categories = [k for k in LABELS if k in seen]
    rows = []
    totals: Counter = Counter()
    for target in dict.fromkeys(c["target"] for c in cells):
        counts: Counter = Counter()
        for c in cells:
            if c["target"] != target:
                continue
            counts["cells"] += 1
            counts[status(c)] += 1
            if not c["passed"] and not c.get("xfail_reason"):
                counts["failing"] += 1
                counts.update(f"cat:{k}" for k in c.get("categories") or [])
        totals.update(counts)
        rows.append(_summary_row(escape(target), counts, categories))
    if len(rows) > 1:
        rows.append(_summary_row("<b>all</b>", totals, categories))
    head = "".join(f"<th>{escape(LABELS[k])}</th>" for k in categories)
    return ('<section id="summary"><h2>Summary</h2><div class="scroll"><table class="summary"><thead><tr>'
            "<th>target</th><th>cells</th><th>pass</th><th>failing</th><th>expected failures</th>"
            f"<th>fixed</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            "<p class=\"note\">Category columns count the unexpected failures; a cell can fail with more than "
            "one category.</p></section>")


def _summary_row(name: str, counts: Counter, categories: list[str]) -> str:
    def num(key: str, status_class: str = "") -> str:
        n = counts.get(key, 0)
        cls = f' class="n s-{status_class}"' if n and status_class else ' class="n"'
        return f"<td{cls}>{n or ''}</td>"

    cats = "".join(num(f"cat:{k}", k) for k in categories)
    return (f"<tr><th>{name}</th><td class=\"n\">{counts.get('cells', 0)}</td>{num(STATUS_PASSED)}"
            f"{num('failing', 'LOST')}{num(STATUS_XFAIL, STATUS_XFAIL)}{num(STATUS_XPASS, STATUS_XPASS)}{cats}</tr>")


def _legend() -> str:
    items = "".join(f'<span class="key"><span class="sw s-{k}">{escape(summary.MARKS[k])}</span>'
                    f"{escape(label)}</span>" for k, label in LABELS.items())
    return f'<p class="legend">{items}</p>'


def _kill_key(kill: str) -> tuple[Any, ...]:
    try:
        return (0, *summary.kill_sort_key(kill))
    except ValueError:
        return (1, 0, 0, 0, kill)


def _heatmaps(cells: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    out = ['<section id="heatmaps"><h2>Heatmaps</h2>',
           "<p class=\"note\">One row per case and resume mode, one column per kill point: <code>3</code> "
           "killed right after the checkpoint of step 3, <code>3+1</code> one unsaved step later, "
           "<code>1,7+1</code> killed twice. Hover a cell for its verdict; click a failing one for its "
           "timeline.</p>", _legend(), '<div class="hms">']
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in cells if c["target"] == target]
        kills = sorted({c["kill"] for c in mine}, key=_kill_key)
        rows = list(dict.fromkeys((c["case_id"], c["resume_mode"]) for c in mine))
        by_key = {(c["case_id"], c["resume_mode"], c["kill"]): c for c in mine}
        head = "".join(f'<th class="k"><span>{escape(k.replace("ckpt", ""))}</span></th>' for k in kills)
        body = []
        for case, mode in rows:
            tds = []
            for k in kills:
                cell = by_key.get((case, mode, k))
                tds.append(_heat_cell(cell, anchors) if cell else '<td class="none"></td>')
            body.append(f'<tr><th class="row">{escape(case)}</th><th class="row mode">{escape(mode)}</th>'
                        f"{''.join(tds)}</tr>")
        out.append(f'<div class="hm"><h3>{escape(target)} <span class="meta">{len(mine)} cells</span></h3>'
                   f'<div class="scroll"><table class="heat"><thead><tr><th>case</th><th>resume</th>{head}'
                   f"</tr></thead><tbody>{''.join(body)}</tbody></table></div></div>")
    out.append("</div></section>")
    return "\n".join(out)


def _heat_cell(cell: Mapping[str, Any], anchors: Mapping[str, str]) -> str:
    st = status(cell)
    name = summary.cell_name(cell)
    text = name + ": " + ("passed" if st == STATUS_PASSED else cell.get("headline", ""))
    if st == STATUS_XFAIL:
        text += f" (expected: {cell['xfail_reason']})"
    mark = escape(summary.MARKS.get(st, "?"))
    anchor = anchors.get(name)
    inner = f'<a href="#{anchor}">{mark}</a>' if anchor else mark
    return f'<td class="s-{escape(st)}" title="{escape(text)}">{inner}</td>'


def _failures(listed: Sequence[Mapping[str, Any]], total: int, drawn: int, anchors: Mapping[str, str],
              seed: int | None) -> str:
    out = ['<section id="failures"><h2>Failing cells</h2>']
    if not listed:
        out.append('<p class="note">No cell failed.</p></section>')
        return "\n".join(out)
    out.append('<p class="tools"><input id="filter" type="search" placeholder="filter by name or headline" '
               'aria-label="filter failing cells"> <button id="open-all" type="button">draw all</button></p>')
    out.append(_TIMELINE_LEGEND)
    # Drawn cells, grouped by target (unexpected failures, then expected ones): the first cell of a
    # group is shown, the rest fold into one line, so a target with hundreds of failures stays short.
    groups: dict[tuple[bool, str], list[int]] = {}
    for i in range(min(drawn, len(listed))):
        groups.setdefault((bool(listed[i].get("xfail_reason")), listed[i]["target"]), []).append(i)
    for g, ((expected, target), indices) in enumerate(groups.items()):
        kind = "expected failure" if expected else "failing cell"
        out.append(f'<div class="group"><h3>{escape(target)} <span class="meta">{len(indices)} {kind}'
                   f'{"s" if len(indices) != 1 else ""}</span></h3>')
        items = [_failure(listed[i], anchors[summary.cell_name(listed[i])], i, g < OPEN_FIRST and i == indices[0],
                          seed) for i in indices]
        out.append(items[0])
        if len(items) > 1:
            out.append(f'<details class="more"><summary>{len(items) - 1} more {kind}s of {escape(target)}'
                       f"</summary>{''.join(items[1:])}</details>")
        out.append("</div>")
    rest = []
    for i in range(drawn, len(listed)):
        cell = listed[i]
        name = summary.cell_name(cell)
        rest.append(f'<tr id="{anchors[name]}"><td><code>{escape(name)}</code></td>'
                    f"<td>{escape(cell.get('headline', ''))}</td><td><code>{escape(_rerun(cell, seed))}</code>"
                    "</td></tr>")
    if rest:
        out.append(f"<h3>{len(rest)} more failing cells (no timeline)</h3><div class=\"scroll\"><table "
                   f"class=\"rest\"><thead><tr><th>cell</th><th>headline</th><th>rerun</th></tr></thead><tbody>"
                   f"{''.join(rest)}</tbody></table></div>")
    if total > len(listed):
        out.append(f'<p class="note">{total - len(listed)} further failing cells are not listed; '
                   "<code>--resume-matrix-json</code> has them all.</p>")
    out.append("</section>")
    return "\n".join(out)


def _failure(cell: Mapping[str, Any], anchor: str, index: int, is_open: bool, seed: int | None) -> str:
    name = summary.cell_name(cell)
    st = status(cell)
    cats = "".join(f'<span class="tag s-{escape(k)}">{escape(k)}</span>' for k in cell.get("categories") or [])
    expected = ""
    if cell.get("xfail_reason"):
        expected = f'<p class="expected">expected failure: {escape(str(cell["xfail_reason"]))}</p>'
    search = escape(f"{name} {cell.get('headline', '')}".lower())
    return (f'<details class="failure" id="{anchor}" data-t="{index}" data-search="{search}"'
            f'{" open" if is_open else ""}><summary><span class="sw s-{escape(st)}">'
            f"{escape(summary.MARKS.get(st, '?'))}</span> <code>{escape(name)}</code> {cats}"
            f'<span class="headline">{escape(cell.get("headline", ""))}</span></summary>'
            f'<div class="body">{expected}<p class="runs">{escape(_story(cell))}</p>'
            f'<p class="rerun">rerun: <code>{escape(_rerun(cell, seed))}</code></p>'
            f'<div class="timeline" data-t="{index}"><p class="note">opening this cell draws its timeline '
            "(needs JavaScript)</p></div></div></details>")


def _story(cell: Mapping[str, Any]) -> str:
    """``run 1: killed after 0.4 s -> run 2 (resumed from step 3): done after 0.3 s``."""
    parts = []
    resumed = cell.get("resumed_from") or []
    for i, run in enumerate(cell.get("runs") or []):
        text = f"run {i + 1}"
        if i and i - 1 < len(resumed):
            text += f" (resumed from step {resumed[i - 1]})" if resumed[i - 1] else " (started from scratch)"
        text += f": {run.get('outcome', '?')}"
        if run.get("exitcode") not in (None, 0) and run.get("outcome") != "killed":
            text += f" (exit code {run['exitcode']})"
        if run.get("seconds") is not None:
            text += f" after {float(run['seconds']):.2f} s"
        parts.append(text)
    return " → ".join(parts) if parts else "no interrupted run (the reference itself failed)"


def _rerun(cell: Mapping[str, Any], seed: int | None) -> str:
    if cell.get("rerun"):
        return str(cell["rerun"])
    parts = ["pytest", "--resume-matrix"]
    if seed is not None:
        parts.append(f"--resume-matrix-seed={seed}")
    parts.append(f"--resume-matrix-cell={summary.cell_name(cell)}")
    return " ".join(shlex.quote(p) for p in parts)


_TIMELINE_LEGEND = (
    '<p class="legend tl">Timelines: one column per step, inputs top to bottom in the order taken. '
    '<span class="key"><span class="sq e0"></span><span class="sq e1"></span>input (epoch 0, 1 ...)</span>'
    '<span class="key"><span class="sq m-L"></span>lost</span>'
    '<span class="key"><span class="sq m-D"></span>duplicated</span>'
    '<span class="key"><span class="sq m-R"></span>reordered</span>'
    '<span class="key"><span class="sq m-E"></span>other epoch</span>'
    '<span class="key"><span class="line kill"></span>kill</span>'
    '<span class="key"><span class="line resume"></span>checkpoint resumed from</span>'
    '<span class="key"><span class="band"></span>steps redone after a kill</span>'
    " Hover an input for its id.</p>"
)

_CSS = """
:root{--fg:#1b1b1f;--muted:#5f6368;--line:#d9dbe0;--bg:#fff}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg);
margin:0 auto;padding:16px 24px 48px;max-width:1500px}
h1{font-size:22px;margin:4px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px}
code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f3f4f6;padding:1px 4px;
border-radius:3px;word-break:break-all}
.meta,.note{color:var(--muted)}.meta{margin:0 0 6px}.note{font-size:13px}
nav a{margin-right:14px}
.verdict{font-size:13px;padding:2px 8px;border-radius:10px;vertical-align:middle;color:#fff}
.v-PASSED{background:#2e7d32}.v-FAILED{background:#c62828}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse}
.hms{display:flex;flex-wrap:wrap;gap:4px 36px;align-items:flex-start}.hm{max-width:100%}
table.summary td,table.summary th{border:1px solid var(--line);padding:3px 8px;text-align:left}
table.summary td.n{text-align:right;min-width:36px}
table.heat{font-size:11px}
table.heat th{font-weight:normal;color:var(--muted);padding:0 6px 0 0;text-align:left;white-space:nowrap}
table.heat th.k{padding:0;vertical-align:bottom;height:58px}
table.heat th.k span{display:block;writing-mode:vertical-rl;transform:rotate(180deg);margin:0 auto;
font:10px ui-monospace,monospace}
table.heat td{width:17px;min-width:17px;height:17px;text-align:center;border:1px solid #fff;padding:0;
font:10px/15px ui-monospace,monospace}
table.heat td a{display:block;color:inherit;text-decoration:none}
table.heat td.none{background:#f7f7f9}
table.rest td,table.rest th{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
.legend{font-size:12px;color:var(--muted)}
.key{display:inline-flex;align-items:center;gap:3px;margin-right:12px;white-space:nowrap}
.sw{display:inline-block;min-width:17px;height:17px;text-align:center;font:10px/17px ui-monospace,monospace;
border-radius:2px}
.tag{font-size:11px;padding:1px 6px;border-radius:8px;margin-right:4px}
.sq{display:inline-block;width:12px;height:12px;border:1px solid #8a9bb0;border-radius:2px}
.sq.e0{background:#c6dbef}.sq.e1{background:#6baed6}
.sq.m-L{background:#d62728;border-color:#d62728}.sq.m-D{background:#ff7f0e;border-color:#ff7f0e}
.sq.m-R{background:#9467bd;border-color:#9467bd}.sq.m-E{background:#b5a800;border-color:#b5a800}
.line{display:inline-block;width:3px;height:14px}.line.kill{background:#d62728}.line.resume{background:#2e7d32}
.band{display:inline-block;width:16px;height:10px;background:repeating-linear-gradient(45deg,#f4b6b6 0 3px,
#fff 3px 6px)}
details.failure{border:1px solid var(--line);border-radius:6px;margin:8px 0;padding:6px 10px}
details.more>summary{cursor:pointer;color:var(--muted);margin:4px 0 10px}details.more{margin-left:16px}
details.failure>summary{cursor:pointer}
details.failure .headline{display:block;margin:4px 0 0 24px;font-weight:600}
details.failure .body{margin-left:24px}
.runs{color:var(--muted);margin:6px 0}.rerun{margin:6px 0}.expected{margin:6px 0;color:#5b4a9b}
.timeline svg{display:block;max-width:100%;height:auto;margin:6px 0}
.tools input{width:320px;padding:4px 6px}
svg text{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
""" + "".join(
    f".s-{k}{{background:{v};color:{'#fff' if k in DARK else '#1b1b1f'}}}" for k, v in COLOURS.items()
)

# The page's script: draws timelines from the embedded JSON into SVG (text goes in through
# textContent only, so ids and headlines are never parsed as markup), filters failing cells, opens the
# cell a heatmap link points at, and reports on <body data-render> whether it ran without an error.
_JS = r"""
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) {
    body.setAttribute("data-render", "error: " + (e.message || "unknown"));
  });
  var NS = "http://www.w3.org/2000/svg";
  var SQ = 16, GAP = 2, COL = SQ + 10, LEFT = 96, TOP = 62, LANE_GAP = 18;
  var FILL = {".": null, "L": "#d62728", "D": "#ff7f0e", "R": "#9467bd", "E": "#b5a800"};
  var WHY = {"L": "LOST: the reference took it here; the resumed job never did",
             "D": "DUPLICATED: taken again after the resume",
             "R": "REORDERED: the reference took another input at this position",
             "E": "EPOCH: taken, but labelled with another epoch than in the reference"};
  var data = JSON.parse(document.getElementById("timelines").textContent);
  var drawn = {};

  function el(name, attrs, parent, text) {
    var node = document.createElementNS(NS, name);
    for (var k in attrs) { node.setAttribute(k, attrs[k]); }
    if (text !== undefined) { node.textContent = text; }
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function xOf(t, step) { return LEFT + (step - t.lo) * COL; }
  function laneHeight(groups) {
    var per = {}, most = 1;
    groups.forEach(function (g) {
      per[g[0]] = (per[g[0]] || 0) + g[3].length + (g[5] ? 1 : 0);
      most = Math.max(most, per[g[0]]);
    });
    return most * (SQ + GAP) + 6;
  }
  function drawLane(svg, t, groups, y0, label, h) {
    el("text", {x: 4, y: y0 + 13, "font-size": 12, fill: "#1b1b1f"}, svg, label);
    el("rect", {x: LEFT - 2, y: y0 - 3, width: (t.hi - t.lo + 1) * COL + 2, height: h, fill: "#f7f8fa"}, svg);
    var used = {};
    groups.forEach(function (g) {
      var step = g[0], run = g[1], epoch = g[2], ids = g[3], marks = g[4], hidden = g[5];
      var x = xOf(t, step) + 5;
      ids.forEach(function (id, i) {
        var row = used[step] || 0; used[step] = row + 1;
        var y = y0 + row * (SQ + GAP);
        var m = marks.charAt(i) || ".";
        var fill = FILL[m] || (epoch % 2 ? "#6baed6" : "#c6dbef");
        var r = el("rect", {x: x, y: y, width: SQ, height: SQ, rx: 2, fill: fill,
                            stroke: m === "." ? "#8a9bb0" : fill, "class": "in m-" + (m === "." ? "ok" : m)}, svg);
        var tip = "id " + id + " \u00b7 step " + step + " \u00b7 epoch " + epoch + " \u00b7 run " + (run + 1);
        if (WHY[m]) { tip += "\n" + WHY[m]; }
        el("title", {}, r, tip);
        var s = String(id);
        if (s.length <= 3) {
          el("text", {x: x + SQ / 2, y: y + SQ / 2 + 3.5, "font-size": 9, "text-anchor": "middle",
                      fill: m === "." || m === "D" ? "#1b1b1f" : "#fff", "pointer-events": "none"}, svg, s);
        }
      });
      if (hidden) {
        var row = used[step] || 0; used[step] = row + 1;
        el("text", {x: x, y: y0 + row * (SQ + GAP) + 12, "font-size": 9, fill: "#5f6368"}, svg, "+" + hidden);
      }
    });
  }
  function draw(host, t) {
    var refH = laneHeight(t.ref), resH = laneHeight(t.res);
    var width = LEFT + (t.hi - t.lo + 1) * COL + 150;
    var height = TOP + refH + LANE_GAP + resH + 40;
    var svg = el("svg", {xmlns: NS, "class": "timeline", width: width, height: height,
                         viewBox: "0 0 " + width + " " + height, role: "img"});
    el("title", {}, svg, "reference and resumed inputs per step");
    var yRef = TOP, yRes = TOP + refH + LANE_GAP, bottom = yRes + resH;
    // steps redone after a kill: what the killed run did after the checkpoint it is resumed from
    t.kills.forEach(function (k) {
      var from = t.resumed[k[0]];
      if (from === undefined || k[2] <= from) { return; }
      var a = Math.max(from + 1, t.lo), b = Math.min(k[2], t.hi);
      if (b < a) { return; }
      var band = el("rect", {x: xOf(t, a), y: 32, width: (b - a + 1) * COL, height: 8,
                             fill: "#f4b6b6", "class": "redone"}, svg);
      el("title", {}, band, "run " + (k[0] + 1) + " took steps " + (from + 1) + "-" + k[2] +
         " after its last checkpoint; the kill threw that work away and run " + (k[0] + 2) + " redid it");
    });
    for (var s = t.lo; s <= t.hi; s++) {
      el("text", {x: xOf(t, s) + COL / 2, y: TOP - 8, "font-size": 10, "text-anchor": "middle",
                  fill: "#5f6368"}, svg, String(s));
    }
    el("text", {x: 4, y: TOP - 8, "font-size": 10, fill: "#5f6368"}, svg, "step");
    drawLane(svg, t, t.ref, yRef, "reference", refH);
    drawLane(svg, t, t.res, yRes, "resumed", resH);
    // the lane of the resumed job: which run each step comes from
    var runs = {};
    t.res.forEach(function (g) { runs[g[0]] = g[1]; });
    var shown = 0;
    for (var st = t.lo; st <= t.hi; st++) {
      if (runs[st] !== undefined && runs[st] !== runs[st - 1]) {
        el("text", {x: xOf(t, st) + 2, y: bottom + 12 + (shown++ % 2) * 11, "font-size": 10, fill: "#5f6368"},
           svg, "\u2192 run " + (runs[st] + 1));
      }
    }
    function vline(step, colour, dash, label, dy, tip) {
      if (step < t.lo - 1 || step > t.hi) { return; }
      var x = xOf(t, step + 1) + (dash ? 2 : -2);  // a kill and its resume often share a boundary
      var g = el("g", {"class": dash ? "kill" : "resume"}, svg);
      el("line", {x1: x, x2: x, y1: 4 + dy, y2: bottom + 2, stroke: colour, "stroke-width": 2,
                  "stroke-dasharray": dash || "none"}, g);
      el("text", {x: x + 4, y: 12 + dy, "font-size": 10, fill: colour}, g, label);
      el("title", {}, g, tip);
    }
    t.kills.forEach(function (k) {
      if (t.ran[k[0]] !== undefined && t.ran[k[0]] !== "killed") { return; }  // planned, but the run ended first
      vline(k[2], "#d62728", "5,3", "\u2715 kill " + (k[0] + 1), 0,
            "run " + (k[0] + 1) + " was killed at the end of step " + k[2] +
            (k[1] ? " (checkpoint of step " + k[1] + " on disk)" : " (no checkpoint on disk)"));
    });
    t.resumed.forEach(function (step, i) {
      vline(step, "#2e7d32", null, step ? "\u21bb from " + step : "\u21bb scratch", 12,
            "run " + (i + 2) + (step ? " resumed from the checkpoint of step " + step : " started from scratch"));
    });
    var notes = [];
    function range(a, b) { return a === b ? "step " + a : "steps " + a + "-" + b; }
    if (t.lo > 1) { notes.push(range(1, t.lo - 1) + " not shown"); }
    if (t.hi < t.last) { notes.push(range(t.hi + 1, t.last) + " not shown"); }
    if (!t.ref.length && !t.res.length) { notes.push("no input ledger for this verdict: see the runs above"); }
    if (notes.length) {
      el("text", {x: 4, y: height - 4, "font-size": 10, fill: "#5f6368"}, svg, notes.join("; "));
    }
    host.textContent = "";
    host.appendChild(svg);
  }
  function drawIndex(i) {
    if (drawn[i] || !data[i]) { return; }
    var host = document.querySelector('div.timeline[data-t="' + i + '"]');
    if (!host) { return; }
    draw(host, data[i]);
    drawn[i] = true;
  }
  function drawAll() {
    document.querySelectorAll("details.failure, details.more").forEach(function (d) { d.open = true; });
    for (var i = 0; i < data.length; i++) { drawIndex(i); }
  }
  document.querySelectorAll("details.failure").forEach(function (d) {
    if (d.open) { drawIndex(+d.getAttribute("data-t")); }
    d.addEventListener("toggle", function () { if (d.open) { drawIndex(+d.getAttribute("data-t")); } });
  });
  function openHash() {
    if (location.hash === "#render-all") { drawAll(); return; }
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (!target) { return; }
    for (var p = target; p; p = p.parentElement) { if (p.tagName === "DETAILS") { p.open = true; } }
    if (target.tagName === "DETAILS") { drawIndex(+target.getAttribute("data-t")); target.scrollIntoView(); }
  }
  window.addEventListener("hashchange", openHash);
  openHash();
  var filter = document.getElementById("filter");
  if (filter) {
    filter.addEventListener("input", function () {
      var q = filter.value.toLowerCase();
      document.querySelectorAll("details.more").forEach(function (d) { d.open = q.length > 0; });
      document.querySelectorAll("details.failure").forEach(function (d) {
        d.style.display = d.getAttribute("data-search").indexOf(q) >= 0 ? "" : "none";
      });
    });
  }
  var all = document.getElementById("open-all");
  if (all) {
    all.addEventListener("click", drawAll);
  }
  if (body.getAttribute("data-render") === "pending") {
    body.setAttribute("data-render", "ok");
  }
})();
"""
