"""The pytest side: options, fixtures, matrix items and the summary. The only module that uses pytest.

Loading this plugin imports nothing heavy: the engine is imported when ``--resume-matrix`` is given
or the ``resume_check`` fixture is used.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

import pytest

from pytest_resume_check.plugin.fixtures import ResumeCheck, resume_check  # noqa: F401

# The fixture for hand-written tests lives in its own module; importing it here registers it.
from pytest_resume_check.records import kill_ids
from pytest_resume_check.records.names import ISOLATIONS

OPT_MATRIX = "--resume-matrix"
OPT_MODE = "--resume-matrix-mode"
OPT_SEED = "--resume-matrix-seed"
OPT_TARGET = "--resume-matrix-target"
OPT_CELL = "--resume-matrix-cell"
OPT_HANG = "--resume-matrix-hang-timeout"
OPT_JSON = "--resume-matrix-json"
OPT_ISOLATION = "--resume-matrix-isolation"
OPT_EXHAUSTIVE = "--resume-matrix-exhaustive"
OPT_HTML = "--resume-matrix-html"

HELP_MATRIX = "run this project's resume-check targets across the kill/resume matrix"
HELP_MODE = ("which kill points: 'quick' (default, a boundary-aware sample) or 'full' (every step); implies "
             f"{OPT_MATRIX}")
HELP_SEED = "seed for shuffles and kill-point sampling: an integer, or 'last' to reuse the previous seed"
HELP_TARGET = "only run this target (repeatable)"
HELP_CELL = "run only this matrix cell, e.g. 'builtin_loop[b4-take2-e2-shuffle-auto-ckpt3]'"
HELP_HANG = ("seconds without an event before a run counts as HUNG and is killed (default 60; 0 or inf: no limit, "
             "longer limits are cut to about 23 days)")
HELP_JSON = "write every cell's verdict and ledgers to this JSON file"
HELP_EXHAUSTIVE = ("run every cell from scratch to the end: no shared first runs, no early stop of resumed "
                   "runs whose reported state equals the reference's (slower; a check on those shortcuts)")
HELP_HTML = "write a self-contained HTML report (heatmaps, timelines of failing cells) to this file"
HELP_ISOLATION = "how children start for every target: 'forkserver' (preloaded) or 'spawn'"

MATRIX_MODES = ("quick", "full")
MARKER = "resume_matrix"
CACHE_SEED = "resume_check/seed"
#: The session's folder in pytest's base temporary directory (``resume-matrix0``, ...).
SESSION_FOLDER = "resume-matrix"
DEFAULT_HANG_TIMEOUT = 60.0

ERR_MODE = "{opt}={value!r} is not a matrix mode; use one of: quick, full (e.g. {opt}=quick)"
ERR_SEED = "{opt}={value!r} is not a seed; give an integer (e.g. {opt}=1234) or 'last'"
ERR_SEED_LAST = "{opt}=last: no previous seed is cached in this project; run once without it first"
ERR_SEED_NO_CACHE = ("{opt}=last: pytest's cache is disabled (-p no:cacheprovider), so no previous seed can be read; "
                     "give the seed itself (the header of the earlier run printed it: {opt}=N)")
#: The old spelling of the mode, ``--resume-matrix=full``: still accepted, with this note.
DEPRECATED_MODE = ("{old} is deprecated: use {new} (a bare {opt} can no longer swallow the path after it); "
                   "the old spelling still works for now")
ERR_NO_PROJECT_TARGETS = ("{opt}: this project declares no resume-check target (resume_target(...) in a "
                          "conftest.py); targets shipped by installed packages run only when named: {known}. "
                          "Declare one (see 'Writing a target' in the docs) or name one with "
                          "--resume-matrix-target=NAME")
ERR_HANG = "{opt}={value!r} must be a positive number of seconds (e.g. {opt}=60), or 0 or inf for no limit"
ERR_ISOLATION = "{opt}={value!r} is not an isolation; use 'forkserver' or 'spawn'"
ERR_NO_TARGET = ("{opt}: no resume-check target named {names}; known targets: {known}. Declare targets with "
                 "pytest_resume_check.resume_target in a conftest.py or an entry point")
ERR_NO_CELL = ("{opt} {value!r}: no such cell in this matrix (mode {mode}, seed {seed}); check the mode and seed "
               "the cell came from (its rerun line has both)")
ERR_CASES_HOOK = ("target {name!r}: the pytest_resume_check_cases hook raised {error}; fix the conftest or plugin "
                  "that implements it")
ERR_BROKEN = ("target {name!r}: building its matrix cells raised {error}; check what its steps, boundaries and "
              "buffered functions return")
ERR_REPORT_WRITE = ("resume matrix: cannot write the {kind} report to {path}: {reason}; choose a writable path "
                    "with {opt}")


@dataclass(frozen=True)
class Settings:
    """Validated plugin settings (command line wins over the ini file)."""

    mode: str | None
    seed: int
    targets: tuple[str, ...]
    cell: str | None
    hang_timeout: float
    json_path: str | None
    isolation: str | None
    html_path: str | None = None
    exhaustive: bool = False


SETTINGS_KEY = pytest.StashKey[Settings]()
TARGETS_KEY = pytest.StashKey[list]()
ENGINE_KEY = pytest.StashKey[Any]()
RESULTS_KEY = pytest.StashKey[list]()
ROOT_KEY = pytest.StashKey[Path]()
RESULT_KEY = pytest.StashKey[Any]()
CELLS_KEY = pytest.StashKey[list]()
#: Targets whose crash cells ``--co`` did not list: recording their save runs the trainer.
UNRECORDED_KEY = pytest.StashKey[list]()
NOT_RECORDED = ("resume-check: {names}: crash-consistency cells not listed; how many there are depends on the "
                "file operations of the save, which only running the trainer can record (--collect-only runs "
                "nothing)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("resume-check", "pytest-resume-check: kill, resume and compare training runs")
    group.addoption(OPT_MATRIX, action="store_true", default=False, dest="resume_matrix", help=HELP_MATRIX)
    group.addoption(OPT_MODE, default=None, dest="resume_matrix_mode", help=HELP_MODE)
    for mode in MATRIX_MODES:  # the old spelling: argparse matches these whole strings before splitting at "="
        group.addoption(f"{OPT_MATRIX}={mode}", action="store_const", const=mode, dest="resume_matrix_old_mode",
                        default=None, help=argparse.SUPPRESS)
    group.addoption(OPT_SEED, default=None, dest="resume_matrix_seed", help=HELP_SEED)
    group.addoption(OPT_TARGET, action="append", default=[], dest="resume_matrix_target", help=HELP_TARGET)
    group.addoption(OPT_CELL, default=None, dest="resume_matrix_cell", help=HELP_CELL)
    group.addoption(OPT_HANG, default=None, dest="resume_matrix_hang_timeout", help=HELP_HANG)
    group.addoption(OPT_JSON, default=None, dest="resume_matrix_json", help=HELP_JSON)
    group.addoption(OPT_HTML, default=None, dest="resume_matrix_html", help=HELP_HTML)
    group.addoption(OPT_ISOLATION, default=None, dest="resume_matrix_isolation", help=HELP_ISOLATION)
    group.addoption(OPT_EXHAUSTIVE, action="store_true", default=False, dest="resume_matrix_exhaustive",
                    help=HELP_EXHAUSTIVE)
    parser.addini("resume_matrix", "matrix mode to run without the command-line flag: quick or full")
    parser.addini("resume_matrix_seed", HELP_SEED)
    parser.addini("resume_matrix_targets", HELP_TARGET, type="args")
    parser.addini("resume_matrix_hang_timeout", HELP_HANG)
    parser.addini("resume_matrix_json", HELP_JSON)
    parser.addini("resume_matrix_html", HELP_HTML)
    parser.addini("resume_matrix_isolation", HELP_ISOLATION)
    parser.addini("resume_matrix_exhaustive", HELP_EXHAUSTIVE, type="bool", default=False)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_resume_check import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _setting(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    if value in (None, [], ""):
        value = config.getini(name if name != "resume_matrix_target" else "resume_matrix_targets")
    return value or None


def _mode(config: pytest.Config) -> str | None:
    """The matrix mode, or None when the matrix is off. On: ``--resume-matrix``, ``--resume-matrix-mode``,
    the old ``--resume-matrix=MODE``, a pasted cell node id, or the ``resume_matrix`` ini value."""
    mode = config.getoption("resume_matrix_mode") or config.getoption("resume_matrix_old_mode")
    on = bool(mode or config.getoption("resume_matrix") or config.stash.get(NODE_IDS_KEY, ()))
    ini = config.getini("resume_matrix") or None
    if ini is not None and ini not in MATRIX_MODES:
        raise pytest.UsageError(ERR_MODE.format(opt="ini resume_matrix", value=ini))
    if mode is not None and mode not in MATRIX_MODES:
        raise pytest.UsageError(ERR_MODE.format(opt=OPT_MODE, value=mode))
    if mode is None and (on or ini):
        mode = ini or MATRIX_MODES[0]
    return mode


def _settings(config: pytest.Config) -> Settings:
    mode = _mode(config)
    hang = _setting(config, "resume_matrix_hang_timeout") or DEFAULT_HANG_TIMEOUT
    try:
        hang = float(hang)
        if math.isnan(hang) or hang < 0:  # 0 and inf: no limit (the runner cuts huge limits)
            raise ValueError
    except ValueError:
        raise pytest.UsageError(ERR_HANG.format(opt=OPT_HANG, value=hang)) from None
    isolation = _setting(config, "resume_matrix_isolation")
    if isolation is not None and isolation not in ISOLATIONS:
        raise pytest.UsageError(ERR_ISOLATION.format(opt=OPT_ISOLATION, value=isolation))
    return Settings(
        mode=mode,
        seed=_seed(config),
        targets=tuple(_setting(config, "resume_matrix_target") or ()),
        cell=config.getoption("resume_matrix_cell"),
        hang_timeout=hang,
        json_path=_setting(config, "resume_matrix_json"),
        html_path=_setting(config, "resume_matrix_html"),
        isolation=isolation,
        exhaustive=bool(config.getoption("resume_matrix_exhaustive") or config.getini("resume_matrix_exhaustive")),
    )


def _seed(config: pytest.Config) -> int:
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and "resume_matrix_seed" in worker_input:
        return int(worker_input["resume_matrix_seed"])
    raw = _setting(config, "resume_matrix_seed")
    cache = getattr(config, "cache", None)
    if raw == "last":
        if cache is None:
            raise pytest.UsageError(ERR_SEED_NO_CACHE.format(opt=OPT_SEED))
        seed = cache.get(CACHE_SEED, None)
        if seed is None:
            raise pytest.UsageError(ERR_SEED_LAST.format(opt=OPT_SEED))
        return int(seed)
    if raw is None and cache is not None and _rerunning_failures(config):
        seed = cache.get(CACHE_SEED, None)  # --lf / --ff: the cells that failed exist only with their seed
        if seed is not None:
            return int(seed)
    if raw is None:
        return Random().randrange(10**6)
    try:
        return int(raw)
    except ValueError:
        raise pytest.UsageError(ERR_SEED.format(opt=OPT_SEED, value=raw)) from None


def _rerunning_failures(config: pytest.Config) -> bool:
    return any(config.getoption(name, False) for name in ("lf", "failedfirst"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a cell of the resume matrix (pytest-resume-check)")
    _take_node_ids(config)
    settings = _settings(config)
    old = config.getoption("resume_matrix_old_mode")
    if old and not hasattr(config, "workerinput"):
        config.issue_config_time_warning(pytest.PytestDeprecationWarning(DEPRECATED_MODE.format(
            old=f"{OPT_MATRIX}={old}", new=f"{OPT_MATRIX} {OPT_MODE}={old}", opt=OPT_MATRIX)), stacklevel=2)
    config.stash[SETTINGS_KEY] = settings
    config.stash[TARGETS_KEY] = []
    config.stash[RESULTS_KEY] = []
    if settings.mode and getattr(config, "cache", None) is not None and not hasattr(config, "workerinput"):
        config.cache.set(CACHE_SEED, settings.seed)
    config.pluginmanager.register(_ResultCollector(config, config.stash[RESULTS_KEY]), "resume_check_results")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistSeed(settings.seed), "resume_check_xdist")


#: Node ids of matrix cells given as arguments (``resume-matrix::t[case-auto-ckpt1]``, pasted from a
#: ``FAILED`` line): taken out of the paths pytest collects, and selected after the matrix is built.
NODE_IDS_KEY = pytest.StashKey[tuple]()
NODE_PREFIX = "resume-matrix::"


def _take_node_ids(config: pytest.Config) -> None:
    """Move cell node ids out of ``config.args`` (pytest would look for a file named ``resume-matrix``).
    With only such ids given, nothing else is collected."""
    ids = tuple(a for a in config.args if a.startswith(NODE_PREFIX))
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:  # an xdist worker: the controller took them out and passes them on
        ids = tuple(worker_input.get("resume_matrix_node_ids", ())) or ids
    config.stash[NODE_IDS_KEY] = ids
    if ids:
        config.args[:] = [a for a in config.args if not a.startswith(NODE_PREFIX)]


class _XdistSeed:
    """Hands the controller's seed to every xdist worker so all collect the same cells."""

    def __init__(self, seed: int):
        self.seed = seed

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["resume_matrix_seed"] = self.seed
        node.workerinput["resume_matrix_node_ids"] = list(node.config.stash.get(NODE_IDS_KEY, ()))

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker's services that failed to stop (or left processes running), said by the controller."""
        _print_problems(node.config, list(getattr(node, "workeroutput", {}).get(WORKER_PROBLEMS, ())))

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """With the matrix on and xdist's default distribution, the cells of one case and resume mode go
        to one worker: they share a first run and a reference, which every worker that runs one of them
        would otherwise make again (issue 14). A case's two modes may go to two workers (its reference is
        then made twice), which keeps a one-case target parallel. Other tests are spread one by one, as
        ``load`` does."""
        if not config.stash[SETTINGS_KEY].mode or config.getoption("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ByCaseAndMode(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return case_group(nodeid)

            def remove_node(self, node: Any) -> str | None:
                """As xdist's, but the cell that was running when the worker crashed is not run again:
                xdist reports it as crashed, and its scope's other cells go to another worker (xdist 3.8
                queued the crashed cell again, which crashed every replacement worker in turn)."""
                workload = self.assigned_work.pop(node)
                if not self._pending_of(workload):
                    return None
                crashed = next(n for unit in workload.values() for n, done in unit.items() if not done)
                for unit in workload.values():
                    if crashed in unit:
                        unit[crashed] = True
                self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
                for other in self.assigned_work:
                    self._reschedule(other)
                return crashed

        return ByCaseAndMode(config, log)


def case_group(nodeid: str) -> str:
    """The xdist work unit of a test: a matrix cell's (target, case, resume mode), any other test alone."""
    from pytest_resume_check.records.kill_ids import split_cell_name

    parts = split_cell_name(nodeid[len(NODE_PREFIX):]) if nodeid.startswith(NODE_PREFIX) else None
    if parts is None:
        return nodeid
    target, case, mode, _ = parts
    return f"{NODE_PREFIX}{target}[{case}-{mode}"


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    names = config.stash.get(UNRECORDED_KEY, [])
    return [NOT_RECORDED.format(names=", ".join(names))] if names else []


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = config.stash[SETTINGS_KEY]
    if not s.mode:
        return []
    return [f"resume-check: matrix={s.mode} seed={s.seed} (rerun with {OPT_SEED}={s.seed})"]


def _conftest_targets(config: pytest.Config) -> list[Any]:
    """Targets declared by the conftest modules pytest loaded (they are registered as plugins)."""
    from pytest_resume_check.targets import targets_in_module

    found = []
    for module in config.pluginmanager.get_plugins():
        if getattr(module, "__file__", "").endswith("conftest.py"):
            found.extend(targets_in_module(module))
    return found


def _discover(config: pytest.Config) -> list[Any]:
    """The targets of this session: the project's own (declared in the conftest.py files pytest loaded),
    or, when named (``--resume-matrix-target``, ini ``resume_matrix_targets``), those names among the
    project's and the installed packages' (entry points). A package's targets never join a project's
    matrix unasked (issue 14: an empty folder ran this package's self-test cells)."""
    from pytest_resume_check.targets import TargetError, entry_point_targets

    wanted = config.stash[SETTINGS_KEY].targets or _targets_of_named_cells(config)
    try:
        project = _unique(_conftest_targets(config))
        # Installed packages' targets only when asked for: a broken or clashing package must not stop a
        # project's own matrix.
        needed = (not project) or any(w not in project for w in wanted)
        installed = _unique(entry_point_targets()) if needed else {}
    except TargetError as exc:
        raise pytest.UsageError(str(exc)) from None
    everything = {**installed, **project}
    if wanted:
        missing = [w for w in wanted if w not in everything]
        if missing:
            raise pytest.UsageError(ERR_NO_TARGET.format(opt=OPT_TARGET, names=", ".join(missing),
                                                         known=", ".join(sorted(everything)) or "none"))
        targets = [everything[w] for w in dict.fromkeys(wanted)]
    else:
        targets = list(project.values())
    config.hook.pytest_resume_check_targets(config=config, targets=targets)
    if not targets:
        raise pytest.UsageError(ERR_NO_PROJECT_TARGETS.format(opt=OPT_MATRIX, known=", ".join(sorted(installed))
                                                              or "none installed"))
    return targets


def _named_cells(config: pytest.Config) -> list[str]:
    """Cell names given by ``--resume-matrix-cell`` or as pasted node ids."""
    settings = config.stash[SETTINGS_KEY]
    names = [settings.cell] if settings.cell else []
    return names + [n[len(NODE_PREFIX):] for n in config.stash.get(NODE_IDS_KEY, ())]


def _targets_of_named_cells(config: pytest.Config) -> tuple[str, ...]:
    """The targets of the named cells: naming a cell names its target, so a rerun line works also where
    that target is an installed package's."""
    return tuple(dict.fromkeys(n.partition("[")[0] for n in _named_cells(config)))


def _unique(targets: list[Any]) -> dict[str, Any]:
    """Targets by name; the first of a name wins."""
    unique: dict[str, Any] = {}
    for t in targets:
        unique.setdefault(t.name, t)
    return unique


class ResumeMatrix(pytest.Collector):
    """Collector that holds the matrix cells."""

    def collect(self) -> list[pytest.Item]:
        from pytest_resume_check.cells import matrix
        from pytest_resume_check.process import starter
        from pytest_resume_check.targets import TargetError, describe_error

        settings = self.config.stash[SETTINGS_KEY]
        items = []
        targets = _discover(self.config)
        for target in targets:  # all of them, before the fork server starts with the first run
            starter.add_preload(target.preload)
        for target in targets:
            try:
                target = self._checked(target)
                cells = matrix.cells(target, settings.mode, settings.seed)
            except Exception as exc:  # one failing item for a broken target; the others still run (issue 13)
                message = str(exc) if isinstance(exc, TargetError) else ERR_BROKEN.format(
                    name=target.name, error=describe_error(exc))
                items.append(BrokenTarget.from_parent(self, message=message, **self._named(f"{target.name}[matrix]")))
                continue
            if target.crash_save and self.config.option.collectonly:
                self.config.stash.setdefault(UNRECORDED_KEY, []).append(target.name)
            elif target.crash_save:
                try:
                    cells += self._crash_cells(target, settings)
                except Exception as exc:  # a target whose save cannot even be recorded
                    items.append(BrokenTarget.from_parent(self, message=str(exc),
                                                          **self._named(f"{target.name}[record-save]")))
            for cell in cells:
                items.append(ResumeCell.from_parent(self, cell=cell, **self._named(f"{target.name}[{cell.id}]")))
        return items

    def _named(self, name: str) -> dict[str, str]:
        """An item's name with its node id spelled out: pytest 9 builds a child's structured id with the
        ``[...]`` inside the name, while the ``--lf`` cache parses it as parameters, so cells never matched
        the failures it recorded (issue 14)."""
        return {"name": name, "nodeid": f"{self.nodeid}::{name}"}

    def _checked(self, target: Any) -> Any:
        """``target`` with the cases a ``pytest_resume_check_cases`` hook answers instead, if one does;
        its name and case ids checked again (a hook or ``with_options`` may have bypassed the declaration)."""
        from pytest_resume_check.targets import ERR_TARGET_NAME, TargetError, check_cases, describe_error, name_problem

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

    def _crash_cells(self, target: Any, settings: Settings) -> list[Any]:
        return _engine(self.config).crash_cells(target, settings.mode)


class BrokenTarget(pytest.Item):
    """Stands for a target the matrix could not even be built for; fails with the reason."""

    def __init__(self, *, message: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.message = message
        self.add_marker(MARKER)

    def runtest(self) -> None:
        raise ResumeCheckFailure(self.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"resume-matrix {self.name}"


class ResumeCheckFailure(Exception):
    """A cell's verdict failed; the message is the whole report."""


class ResumeCell(pytest.Item):
    """One cell of the matrix: reference run (shared per case), interrupted runs, verdict."""

    def __init__(self, *, cell: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.cell = cell
        self.add_marker(MARKER)
        if cell.xfail_reason:
            self.add_marker(pytest.mark.xfail(reason=cell.xfail_reason, strict=True,
                                              raises=ResumeCheckFailure))
        self.user_properties += [("target", cell.target.name), ("case", cell.case_id),
                                 ("resume_mode", cell.resume_mode), ("kill", cell.kill_id)]

    def runtest(self) -> None:
        from pytest_resume_check import categories
        from pytest_resume_check.report import text as report
        from pytest_resume_check.targets import TargetError

        try:
            result = _engine(self.config).run_cell(self.cell)
        except TargetError as exc:  # the target cannot run at all: one line, and the cell is counted
            cell = self.cell
            headline = f"{categories.TARGET_ERROR}: {exc}"
            self.cell_json = report.unjudged_cell_json(cell.target.name, cell.case_id, cell.resume_mode, cell.kills,
                                                       cell.kill_id, headline, categories.TARGET_ERROR, cell.case,
                                                       cell.xfail_reason)  # counted as pytest counts it
            self.cell_json["rerun"] = rerun_command(self)
            raise ResumeCheckFailure(headline) from None
        self.stash[RESULT_KEY] = result
        self.cell_json = report.cell_json(result)
        self.cell_json["rerun"] = rerun_command(self)
        self.config.hook.pytest_resume_check_cell_result(config=self.config, result=result)
        self.user_properties += [("verdict", ",".join(result.verdict.categories) or "PASSED"),
                                 ("headline", result.verdict.headline)]
        if not result.passed:
            raise ResumeCheckFailure(report.failure_text(result, rerun_command(self)))
        if result.workdir is not None:
            _engine(self.config).layout.remove(result.workdir)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        from pytest_resume_check.targets import TargetError

        # TargetError: the target itself is broken (a preload module that fails to import), one line says why.
        if isinstance(excinfo.value, (ResumeCheckFailure, TargetError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"resume-matrix {self.name}"


def rerun_command(item: pytest.Item) -> str:
    """The command that reruns exactly this cell with the same seed (run from the same directory)."""
    return _rerun_of(item.config, item.name)


def _rerun_of(config: pytest.Config, name: str) -> str:
    from pytest_resume_check.report import text as report

    settings = config.stash[SETTINGS_KEY]
    args = list(config.args) if config.args_source == pytest.Config.ArgsSource.ARGS else []
    options = []
    if settings.isolation:
        options.append(f"{OPT_ISOLATION}={settings.isolation}")
    if settings.exhaustive:
        options.append(OPT_EXHAUSTIVE)
    if config.getoption("resume_matrix_hang_timeout") is not None:  # the ini (or a target) is read again
        options.append(f"{OPT_HANG}={settings.hang_timeout:g}")
    return report.rerun_command(name, settings.mode, settings.seed, args, options)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    settings = config.stash[SETTINGS_KEY]
    if not settings.mode:
        return
    node = ResumeMatrix.from_parent(session, name="resume-matrix", nodeid="resume-matrix")
    cells = node.collect()
    config.stash[CELLS_KEY] = [item.cell for item in cells if isinstance(item, ResumeCell)]
    # Report the cells as collected, so "collected N items" and the deselected counts include them.
    config.hook.pytest_collectreport(report=pytest.CollectReport(node.nodeid, "passed", None, cells))
    names = _named_cells(config)
    if names:  # exactly these cells (and, for pasted node ids, the tests of any paths given with them)
        by_name = {c.name: c for c in cells}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise pytest.UsageError(ERR_NO_CELL.format(opt=OPT_CELL if settings.cell else "node id",
                                                       value=missing[0], mode=settings.mode, seed=settings.seed))
        chosen = [by_name[n] for n in dict.fromkeys(names)]
        others = [] if config.stash.get(NODE_IDS_KEY, ()) else list(items)
        config.hook.pytest_deselected(items=others + [c for c in cells if c not in chosen])
        items[:] = [i for i in items if i not in others] + chosen
        return
    items.extend(cells)


def _session_root(config: pytest.Config) -> Path:
    """The session's folder: ``resume-matrix<N>`` in pytest's own base temporary directory, so
    ``--basetemp``, ``tmp_path_retention_count`` and ``tmp_path_retention_policy`` decide where runs
    keep their files and how many sessions stay, the folder is private (pytest checks its owner and
    that it is no symlink), and no session removes another live session's folder (pytest keeps a
    numbered directory while its lock is held). Without pytest's tmpdir plugin: a private new folder."""
    if ROOT_KEY not in config.stash:
        factory = getattr(config, "_tmp_path_factory", None)
        if factory is not None:
            root = factory.mktemp(SESSION_FOLDER, numbered=True)
        else:
            root = Path(tempfile.mkdtemp(prefix=f"pytest-{SESSION_FOLDER}-"))
        config.stash[ROOT_KEY] = root
    return config.stash[ROOT_KEY]


def _engine(config: pytest.Config) -> Any:
    if ENGINE_KEY not in config.stash:
        from pytest_resume_check.engine import Engine

        s = config.stash[SETTINGS_KEY]
        engine = Engine(_session_root(config), s.seed, s.hang_timeout, s.isolation, share=not s.exhaustive,
                        hang_forced=config.getoption("resume_matrix_hang_timeout") is not None)
        engine.register(config.stash.get(CELLS_KEY, []))
        config.stash[ENGINE_KEY] = engine
    return config.stash[ENGINE_KEY]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Also after Ctrl-C: no process a run started outlives the session, nor the fork server; of the
    session's files only the failing cells' folders stay (with their cases' references)."""
    if ENGINE_KEY in session.config.stash:
        from pytest_resume_check.process import starter

        problems = session.config.stash[ENGINE_KEY].close()  # services first: they may use the server
        worker_output = getattr(session.config, "workeroutput", None)
        if worker_output is not None:  # an xdist worker's output is not shown: its controller prints them
            worker_output[WORKER_PROBLEMS] = problems
        else:
            _print_problems(session.config, problems)
        starter.stop_server()
        try:
            session.config.stash[ENGINE_KEY].layout.tidy()
        except OSError:  # the folder went away under the session: nothing left to tidy
            pass


#: Key of ``config.workeroutput``: what went wrong when an xdist worker stopped its services.
WORKER_PROBLEMS = "resume_check_problems"


def _print_problems(config: pytest.Config, problems: list[str]) -> None:
    """Print each line in red, whatever the verbosity (a service that failed to stop, processes it left)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for problem in problems:
        if reporter is not None:
            reporter.write_line(problem, red=True)
        else:
            print(problem, file=sys.stderr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if isinstance(item, ResumeCell) and call.when == "call" and hasattr(item, "cell_json"):
        # Carried on the report, so an xdist controller receives it with the report.
        rep.resume_check_cell = item.cell_json
        paid = item.stash[RESULT_KEY].reference_seconds if RESULT_KEY in item.stash else 0.0
        if paid:
            rep.user_properties.append(("reference_seconds", round(paid, 3)))
    return rep


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    """With ``-v``, a passing cell that made its case's reference runs says how long they took: that time
    counts toward its own duration (and a pytest-timeout limit), not the others'. (A failing cell keeps
    pytest's plain ``FAILED``, so its line still starts with the node id to paste.)"""
    paid = dict(report.user_properties).get("reference_seconds") if report.when == "call" else None
    if not paid or not report.passed or hasattr(report, "wasxfail") or not report.nodeid.startswith(NODE_PREFIX):
        return None
    return report.outcome, ".", f"PASSED (reference runs {paid:.1f} s)"


class _ResultCollector:
    """Gathers each cell's JSON from the reports (in the controller too, when xdist runs the cells), and
    gives each cell its junit ``classname``."""

    def __init__(self, config: pytest.Config, results: list[dict[str, Any]]):
        self.config = config
        self.results = results
        #: Node ids of matrix items that failed without being cells (a target whose matrix cannot be built).
        self.broken: list[str] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cell = getattr(report, "resume_check_cell", None)
        if cell is None and report.failed and report.when in ("call", "???"):  # "???": xdist's crashed worker
            cell = self._unjudged(report)
        if cell is not None:
            self.results.append(cell)
        if report.nodeid.startswith(NODE_PREFIX):
            self._junit_classname(report)

    def _unjudged(self, report: pytest.TestReport) -> dict[str, Any] | None:
        """The JSON of a matrix cell that failed without a verdict, so the summary counts it as pytest does
        (issue 26: a crashed xdist worker's cell was drawn as passed and missing from the JSON)."""
        from pytest_resume_check.judge import harness_errors
        from pytest_resume_check.report import text as rp

        if not report.nodeid.startswith(NODE_PREFIX):
            return None
        name = report.nodeid[len(NODE_PREFIX):]
        parts = kill_ids.split_cell_name(name)
        if parts is None:
            self.broken.append(report.nodeid)
            return None
        target, case, mode, kill = parts
        try:
            kills = kill_ids.parse_kill_id(kill)
        except ValueError:
            kills = ()
        lines = [ln.strip() for ln in str(report.longreprtext).strip().splitlines() if ln.strip()]
        what = lines[-1] if lines else "no details"  # xdist: "worker 'gw0' crashed while running '...'"
        template = harness_errors.MSG_WORKER_CRASHED if report.when == "???" else harness_errors.MSG_BUG
        headline = template.format(what=what[:200], kept="")
        cell = rp.unjudged_cell_json(target, case, mode, kills, kill, headline)
        cell["rerun"] = _rerun_of(self.config, name)
        return cell

    def _junit_classname(self, report: pytest.TestReport) -> None:
        """``resume-matrix.<target>``, so CI views group the cells by target (from the node id alone it
        is ``resume-matrix`` for all). Set before junitxml records the report; it keeps such attributes."""
        from _pytest import junitxml

        key = getattr(junitxml, "xml_key", None)
        xml = self.config.stash.get(key, None) if key is not None else None
        target = dict(report.user_properties).get("target")
        if xml is not None and target:
            xml.node_reporter(report).add_attribute("classname", f"resume-matrix.{target}")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from pytest_resume_check import categories
    from pytest_resume_check.report import summary

    results = sorted(config.stash[RESULTS_KEY], key=summary.cell_name)
    settings = config.stash[SETTINGS_KEY]
    if not results or hasattr(config, "workerinput"):
        return
    failed = [r for r in results if categories.fails(r)]  # an XPASS fails, as pytest counts it
    expected = [r for r in results if categories.status(r) == categories.XFAIL]
    tr = terminalreporter
    broken = config.pluginmanager.get_plugin("resume_check_results").broken
    tr.write_sep("=", f"resume matrix: {len(results)} cells, {len(failed)} failing, "
                      f"{len(expected)} expected failures, "
                      + (f"{len(broken)} target{'s' if len(broken) > 1 else ''} whose matrix could not be built, "
                         if broken else "") + f"seed {settings.seed}")
    for line in summary.session_lines(results, width=min(100, tr._tw.fullwidth), more_hint=OPT_JSON):
        tr.write_line(line)
    if settings.json_path:
        from pytest_resume_check.report import text as report

        path = Path(settings.json_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(report.dump_json(results, settings.seed))
        except OSError as exc:  # a report that cannot be written must not change the matrix's result
            tr.write_line(_cannot_write("JSON", path, exc, OPT_JSON), red=True)
        else:
            tr.write_line(f"resume matrix verdicts written to {path}")
    if settings.html_path:
        from pytest_resume_check.report import html

        try:
            written = html.write_report(results, Path(settings.html_path), seed=settings.seed)
        except OSError as exc:
            tr.write_line(_cannot_write("HTML", settings.html_path, exc, OPT_HTML), red=True)
        else:
            tr.write_line(f"resume matrix HTML report written to {written}")


def _cannot_write(kind: str, path: Any, exc: OSError, opt: str) -> str:
    return ERR_REPORT_WRITE.format(kind=kind, path=path, reason=exc.strerror or exc, opt=opt)
