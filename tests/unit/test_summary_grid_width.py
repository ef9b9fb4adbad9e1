"""The summary grid shows every cell exactly once, whatever the width (at 80 columns, the width
of a CI log or a redirected file, cells were reported missing).

Each grid is parsed back (for each chunk of columns: its header's column labels, and each row's marks
under them) and compared with the cells it was made from: a realistic matrix (cases with long ids, both
resume modes, single, unsaved and double kills, the distributed kinds, the crash-consistency cells of a
save) at 80, 120 and a pathological 30 columns. No processes, no torch.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from pytest_resume_check import categories
from pytest_resume_check.cells import matrix
from pytest_resume_check.records import faults, kill_ids
from pytest_resume_check.records.faults import FileOp
from pytest_resume_check.report import summary
from pytest_resume_check.targets import resume_target

WIDTHS = (80, 120, 30)
STEPS = 12


def never_run(run):  # the grid tests only generate cells; nothing runs a target
    raise AssertionError("not run")


#: Case ids as long as the bundled loop's, and one longer than 30 columns.
LOOP = resume_target(never_run, name="builtin_loop", steps=STEPS, boundaries=lambda case: [6, 12],
                     buffered=lambda case: [3], cases=[{"id": "b4-take2-e2-shuffle"}, {"id": "b4-take3-e2-shuffle-w2"},
                                                       {"id": "b4-take4-e2"}, {"id": "b4-take6-e1"}])
DDP = resume_target(never_run, name="ddp_loop", steps=STEPS, boundaries=lambda case: [6, 12],
                    cases=[{"id": "shuffle"}, {"id": "a-case-id-longer-than-thirty-columns"}], world_size=2,
                    elastic=(1, 3), preemption=(2.0,))
#: Under torchrun over two simulated nodes: its crash cells also lose each node's power alone.
NODES = resume_target(never_run, name="ddp_two_nodes", steps=STEPS, boundaries=lambda case: [6, 12],
                      cases=[{"id": "shuffle"}], world_size=2, launcher="torchrun", nnodes=(1, 2))
#: The recorded operations of a save: a file written in place (tearable), one written safely, a tracker.
SAVE_OPS = [FileOp(0, "mkdir", "step_2"), FileOp(1, "open", "step_2/weights.pt"),
            FileOp(2, "write", "step_2/weights.pt"), FileOp(3, "write", "step_2/weights.pt"),
            FileOp(4, "close", "step_2/weights.pt"),
            FileOp(5, "open", "step_2/extra.pt"), FileOp(6, "close", "step_2/extra.pt"),
            FileOp(7, "open", "step_2/state.tmp"), FileOp(8, "write", "step_2/state.tmp"),
            FileOp(9, "fsync", "step_2/state.tmp"), FileOp(10, "close", "step_2/state.tmp"),
            FileOp(11, "replace", "step_2/state.tmp", "step_2/state.pt"), FileOp(12, "open", "latest")]
#: An asynchronous save of two ranks: each main thread starts a writer (thread 1), writes, waits, meets the other.
RANKED_OPS = [FileOp(i, kind, path, None, rank, lane) for rank in (0, 1) for lane, kinds in (
    (None, [(faults.START, "thread 1"), ("open", f"r{rank}"), ("write", f"r{rank}"), ("close", f"r{rank}"),
            (faults.AWAIT, "Future.result"), (faults.COLLECTIVE, "barrier")]),
    (1, [(faults.COLLECTIVE, "gather_object"), ("open", f"s{rank}"), ("write", f"s{rank}"), ("fsync", f"s{rank}"),
         ("close", f"s{rank}")])) for i, (kind, path) in enumerate(kinds)]
#: Every status a cell can have, so a mark in the wrong place shows.
STATUSES = [c.name for c in categories.TABLE]


def cell_json(cell, index):
    """The JSON of a cell as the report writes it, with the status ``STATUSES[index % len]``."""
    status = STATUSES[index % len(STATUSES)]
    return {"target": cell.target.name, "case_id": cell.case_id, "resume_mode": cell.resume_mode, "kill": cell.kill_id,
            "kills": [k.to_json() for k in cell.kills], "passed": status in (categories.PASSED, categories.XPASS),
            "xfail_reason": "known" if status in (categories.XFAIL, categories.XPASS) else None,
            "categories": [] if status in categories.STATUSES else [status]}


def realistic_cells():
    cells = matrix.cells(LOOP, matrix.FULL, seed=1) + matrix.cells(DDP, matrix.FULL, seed=1)
    cells += matrix.crash_cells(LOOP, LOOP.cases[2], SAVE_OPS, 2, 1, matrix.FULL, random.Random(1))
    cells += matrix.crash_cells(DDP, DDP.cases[0], RANKED_OPS, 2, 1, matrix.FULL, random.Random(1))
    cells += matrix.crash_cells(NODES, NODES.cases[0], RANKED_OPS, 2, 1, matrix.FULL, random.Random(1))
    return [cell_json(c, i) for i, c in enumerate(cells)]


def expected_place(cell):
    """(grid title's target, row label, column label) where a cell belongs, and its mark."""
    if summary.is_crash_cell(cell):
        where = (cell["target"], summary.crash_row(cell), str(summary.fault_of(cell).op))
    else:
        row = " ".join(x for x in (cell["case_id"], cell["resume_mode"], summary.kind_of(cell)) if x)
        where = (cell["target"], row, summary.column(cell))
    return where, summary.mark(cell)


def parse_grid(lines, width):
    """The marks a grid shows: ((target, row, column), mark) for each mark, in order, and the lines that are
    wider than ``width`` although their chunk could fit (more than one column, or one that fits)."""
    shown, too_wide = [], []
    target = None
    at = 0
    while at < len(lines):
        line = lines[at]
        title = re.match(r"^(\S+): \d+ (crash-consistency )?cells", line)
        if title:
            target = title[1]
            at += 1
            continue
        if not line.startswith(" ") or not line.strip():  # the blank line after a table, the legend
            at += 1
            continue
        # A chunk: its header, then its rows until the next header or the blank line.
        label_width = len(line) - len(line.lstrip(" "))
        columns = [(m.start(), m[0]) for m in re.finditer(r"\S+", line)]
        rows = []
        at += 1
        while at < len(lines) and lines[at].strip() and not lines[at].startswith(" "):
            rows.append(lines[at])
            at += 1
        single_too_wide = len(columns) == 1 and label_width + len(columns[0][1]) > width
        for row in [line, *rows]:
            if len(row) > width and not single_too_wide:
                too_wide.append(row)
        for row in rows:
            label = row[:label_width].rstrip()
            assert len(row) <= label_width - 2 or row[:label_width].endswith("  "), f"a mark in the labels: {row!r}"
            starts = {start for start, _ in columns}
            stray = [i for i, ch in enumerate(row) if i >= label_width and ch != " " and i not in starts]
            assert not stray, f"characters outside the columns: {row!r}"
            for start, column in columns:
                if start < len(row) and row[start] != " ":
                    shown.append(((target, label, column), row[start]))
    return shown, too_wide


@pytest.mark.parametrize("width", WIDTHS)
def test_every_cell_of_a_realistic_matrix_appears_exactly_once_with_its_mark(width):
    cells = realistic_cells()
    assert len(cells) > 150 and any(summary.kind_of(c) for c in cells) and any(summary.is_crash_cell(c) for c in cells)
    lines = summary.grid(cells, width=width)
    shown, too_wide = parse_grid(lines, width)
    expected = [expected_place(c) for c in cells]
    assert len({where for where, _ in expected}) == len(cells)  # the matrix's places are distinct
    assert Counter(where for where, _ in shown) == Counter(where for where, _ in expected)  # each exactly once
    assert dict(shown) == dict(expected)  # with its mark
    assert too_wide == []
    legend = lines[-len(categories.legend(width)):]
    assert legend == categories.legend(width) and all(len(line) <= width for line in legend)
    assert all(c.mark in " ".join(legend).split() for c in categories.TABLE)


def test_at_80_columns_the_chunks_repeat_every_row_label():
    lines = summary.grid(realistic_cells(), width=80)
    at = lines.index(next(line for line in lines if line.startswith(f"{LOOP.name}: ") and "crash" not in line))
    table = lines[at + 1:lines.index("", at)]
    headers = [line for line in table if line.startswith(" ")]
    assert len(headers) >= 2  # wrapped
    labels = [f"{case['id']} {mode}" for case in LOOP.cases for mode in ("auto", "path")]
    for label in labels:
        assert sum(line.rstrip() == label or line.startswith(label + "  ") for line in table) == len(headers)
    assert len(table) == len(headers) * (1 + len(labels))


def test_a_row_label_wider_than_the_grid_gives_each_column_its_own_chunk():
    cells = [c for c in realistic_cells() if c["target"] == DDP.name and not summary.is_crash_cell(c)]
    lines = summary.grid(cells, width=20)
    shown, too_wide = parse_grid(lines, 20)
    assert dict(shown) == dict(expected_place(c) for c in cells) and too_wide == []
    headers = [line.split() for line in lines if line.startswith(" ") and line.strip()]
    assert all(len(h) == 1 for h in headers)


def ddp_cell(kill_id, status=categories.PASSED, case="shuffle"):
    kills = kill_ids.parse_kill_id(kill_id)
    return {"target": "ddp", "case_id": case, "resume_mode": "auto", "kill": kill_id,
            "kills": [k.to_json() for k in kills], "passed": status == categories.PASSED, "xfail_reason": None,
            "categories": [] if status == categories.PASSED else [status]}


def test_two_cells_with_one_short_label_in_one_row_are_both_shown():
    """The short label leaves the kinds to the row, so kills whose kinds differ only in which kill carries
    them share it; the second keeps its whole kill id as its column."""
    cells = [ddp_cell("ckpt1:rank1_ckpt5", categories.LOST), ddp_cell("ckpt1_ckpt5:rank1", categories.PASSED),
             ddp_cell("ckpt3")]
    shown, _ = parse_grid(summary.grid(cells, width=80), 80)
    assert sorted(shown) == sorted([(("ddp", "shuffle auto rank1", "1,5"), "L"),
                                    (("ddp", "shuffle auto rank1", "ckpt1_ckpt5:rank1"), "."),
                                    (("ddp", "shuffle auto", "3"), ".")])


def crash_json(case, step, plan, status=categories.PASSED):
    kills = (matrix.KillSpec(step, 0, plan),)
    return {"target": "t", "case_id": case, "resume_mode": "auto", "kill": kill_ids.kill_id(kills),
            "kills": [k.to_json() for k in kills], "passed": status == categories.PASSED, "xfail_reason": None,
            "categories": [] if status == categories.PASSED else [status]}


def test_crash_cells_of_two_saves_or_two_torn_files_at_one_operation_are_all_shown():
    cells = [crash_json("a", 2, faults.FaultPlan(2, faults.MODE_CRASH, 1)),
             crash_json("a", 2, faults.FaultPlan(2, faults.MODE_TORN, 3, file="x.pt")),
             crash_json("a", 2, faults.FaultPlan(2, faults.MODE_TORN, 3, file="y.pt"), categories.LOST),
             crash_json("a", 4, faults.FaultPlan(4, faults.MODE_CRASH, 1), categories.CRASHED),
             crash_json("b", 2, faults.FaultPlan(2, faults.MODE_CRASH, 1), categories.HUNG)]
    lines = summary.grid(cells, width=80)
    titles = [line for line in lines if line.startswith("t: ")]
    assert titles == ["t: 3 crash-consistency cells of the save of step 2 (case a), columns are file operations",
                      "t: 1 crash-consistency cells of the save of step 4 (case a), columns are file operations",
                      "t: 1 crash-consistency cells of the save of step 2 (case b), columns are file operations"]
    shown, _ = parse_grid(lines, 80)
    assert [mark for _, mark in shown].count(".") == 2 and sorted(m for _, m in shown if m != ".") == ["C", "H", "L"]
    assert (("t", "torn", "save2op3:torn:y.pt"), "L") in shown
