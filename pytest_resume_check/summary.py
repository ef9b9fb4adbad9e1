"""The end-of-session summary of a matrix: a grid per target (cases x kill points), the smallest
failing kill point of each failing case, and the failing headlines. Works on the JSON form of the
cells (``report.cell_json``), so it can be built from any process's results (xdist controller).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pytest_resume_check.matrix import parse_kill_id

#: One mark per cell. Failing cells show their first category's letter.
MARKS = {
    "PASSED": ".",
    "XFAIL": "x",
    "XPASS": "!",
    "LOST": "L",
    "DUPLICATED": "D",
    "REORDERED": "R",
    "EPOCH": "E",
    "RESUME_ERROR": "X",
    "STALE_RESUME": "S",
    "SILENT_IO_ERROR": "I",
    "CRASHED": "C",
    "HUNG": "H",
    "NONDETERMINISTIC": "N",
    "PROTOCOL": "P",
}
LEGEND = (
    ". pass  x expected failure  ! fixed (xfail passed)  L lost  D duplicated  R reordered",
    "E epoch  S stale resume  I silent I/O error  X resume error  C crashed  H hung  N nondeterministic",
    "P protocol",
)


def mark(cell: dict[str, Any]) -> str:
    """The grid mark of one cell."""
    if cell.get("xfail_reason"):
        return MARKS["XFAIL"] if not cell["passed"] else MARKS["XPASS"]
    if cell["passed"]:
        return MARKS["PASSED"]
    return MARKS.get(cell["categories"][0] if cell["categories"] else "PROTOCOL", "?")


def kill_sort_key(kill: str) -> tuple[int, int, int, str]:
    """Order kill points: single kills right after a checkpoint, unsaved steps, then double kills."""
    kills = parse_kill_id(kill)
    group = 0 if len(kills) == 1 and kills[0].extra_steps == 0 else (1 if len(kills) == 1 else 2)
    return (group, kills[0].checkpoint_step, kills[-1].kill_step, kill)


def _short(kill: str) -> str:
    return kill.replace("ckpt", "")


def grid(cells: Sequence[dict[str, Any]], width: int = 100) -> list[str]:
    """Lines of one grid per target (and one more for its crash-consistency cells); columns wrap to
    ``width``."""
    lines: list[str] = []
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in cells if c["target"] == target]
        plain = [c for c in mine if not c["kill"].startswith("save")]
        crash = [c for c in mine if c["kill"].startswith("save")]
        if plain:
            lines.append(f"{target}: {len(plain)} cells, columns are kill points (ckpt N[+unsaved steps])")
            kills = sorted({c["kill"] for c in plain}, key=kill_sort_key)
            rows = {f"{c['case_id']} {c['resume_mode']}": {} for c in plain}
            for c in plain:
                rows[f"{c['case_id']} {c['resume_mode']}"][_short(c["kill"])] = c
            lines += _table(rows, [_short(k) for k in kills], width)
        if crash:
            save = crash[0]["kill"].split("@")[0]
            lines.append(f"{target}: {len(crash)} crash-consistency cells of {save} (case {crash[0]['case_id']}), "
                         "columns are file operations")
            rows = {}
            for c in crash:
                op, _, fault = c["kill"].split("@", 1)[1].partition(":")
                kind = "torn" if fault.startswith("torn") else (fault or "kill")
                rows.setdefault(kind, {})[op] = c
            ops = sorted({op for row in rows.values() for op in row}, key=int)
            lines += _table(rows, ops, width)
    lines.extend(LEGEND)
    return lines


def _table(rows: dict[str, dict[str, dict[str, Any]]], columns: list[str], width: int) -> list[str]:
    lines = []
    label_width = max(len(label) for label in rows) + 2
    for chunk in _chunks(columns, width - label_width):
        lines.append(" " * label_width + " ".join(chunk))
        for label, row in rows.items():
            marks = [(mark(row[k]) if k in row else " ").ljust(len(k)) for k in chunk]
            lines.append((label.ljust(label_width) + " ".join(marks)).rstrip())
    lines.append("")
    return lines


def _chunks(kills: list[str], room: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    used = 0
    for k in kills:
        need = len(k) + 1
        if chunk and used + need > room:
            yield chunk
            chunk, used = [], 0
        chunk.append(k)
        used += need
    if chunk:
        yield chunk


def smallest_failures(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per failing (target, case, resume mode): the smallest failing kill point (fewest kills, then
    earliest kill), i.e. the simplest reproduction of that case's failure."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in cells:
        if c["passed"] or c.get("xfail_reason"):
            continue
        key = (c["target"], c["case_id"], c["resume_mode"])
        kills = parse_kill_id(c["kill"])
        rank = (len(kills), kills[-1].kill_step, kills[0].checkpoint_step)
        best = out.get(key)
        if best is None or rank < best["_rank"]:
            out[key] = {**c, "_rank": rank}
    return [{k: v for k, v in c.items() if k != "_rank"} for c in out.values()]


def cell_name(cell: dict[str, Any]) -> str:
    return f"{cell['target']}[{cell['case_id']}-{cell['resume_mode']}-{cell['kill']}]"
