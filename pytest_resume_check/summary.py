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
    "CRASHED": "C",
    "HUNG": "H",
    "NONDETERMINISTIC": "N",
    "PROTOCOL": "P",
}
LEGEND = (
    ". pass  x expected failure  ! fixed (xfail passed)  L lost  D duplicated  R reordered",
    "E epoch  X resume error  C crashed  H hung  N nondeterministic  P protocol",
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
    """Lines of one grid per target; columns wrap to ``width``."""
    lines: list[str] = []
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in cells if c["target"] == target]
        kills = sorted({c["kill"] for c in mine}, key=kill_sort_key)
        rows = list(dict.fromkeys((c["case_id"], c["resume_mode"]) for c in mine))
        by_key = {(c["case_id"], c["resume_mode"], c["kill"]): c for c in mine}
        label_width = max(len(f"{case} {mode}") for case, mode in rows) + 2
        lines.append(f"{target}: {len(mine)} cells, columns are kill points (ckpt N[+unsaved steps])")
        for chunk in _chunks(kills, width - label_width):
            lines.append(" " * label_width + " ".join(_short(k) for k in chunk))
            for case, mode in rows:
                marks = []
                for k in chunk:
                    cell = by_key.get((case, mode, k))
                    marks.append((mark(cell) if cell else " ").ljust(len(_short(k))))
                lines.append((f"{case} {mode}".ljust(label_width) + " ".join(marks)).rstrip())
        lines.append("")
    lines.extend(LEGEND)
    return lines


def _chunks(kills: list[str], room: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    used = 0
    for k in kills:
        need = len(_short(k)) + 1
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
