"""The matrix as pytest nodes: the collector :class:`ResumeMatrix`, one :class:`ResumeCell` per cell, and
a :class:`BrokenTarget` for a target whose cells cannot be built.

The nodes ask the session's matrix object (:class:`Matrix`) for the targets, the engine and the rerun
command; they never import it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_resume_check.plugin import environment, worker_saves
from pytest_resume_check.plugin.options import MARKER
from pytest_resume_check.plugin.settings import NODE_PREFIX, Settings

if TYPE_CHECKING:  # the engine and its data are imported when a cell runs
    from _pytest._code.code import TerminalRepr, TracebackStyle

    from pytest_resume_check.cells.matrix import Cell
    from pytest_resume_check.cluster.executor import RayExecutor
    from pytest_resume_check.engine import Engine
    from pytest_resume_check.records.cell_json import CellJson
    from pytest_resume_check.records.results import CellResult
    from pytest_resume_check.targets import Target

ERR_CASES_HOOK = ("target {name!r}: the pytest_resume_check_cases hook raised {error}; fix the conftest or plugin "
                  "that implements it")
ERR_BROKEN = ("target {name!r}: building its matrix cells raised {error}; check what its steps, boundaries and "
              "buffered functions return")


class Matrix(Protocol):
    """What the nodes need of the session that made them."""

    settings: Settings
    #: Targets whose crash cells ``--co`` did not list.
    unrecorded: list[str]

    @property
    def engine(self) -> Engine:
        """The session's engine (made at its first use)."""

    @property
    def executor(self) -> RayExecutor | None:
        """The Ray cluster that runs the cells (``--resume-matrix-ray``), None: they run here."""

    def targets(self) -> list[Target]:
        """The targets this session runs."""

    def preload(self, entries: Sequence[str]) -> None:
        """Ask the fork server of the session's engine to preload a target's ``preload`` entries."""

    def rerun_command(self, name: str) -> str:
        """The command that reruns exactly the cell ``name``."""


class ResumeCheckFailure(Exception):
    """A cell's verdict failed; the message is the whole report."""


