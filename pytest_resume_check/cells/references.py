"""The oracle: the uninterrupted run of each (target, case), run twice to prove it is deterministic,
computed once per session and shared by every cell of the case.

A zero-change program that declares no commit point may have one all the same: its first uninterrupted run
tells (:func:`recognised_commit_of`). Then every later run of the case follows that commit point, the repeat
first: it is the reference the cells are judged against, and the first run is the repeat it is compared with
(the program does the same either way; only where the watcher publishes differs). Decided from one finished run
and never from a killed one, it cannot depend on when a kill came.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pytest_resume_check.judge.verdict import judge_reference
from pytest_resume_check.process.layout import REPEAT_OUT, STATE_VALUES, Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.commits import recognised_commit
from pytest_resume_check.records.ledger import step_inputs_digest
from pytest_resume_check.records.names import case_id
from pytest_resume_check.records.plan import EARLY_STOP_ANY, EARLY_STOP_EPOCH, EARLY_STOP_NEVER, RESUME_DISABLED
from pytest_resume_check.records.results import Finding, Outcome, RunRecord
from pytest_resume_check.records.state import CAPTURED, drawn_after
from pytest_resume_check.targets import Target


@dataclass
class Reference:
    """The uninterrupted run of a case and what is wrong with it (empty: usable as the oracle)."""

    record: RunRecord
    findings: list[Finding]
    #: Tolerance mode: the folder of the reference's state values, which resumed runs compare with.
    values_dir: str | None = None

    #: The target's ``early_stop`` (records.plan.EARLY_STOPS).
    early_stop: str = EARLY_STOP_EPOCH

    @cached_property
    def converge(self) -> dict[int, dict[str, str]]:
        """The reference's component digests at each step where a resumed run may stop early: under the
        target's ``early_stop``, at the steps that end an epoch (``epoch``) or at every step (``any``).
        A captured generator is among them only if the reference still draws from it after that step.
        Empty (no early stop) when the target reports no state, compares it under a tolerance (close is
        not equal), reports final outputs (the last run must get to them) or says ``never``."""
        record = self.record
        states = {step: dict(state.digests) for step, state in record.states.items() if state.digests}
        if self.early_stop == EARLY_STOP_NEVER or record.finals or any(s.compared for s in record.states.values()):
            return {}
        reported = {step for step, state in states.items() if any(name not in CAPTURED for name in state)}
        steps = reported if self.early_stop == EARLY_STOP_ANY else reported & epoch_ends(record)
        return {step: {name: digest for name, digest in states[step].items()
                       if name not in CAPTURED or drawn_after(states, name, step)} for step in sorted(steps)}


    @cached_property
    def converge_inputs(self) -> dict[int, str]:
        """The reference's consumed inputs of each step up to the one after its last :attr:`converge` step,
        one digest a step: a resumed run may stop early only where it took the same inputs at each of its
        steps and takes the next step's inputs next, so a resume that replays a batch (and so has a longer
        epoch than the reference) runs on to show it."""
        converge = self.converge
        if not converge:
            return {}
        last = max(converge)
        steps: dict[int, list[tuple[object, int]]] = {step: [] for step in range(1, last + 1)}
        for e in self.record.events:  # the step after the last is there only if the reference took inputs in it
            if e.kind == ev.CONSUMED and not e.rank and e.step is not None and e.step <= last + 1:
                steps.setdefault(e.step, []).extend((i, e.epoch or 0) for i in e.ids)
        return {step: step_inputs_digest(entries) for step, entries in steps.items()}


def epoch_ends(record: RunRecord) -> set[int]:
    """Steps after which the run's next step takes inputs of a later epoch only (the loader started a new
    epoch), from its consumed inputs."""
    epochs: dict[int, list[int]] = {}
    for e in record.events:
        if e.kind == ev.CONSUMED and e.step is not None and e.epoch is not None:
            epochs.setdefault(e.step, []).append(e.epoch)
    return {step for step in epochs if step + 1 in epochs and min(epochs[step + 1]) > max(epochs[step])}


class References:
    """Reference runs of a session, cached by (target, case)."""

    def __init__(self, runner: Runner, layout: Layout, check_determinism: bool = True):
        self.runner = runner
        self.layout = layout
        self.check_determinism = check_determinism
        self._cache: dict[tuple[str, str], Reference] = {}

    def made(self, target: Target, case: Mapping[str, Any]) -> bool:
        """Whether the reference of this case is made already (in this process)."""
        return (target.name, case_id(case)) in self._cache

    def get(self, target: Target, case: Mapping[str, Any]) -> Reference:
        key = (target.name, case_id(case))
        if key not in self._cache:
            self._cache[key] = self._compute(target, case)
        return self._cache[key]

    def _compute(self, target: Target, case: Mapping[str, Any]) -> Reference:
        workdir = self.layout.fresh(self.layout.reference(target.name, case_id(case)))
        values_dir: str | None = None
        if target.state_tolerance is not None:
            values = workdir / STATE_VALUES
            values.mkdir()
            values_dir = str(values)
        first = self.runner.run(self.runner.plan(target, case, workdir, 0, resume_mode=RESUME_DISABLED,
                                                 report_state=True, state_values_dir=values_dir), target)
        second = None
        recognising = self.recognisable(target) and first.outcome == Outcome.DONE
        commit = recognised_commit_of(first) if recognising else None
        if commit is not None:
            self.runner.recognise(target, case, commit)
            plan = self.runner.plan(target, case, workdir, 1, out=workdir / REPEAT_OUT, resume_mode=RESUME_DISABLED,
                                    report_state=True, state_values_dir=values_dir)
            observed, first = first, self.runner.run(plan, target)
            second = observed if self.check_determinism else None
        elif self.check_determinism and first.outcome == Outcome.DONE:
            plan = self.runner.plan(target, case, workdir, 1, out=workdir / REPEAT_OUT, resume_mode=RESUME_DISABLED,
                                    report_state=True, state_reference_dir=values_dir)
            second = self.runner.run(plan, target)
        findings = judge_reference(first, second, int(target.steps(case)), target.contract)
        return Reference(first, findings, values_dir, target.early_stop)

    @staticmethod
    def recognisable(target: Target) -> bool:
        """Whether runs of ``target`` may follow a commit point its reference recognises (then the reference
        must come before any other run of the case)."""
        command = target.command
        return command is not None and command.checkpoints is not None and command.commit is None


def recognised_commit_of(record: RunRecord) -> str | None:
    """The commit point of a zero-change program's finished run that declared none
    (:func:`~pytest_resume_check.records.commits.recognised_commit`), from what its watcher reported: the
    checkpoints published, the pointers and the folders filled in place."""
    root = os.path.realpath(record.plan.checkpoint_dir)
    published = [os.path.relpath(path, root) for _, path in record.published if path]
    pointers = [(str(e.extra.get(ev.EXTRA_FILE)), os.path.relpath(e.path, root))
                for e in record.events if e.kind == ev.POINTER and e.path]
    filled = {os.path.relpath(e.path, root) for e in record.events if e.kind == ev.IN_PLACE and e.path}
    return recognised_commit(published, pointers, filled)
