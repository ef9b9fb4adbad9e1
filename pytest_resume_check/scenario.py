"""Reference and interrupted runs of one cell, and their verdict. Usable from a script:

    engine = Engine(Path("/tmp/rc"), seed=0)
    result = engine.run_cell(cell)
    print(report.failure_text(result))
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_resume_check import starter
from pytest_resume_check import supervisor as sv
from pytest_resume_check.matrix import Cell, case_id
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, KillSpec, RunPlan
from pytest_resume_check.targets import Target
from pytest_resume_check.verdict import Finding, Verdict, judge, judge_reference


@dataclass
class Reference:
    """The uninterrupted run of a case (run twice to prove it is deterministic)."""

    record: sv.RunRecord
    findings: list[Finding]


@dataclass
class CellResult:
    """Everything about one judged cell: the verdict, all runs, and where their files are."""

    cell: Cell
    verdict: Verdict
    reference: sv.RunRecord
    runs: list[sv.RunRecord] = field(default_factory=list)
    workdir: Path | None = None
    seed: int | None = None

    @property
    def passed(self) -> bool:
        return self.verdict.passed


class Engine:
    """Runs cells of targets. References are computed once per (target, case) and reused."""

    def __init__(self, root: Path, seed: int, hang_timeout: float = sv.DEFAULT_HANG_TIMEOUT,
                 isolation: str | None = None, check_determinism: bool = True):
        self.root = Path(root)
        self.seed = seed
        self.hang_timeout = hang_timeout
        self.isolation = isolation
        self.check_determinism = check_determinism
        self._references: dict[tuple[str, str], Reference] = {}
        self.root.mkdir(parents=True, exist_ok=True)

    def _isolation(self, target: Target) -> str:
        return self.isolation or target.isolation

    def plan(self, target: Target, case: Mapping[str, Any], workdir: Path, index: int, *,
             resume_mode: str = RESUME_AUTO, resume_path: str | None = None, kill: KillSpec | None = None,
             checkpoint_steps: Sequence[int] = (), is_resume: bool = False, out: str = "out") -> RunPlan:
        """A plan for one run of ``target`` whose files live under ``workdir``."""
        ckpt = workdir / out
        ckpt.mkdir(parents=True, exist_ok=True)
        if kill is not None and kill.checkpoint_step:
            checkpoint_steps = (*checkpoint_steps, kill.checkpoint_step)
        return RunPlan(
            target_name=target.name, target_ref=target.ref, case=dict(case), seed=self.seed,
            checkpoint_dir=str(ckpt), log_path=str(workdir / f"run{index}.log"),
            resume_mode=resume_mode, resume_path=resume_path, checkpoint_steps=frozenset(checkpoint_steps),
            kill=kill, is_resume=is_resume,
        )

    def run(self, plan: RunPlan, target: Target) -> sv.RunRecord:
        """One supervised child run."""
        starter.add_preload(target.preload)
        return sv.supervise(plan, isolation=self._isolation(target), hang_timeout=self.hang_timeout)

    def reference(self, target: Target, case: Mapping[str, Any]) -> Reference:
        """The uninterrupted reference of a case (cached)."""
        key = (target.name, case_id(case))
        if key not in self._references:
            workdir = self.root / _safe(target.name) / _safe(case_id(case)) / "reference"
            if workdir.exists():
                shutil.rmtree(workdir)
            first = self.run(self.plan(target, case, workdir, 0, resume_mode=RESUME_DISABLED), target)
            second = None
            if self.check_determinism and first.outcome == sv.DONE:
                second = self.run(self.plan(target, case, workdir, 1, resume_mode=RESUME_DISABLED,
                                            out="out-repeat"), target)
            findings = judge_reference(first, second, int(target.steps(case)), target.contract)
            self._references[key] = Reference(first, findings)
        return self._references[key]

    def interrupted(self, target: Target, case: Mapping[str, Any], kills: Sequence[KillSpec],
                    resume_mode: str, workdir: Path) -> list[sv.RunRecord]:
        """Run, kill at each of ``kills`` in turn, resume from what is on disk, finish."""
        runs: list[sv.RunRecord] = []
        latest: str | None = None
        for index in range(len(kills) + 1):
            kill = kills[index] if index < len(kills) else None
            if resume_mode == RESUME_PATH:
                mode = RESUME_PATH if latest else (RESUME_AUTO if index == 0 else RESUME_DISABLED)
                plan = self.plan(target, case, workdir, index, resume_mode=mode, resume_path=latest,
                                 kill=kill, is_resume=index > 0, out=f"out{index}")
            else:
                plan = self.plan(target, case, workdir, index, resume_mode=resume_mode, kill=kill,
                                 is_resume=index > 0)
            record = self.run(plan, target)
            runs.append(record)
            if record.outcome != sv.KILLED or kill is None:
                break
            if record.published:
                latest = record.published[-1][1] or latest
        return runs

    def run_cell(self, cell: Cell) -> CellResult:
        """Reference (cached), interrupted runs, verdict."""
        ref = self.reference(cell.target, cell.case)
        workdir = self.root / _safe(cell.target.name) / _safe(cell.case_id) / _safe(
            f"{cell.resume_mode}-{cell.kill_id}")
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        if ref.findings:
            return CellResult(cell, Verdict(findings=list(ref.findings)), ref.record, [], workdir, self.seed)
        runs = self.interrupted(cell.target, cell.case, cell.kills, cell.resume_mode, workdir)
        verdict = judge(ref.record, runs, cell.target.contract)
        return CellResult(cell, verdict, ref.record, runs, workdir, self.seed)

    def preload(self, targets: Sequence[Target]) -> None:
        """Ask the fork server to preload every target's modules (call before the first run)."""
        for target in targets:
            starter.add_preload(target.preload)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=+," else "_" for c in text)[:120]
