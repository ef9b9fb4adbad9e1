"""In-flight inputs: what the async trainer submitted for rollout but has not trained on yet.

An async step trains only on the rollouts that finished by its end; the others are *carried over* to
later steps. Such an input has left the loader and the buffer, so neither the loader state nor the
buffered tail describes it: without a record of its own, a resume would never train on it.
:class:`InFlightInputs` is that record. For each carried-over group (the rollouts of one input) it keeps
the input's original row as the trainer took it from the input stream, before the rollout engine
transforms it in any way, with its id, input epoch and the step it was first submitted in. A resume
resubmits these rows first, in their original order and with their original submission step (see
:meth:`InFlightInputs.resubmissions`), so the rollout engine transforms each input exactly once per run
and a deterministic engine finishes each rollout at the same step as the uninterrupted run.

``load_state_dict`` is eager: the record holds exactly the saved groups afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentlightning.verl.inputs import Batch, batch_len, concat_batches, select_rows

# Keys of InFlightInputs.state_dict(); each list has one entry per carried-over group, oldest first.
STATE_ROWS = "rows"
STATE_INPUT_IDS = "input_ids"
STATE_INPUT_EPOCHS = "input_epochs"
STATE_SUBMITTED_STEPS = "submitted_steps"
STATE_KEYS = (STATE_ROWS, STATE_INPUT_IDS, STATE_INPUT_EPOCHS, STATE_SUBMITTED_STEPS)


class InFlightRecordError(RuntimeError):
    """The rollout engine returned an input the trainer never submitted (or returned it twice)."""


@dataclass(frozen=True)
class InFlightGroup:
    """The rollouts of one input that are still running: its original row (a batch of one input)."""

    input_id: int
    epoch: int
    submitted_step: int
    row: Batch


@dataclass(frozen=True)
class Resubmission:
    """Consecutive in-flight groups sharing an input epoch and a submission step: one ``submit`` call."""

    batch: Batch
    ids: list[int]
    epoch: int
    step: int


def _own_row(batch: Batch, index: int) -> Batch:
    # A private deep copy: an engine that transforms rows in place (a list of dicts, an object array of
    # dicts) must not change the record, or a checkpoint would store - and a resume transform again - an
    # already transformed input.
    row = select_rows(batch, [index])
    return {key: value if isinstance(value, torch.Tensor) else copy.deepcopy(value) for key, value in row.items()}


class InFlightInputs:
    """The carried-over groups of an async trainer, in submission order (``Stateful``)."""

    def __init__(self) -> None:
        self._groups: list[InFlightGroup] = []

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def groups(self) -> list[InFlightGroup]:
        """The in-flight groups, oldest submission first."""
        return list(self._groups)

    def clear(self) -> None:
        """Forget every group (a resume from a checkpoint that did not record them)."""
        self._groups = []

    def add(self, batch: Batch, ids: Sequence[int], epoch: int, step: int) -> None:
        """Record the inputs of ``batch`` (ids ``ids``) as submitted in ``step`` with input epoch ``epoch``."""
        if len(ids) != batch_len(batch):
            raise ValueError(f"{len(ids)} ids for a batch of {batch_len(batch)} inputs")
        for index, input_id in enumerate(ids):
            self._groups.append(InFlightGroup(int(input_id), int(epoch), int(step), _own_row(batch, index)))

    def complete(self, ids: Sequence[int], epochs: Sequence[int]) -> None:
        """Drop the groups whose rollouts finished (each ``(id, epoch)`` pair matches its oldest group)."""
        for input_id, epoch in zip(ids, epochs, strict=True):
            for position, group in enumerate(self._groups):
                if group.input_id == int(input_id) and group.epoch == int(epoch):
                    del self._groups[position]
                    break
            else:
                raise InFlightRecordError(
                    f"the rollout engine returned input {input_id} (input epoch {epoch}), which is not in "
                    "flight: an engine must return each submitted input exactly once, and reset() must drop "
                    "everything submitted before a resume"
                )

    def resubmissions(self) -> list[Resubmission]:
        """The groups as ``submit`` calls that recreate them in order: one per run of groups that share
        an input epoch and a submission step (a run is a subset of one original submission, so its rows
        concatenate exactly as the original batch did)."""
        calls: list[Resubmission] = []
        run: list[InFlightGroup] = []
        for group in [*self._groups, None]:
            if run and (group is None or (group.epoch, group.submitted_step) != (run[0].epoch, run[0].submitted_step)):
                batch = concat_batches([g.row for g in run])
                calls.append(Resubmission(batch, [g.input_id for g in run], run[0].epoch, run[0].submitted_step))
                run = []
            if group is not None:
                run.append(group)
        return calls

    def state_dict(self) -> dict[str, Any]:
        """Every group's original row, id, input epoch and first submission step, oldest first."""
        return {
            STATE_ROWS: [dict(g.row) for g in self._groups],
            STATE_INPUT_IDS: [g.input_id for g in self._groups],
            STATE_INPUT_EPOCHS: [g.epoch for g in self._groups],
            STATE_SUBMITTED_STEPS: [g.submitted_step for g in self._groups],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the record with the groups saved by :meth:`state_dict`."""
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise KeyError(f"in-flight inputs state lacks {missing}")
        columns = [list(state[key]) for key in STATE_KEYS]
        if len({len(column) for column in columns}) != 1:
            raise ValueError(f"in-flight inputs state has lists of different lengths: {[len(c) for c in columns]}")
        groups = []
        for row, input_id, epoch, step in zip(*columns, strict=True):
            if batch_len(row) != 1:
                raise ValueError(f"in-flight row of input {input_id} holds {batch_len(row)} inputs, not 1")
            groups.append(InFlightGroup(int(input_id), int(epoch), int(step), dict(row)))
        self._groups = groups

