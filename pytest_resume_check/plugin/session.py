"""The matrix session: the plugin object that ``pytest_configure`` registers only when the matrix is on
(as pytest-xdist registers its ``DSession`` only when it distributes), so none of its hooks asks whether
it is. It owns what only the matrix uses: the engine and the session's folder, the cells, their results
and the targets whose matrix could not be built.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_resume_check.plugin import cluster, reports, repro, scheduler, summary, worker_saves
from pytest_resume_check.plugin.commands import rerun_command
from pytest_resume_check.plugin.discovery import discover
from pytest_resume_check.plugin.items import ResumeCell, ResumeMatrix
from pytest_resume_check.plugin.options import ERR_SESSION_FOLDER
from pytest_resume_check.plugin.settings import CACHE_SEED, MATRIX_NODE, NODE_PREFIX, Settings
from pytest_resume_check.records.kill_ids import target_of
from pytest_resume_check.records.names import OPT_BUDGET, OPT_CELL, OPT_SEED

if TYPE_CHECKING:  # made at their first use
    from pytest_resume_check.cells.matrix import Cell
    from pytest_resume_check.cluster.executor import RayExecutor
    from pytest_resume_check.engine import Engine
    from pytest_resume_check.records.cell_json import CellJson
    from pytest_resume_check.targets import Target

#: The name the session is registered under.
PLUGIN_NAME = "resume_check_matrix"
#: The session's folder in pytest's base temporary directory (``resume-matrix0``, ...).
SESSION_FOLDER = "resume-matrix"
#: Keys of ``config.workeroutput``: what went wrong when an xdist worker stopped its services, and whether its
#: shared fork server was warm (``--resume-matrix-server``).
WORKER_PROBLEMS, WORKER_SERVER = "resume_check_problems", "resume_check_server"

REPORT_HEADER = "resume-check: matrix={mode} seed={seed} (rerun with {opt}={seed})"
ERR_NO_CELL = ("{opt} {value!r}: no such cell in this matrix (mode {mode}, seed {seed}); check the mode and seed "
               "the cell came from (its rerun line has both)")
#: Said after collection for targets whose crash cells ``--co`` did not list: recording their save runs
#: the trainer.
NOT_RECORDED = ("resume-check: {names}: crash-consistency cells not listed; how many there are depends on the "
                "file operations of the save, which only running the trainer can record (--collect-only runs "
                "nothing)")

#: The skip reason of a cell the budget leaves out (the summary finds these by its start).
BUDGET_SKIP = ("left out by " + OPT_BUDGET + "={budget}: the {kept} cells that reveal most take {runs} of the "
               "{total} runs of all {cells} cells")


class MatrixSession:
    """The hooks of a session with the matrix on, in the controller, a worker, or a run without xdist."""

    def __init__(self, config: pytest.Config, settings: Settings):
        self.config = config
        self.settings = settings
        #: Every cell's JSON, from the reports (in the controller too, when xdist runs the cells).
        self.results: list[CellJson] = []
        #: Node ids of matrix items that failed without being cells (a target whose matrix cannot be built).
        self.broken: list[str] = []
        #: Targets whose crash cells ``--co`` did not list: recording their save runs the trainer.
        self.unrecorded: list[str] = []
        self.cells: list[Cell] = []
        #: Cells the budget left out, from their skip reports, with the reason's figures.
        self.left_out: list[str] = []
        self.budget_reason = ""
        self._root: Path | None = None
        self._engine: Engine | None = None
        #: The targets' preload entries collected before the engine is made (it starts its server with them).
        self._preload: list[str] = []
        #: The Ray cluster that runs the cells (``--resume-matrix-ray``), once they are known.
        self._executor: RayExecutor | None = None
        cache = getattr(config, "cache", None)
        if cache is not None and not hasattr(config, "workerinput"):
            cache.set(CACHE_SEED, settings.seed)

    # -- what the items ask for ----------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The session's engine, made at its first use (by a cell, or by recording a target's save while
        collecting); it learns the cells to run when collection ends (:meth:`pytest_collection_finish`)."""
        if self._engine is None:
            from pytest_resume_check.engine import Engine

            s, saves = self.settings, worker_saves.shared_saves(self.config)
            self._engine = Engine(self.root, s.seed, s.hang_timeout, s.isolation, share=not s.exhaustive,
                                  hang_forced=s.hang_forced, server=s.server, saves=saves)
            self._engine.register(self.cells)
            self._engine.add_preload(self._preload)
        return self._engine

    @property
    def executor(self) -> RayExecutor | None:
        """The Ray cluster's executor when ``--resume-matrix-ray`` is given (None: cells run here)."""
        return self._executor

    @property
    def root(self) -> Path:
        """The session's folder: ``resume-matrix<N>`` in pytest's own base temporary directory, so
        ``--basetemp``, ``tmp_path_retention_count`` and ``tmp_path_retention_policy`` decide where runs
        keep their files and how many sessions stay, the folder is private (pytest checks its owner and
        that it is no symlink), and no session removes another live session's folder (pytest keeps a
        numbered directory while its lock is held). Without pytest's tmpdir plugin: a private new folder."""
        if self._root is None:
            factory = getattr(self.config, "_tmp_path_factory", None)
            try:
                if factory is not None:
                    self._root = factory.mktemp(SESSION_FOLDER, numbered=True)
                else:
                    self._root = Path(tempfile.mkdtemp(prefix=f"pytest-{SESSION_FOLDER}-"))
            except OSError as exc:
                where = Path(exc.filename) if isinstance(exc.filename, str) else Path(tempfile.gettempdir())
                raise pytest.UsageError(ERR_SESSION_FOLDER.format(where=where, error=exc.strerror or exc,
                                                                  parent=where.parent)) from None
        return self._root

    def targets(self) -> list[Target]:
        """The targets this session runs; naming a cell names its target, so a rerun line works also
        where that target is an installed package's."""
        wanted = self.settings.targets or tuple(dict.fromkeys(map(target_of, self._named_cells())))
        return discover(self.config, wanted)

    def preload(self, entries: Sequence[str]) -> None:
        """Ask the engine's fork server to preload a target's entries; kept until the engine is made (making it
        makes the session's folder, which a collection alone must not)."""
        self._preload += [entry for entry in entries if entry not in self._preload]
        if self._engine is not None:
            self._engine.add_preload(entries)

    def rerun_command(self, name: str) -> str:
        """The command that reruns exactly the cell ``name`` with this session's seed and options."""
        return rerun_command(self.config, name)

    def _named_cells(self) -> list[str]:
        """Cell names given by ``--resume-matrix-cell`` (each time it was given) or as pasted node ids."""
        return [*self.settings.cells, *(n[len(NODE_PREFIX):] for n in self.settings.node_ids)]

    # -- collection ----------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self) -> None:
        """With ``--resume-matrix-ray``: connect now, so the header names the cluster and its nodes (a cluster
        that cannot be used is one usage error before anything is collected). ``--co`` runs nothing there."""
        if self.settings.ray and not self.config.option.collectonly:
            self._executor = cluster.connect(self.settings, self.root)

    def pytest_report_header(self) -> list[str]:
        s = self.settings
        lines = [REPORT_HEADER.format(mode=s.mode, seed=s.seed, opt=OPT_SEED)]
        if self._executor is not None:
            lines.append(self._executor.header())
        return lines

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        """Add the matrix's cells to the items (only the named ones when cells are named)."""
        node = ResumeMatrix.from_parent(session, name=MATRIX_NODE, nodeid=MATRIX_NODE, matrix=self)
        cells = node.collect()
        # Report the cells as collected, so "collected N items" and the deselected counts include them.
        collected: list[pytest.Item | pytest.Collector] = list(cells)
        self.config.hook.pytest_collectreport(report=pytest.CollectReport(node.nodeid, "passed", None, collected))
        names = self._named_cells()
        if names:
            self._select(names, cells, items)
        else:
            items.extend(cells)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The cells that will run (after selection by name, ``-k`` or ``-m``) go to the engine, so a
        group's shared first run pauses at their kill steps only. The engine may already exist: recording
        a target's save while collecting makes it, and it used to keep the empty list of that moment,
        which turned every shared first run off."""
        items = [item for item in session.items if isinstance(item, ResumeCell)]
        if self.settings.budget is not None and not self._named_cells():  # named cells run as named
            items = self._within_budget(items, self.settings.budget)
        self.cells = [item.cell for item in items]
        if self._engine is not None:
            self._engine.register(self.cells)
        if self._executor is not None and items:
            cluster.start(self._executor, self.config, self.settings, items)

    @staticmethod
    def _within_budget(items: list[ResumeCell], budget: int) -> list[ResumeCell]:
        """The items of the cells that reveal most within ``budget`` runs; the others are skipped, each
        with the same reason (every xdist worker cuts the same matrix: the cut is a function of the cells)."""
        from pytest_resume_check.cells import budget as budgets

        cut = budgets.cut([item.cell for item in items], budget)
        kept = {id(cell) for cell in cut.kept}
        reason = BUDGET_SKIP.format(budget=budget, kept=len(cut.kept), runs=cut.runs, total=cut.total_runs,
                                    cells=len(items))
        for item in items:
            if id(item.cell) not in kept:
                item.left_out = reason
        return [item for item in items if id(item.cell) in kept]

    def _select(self, names: list[str], cells: list[pytest.Item], items: list[pytest.Item]) -> None:
        """Exactly the cells ``names`` (and, for pasted node ids, the tests of any paths given with them)."""
        s = self.settings
        by_name = {c.name: c for c in cells}
        missing = [n for n in names if n not in by_name]
        if missing:  # the first unknown name, with the option that gave it
            raise pytest.UsageError(ERR_NO_CELL.format(opt=OPT_CELL if missing[0] in s.cells else "node id",
                                                       value=missing[0], mode=s.mode, seed=s.seed))
        chosen = [by_name[n] for n in dict.fromkeys(names)]
        others = [] if s.node_ids else list(items)
        self.config.hook.pytest_deselected(items=others + [c for c in cells if c not in chosen])
        items[:] = [i for i in items if i not in others] + chosen

    def pytest_report_collectionfinish(self) -> list[str]:
        return [NOT_RECORDED.format(names=", ".join(self.unrecorded))] if self.unrecorded else []

    # -- the cells' reports --------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """A judged cell's JSON rides on its call report, so an xdist controller receives it too; with
        ``--resume-matrix-repro``, a failing cell's reproduction is written here, where it ran, and its JSON
        names the folder."""
        rep = yield
        if isinstance(item, ResumeCell) and call.when == "call" and item.cell_json is not None:
            repro.write_cell(self.config, item)
            reports.carry(rep, item.cell_json, item.reference_seconds)
        if isinstance(item, ResumeCell) and call.when == "call":
            cluster.write_record(item, call, rep, self.root)
        return rep

    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        """``PASSED (reference runs 1.2 s)`` with ``-v`` for a passing cell that made its case's reference."""
        return reports.teststatus(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Gather each cell's JSON (made here for a cell that failed without one), and give each cell its
        junit ``classname``."""
        name = reports.cell_name(report)
        cell = reports.carried(report)
        if name is not None and reports.failed_unjudged(report):
            cell = reports.unjudged(report, name, self.rerun_command(name))
            if cell is None:
                self.broken.append(report.nodeid)
        if cell is not None:
            self.results.append(cell)
        reason = reports.skip_reason(report)
        if name is not None and reason.startswith(BUDGET_SKIP.split("{")[0]):
            self.left_out.append(name)
            self.budget_reason = reason
        if name is not None:
            reports.set_junit_classname(self.config, report)

    # -- the end -------------------------------------------------------------------------------------

    def pytest_sessionfinish(self) -> None:
        """Also after Ctrl-C: no process a run started outlives the session, nor the fork server; of the
        session's files only the failing cells' folders stay (with their cases' references)."""
        problems = self._executor.close() if self._executor is not None else []
        if self._engine is None:
            summary.print_problems(self.config, problems)
            return
        problems += self._engine.close()  # services first: they may use the server
        worker_output = getattr(self.config, "workeroutput", None)
        if worker_output is not None:  # an xdist worker's output is not shown: its controller prints them
            worker_output.update({WORKER_PROBLEMS: problems, WORKER_SERVER: self._engine.fork_server.server_line})
        else:
            summary.print_problems(self.config, problems)
        self._engine.stop_server()
        try:
            self._engine.layout.tidy()
        except OSError:  # the folder went away under the session: nothing left to tidy
            pass

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if hasattr(self.config, "workerinput"):
            return
        if self.results:
            summary.write_summary(terminalreporter, self.results, self.broken, self.settings)
        if self.left_out:
            terminalreporter.write_line(summary.left_out_line(self.budget_reason, self.left_out))
        summary.print_server_line(self.config, self._engine.fork_server.server_line if self._engine else None)
        placement = self._executor.placement() if self._executor is not None else None
        if placement:
            terminalreporter.write_line(placement)

    # -- pytest-xdist (its hooks exist only when it is installed) ------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker's services that failed to stop (or left processes running), said by the controller."""
        output = getattr(node, "workeroutput", {})
        summary.print_problems(self.config, list(output.get(WORKER_PROBLEMS, ())))
        summary.print_server_line(self.config, output.get(WORKER_SERVER), node.workerinput.get("workerid"))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Keep a case's cells of one resume mode on one worker (:mod:`.scheduler`)."""
        return scheduler.case_and_mode_scheduler(config, log)
