"""Reference and interrupted runs of one cell, and their verdict. Usable from a script:

    engine = Engine(Path("/tmp/rc"), seed=0)
    result = engine.run_cell(cell)
    print(report.failure_text(result))
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_resume_check import events as ev
from pytest_resume_check import starter
from pytest_resume_check import supervisor as sv
from pytest_resume_check.faults import CRASH, INJECTED, POWER, RECORD, FaultPlan, FileOp, apply_after_kill
from pytest_resume_check.matrix import Cell, case_id
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, KillSpec, RunPlan
from pytest_resume_check.targets import Target
from pytest_resume_check.verdict import Finding, Verdict, judge, judge_reference


@dataclass
class Reference:
    """The uninterrupted run of a case (run twice to prove it is deterministic)."""

    record: sv.RunRecord
    findings: list[Finding]

    @property
    def digests(self) -> dict[int, str]:
        """State digests the reference reported, by step (empty if the target reports none)."""
        return {e.step: e.text for e in self.record.events if e.kind == ev.DIGEST and e.step and e.text}


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
                 isolation: str | None = None, check_determinism: bool = True, share: bool = True):
        self.root = Path(root)
        self.seed = seed
        self.hang_timeout = hang_timeout
        self.isolation = isolation
        self.check_determinism = check_determinism
        self.share = share
        self.steps_executed = 0
        self.runs_started = 0
        self._references: dict[tuple[str, str], Reference] = {}
        self._groups: dict[tuple[str, str, str], list[int]] = {}
        self._prefixes: dict[tuple[str, str, str], _Prefix | None] = {}
        self.root.mkdir(parents=True, exist_ok=True)

    def _isolation(self, target: Target) -> str:
        return self.isolation or target.isolation

    def plan(self, target: Target, case: Mapping[str, Any], workdir: Path, index: int, *,
             resume_mode: str = RESUME_AUTO, resume_path: str | None = None, kill: KillSpec | None = None,
             checkpoint_steps: Sequence[int] = (), is_resume: bool = False, out: str = "out",
             converge: Mapping[int, str] | None = None, pause_steps: Sequence[int] = (),
             faults: FaultPlan | None = None) -> RunPlan:
        """A plan for one run of ``target`` whose files live under ``workdir``."""
        ckpt = workdir / out
        ckpt.mkdir(parents=True, exist_ok=True)
        if kill is not None and kill.checkpoint_step:
            checkpoint_steps = (*checkpoint_steps, kill.checkpoint_step)
        return RunPlan(
            target_name=target.name, target_ref=target.ref, case=dict(case), seed=self.seed,
            checkpoint_dir=str(ckpt), log_path=str(workdir / f"run{index}.log"),
            resume_mode=resume_mode, resume_path=resume_path, checkpoint_steps=frozenset(checkpoint_steps),
            kill=kill, is_resume=is_resume, converge=dict(converge or {}), pause_steps=frozenset(pause_steps),
            faults=faults if faults is not None else (kill.fault if kill is not None else None),
        )

    def run(self, plan: RunPlan, target: Target) -> sv.RunRecord:
        """One supervised child run."""
        return self._supervise(plan, target)

    def _supervise(self, plan: RunPlan, target: Target, on_pause: Any = None) -> sv.RunRecord:
        starter.add_preload(target.preload)
        record = sv.supervise(plan, isolation=self._isolation(target), hang_timeout=self.hang_timeout,
                              on_pause=on_pause)
        self.runs_started += 1
        self.steps_executed += record.steps_run
        return record

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
                    resume_mode: str, workdir: Path, prior_checkpoints: Sequence[int] = (),
                    first: tuple[sv.RunRecord, str | None] | None = None) -> list[sv.RunRecord]:
        """Run, kill at each of ``kills`` in turn, resume from what is on disk, finish.

        ``first``: the first run already happened (a shared prefix): its record and the checkpoint
        folder it published last. The final run stops early once its state digest equals the
        reference's (targets that report digests only).
        """
        runs: list[sv.RunRecord] = []
        latest: str | None = None
        converge = self.reference(target, case).digests if self.share else {}
        start = 0
        if first is not None:
            runs.append(first[0])
            latest, start = first[1], 1
        for index in range(start, len(kills) + 1):
            kill = kills[index] if index < len(kills) else None
            extra = dict(checkpoint_steps=prior_checkpoints if index == 0 else (),
                         converge=converge if kill is None else None)
            if resume_mode == RESUME_PATH:
                mode = RESUME_PATH if latest else (RESUME_AUTO if index == 0 else RESUME_DISABLED)
                plan = self.plan(target, case, workdir, index, resume_mode=mode, resume_path=latest,
                                 kill=kill, is_resume=index > 0, out=f"out{index}", **extra)
            else:
                plan = self.plan(target, case, workdir, index, resume_mode=resume_mode, kill=kill,
                                 is_resume=index > 0, **extra)
            record = self.run(plan, target)
            runs.append(record)
            if kill is not None and kill.fault is not None:
                if record.outcome == sv.KILLED:
                    # What a power loss or a torn write leaves on disk, applied after the kill.
                    extra = next((e.extra for e in record.events if e.kind == ev.KILL_READY), {})
                    record.notes.extend(apply_after_kill(plan.checkpoint_dir, extra))
                elif not (record.outcome == sv.RAISED and INJECTED in (record.error or "")):
                    break  # the run did not fail where the fault was injected: judged as is
            elif record.outcome != sv.KILLED or kill is None:
                break
            if record.published:
                latest = record.published[-1][1] or latest
        return runs

    def record_ops(self, target: Target, case: Mapping[str, Any], step: int, prior: int) -> list[FileOp]:
        """The file operations of the save of checkpoint ``step`` (after one of ``prior``), in order."""
        workdir = self.root / _safe(target.name) / _safe(case_id(case)) / f"record-save{step}"
        if workdir.exists():
            shutil.rmtree(workdir)
        plan = self.plan(target, case, workdir, 0, kill=KillSpec(step), checkpoint_steps=(prior,),
                         faults=FaultPlan(step, RECORD))
        record = self.run(plan, target)
        if record.outcome != sv.KILLED:
            raise RuntimeError(f"recording the save of step {step} of {target.name} failed: {record.describe()}"
                               f"; see {plan.log_path}")
        return [FileOp(e.extra["index"], e.text or "", e.path or "", e.extra.get("target"))
                for e in record.events if e.kind == ev.FILE_OP]

    def register(self, cells: Sequence[Cell]) -> None:
        """Tell the engine the whole matrix, so cells that differ only in their single kill step
        share one first run (see :meth:`_shared_first_run`)."""
        for cell in cells:
            if cell.shares_prefix:
                steps = self._groups.setdefault(cell.group, [])
                for step in (*cell.prior_checkpoints, cell.kills[0].checkpoint_step):
                    if step not in steps:
                        steps.append(step)

    def _prefix(self, cell: Cell) -> _Prefix | None:
        """Run the group's first run once: checkpoint at every kill step of the group and copy the
        checkpoint directory at each (the child waits meanwhile), so each cell later gets exactly
        the files a run killed right there would have left."""
        if cell.group in self._prefixes:
            return self._prefixes[cell.group]
        steps = sorted(self._groups.get(cell.group, ()))
        workdir = self.root / _safe(cell.target.name) / _safe(cell.case_id) / _safe(f"{cell.resume_mode}-prefix")
        if workdir.exists():
            shutil.rmtree(workdir)
        out = "out0" if cell.resume_mode == RESUME_PATH else "out"
        plan = self.plan(cell.target, cell.case, workdir, 0, resume_mode=RESUME_AUTO, kill=KillSpec(steps[-1]),
                         checkpoint_steps=steps, pause_steps=steps, out=out)
        live = Path(plan.checkpoint_dir)

        def snapshot(step: int) -> None:
            shutil.copytree(live, workdir / f"snapshot-{step}", symlinks=True)

        record = self._supervise(plan, cell.target, on_pause=snapshot)
        prefix = _Prefix(record, workdir, live) if record.outcome == sv.KILLED else None
        self._prefixes[cell.group] = prefix
        return prefix

    def _shared_first_run(self, cell: Cell, workdir: Path) -> tuple[sv.RunRecord, str | None] | None:
        """The first run of ``cell`` cut from its group's prefix run, with its files copied into
        ``workdir``; None when the cell cannot share (then it runs on its own)."""
        if not (self.share and cell.shares_prefix and cell.group in self._groups):
            return None
        prefix = self._prefix(cell)
        step = cell.kills[0].checkpoint_step
        if prefix is None or not (prefix.workdir / f"snapshot-{step}").exists():
            return None
        out = workdir / ("out0" if cell.resume_mode == RESUME_PATH else "out")
        shutil.copytree(prefix.workdir / f"snapshot-{step}", out, symlinks=True)
        events, published = [], None
        for event in prefix.record.events:
            if event.kind == ev.PAUSED:
                continue
            if event.path and event.path.startswith(str(prefix.live)):
                event = replace(event, path=str(out) + event.path[len(str(prefix.live)):])
            events.append(event)
            if event.kind == ev.CHECKPOINT and event.step == step:
                published = event.path
                break
        kill = cell.kills[0]
        events.append(ev.Event(ev.KILL_READY, text=kill.describe()))
        plan = replace(prefix.record.plan, checkpoint_dir=str(out), log_path=str(prefix.workdir / "run0.log"),
                       kill=kill, checkpoint_steps=frozenset((*cell.prior_checkpoints, step)), pause_steps=frozenset())
        return sv.RunRecord(plan, events, sv.KILLED, prefix.record.exitcode, None, 0.0,
                            prefix.record.hang_timeout, prefix.record.pid, prefix.record.isolation), published

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
        first = self._shared_first_run(cell, workdir)
        runs = self.interrupted(cell.target, cell.case, cell.kills, cell.resume_mode, workdir,
                                cell.prior_checkpoints, first)
        verdict = judge(ref.record, runs, cell.target.contract, newest_complete(cell, runs))
        return CellResult(cell, verdict, ref.record, runs, workdir, self.seed)



def newest_complete(cell: Cell, runs: Sequence[sv.RunRecord]) -> int | None:
    """For a fault cell: the newest checkpoint whose save completed (and was durable) before the
    fault. A resume from anything older re-trains saved work. None for other cells."""
    kill = cell.kills[0]
    fault = kill.fault
    if fault is None or not runs:
        return None
    before = [step for step, _ in runs[0].published if step < kill.checkpoint_step]
    previous = max(before, default=0)
    complete = fault.total is not None and fault.op == fault.total
    if fault.mode == CRASH and complete:
        return kill.checkpoint_step
    if fault.mode == POWER and complete and not any(n.startswith("not durable") for n in runs[0].notes):
        return kill.checkpoint_step
    return previous


@dataclass
class _Prefix:
    """The shared first run of a group: its record, its folder (with snapshot-N copies) and the
    checkpoint directory it wrote to."""

    record: sv.RunRecord
    workdir: Path
    live: Path


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=+," else "_" for c in text)[:120]