class ResumeMatrix(pytest.Collector):
    """Collector that holds the matrix cells."""

    def __init__(self, *, matrix: Matrix, **kwargs: Any):
        super().__init__(**kwargs)
        self.matrix = matrix

    def collect(self) -> list[pytest.Item]:
        targets = self.matrix.targets()
        for target in targets:  # all of them, before the fork server starts with the first run
            self.matrix.preload(target.preload)
        worker_saves.record_in_turn(self.config, targets, self._record_save)
        return [item for target in targets for item in self._items_of(target)]

    def _record_save(self, target: Target) -> None:
        """Record (or read, once another xdist worker recorded it) the save ``target``'s crash cells need."""
        from pytest_resume_check.cells import matrix

        target = self._checked(target)
        if matrix.crash_axis(target) is not None and self._crash_cells_wanted(target.name):
            self.matrix.engine.crash_cells(target, self.matrix.settings.mode or "")

    def _items_of(self, target: Target) -> list[pytest.Item]:
        """The cells of one target, or one failing item that says why they could not be built (the other
        targets still run)."""
        from pytest_resume_check.cells import matrix
        from pytest_resume_check.engine import ForkServerDied
        from pytest_resume_check.judge.harness_errors import server_died
        from pytest_resume_check.records.declaration import describe_error
        from pytest_resume_check.targets import TargetError

        settings = self.matrix.settings
        assert settings.mode is not None  # the matrix's items exist only when a mode is given
        try:
            target = self._checked(target)
            cells = matrix.cells(target, settings.mode, settings.seed)
        except Exception as exc:
            message = str(exc) if isinstance(exc, TargetError) else ERR_BROKEN.format(
                name=target.name, error=describe_error(exc))
            return [self._broken(f"{target.name}[matrix]", message)]
        items: list[pytest.Item] = []
        axis = matrix.crash_axis(target)  # declared, or the default smoke cells where they apply
        if axis is not None and not self._crash_cells_wanted(target.name):
            axis = None  # only other cells of it are named (a rerun line, a group on a cluster node)
        if axis is not None and self.config.option.collectonly:
            self.matrix.unrecorded.append(target.name)
        elif axis is not None:
            try:
                cells += self.matrix.engine.crash_cells(target, settings.mode)
            except TargetError as exc:  # it cannot run at all (a preload module that fails)
                if not axis.smoke:  # its cells say so, each with this one line: no item for smoke cells
                    items.append(self._broken(f"{target.name}[record-save]", str(exc)))
            except ForkServerDied as exc:  # the harness's own failure, not the target's
                items.append(self._broken(f"{target.name}[record-save]", server_died(exc.end)))
            except Exception as exc:  # a target whose save cannot even be recorded
                items.append(self._broken(f"{target.name}[record-save]", str(exc)))
        items += [ResumeCell.from_parent(self, cell=cell, matrix=self.matrix,
                                         **self._named(cell.name)) for cell in cells]
        return items

    def _crash_cells_wanted(self, target: str) -> bool:
        """Whether the session may run crash cells of ``target``: not when cells are named and none of the
        target's is one (recording the save runs the trainer once, for nothing then)."""
        from pytest_resume_check.records import kill_ids

        s = self.matrix.settings
        named = [*s.cells, *(n[len(NODE_PREFIX):] for n in s.node_ids)]
        if not named:
            return True
        for name in named:
            parts = kill_ids.split_cell_name(name)
            if parts is None or parts[0] != target:
                continue
            try:
                if any(k.fault is not None for k in kill_ids.parse_kill_id(parts[3])):
                    return True
            except ValueError:  # not a kill id we read: let the matrix say the name is no cell's
                return True
        return False

    def _broken(self, name: str, message: str) -> pytest.Item:
        return BrokenTarget.from_parent(self, message=message, **self._named(name))

    def _named(self, name: str) -> dict[str, str]:
        """An item's name with its node id spelled out: pytest 9 builds a child's structured id with the
        ``[...]`` inside the name, while the ``--lf`` cache parses it as parameters, so cells never matched
        the failures it recorded."""
        return {"name": name, "nodeid": f"{self.nodeid}::{name}"}

    def _checked(self, target: Target) -> Target:
        """``target`` with the cases a ``pytest_resume_check_cases`` hook answers instead, if one does;
        its name and case ids checked again (a hook or ``with_options`` may have bypassed the declaration)."""
        from pytest_resume_check.records.declaration import ERR_TARGET_NAME, check_cases, describe_error, name_problem
        from pytest_resume_check.targets import TargetError

        problem = name_problem(str(target.name))
        if problem:
            raise TargetError(ERR_TARGET_NAME.format(name=target.name, problem=problem))
        try:
            cases = self.config.hook.pytest_resume_check_cases(config=self.config, target=target)
            cases = target.cases if cases is None else tuple(dict(c) for c in cases)
        except Exception as exc:
            raise TargetError(ERR_CASES_HOOK.format(name=target.name, error=describe_error(exc))) from exc
        check_cases(target.name, cases)
        return target.with_options(cases=cases)


