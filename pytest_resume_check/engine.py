"""Run and judge cells of targets. Usable from a script::

    engine = Engine(Path("/tmp/rc"), seed=0)
    result = engine.run_cell(cell)
    print(report.failure_text(result))

The engine puts together the parts that each own one job: :class:`~.fork_server.ForkServer` (the server
its runs are forked from, one per engine), :class:`~.runner.Runner` (plans and supervised runs),
:class:`~.layout.Layout` (folders), :class:`~.references.References` (the oracle),
:class:`~.shared_runs.SharedFirstRuns` (first runs shared by a group of cells) and
:func:`~.interrupted.run_interrupted` (one cell's kills and resumes).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_resume_check.cells.interrupted import newest_complete, run_interrupted
from pytest_resume_check.cells.matrix import Cell, crash_axis, crash_cells, smoke_cells
from pytest_resume_check.cells.references import Reference, References
from pytest_resume_check.cells.shared_runs import SharedFirstRuns
from pytest_resume_check.judge.harness_errors import harness_finding
from pytest_resume_check.judge.verdict import FIX_FILLED_IN_PLACE, judge
from pytest_resume_check.process.fork_server import ForkServer, ForkServerDied, check_main
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.process.shared_saves import SharedSaves
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import MODE_RECORD, FaultPlan, FileOp
from pytest_resume_check.records.names import DEFAULT_HANG_TIMEOUT, case_id
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import CellResult, Outcome, RunRecord, Verdict
from pytest_resume_check.targets import Target, TargetError

__all__ = ["Engine", "FilledInPlace"]

#: Added to the error of a save that could not be recorded for the default smoke cells: the target asked
#: for none of them.
ERR_SMOKE_RECORD = ("; every target gets crash smoke cells by default (a few faults in the save of checkpoint 2 "
                    "of its first case, recorded by running it; docs/crash-consistency.md): fix what stopped the "
                    "run, or declare crash_save=False to turn them off")


#: A zero-change program whose checkpoint folders are filled in place never publishes one, so its save cannot be
#: recorded; ``fix`` is :data:`~pytest_resume_check.judge.verdict.FIX_FILLED_IN_PLACE`.
ERR_FILLED_IN_PLACE = ("recording the save of checkpoint {step} of {name} failed: the program published no checkpoint "
                       "(see {log}); {fix}")


class FilledInPlace(RuntimeError):
    """The save of a zero-change program cannot be recorded: it fills its checkpoint folders in place."""


class Engine:
    """Runs cells of targets under ``root``. References are computed once per (target, case)."""

    def __init__(self, root: Path, seed: int, hang_timeout: float = DEFAULT_HANG_TIMEOUT,
                 isolation: str | None = None, check_determinism: bool = True, share: bool = True,
                 hang_forced: bool = False, server: bool = False, saves: SharedSaves | None = None):
        self.layout = Layout(root)
        #: The saves recorded for crash cells (kept for the session's other xdist workers when it has some).
        self.saves = saves if saves is not None else SharedSaves()
        #: The fork server this engine's runs start from (started at the first run that needs it; ``server``:
        #: shared with other sessions, see :meth:`.ForkServer.share`).
        self.fork_server = ForkServer()
        if server:
            self.fork_server.share()
        self.runner = Runner(seed, hang_timeout, isolation, hang_forced, self.fork_server)
        self.references = References(self.runner, self.layout, check_determinism)
        self.shared = SharedFirstRuns(self.runner, self.layout) if share else None

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def seed(self) -> int:
        return self.runner.seed

    @property
    def steps_executed(self) -> int:
        """Trainer steps executed by every run so far (the cost of the matrix)."""
        return self.runner.steps_executed

    def plan(self, target: Target, case: Mapping[str, Any], workdir: Path, index: int, **options: Any) -> RunPlan:
        """A plan for one run of ``target`` under ``workdir`` (see :meth:`Runner.plan`)."""
        return self.runner.plan(target, case, workdir, index, **options)

    def run(self, plan: RunPlan, target: Target) -> RunRecord:
        """One supervised child run."""
        return self.runner.run(plan, target)

    def reference(self, target: Target, case: Mapping[str, Any]) -> Reference:
        """The uninterrupted reference of a case (cached)."""
        return self.references.get(target, case)

    def close(self) -> list[str]:
        """Stop the targets' shared services (at the session's end); returns what went wrong."""
        return self.runner.close()

    def add_preload(self, entries: Iterable[str]) -> None:
        """Ask the fork server to preload these modules and warm-ups (a target's ``preload``): asked before
        the first run, they are in the server it starts, not paid again by every run."""
        self.fork_server.add_preload(entries)

    def stop_server(self) -> None:
        """Stop the fork server (and multiprocessing's resource tracker) the runs started from, after the
        services (they may use it); the next run would start a new one."""
        self.fork_server.stop()

    def register(self, cells: Sequence[Cell]) -> None:
        """Tell the engine the whole matrix, so cells that differ only in their single kill step share
        one first run."""
        if self.shared is not None:
            self.shared.register(cells)

    def record_ops(self, target: Target, case: Mapping[str, Any], step: int, prior: int) -> list[FileOp]:
        """The file operations of the save of checkpoint ``step`` (after one of ``prior``), in order (each rank's
        in its order, with the collectives it entered, in a run of several ranks). A
        zero-change program's saves end at its commit point, which its uninterrupted run may recognise: that
        run comes first (it is the case's reference, made once)."""
        if References.recognisable(target):
            self.reference(target, case)
        workdir = self.layout.fresh(self.layout.record_save(target.name, case_id(case), step))
        plan = self.runner.plan(target, case, workdir, 0, kill=KillSpec(step), checkpoint_steps=(prior,),
                                faults=FaultPlan(step, MODE_RECORD))
        record = self.runner.run(plan, target)
        filled = [os.path.basename(e.path) for e in record.events if e.kind == ev.IN_PLACE and e.path]
        if record.outcome != Outcome.KILLED and filled and not record.published:
            fix = FIX_FILLED_IN_PLACE.format(folder=filled[0])
            raise FilledInPlace(ERR_FILLED_IN_PLACE.format(step=step, name=target.name, log=plan.log_path, fix=fix))
        if record.outcome != Outcome.KILLED:
            raise RuntimeError(f"recording the save of step {step} of {target.name} failed: {record.describe()}"
                               f"; see {plan.log_path}")
        ranks = plan.world_size > 1  # each rank's ops, numbered on that rank: rank by rank, however they interleaved
        ops = [FileOp(e.extra["index"], e.text or "", e.path or "", e.extra.get("target"), e.rank if ranks else None,
                      e.extra.get("lane")) for e in record.events if e.kind == ev.FILE_OP]
        return sorted(ops, key=lambda op: (op.rank or 0, op.lane or 0, op.index))

    def crash_cells(self, target: Target, mode: str) -> list[Cell]:
        """The crash-consistency cells of ``target`` (its ``crash_save``; see
        :func:`~pytest_resume_check.cells.matrix.crash_axis`), none if it has none: the save's file operations
        are recorded by running the trainer once (once per session: :attr:`saves`); every crash point's
        cells, the points sampled with this engine's seed, or the default smoke cells in either mode."""
        axis = crash_axis(target)
        if axis is None:
            return []
        case = target.cases[0]
        key = f"{target.name}\0{case_id(case)}\0{axis.step}\0{axis.prior}"
        try:
            ops = self.saves.get(key, lambda: self.record_ops(target, case, axis.step, axis.prior))
        except (FilledInPlace, ForkServerDied):
            raise  # its fix is to publish by rename, or the harness's own: not to turn the crash cells off
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}{ERR_SMOKE_RECORD if axis.smoke else ''}") from exc
        if axis.smoke:
            return smoke_cells(target, case, ops, axis.step, axis.prior)
        return crash_cells(target, case, ops, axis.step, axis.prior, mode,
                           random.Random(f"{self.seed}:{target.name}:crash"))

    def run_cell(self, cell: Cell) -> CellResult:
        """Reference (cached), interrupted runs, verdict. An error of the harness itself (a full disk, a
        session folder that went away, a bug) is the cell's ``HARNESS`` finding, and the session goes on;
        a broken target (:class:`~.targets.TargetError`) and Ctrl-C are raised."""
        try:
            return self._run_cell(cell)
        except TargetError:
            raise
        except Exception as exc:
            workdir = self._existing_cell_folder(cell)
            return CellResult(cell, Verdict(findings=[harness_finding(exc, self.root, workdir)]), None, [], workdir,
                              self.seed)

    def _existing_cell_folder(self, cell: Cell) -> Path | None:
        try:
            workdir = self.layout.cell(cell.target.name, cell.case_id, cell.resume_mode, cell.kill_id)
            return workdir if workdir.is_dir() else None
        except (OSError, ValueError):
            return None

    def _run_cell(self, cell: Cell) -> CellResult:
        # Before any folder of the session is touched: a copy of an unguarded driving program, which each run
        # runs first, must not make or delete folders of the program's own session.
        check_main()
        started = time.monotonic()
        made = self.references.made(cell.target, cell.case)
        ref = self.reference(cell.target, cell.case)
        paid = 0.0 if made else time.monotonic() - started
        workdir = self.layout.fresh(self.layout.cell(cell.target.name, cell.case_id, cell.resume_mode, cell.kill_id))
        if ref.findings:
            return CellResult(cell, Verdict(findings=list(ref.findings)), ref.record, [], workdir, self.seed, paid)
        first = self.shared.first_run(cell, workdir) if self.shared is not None else None
        converge = ref.converge if self.shared is not None else None
        try:
            runs = run_interrupted(self.runner, cell.target, cell.case, cell.kills, cell.resume_mode, workdir,
                                   cell.prior_checkpoints, first, converge, ref.values_dir,
                                   ref.converge_inputs if converge else None)
        finally:  # what its snapshot still shares with later ones is checked before another cell takes one
            if first is not None and self.shared is not None:
                self.shared.release(workdir)
        if not workdir.is_dir():  # its files went away under it (another session's clean-up): nothing to judge
            return CellResult(cell, Verdict(findings=[harness_finding(FileNotFoundError(str(workdir)), self.root,
                                                                      None, workdir)]), ref.record, runs, None,
                              self.seed, paid)
        verdict = judge(ref.record, runs, cell.target.contract, newest_complete(cell, runs))
        return CellResult(cell, verdict, ref.record, runs, workdir, self.seed, paid)
