"""The end-of-session summary in Markdown, for a GitHub Actions step summary: the counts line, each
target's grid, and the failing cells' headlines with their rerun commands, within a size.

Built from the cells' JSON like the terminal summary (:mod:`.summary`), whose grids it shows in text
blocks; marks and their labels come from the one table (:mod:`pytest_resume_check.categories`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_resume_check import categories
from pytest_resume_check.records.cell_json import CellJson
from pytest_resume_check.records.names import OPT_JSON
from pytest_resume_check.report import summary
from pytest_resume_check.report.repro import CELL_KEY, fenced

#: GitHub refuses a step's summary larger than this (1 MiB), and shows none of it then.
GITHUB_LIMIT = 1024 * 1024
#: What one session writes at most, so that other writers of the same step's file keep room.
MAX_BYTES = 256 * 1024
#: At most this many failing cells are listed (the smallest failing kill point of each case first).
LISTED = 30
#: A headline longer than this is cut (the terminal and the JSON report keep it whole).
HEADLINE_CHARS = 1000
#: Room kept for the line that says how much was left out.
_TAIL_ROOM = 400

TITLE = "### {header}"
FAILING_TITLE = "#### Failing cells"
MORE_CELLS = "... and {count} more failing cell{s}: every cell is in the terminal log and the JSON report ({hint})."
MORE_GRIDS = "... and the grids of {count} more target{s}: see the terminal log."
REPRO = "reproduction: {path}"
#: Characters that Markdown could read as markup in a headline (each escaped with a backslash).
_MARKUP = re.compile(r"([\\`*_\[\]<>|~&#])")


def step_summary(results: Sequence[CellJson], header: str, *, width: int = 100, listed: int = LISTED,
                 max_bytes: int = MAX_BYTES, more_hint: str = OPT_JSON) -> str:
    """The summary of ``results`` (cells' JSON) under ``header`` (the terminal summary's counts line), at
    most ``max_bytes`` bytes of UTF-8 (what does not fit is counted, not cut in the middle)."""
    results = sorted(results, key=summary.cell_name)
    out = _Budget(max_bytes - 2 * _TAIL_ROOM)
    out.force([TITLE.format(header=escape(header)), ""])
    targets = list(dict.fromkeys(c["target"] for c in results))
    shown = 0
    for target in targets:
        if not out.add(_target_grid(target, [c for c in results if c["target"] == target], width)):
            break
        shown += 1
    out.room += _TAIL_ROOM
    if shown < len(targets):
        out.force([MORE_GRIDS.format(count=len(targets) - shown, s=_s(len(targets) - shown)), ""])
    out.add([_legend(results), ""])
    failing = _failing_in_order(results)
    if failing:
        out.add([FAILING_TITLE, ""])
    listed_now = 0
    for cell in failing[:listed]:
        if not out.add(_entry(cell)):
            break
        listed_now += 1
    out.room += _TAIL_ROOM
    if listed_now < len(failing):
        left = len(failing) - listed_now
        out.force([MORE_CELLS.format(count=left, s=_s(left), hint=more_hint), ""])
    return "\n".join(out.lines).rstrip("\n") + "\n"


class _Budget:
    """Lines that fit in a number of UTF-8 bytes."""

    def __init__(self, room: int):
        self.room = room
        self.lines: list[str] = []

    def add(self, lines: list[str]) -> bool:
        """Add ``lines`` if they all fit; False (and nothing added) if not."""
        size = sum(len(line.encode()) + 1 for line in lines)
        if size > self.room:
            return False
        self.force(lines)
        return True

    def force(self, lines: list[str]) -> None:
        """Add ``lines`` from the room kept for them."""
        self.room -= sum(len(line.encode()) + 1 for line in lines)
        self.lines += lines


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _target_grid(target: str, cells: list[CellJson], width: int) -> list[str]:
    """A target's grid in a text block (the terminal's, without its legend: one legend follows them all)."""
    lines = summary.grid(cells, width=width)
    lines = lines[:len(lines) - len(categories.legend(width))]
    while lines and not lines[-1].strip():
        lines.pop()
    return [f"#### {escape(target)}", "", *fenced(lines, "text"), ""]


def _legend(results: Sequence[CellJson]) -> str:
    """The marks the grids show, with their labels, in the table's order."""
    shown = {categories.status(c) for c in results}
    return " · ".join(f"{code_span(c.mark)} {c.label}" for c in categories.TABLE if c.name in shown)


def _failing_in_order(results: Sequence[CellJson]) -> list[CellJson]:
    """The failing cells: the smallest failing kill point of each failing case first, then the others."""
    smallest = [summary.cell_name(c) for c in summary.smallest_failures(results)]
    failing = [c for c in results if categories.fails(c)]
    first = {name: i for i, name in enumerate(smallest)}
    return sorted(failing, key=lambda c: first.get(summary.cell_name(c), len(first)))


def _entry(cell: CellJson) -> list[str]:
    """One failing cell: its name and headline, its rerun command in a block (GitHub offers to copy it),
    and where its reproduction was written, if it was."""
    headline = categories.headline(cell)
    if len(headline) > HEADLINE_CHARS:
        headline = headline[:HEADLINE_CHARS - 3] + "..."
    lines = [f"- {code_span(summary.cell_name(cell))}: {escape(headline)}"]
    if cell.get("rerun"):
        lines += ["", *("  " + line for line in fenced([str(cell["rerun"])], "sh"))]
    if cell.get(CELL_KEY):
        lines += ["", "  " + REPRO.format(path=code_span(str(cell[CELL_KEY])))]
    return [*lines, ""]


def escape(text: str) -> str:
    """``text`` with the characters Markdown would read as markup escaped, on one line."""
    return _MARKUP.sub(r"\\\1", " ".join(text.split()))


def code_span(text: str) -> str:
    """``text`` as an inline code span, delimited by more backticks than any run inside it."""
    text = " ".join(text.split())
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"
