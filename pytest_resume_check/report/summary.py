"""The end-of-session summary of a matrix: a grid per target (cases x kill points), the smallest
failing kill point of each failing case, and the failing headlines. Works on the JSON form of the
cells (``report.cell_json``), so it can be built from any process's results (xdist controller).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pytest_resume_check import categories
from pytest_resume_check.records.plan import KillSpec


def mark(cell: dict[str, Any]) -> str:
    """The grid mark of one cell."""
    return categories.mark(categories.status(cell))


def kills_of(cell: dict[str, Any]) -> tuple[KillSpec, ...]:
    """The structured kill points of a cell's JSON."""
    return tuple(KillSpec.from_json(k) for k in cell["kills"])


def kill_sort_key(kills: Sequence[KillSpec]) -> tuple[int, int, int, int, str]:
    """Order kill points: single kills right after a checkpoint, unsaved steps, double kills, and the
    crash-consistency cells last (by file operation)."""
    first = kills[0]
    if first.fault is not None:
        return (3, first.checkpoint_step, first.fault.op or 0, 0, first.fault.kind)
    group = 0 if len(kills) == 1 and first.extra_steps == 0 else (1 if len(kills) == 1 else 2)
    return (group, first.checkpoint_step, kills[-1].kill_step, len(kills), "")


def is_crash_cell(cell: dict[str, Any]) -> bool:
    """A cell of the crash-consistency axis (a fault inside a save)."""
    return any(k.get("fault") for k in cell["kills"])


def crash_row(cell: dict[str, Any]) -> str:
    """The row of a crash-consistency cell in its grid: the fault's kind (``kill``, ``power``, ``torn``,
    ``enospc``, ``eio``, ``enospc+``)."""
    fault = kills_of(cell)[0].fault
    assert fault is not None
    return "kill" if fault.kind == "crash" else fault.kind


#: Crash-grid rows in this order (a kill, then the disk damage kinds, then the I/O errors); others after.
CRASH_ROWS = ("kill", "power", "torn", "enospc", "enospc+", "eio", "eio+")


def _crash_row_order(row: str) -> tuple[int, str]:
    return (CRASH_ROWS.index(row) if row in CRASH_ROWS else len(CRASH_ROWS), row)


def _short(kill: str) -> str:
    """A column label: ``1,7+1`` reads as "then"; a distributed kind (``:rank1``) goes to the row."""
    return ",".join(part.split(":")[0] for part in kill.replace("ckpt", "").split("_"))


def _kind(kill: str) -> str:
    """The distributed kind of a kill id (``rank1``, ``term2``, ``ws3``; '' for a plain SIGKILL of all)."""
    mods = [m for part in kill.split("_") for m in part.split(":")[1:]]
    return " ".join(dict.fromkeys(mods))


def _row(cell: dict[str, Any]) -> str:
    """``shuffle auto``, or ``shuffle auto rank1`` for the cells of one distributed kind."""
    return " ".join(x for x in (cell["case_id"], cell["resume_mode"], _kind(cell["kill"])) if x)


def grid(cells: Sequence[dict[str, Any]], width: int = 100) -> list[str]:
    """Lines of one grid per target (and one more for its crash-consistency cells); columns wrap to
    ``width``."""
    lines: list[str] = []
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in cells if c["target"] == target]
        plain = [c for c in mine if not is_crash_cell(c)]
        crash = [c for c in mine if is_crash_cell(c)]
        if plain:
            kinds = any(_kind(c["kill"]) for c in plain)
            lines.append(f"{target}: {len(plain)} cells, columns are kill points (ckpt N[+unsaved steps])"
                         + ("; rows rankR: that rank alone killed, termG: SIGTERM with G s grace, wsW: resumed on W "
                            "ranks" if kinds else ""))
            order = {c["kill"]: kill_sort_key(kills_of(c)) for c in plain}
            kills = sorted(order, key=order.__getitem__)
            rows = {_row(c): {} for c in sorted(plain, key=lambda c: bool(_kind(c["kill"])))}
            for c in plain:
                rows[_row(c)][_short(c["kill"])] = c
            lines += _table(rows, list(dict.fromkeys(_short(k) for k in kills)), width)
        if crash:
            step = kills_of(crash[0])[0].checkpoint_step
            lines.append(f"{target}: {len(crash)} crash-consistency cells of the save of step {step} "
                         f"(case {crash[0]['case_id']}), columns are file operations")
            rows = {}
            for c in sorted(crash, key=lambda c: _crash_row_order(crash_row(c))):  # the same rows on every run
                rows.setdefault(crash_row(c), {})[str(kills_of(c)[0].fault.op)] = c
            ops = sorted({op for row in rows.values() for op in row}, key=int)
            lines += _table(rows, ops, width)
    lines.extend(categories.legend(width))
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
    earliest kill), i.e. the simplest reproduction of that case's failure. An expected failure that
    passed fails too (``XPASS``)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in cells:
        if not categories.fails(c):
            continue
        key = (c["target"], c["case_id"], c["resume_mode"])
        kills = kills_of(c)
        rank = (len(kills), kills[-1].kill_step, kills[0].checkpoint_step)
        best = out.get(key)
        if best is None or rank < best["_rank"]:
            out[key] = {**c, "_rank": rank}
    return [{k: v for k, v in c.items() if k != "_rank"} for c in out.values()]


def cell_name(cell: dict[str, Any]) -> str:
    return f"{cell['target']}[{cell['case_id']}-{cell['resume_mode']}-{cell['kill']}]"


def session_lines(results: Sequence[dict[str, Any]], width: int = 100, more_hint: str = "--resume-matrix-json",
                  listed: int = 50) -> list[str]:
    """The end-of-session summary under its header: the grids, the smallest failing kill point of each
    failing case with its rerun command, and the failing cells' headlines (at most ``listed``)."""
    lines = grid(results, width=width)
    smallest = smallest_failures(results)
    if smallest:
        lines += ["", "smallest failing kill point of each failing case:"]
        for r in smallest:
            lines += [f"  {cell_name(r)}: {categories.headline(r)}", f"    rerun: {r['rerun']}"]
    failed = [r for r in results if categories.fails(r)]
    if failed:
        lines += ["", "failing cells:"]
        lines += [f"  {cell_name(r)}: {categories.headline(r)}" for r in failed[:listed]]
        if len(failed) > listed:
            lines.append(f"  ... and {len(failed) - listed} more (see {more_hint})")
    return lines
