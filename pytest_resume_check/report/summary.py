"""The end-of-session summary of a matrix: a grid per target (cases x kill points), the smallest
failing kill point of each failing case, and the failing headlines. Works on the JSON form of the
cells (``report.cell_json``), so it can be built from any process's results (xdist controller).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Final

from pytest_resume_check import categories
from pytest_resume_check.records import faults, kill_ids
from pytest_resume_check.records.cell_json import CellJson
from pytest_resume_check.records.names import OPT_JSON
from pytest_resume_check.records.plan import RESUME_AUTO, KillSpec

#: The summary's line for a commit point recognised in a reference run (the failure report says it too).
MSG_COMMIT_RECOGNISED = ("{target}: {file} recognised as the commit point of its checkpoints (each write of it names "
                         "one): publications, kills and saves follow it; declare commit={file!r} to say so")

#: Key of a cell's JSON: the runs' environment (:func:`~pytest_resume_check.report.text.environment_json`; names
#: only, never values).
ENVIRONMENT_KEY: Final = "environment"
#: Key of a cell's ``environment``: the ``env=`` variables for which its command target's Python program ran in
#: a fresh interpreter, not in the run's process (:data:`MSG_RAN_FRESH`).
RAN_FRESH_KEY: Final = "ran_fresh"
#: The summary's line (and the failure report's) for a command target whose Python program ran in a fresh
#: interpreter because of its ``env=``.
MSG_RAN_FRESH = ("{target}: ran in a fresh interpreter, not in the run's process: its env= sets {names}, which "
                 "modules the fork server imported read with another value (in the run's process they would "
                 "keep it); declare fresh_interpreter=True to say so")


def mark(cell: CellJson) -> str:
    """The grid mark of one cell."""
    return categories.mark(categories.status(cell))


def kills_of(cell: CellJson) -> tuple[KillSpec, ...]:
    """The structured kill points of a cell's JSON (none for JSON written before cells carried
    ``kills``, and for a failed cell whose name held no kill id)."""
    return tuple(KillSpec.from_json(k) for k in cell.get("kills") or ())


def kill_sort_key(kills: Sequence[KillSpec]) -> tuple[int, int, int, int, str]:
    """Order kill points: single kills right after a checkpoint, unsaved steps, double kills, and the
    crash-consistency cells last (by file operation)."""
    first = kills[0]
    if first.fault is not None:
        return (3, first.checkpoint_step, first.fault.op or 0, 0, kill_ids.fault_kind(first.fault))
    group = 0 if len(kills) == 1 and first.extra_steps == 0 else (1 if len(kills) == 1 else 2)
    return (group, first.checkpoint_step, kills[-1].kill_step, len(kills), "")


def cell_sort_key(cell: CellJson) -> tuple[Any, ...]:
    """Order cells by kill point (:func:`kill_sort_key`); cells without structured kills last, by name."""
    kills = kills_of(cell)
    return (0, *kill_sort_key(kills)) if kills else (1, 0, 0, 0, 0, str(cell.get("kill", "")))


def column(cell: CellJson) -> str:
    """The kill-point column of a cell: ``3``, ``3+1``, ``1,7+1`` (:func:`kill_ids.short_label`); a cell
    without structured kills shows its kill id as it is."""
    kills = kills_of(cell)
    return kill_ids.short_label(kills) if kills else str(cell.get("kill", "?"))


def kind_of(cell: CellJson) -> str:
    """The distributed kind of a cell's kills (``rank1``, ``term2``, ``ws3``; '' for a plain SIGKILL of all)."""
    return kill_ids.kind_label(kills_of(cell))


def is_crash_cell(cell: CellJson) -> bool:
    """A cell of the crash-consistency axis (a fault inside a save)."""
    return any(k.fault is not None for k in kills_of(cell))


#: The crash-grid row of a kill inside a save (the other rows are named by :func:`kill_ids.fault_kind`).
KILL_ROW = "kill"


def fault_of(cell: CellJson) -> faults.FaultPlan:
    """The fault of a crash-consistency cell (:func:`is_crash_cell`)."""
    fault = kills_of(cell)[0].fault
    assert fault is not None, "not a crash-consistency cell"
    return fault


