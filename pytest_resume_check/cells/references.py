"""The oracle: the uninterrupted run of each (target, case), run twice to prove it is deterministic,
computed once per session and shared by every cell of the case."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pytest_resume_check.judge.verdict import judge_reference
from pytest_resume_check.process.layout import REPEAT_OUT, STATE_VALUES, Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records.names import case_id
from pytest_resume_check.records.plan import RESUME_DISABLED
from pytest_resume_check.records.results import Finding, Outcome, RunRecord
from pytest_resume_check.targets import Target


@dataclass
class Reference:
    """The uninterrupted run of a case and what is wrong with it (empty: usable as the oracle)."""

    record: RunRecord
    findings: list[Finding]
    #: Tolerance mode: the folder of the reference's state values, which resumed runs compare with.
    values_dir: str | None = None

    @cached_property
    def converge(self) -> dict[int, dict[str, str]]:
        """The reference's component digests by step, where a resumed run may stop early (empty if the
        target reports no state, or compares it under a tolerance: close is not equal, so no early stop)."""
        return {step: dict(state.digests) for step, state in self.record.states.items() if state.digests}


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
        if self.check_determinism and first.outcome == Outcome.DONE:
            plan = self.runner.plan(target, case, workdir, 1, out=workdir / REPEAT_OUT, resume_mode=RESUME_DISABLED,
                                    report_state=True, state_reference_dir=values_dir)
            second = self.runner.run(plan, target)
        findings = judge_reference(first, second, int(target.steps(case)), target.contract)
        return Reference(first, findings, values_dir)
