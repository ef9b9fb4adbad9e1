"""``--resume-matrix-budget=RUNS``: the cells of a matrix ordered by how much each can reveal, and cut where
their runs would pass the budget. For trainers that pay tens of seconds a run, where the quick
matrix's hundreds of runs are more than a day's CI can give.

What a cell can reveal is the set of *features* its kills exercise, each for its target and case: every
resume mode once, an epoch boundary, the first and the last steps, steps where the trainer holds buffered
inputs, work done after the last checkpoint, a double kill, one rank killed alone, a preemption, a
changed world size, one crash cell of a save, and (weighed least) each distinct kill step. The order is
greedy: next comes the cell whose features not yet covered weigh most per run it adds, ties in the
matrix's own order. What a cell adds in runs: one per kill (each resumed run), its first run unless its
group's shared first run is paid already, and its case's reference (one per resume mode) and the recorded
save of a crash cell where no earlier cell paid them. The order is a pure function of the cells, so every
xdist worker cuts the same matrix.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.records.plan import SIGNAL_KILL

#: How much each feature weighs: what finds the bugs users had (docs/findings.md) weighs most.
WEIGHTS = {
    "mode": 4.0,  # each resume mode of each case, once
    "boundary": 3.0,  # a kill at, just before or just after an epoch boundary
    "buffered": 3.0,  # a checkpoint while the trainer holds buffered inputs
    "crash": 3.0,  # one crash-consistency cell of the target's save
    "first": 2.0,  # a kill at the first step (or before any checkpoint)
    "last": 2.0,  # a kill at one of the last two steps
    "unsaved": 2.0,  # steps done after the last checkpoint, to be redone
    "double": 2.0,  # two kills in one job
    "rank": 2.0,  # one rank killed alone
    "term": 2.0,  # SIGTERM preemption
    "elastic": 2.0,  # a resume at another world size
    "node": 2.0,  # a simulated node lost, the job going on without it
    "agent": 2.0,  # torchrun's agent alone killed
    "step": 0.25,  # each distinct kill step of a case and mode
}


@dataclass(frozen=True)
class Cut:
    """The cells kept (in matrix order), the cells left out, and the runs each side costs."""

    kept: list[Cell]
    left_out: list[Cell]
    runs: int
    total_runs: int


def features(cell: Cell) -> set[tuple[Any, ...]]:
    """What ``cell`` exercises, each feature keyed by its kind (see :data:`WEIGHTS`), target and case."""
    key = (cell.target.name, cell.case_id)
    boundaries = set(_asked(cell, "boundaries"))
    buffered = set(_asked(cell, "buffered"))
    found: set[tuple[Any, ...]] = {("mode", *key, cell.resume_mode)}
    for kill in cell.kills:
        if kill.fault is not None:
            found.add(("crash", cell.target.name))
            continue
        ckpt, at = kill.checkpoint_step, kill.kill_step
        found.add(("step", *key, cell.resume_mode, at, kill.extra_steps > 0))
        if boundaries & {ckpt - 1, ckpt, ckpt + 1, at}:
            found.add(("boundary", *key))
        if ckpt in buffered:
            found.add(("buffered", *key))
        if ckpt <= 1:
            found.add(("first", *key))
        if at >= cell.steps - 1:
            found.add(("last", *key))
        if kill.extra_steps:
            found.add(("unsaved", *key))
        if kill.rank is not None:
            found.add(("rank", *key))
        if kill.signal != SIGNAL_KILL:
            found.add(("term", *key))
        if kill.resume_world_size is not None:
            found.add(("elastic", *key, kill.resume_world_size))
        if kill.node is not None:
            found.add(("node", *key))
        if kill.rejoin is not None:
            found.add(("rejoin", *key))
        if kill.agent:
            found.add(("agent", *key))
    if len(cell.kills) > 1:
        found.add(("double", *key))
    return found


def cut(cells: Sequence[Cell], budget: int) -> Cut:
    """The cells of ``cells`` that reveal most within ``budget`` runs (:func:`order`), the rest left out."""
    paid: set[Hashable] = set()
    every: set[Hashable] = set()  # what the whole matrix pays, for its total
    kept: set[int] = set()
    runs = total = 0
    for index, cell in order(cells):
        total += _cost(cell, every)
        every |= _paid_by(cell)
        cost = _cost(cell, paid)
        if runs + cost > budget:
            continue  # a cheaper cell further down may still fit
        runs += cost
        paid |= _paid_by(cell)
        kept.add(index)
    return Cut([c for i, c in enumerate(cells) if i in kept], [c for i, c in enumerate(cells) if i not in kept],
               runs, total)


def order(cells: Sequence[Cell]) -> list[tuple[int, Cell]]:
    """(index in ``cells``, cell), most telling first: greedy by uncovered feature weight per added run."""
    remaining = {i: features(c) for i, c in enumerate(cells)}
    covered: set[tuple[Any, ...]] = set()
    paid: set[Hashable] = set()
    out = []
    while remaining:
        best = max(remaining, key=lambda i: (_weight(remaining[i] - covered) / _cost(cells[i], paid), -i))
        out.append((best, cells[best]))
        covered |= remaining.pop(best)
        paid |= _paid_by(cells[best])
    return out


def _weight(found: set[tuple[Any, ...]]) -> float:
    return sum(WEIGHTS[kind] for kind, *_ in found)


def _cost(cell: Cell, paid: set[Hashable]) -> int:
    """The runs ``cell`` adds once the items of ``paid`` (references, shared first runs, recorded saves)
    are paid for."""
    shared_first = cell.shares_prefix and ("first-run", cell.group) in paid
    return len(cell.kills) + (0 if shared_first else 1) + len(_paid_by(cell) - paid - {("first-run", cell.group)})


def _paid_by(cell: Cell) -> set[Hashable]:
    """The runs a cell makes that later cells reuse."""
    found: set[Hashable] = {("reference", cell.target.name, cell.case_id, cell.resume_mode)}
    if cell.shares_prefix:
        found.add(("first-run", cell.group))
    if any(k.fault is not None for k in cell.kills):
        found.add(("recorded-save", cell.target.name))
    return found


def _asked(cell: Cell, function: str) -> list[int]:
    """The target's ``boundaries`` or ``buffered`` steps of the cell's case (none when it has no such
    function; the matrix asked it already, so it answers)."""
    fn = getattr(cell.target, function, None)
    return [int(s) for s in fn(cell.case)] if fn else []
