"""Ordered ledgers of consumed (or trained) inputs, and the composite ledger of an interrupted run.

The composite ledger is what the interrupted job as a whole trained on: the events of each run up to
the checkpoint the *next* run actually resumed from (as that run reported it), then the next run's
events. Work done after that checkpoint was lost with the kill and is redone by the next run, so it
does not count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_resume_check.records import events as ev

CONSUMED = ev.CONSUMED
TRAINED = ev.TRAINED


def step_inputs_digest(entries: Iterable[tuple[Any, int]]) -> str:
    """One digest of the inputs one step consumed, as (id, epoch) pairs in any order: the early stop's check
    that a resumed run took the same inputs at each of its steps as the uninterrupted run, and takes the
    same ones next, computed alike in the child and from the reference's events."""
    text = json.dumps(sorted(json.dumps([i, int(epoch)]) for i, epoch in entries))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """One input in a ledger: its id, the step that took it, the epoch it was labelled with, the
    index of the run (0 = first run) that reported it, and the rank that took it (None: a one-process
    run)."""

    id: Any
    step: int
    epoch: int
    run: int = 0
    rank: int | None = None


class Ledger(tuple):
    """An ordered, immutable sequence of :class:`Entry`."""

    @classmethod
    def from_events(cls, events: Iterable[ev.Event], kind: str = CONSUMED, run: int = 0) -> Ledger:
        """The ledger of one run: every ``kind`` event's ids, in the order they were reported. In a
        multi-rank run the global ledger: step by step, rank 0's inputs of the step, then rank 1's, ...
        (the order in which the ranks' reports reached the harness means nothing)."""
        entries = [Entry(i, e.step or 0, e.epoch or 0, run, e.rank) for e in events if e.kind == kind for i in e.ids]
        if any(e.rank for e in entries):
            entries.sort(key=lambda e: (e.step, e.rank or 0))  # stable: each rank's own order is kept
        return cls(entries)

    @property
    def ids(self) -> list[Any]:
        return [e.id for e in self]

    def up_to_step(self, step: int) -> Ledger:
        """Entries taken in steps ``<= step``: what a checkpoint of ``step`` has behind it."""
        return Ledger(e for e in self if e.step <= step)

    @property
    def ranks(self) -> list[int]:
        """The ranks that took inputs (empty for a one-process run)."""
        return sorted({e.rank for e in self if e.rank is not None})

    def of_rank(self, rank: int) -> Ledger:
        """What one rank took: its own ledger."""
        return Ledger(e for e in self if (e.rank or 0) == rank)

    def to_json(self) -> list[list[Any]]:
        """Rows ``[id, step, epoch, run]``, with the rank as a fifth item in a multi-rank run."""
        if self.ranks:
            return [[e.id, e.step, e.epoch, e.run, e.rank or 0] for e in self]
        return [[e.id, e.step, e.epoch, e.run] for e in self]


class ResumeReportMissing(Exception):
    """A resumed run never reported which checkpoint it restored."""


def compose(runs: Sequence[Sequence[ev.Event]], kind: str = CONSUMED) -> tuple[Ledger, list[int]]:
    """The composite ledger of consecutive runs, and the step each later run resumed from.

    ``runs[i]`` are the events of run i. Each run after the first must have reported ``resumed``;
    its step (0 = started fresh) cuts the ledger built so far.
    """
    composite = Ledger.from_events(runs[0], kind, 0) if runs else Ledger()
    resumed_from: list[int] = []
    for index, events in enumerate(runs[1:], start=1):
        step = next((e.step for e in events if e.kind == ev.RESUMED), None)
        if step is None:
            raise ResumeReportMissing(
                f"run {index + 1} never reported which checkpoint it resumed from; call "
                "run.resumed(step, path) once after loading (step 0 when starting fresh)"
            )
        resumed_from.append(step)
        composite = Ledger(composite.up_to_step(step) + Ledger.from_events(events, kind, index))
    return composite, resumed_from