def crash_row(cell: CellJson) -> str:
    """The row of a crash-consistency cell in its grid: the fault's kind (``kill``, ``power``, ``torn``,
    ``enospc``, ``eio``, ``enospc+``), and in a save of several ranks the rank, and thread, whose operations are
    the columns (``kill rank1``, ``power rank0 thread1``); a power loss of one simulated node alone has a row of
    its own (``power:node1 rank0``)."""
    fault = fault_of(cell)
    kind = KILL_ROW if fault.mode == faults.MODE_CRASH else kill_ids.fault_kind(fault)
    kind += f"{kill_ids.SUFFIX}{kill_ids.NODE}{fault.node}" if fault.node is not None else ""
    if fault.rank is None:
        return kind
    return f"{kind} {kill_ids.RANK}{fault.rank}" + (f" {kill_ids.THREAD}{fault.lane}" if fault.lane else "")


#: Crash-grid rows in this order (a kill, then the disk damage kinds, then the I/O errors); others after.
CRASH_ROWS = (KILL_ROW, faults.MODE_POWER, faults.MODE_TORN,
              *(name + persistent for name in faults.ERRNOS for persistent in ("", kill_ids.PERSISTENT)))


def _crash_row_order(row: str) -> tuple[int, int, int, str]:
    """By rank (none first) and thread, then as :data:`CRASH_ROWS`."""
    kind, *where = row.split(" ")
    rank = int(where[0][len(kill_ids.RANK):]) if where else -1
    thread = int(where[1][len(kill_ids.THREAD):]) if len(where) > 1 else 0
    return (rank, thread, CRASH_ROWS.index(kind) if kind in CRASH_ROWS else len(CRASH_ROWS), row)


def _row(cell: CellJson) -> str:
    """``shuffle auto``, or ``shuffle auto rank1`` for the cells of one distributed kind."""
    return " ".join(x for x in (cell["case_id"], cell["resume_mode"], kind_of(cell)) if x)


def grid(cells: Sequence[CellJson], width: int = 100) -> list[str]:
    """Lines of one grid per target (and one more per case, resume mode and save of its crash-consistency
    cells). Every cell is shown exactly once: columns wrap into chunks that repeat the row labels, so no
    line is wider than ``width`` unless one row label and one column alone are (then each chunk holds one
    column), and a cell whose row and column another cell already holds gets a column of its own (its
    full kill id) instead of replacing it."""
    lines: list[str] = []
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in cells if c["target"] == target]
        plain = [c for c in mine if not is_crash_cell(c)]
        if plain:
            lines += _kill_grid(target, plain, width)
        crash: dict[tuple[str, str, int], list[CellJson]] = {}
        for c in mine:
            if is_crash_cell(c):
                crash.setdefault((c["case_id"], c["resume_mode"], fault_of(c).step), []).append(c)
        for group in crash.values():
            lines += _crash_grid(target, group, width)
    lines.extend(categories.legend(width))
    return lines


#: A table's cells by row label, then by column label.
_Rows = dict[str, dict[str, CellJson]]


def _place(rows: _Rows, label: str, columns: Sequence[str], cell: CellJson) -> str:
    """Put ``cell`` in row ``label`` under the first of ``columns`` that row has free (each a fallback for
    the one before, the last one with a number added until it is free); return the column."""
    row = rows.setdefault(label, {})
    numbered = (f"{columns[-1]}#{n}" for n in itertools.count(2))  # the same cell twice (merged reports)
    choice = next(k for k in itertools.chain(columns, numbered) if k not in row)
    row[choice] = cell
    return choice


#: The grid's legend for the rows of torchrun's kinds, each where a cell of it is (kind word, text).
TORCHRUN_ROWS = ((kill_ids.NODE, ", nodeN: node N lost"), (kill_ids.REJOIN, ", rejoinS: back after checkpoint S"),
                 (kill_ids.AGENT, ", agent: torchrun's agent alone killed"))


def _kill_grid(target: str, cells: Sequence[CellJson], width: int) -> list[str]:
    """Cases, resume modes and distributed kinds x kill points."""
    kinds = " ".join(kind_of(c) for c in cells)
    torchrun = "".join(text for word, text in TORCHRUN_ROWS if word in kinds)
    lines = [f"{target}: {len(cells)} cells, columns are kill points (ckpt N[+unsaved steps])"
             + ("; rows rankR: that rank alone killed, termG: SIGTERM with G s grace, wsW: resumed on W ranks"
                + torchrun if kinds.strip() else "")]
    rows: _Rows = {_row(c): {} for c in sorted(cells, key=lambda c: bool(kind_of(c)))}
    # Two cells of one row share a short label when only their kinds' order tells them apart
    # (ckpt1:rank1_ckpt5 and ckpt1_ckpt5:rank1): the second keeps its whole kill id as its column.
    placed = [_place(rows, _row(c), (column(c), str(c.get("kill", "?"))), c)
              for c in sorted(cells, key=lambda c: (cell_sort_key(c), str(c.get("kill", ""))))]
    return lines + _table(rows, list(dict.fromkeys(placed)), width)