class BrokenTarget(pytest.Item):
    """Stands for a target the matrix could not even be built for; fails with the reason."""

    def __init__(self, *, message: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.message = message
        self.add_marker(MARKER)

    def runtest(self) -> None:
        raise ResumeCheckFailure(self.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: TracebackStyle | None = None) -> str | TerminalRepr:
        from pytest_resume_check.report.text import visible

        return visible(str(excinfo.value))  # it quotes the target's own exception

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self.path, None, f"resume-matrix {self.name}"


class ResumeCell(pytest.Item):
    """One cell of the matrix: reference run (shared per case), interrupted runs, verdict."""

    def __init__(self, *, cell: Cell, matrix: Matrix, **kwargs: Any):
        super().__init__(**kwargs)
        self.cell = cell
        self.matrix = matrix
        #: The cell's ``CellResult`` once judged; its JSON (with the rerun command) once run.
        self.result: CellResult | None = None
        self.cell_json: CellJson | None = None
        #: Why the cell is skipped unrun (``--resume-matrix-budget`` left it out); None: it runs.
        self.left_out: str | None = None
        #: How long this cell's case's reference runs took, if this cell made them.
        self.reference_seconds = 0.0
        #: The failure report of a cell run on a cluster node (its ``result`` lives there).
        self.failure_text: str | None = None
        self.add_marker(MARKER)
        if cell.xfail_reason:
            self.add_marker(pytest.mark.xfail(reason=cell.xfail_reason, strict=True,
                                              raises=ResumeCheckFailure))
        self.user_properties += [("target", cell.target.name), ("case", cell.case_id),
                                 ("resume_mode", cell.resume_mode), ("kill", cell.kill_id)]

    def runtest(self) -> None:
        from pytest_resume_check.report import text as report
        from pytest_resume_check.targets import TargetError

        if self.left_out is not None:
            pytest.skip(self.left_out)
        rerun = self.matrix.rerun_command(self.name)
        if self.matrix.executor is not None:
            return self._from_cluster(self.matrix.executor, rerun)
        try:
            result = self.matrix.engine.run_cell(self.cell)
        except TargetError as exc:  # the target cannot run at all: one line, and the cell is counted
            raise self._target_error(exc, rerun) from None
        self.result = result
        self.reference_seconds = result.reference_seconds
        self.cell_json = report.cell_json(result)
        self.cell_json["rerun"] = rerun
        environment.annotate(self.cell_json, self.cell.target, self.matrix.settings)
        self.config.hook.pytest_resume_check_cell_result(config=self.config, result=result)
        self.user_properties += [("verdict", ",".join(result.verdict.categories) or "PASSED"),
                                 ("headline", result.verdict.headline)]
        if not result.passed:
            raise ResumeCheckFailure(report.failure_text(result, rerun))
        if result.workdir is not None:
            self.matrix.engine.layout.remove(result.workdir)

    def _from_cluster(self, executor: RayExecutor, rerun: str) -> None:
        """Report the outcome the cluster node gave this cell (its JSON and report with this session's
        rerun line and paths); the ``pytest_resume_check_cell_result`` hook ran where the cell ran."""
        from pytest_resume_check.cluster import wire
        from pytest_resume_check.report import text as report

        got = executor.outcome(self.name)
        if got.kind == wire.SKIPPED:
            pytest.skip(got.text)
        remote_rerun = got.cell_json.get("rerun") if got.cell_json is not None else None
        text = got.text.replace(remote_rerun, rerun) if remote_rerun else got.text
        self.reference_seconds = got.reference_seconds
        self.cell_json = got.cell_json.copy() if got.cell_json is not None else None
        if self.cell_json is None and got.category is not None:  # no verdict: lost node, refused target
            cell = self.cell
            self.cell_json = report.unjudged_cell_json(cell.target.name, cell.case_id, cell.resume_mode, cell.kills,
                                                       cell.kill_id, text, got.category, cell.case,
                                                       cell.xfail_reason)
        if self.cell_json is not None:
            self.cell_json["rerun"] = rerun
            self.user_properties += [("verdict", ",".join(self.cell_json.get("categories") or ()) or "PASSED"),
                                     ("headline", self.cell_json.get("headline") or "")]
            environment.annotate(self.cell_json, self.cell.target, self.matrix.settings,
                                 got.differs if got.node else None)
        if got.differs:  # the node's runs had another configuration than this machine would give them
            warnings.warn(environment.EnvironmentDiffersWarning(environment.differs_message(got.differs)),
                          stacklevel=1)
        if got.kind == wire.PASSED:
            return
        self.failure_text = text
        raise ResumeCheckFailure(text)

    def _target_error(self, exc: Exception, rerun: str) -> ResumeCheckFailure:
        """The one-line failure under ``TARGET_ERROR``; the cell's JSON is kept, counted as pytest counts it."""
        from pytest_resume_check import categories
        from pytest_resume_check.report import text as report

        cell = self.cell
        headline = f"{categories.TARGET_ERROR}: {exc}"
        self.cell_json = report.unjudged_cell_json(cell.target.name, cell.case_id, cell.resume_mode, cell.kills,
                                                   cell.kill_id, headline, categories.TARGET_ERROR, cell.case,
                                                   cell.xfail_reason)
        self.cell_json["rerun"] = rerun
        return ResumeCheckFailure(headline)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: TracebackStyle | None = None) -> str | TerminalRepr:
        from pytest_resume_check.targets import TargetError

        # TargetError: the target itself is broken (a preload module that fails to import), one line says why.
        if isinstance(excinfo.value, (ResumeCheckFailure, TargetError)):
            from pytest_resume_check.report.text import visible

            return visible(str(excinfo.value))  # the trainer's words in it reach the terminal as text
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self.path, None, f"resume-matrix {self.name}"
