"""The one table of verdict categories and cell statuses.

Every view of a verdict reads this table: the terminal grid and its legend, the HTML report (marks,
colours, legend, summary columns), the JSON report (``categories`` and ``status`` of a cell) and the
docs page *Reading a report*, whose table a test compares with :func:`markdown_table`. A category
added here appears in all of them.

A *status* is what one cell shows: ``PASSED``, ``XFAIL`` (an expected failure that failed),
``XPASS`` (an expected failure that passed: the bug is fixed) or the first category of its verdict.
Categories are listed in the order the verdict reports them (process problems and ledger problems
first), which is also the order of legends and summary columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the plugin imports this table at load: the types stay out of it
    from pytest_resume_check.records.cell_json import CellJson

__all__ = ["BY_NAME", "CRASHED", "Category", "DUPLICATED", "EPOCH", "HARNESS", "HUNG", "LOST", "NONDETERMINISTIC",
           "PASSED", "PROTOCOL", "REORDERED", "RESUME_ERROR", "SILENT_IO_ERROR", "STALE_RESUME", "STATE_DIVERGED",
           "STATUSES", "TABLE", "TARGET_ERROR", "VERDICT_CATEGORIES", "XFAIL", "XPASS", "fails", "headline", "legend",
           "mark", "markdown_table", "status"]


@dataclass(frozen=True)
class Category:
    """One row of the table."""

    name: str
    #: One character for the terminal grid and the HTML heatmap.
    mark: str
    #: Background colour in the HTML report; ``dark`` colours take white text.
    colour: str
    dark: bool
    #: A few words for legends.
    label: str
    #: One sentence for the docs and tooltips.
    meaning: str
    #: Whether a cell with this status fails the session.
    fails: bool


PASSED = "PASSED"
XFAIL = "XFAIL"
XPASS = "XPASS"
LOST = "LOST"
DUPLICATED = "DUPLICATED"
REORDERED = "REORDERED"
EPOCH = "EPOCH"
STALE_RESUME = "STALE_RESUME"
STATE_DIVERGED = "STATE_DIVERGED"
SILENT_IO_ERROR = "SILENT_IO_ERROR"
RESUME_ERROR = "RESUME_ERROR"
CRASHED = "CRASHED"
HUNG = "HUNG"
NONDETERMINISTIC = "NONDETERMINISTIC"
PROTOCOL = "PROTOCOL"
TARGET_ERROR = "TARGET_ERROR"
HARNESS = "HARNESS"

TABLE: tuple[Category, ...] = (
    Category(PASSED, ".", "#cfe9cf", False, "pass", "The job continued exactly as the uninterrupted run.", False),
    Category(XFAIL, "x", "#c9c9d6", False, "expected failure",
             "Failed as the target declared it would (expected_failures); does not fail the session.", False),
    Category(XPASS, "!", "#ffd54f", False, "fixed (xfail passed)",
             "Declared as an expected failure but passed: the bug is fixed, remove the declaration.", True),
    Category(LOST, "L", "#d62728", True, "lost",
             "Inputs of the reference the interrupted job never consumed.", True),
    Category(DUPLICATED, "D", "#ff7f0e", False, "duplicated",
             "Inputs consumed more often than in the reference.", True),
    Category(REORDERED, "R", "#9467bd", True, "reordered",
             "The same inputs per epoch in another order (ordered contracts only).", True),
    Category(EPOCH, "E", "#b5a800", False, "epoch",
             "The reference's inputs in their places (step and position), labelled with another epoch.", True),
    Category(STALE_RESUME, "S", "#1f77b4", True, "stale resume",
             "A resumed run started fresh or restored an older checkpoint than the newest one it was "
             "entitled to: saved training is done again.", True),
    Category(STATE_DIVERGED, "T", "#393b79", True, "state diverged",
             "After a resume the training state (model, optimizer, scheduler, RNG, ...) differs from the "
             "uninterrupted run's at the same step.", True),
    Category(SILENT_IO_ERROR, "I", "#bcbd22", False, "silent I/O error",
             "An injected I/O error during a save did not make the run fail.", True),
    Category(RESUME_ERROR, "X", "#8c564b", True, "resume error", "A resumed run raised.", True),
    Category(CRASHED, "C", "#333333", True, "crashed",
             "A run died by itself (non-zero exit or a signal the harness did not send).", True),
    Category(HUNG, "H", "#17becf", False, "hung",
             "A run sent no event within the hang limit and was killed.", True),
    Category(NONDETERMINISTIC, "N", "#e377c2", False, "nondeterministic",
             "Two uninterrupted reference runs differ in their inputs or state; nothing can be judged.", True),
    Category(PROTOCOL, "P", "#7f7f7f", True, "protocol",
             "The target broke the reporting rules (e.g. never said where it resumed, resumed from a step "
             "no run reached, or reported out of order).", True),
    Category(TARGET_ERROR, "B", "#a55194", True, "broken target",
             "The target could not be run at all (a preload module that fails to import, a warm-up that leaves "
             "threads running, a service that fails to start); the headline names it and the fix.", True),
    Category(HARNESS, "#", "#e7ba52", False, "harness error",
             "The harness itself could not run or judge the cell (a full disk, a removed session folder, a "
             "crashed pytest-xdist worker, a killed fork server, a lost Ray node, its own bug); the headline says "
             "what happened and the fix.", True),
)

BY_NAME: dict[str, Category] = {c.name: c for c in TABLE}
STATUSES = (PASSED, XFAIL, XPASS)
#: The verdict categories, in the order findings are reported.
VERDICT_CATEGORIES: tuple[str, ...] = tuple(c.name for c in TABLE if c.name not in STATUSES)


def status(cell: CellJson) -> str:
    """The status of a cell in its JSON form (``passed``, ``xfail_reason``, ``categories``)."""
    if cell.get("xfail_reason"):
        return XPASS if cell["passed"] else XFAIL
    if cell["passed"]:
        return PASSED
    categories = cell.get("categories") or [PROTOCOL]
    return categories[0] if categories[0] in BY_NAME else PROTOCOL


def fails(cell: CellJson) -> bool:
    """Whether a cell in its JSON form fails the session (its status's row says so): an unexpected
    failure, or an expected failure that passed (``XPASS``, strict as pytest counts it)."""
    return BY_NAME[status(cell)].fails


#: The headline of a cell that passed although the target declared it an expected failure.
MSG_XPASS = ("XPASS: declared as an expected failure ({reason}) but passed: the bug is fixed, remove the "
             "declaration from the target's expected_failures")


def headline(cell: CellJson) -> str:
    """What a summary line says of a cell: its verdict's headline, or why an ``XPASS`` cell fails."""
    if status(cell) == XPASS:
        return MSG_XPASS.format(reason=cell["xfail_reason"])
    return str(cell.get("headline") or "")


def mark(name: str) -> str:
    """The grid mark of a status or category (``?`` for a name not in the table)."""
    category = BY_NAME.get(name)
    return category.mark if category else "?"


def legend(width: int = 100) -> list[str]:
    """The terminal legend: ``mark label`` pairs, wrapped to ``width``."""
    lines: list[str] = []
    line = ""
    for c in TABLE:
        item = f"{c.mark} {c.label}"
        if line and len(line) + 2 + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line}  {item}" if line else item
    return [*lines, line] if line else lines


def markdown_table() -> str:
    """The docs table (``docs/reading-a-report.md`` holds it verbatim; a test checks)."""
    rows = ["| mark | status | fails the session | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{c.mark}` | `{c.name}` | {'yes' if c.fails else 'no'} | {c.meaning} |" for c in TABLE]
    return "\n".join(rows)