def _crash_grid(target: str, cells: Sequence[CellJson], width: int) -> list[str]:
    """Fault kinds x file operations of one save (cells of one case and resume mode)."""
    first = cells[0]
    mode = "" if first["resume_mode"] == RESUME_AUTO else f", resume mode {first['resume_mode']}"
    unit = first.get("step_unit", "step")  # a zero-change program's steps are its checkpoints
    lines = [f"{target}: {len(cells)} crash-consistency cells of the save of {unit} {fault_of(first).step} "
             f"(case {first['case_id']}{mode}), columns are file operations"]
    rows: _Rows = {}
    placed = []
    for c in sorted(cells, key=lambda c: (_crash_row_order(crash_row(c)), fault_of(c).op or 0, str(c.get("kill", "")))):
        # The same rows on every run; two torn files at one operation: the second keeps its kill id.
        placed.append(_place(rows, crash_row(c), (str(fault_of(c).op), str(c.get("kill", "?"))), c))
    ops = sorted(dict.fromkeys(placed), key=lambda k: (0, int(k), "") if k.isdigit() else (1, 0, k))
    return lines + _table(rows, ops, width)


def _table(rows: _Rows, columns: list[str], width: int) -> list[str]:
    """The rows' marks under their columns, the columns wrapped into chunks of at most ``width``
    characters a line (at least one column a chunk), each chunk under a header of its columns with the
    row labels repeated."""
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
    """``kills`` in order, cut into lists whose labels joined by spaces take fewer than ``room``
    characters; a label longer than that is a list of its own."""
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


#: The size :func:`smallest_failures` gives a cell without structured kills: more than any cell has.
_NO_KILLS = 1 << 30


def smallest_failures(cells: Sequence[CellJson]) -> list[CellJson]:
    """Per failing (target, case, resume mode): the smallest failing kill point (fewest kills, then
    earliest kill), i.e. the simplest reproduction of that case's failure. An expected failure that
    passed fails too (``XPASS``)."""
    out: dict[tuple[str, str, str], tuple[tuple[int, int, int], CellJson]] = {}
    for c in cells:
        if not categories.fails(c):
            continue
        key = (c["target"], c["case_id"], c["resume_mode"])
        kills = kills_of(c)  # a cell without structured kills is the last choice
        rank = (len(kills), kills[-1].kill_step, kills[0].checkpoint_step) if kills else (_NO_KILLS, 0, 0)
        best = out.get(key)
        if best is None or rank < best[0]:
            out[key] = (rank, c)
    return [c.copy() for _, c in out.values()]


def cell_name(cell: CellJson) -> str:
    """The name of a cell's JSON: ``target[case-mode-kill]``."""
    return kill_ids.cell_name(cell["target"], cell["case_id"], cell["resume_mode"], cell["kill"])


def recognised_commits(cells: Sequence[CellJson]) -> list[str]:
    """A line per target whose commit point its reference run recognised (none declared): which file, and the
    ``commit=`` that says so."""
    seen: dict[str, str] = {}
    for cell in cells:
        commit = cell.get("commit")
        if commit and commit.get("recognised") and cell["target"] not in seen:
            seen[cell["target"]] = str(commit["file"])
    return [MSG_COMMIT_RECOGNISED.format(target=t, file=f) for t, f in seen.items()] + ([""] if seen else [])


def fresh_interpreters(cells: Sequence[CellJson]) -> list[str]:
    """A line per target whose Python program ran in a fresh interpreter because of its ``env=``."""
    seen: dict[str, list[str]] = {}
    for cell in cells:
        names = (cell.get(ENVIRONMENT_KEY) or {}).get(RAN_FRESH_KEY)
        if names and cell["target"] not in seen:
            seen[cell["target"]] = list(names)
    return [MSG_RAN_FRESH.format(target=t, names=", ".join(n)) for t, n in seen.items()] + ([""] if seen else [])


def session_lines(results: Sequence[CellJson], width: int = 100, more_hint: str = OPT_JSON,
                  listed: int = 50) -> list[str]:
    """The end-of-session summary under its header: the grids, the smallest failing kill point of each
    failing case with its rerun command, and the failing cells' headlines (at most ``listed``)."""
    lines = grid(results, width=width)
    lines += recognised_commits(results)
    lines += fresh_interpreters(results)
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
