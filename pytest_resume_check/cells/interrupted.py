"""One cell's interrupted job: run, kill at each planned point, resume from what is on disk, finish.

After a kill inside a save, the disk is damaged as the fault says (power loss, torn file) before the
next run starts. :func:`newest_complete` says which checkpoint such a resume is entitled to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import INJECTED, MODE_CRASH, MODE_POWER, apply_after_kill, merge_kill_extras
from pytest_resume_check.records.plan import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, KillSpec
from pytest_resume_check.records.results import Outcome, RunRecord, split_restarts
from pytest_resume_check.targets import Target


def run_interrupted(runner: Runner, target: Target, case: Mapping[str, Any], kills: Sequence[KillSpec],
                    resume_mode: str, workdir: Path, prior_checkpoints: Sequence[int] = (),
                    first: tuple[RunRecord, str | None] | None = None,
                    converge: Mapping[int, Mapping[str, str]] | None = None,
                    state_reference: str | None = None,
                    converge_inputs: Mapping[int, str] | None = None) -> list[RunRecord]:
    """The runs of one interrupted job, first to last.

    ``first``: the first run already happened (a shared first run): its record and the checkpoint it
    published last. Resumed runs report their state. ``converge``: the reference's state digests; the
    final run stops once its state equals the reference's at the same step, and it took the reference's
    inputs at each of its steps (``converge_inputs``). ``state_reference``: the reference's state values
    (targets compared under a tolerance).
    """
    runs: list[RunRecord] = []
    latest: str | None = None
    world = target.world_size
    start = 0
    if first is not None:
        runs.append(first[0])
        latest, start = first[1], 1
    for index in range(start, len(kills) + 1):
        kill = kills[index] if index < len(kills) else None
        if index and (resized := kills[index - 1].resume_world_size) is not None:
            world = resized  # an elastic resume: this run has another world size
        mode, path = resume_mode, None
        if resume_mode == RESUME_PATH:  # the first run starts fresh, later ones name the last checkpoint
            mode = RESUME_PATH if latest else (RESUME_AUTO if index == 0 else RESUME_DISABLED)
            path = latest
        plan = runner.plan(target, case, workdir, index, out=Layout.out(workdir, resume_mode, index),
                           resume_mode=mode, resume_path=path, kill=kill, is_resume=index > 0,
                           checkpoint_steps=prior_checkpoints if index == 0 else (),
                           converge=converge if kill is None else None,
                           converge_inputs=converge_inputs if kill is None else None, report_state=index > 0,
                           state_reference_dir=state_reference if index > 0 else None, world_size=world)
        record = runner.run(plan, target)
        runs.extend(split_restarts(record))  # torchrun's restarts within the run are resumes too
        if kill is not None and kill.fault is not None:
            if record.outcome == Outcome.KILLED:
                ready = [(e.rank, e.extra) for e in record.events if e.kind == ev.KILL_READY]  # every lane's
                lost = kill.fault.lost_ranks(plan.nproc_per_node)  # a node's power alone: its ranks' writes
                record.damage = apply_after_kill(plan.checkpoint_dir, merge_kill_extras(ready, lost))
            elif not (record.outcome == Outcome.RAISED and INJECTED in (record.error or "")):
                break  # the run did not fail where the fault was injected: judged as is
        elif record.outcome != Outcome.KILLED or kill is None:
            break
        if record.published:
            latest = record.published[-1][1] or latest
    return runs


def newest_complete(cell: Cell, runs: Sequence[RunRecord]) -> int | None:
    """For a fault cell: the newest checkpoint whose save completed (and was durable) before the
    fault. A resume from anything older re-trains saved work. None for other cells."""
    kill = cell.kills[0]
    fault = kill.fault
    if fault is None or not runs:
        return None
    previous = max((step for step, _ in runs[0].published if step < kill.checkpoint_step), default=0)
    if fault.mode == MODE_CRASH and fault.completes_save:
        return kill.checkpoint_step
    if fault.mode == MODE_POWER and fault.completes_save and not runs[0].damage.not_durable:
        return kill.checkpoint_step
    return previous
