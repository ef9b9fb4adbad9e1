"""The matrix's part of the terminal summary, its JSON and HTML files, the red lines of services
that failed to stop, and a line on where the runs' time went when they spent most of it starting."""

from __future__ import annotations

import os
import statistics
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_resume_check.plugin.options import GITHUB_STEP_SUMMARY
from pytest_resume_check.plugin.settings import Settings
from pytest_resume_check.records.names import OPT_HTML, OPT_JSON, OPT_STEP_SUMMARY
from pytest_resume_check.records.regular_files import NotRegular, open_for_append

if TYPE_CHECKING:
    from pytest_resume_check.records.cell_json import CellJson

ERR_REPORT_WRITE = ("resume matrix: cannot write the {kind} report to {path}: {reason}; choose a writable path "
                    "with {opt}")
SUMMARY_HEADER = "resume matrix: {cells} cells, {failing} failing, {expected} expected failures, {broken}seed {seed}"
#: Part of the summary's header when some targets' cells could not be built.
BROKEN = "{count} target{s} whose matrix could not be built, "
JSON_WRITTEN = "resume matrix verdicts written to {path}"
HTML_WRITTEN = "resume matrix HTML report written to {path}"
REPRO_WRITTEN = ("resume matrix: reproductions of {count} failing cell{s} written to {path} (in each folder, the "
                 "command in its README.md runs the cell alone)")
ERR_STEP_SUMMARY = ("resume matrix: cannot append the step summary to {path}: {reason}; the session's result is "
                    "unchanged (point " + OPT_STEP_SUMMARY + " at a writable file)")
#: An existing step summary path that is no regular file (``kind``: what it is, records.regular_files).
ERR_STEP_SUMMARY_NOT_REGULAR = ("resume matrix: the step summary is not written: {path} is {kind}, not a regular file; "
                                "the session's result is unchanged (point " + OPT_STEP_SUMMARY + " or $"
                                + GITHUB_STEP_SUMMARY + " at a regular file)")
#: Said instead of the summary when the step's file has little room left under GitHub's limit.
STEP_SUMMARY_FULL = ("### {header}\n\nNo room for the grids and the failing cells: this step's summary is "
                     "nearly {limit} KiB, all GitHub shows.\n")
#: The summary's line under a budget: the reason the cells left out were skipped with, then each by target.
LEFT_OUT_LINE = "resume matrix: {reason}; {count} left out: {names}"
#: The summary grid is at most this wide.
MAX_WIDTH = 100
#: Said last when the runs spent most of their time before their first step (a target declared
#: without preload ran 7x slower, and nothing said where the time went).
TIME_NOTE = ("resume-check: runs spent {share:.0%} of their time before their first step (median {median:.1f} s"
             "{where}); preload the modules your trainer imports, and a warm-up for what it builds on first use: "
             "preload=(\"torch\", \"my_trainer\", \"my_trainer:warm_up\") (docs/writing-a-target.md){why}")
#: The same, when the target that spent most is a command target whose program is a process of its own.
TIME_NOTE_COMMAND = ("resume-check: runs spent {share:.0%} of their time before their first step (median {median:.1f} s"
                     "{where}); the program of a command target starts as a process of its own each run and pays its "
                     "own imports every time, which no preload spares; a Python script that reports through "
                     "pytest_resume_check.client, started as {{python}} script.py, runs in the run's process with "
                     "its imports preloaded (docs/recipes/command.md, Cost)")
#: The same, naming what the runs of the target that spent most imported themselves (the fork server had not):
#: ``{preload}`` is the tuple to declare, ``("torch", "transformers")``.
TIME_NOTE_IMPORTED = ("resume-check: runs spent {share:.0%} of their time before their first step "
                      "(median {median:.1f} s{where}); its runs imported what the fork server had not: "
                      "preload={preload} would import it once, and a warm-up for what it builds on first use "
                      "spares that too (docs/writing-a-target.md){why}")
TIME_NOTE_WHERE = ", most in target {target!r}"
#: Appended when the fork server could not preload a target's module by itself (``auto_preload``).
TIME_NOTE_WHY = "; not preloaded by itself: {notes}"
#: Appended for targets that turned the server's own preload off.
TIME_NOTE_MANUAL = "; {targets} declared auto_preload=False (the fork server then imports only what preload= names)"
#: The note's thresholds. At least this share of the runs' time went before their first step: then start-up,
#: not training, is what the matrix costs, and preloading can save more than it costs to add.
NOTE_SHARE = 0.5
#: And a run's median start-up (seconds) is at least this: a run forked from a server that has its imports
#: and torch's first-use costs behind it reaches its first step in tens of milliseconds plus building the
#: trainer (a small torch loop: 0.3 s median on 2 cores at load 6-8, benchmarks/untuned_cost.py), while one
#: import of torch costs 2-3 s per run, and torch._dynamo (the first optimizer step) 1-3 s. Below this, what
#: a run spends starting is mostly the trainer's own building, which no preload saves.
NOTE_MEDIAN = 1.0
#: And all runs together spent at least this many seconds starting: less is not worth a line.
NOTE_TOTAL = 10.0


def write_summary(tr: pytest.TerminalReporter, results: Sequence[CellJson], broken: Sequence[str],
                  settings: Settings) -> None:
    """The header line, the grids and failing cells, then the JSON and HTML files asked for."""
    from pytest_resume_check import categories
    from pytest_resume_check.report import summary
    from pytest_resume_check.report.text import visible

    results = sorted(results, key=summary.cell_name)
    failed = [r for r in results if categories.fails(r)]  # an XPASS fails, as pytest counts it
    expected = [r for r in results if categories.status(r) == categories.XFAIL]
    some_broken = BROKEN.format(count=len(broken), s="s" if len(broken) > 1 else "") if broken else ""
    tr.write_sep("=", SUMMARY_HEADER.format(cells=len(results), failing=len(failed), expected=len(expected),
                                            broken=some_broken, seed=settings.seed))
    width = min(MAX_WIDTH, tr.config.get_terminal_writer().fullwidth)  # pytest's public way to the width
    for line in summary.session_lines(results, width=width, more_hint=OPT_JSON):
        tr.write_line(visible(line))  # headlines quote the trainer's exceptions and log lines
    if settings.repro_dir:
        _say_repros(tr, results, settings.repro_dir)
    if settings.step_summary:
        header = SUMMARY_HEADER.format(cells=len(results), failing=len(failed), expected=len(expected),
                                       broken=some_broken, seed=settings.seed)
        _write_step_summary(tr, results, header, settings.step_summary)
    if settings.json_path:
        _write_json(tr, results, Path(settings.json_path), settings.seed)
    if settings.html_path:
        _write_html(tr, results, settings.html_path, settings.seed)
    note = time_note(_start_costs(tr.config))
    if note:
        tr.write_line(note, yellow=True)


def left_out_line(reason: str, names: Sequence[str]) -> str:
    """One line naming every cell ``--resume-matrix-budget`` left out (``reason``: their skip reason),
    grouped by target: ``t[a-auto-ckpt1, a-path-ckpt2]; u[...]``."""
    from pytest_resume_check.records.kill_ids import target_of

    by_target: dict[str, list[str]] = {}
    for name in sorted(names):
        target = target_of(name)
        by_target.setdefault(target, []).append(name[len(target) + 1:-1])
    grouped = "; ".join(f"{target}[{', '.join(ids)}]" for target, ids in by_target.items())
    return LEFT_OUT_LINE.format(reason=reason, count=len(names), names=grouped)


def _start_costs(config: pytest.Config) -> dict[str, Any] | None:
    """Where the runs of this process spent their time (None: it ran none; with pytest-xdist the workers
    ran them and this process has no figures). The session's engine is found among the registered plugins
    (the matrix session holds it) rather than by importing the session module, which imports this one."""
    for plugin in config.pluginmanager.get_plugins():
        runner = getattr(getattr(plugin, "_engine", None), "runner", None)
        if runner is not None and hasattr(runner, "start_costs"):
            costs: dict[str, Any] = runner.start_costs()
            return costs
    return None


def time_note(costs: dict[str, Any] | None) -> str | None:
    """The line saying where the runs' time went, when they spent most of it before their first step (see
    :data:`NOTE_SHARE`, :data:`NOTE_MEDIAN`, :data:`NOTE_TOTAL`), naming what the runs of the target that
    spent most imported themselves when they told it (:data:`TIME_NOTE_IMPORTED`); None otherwise. ``costs``:
    :meth:`~pytest_resume_check.process.runner.Runner.start_costs`. It never changes a verdict."""
    targets = (costs or {}).get("targets", {})
    starts = [x for t in targets.values() for x in t["starts"]]
    seconds = sum(t["seconds"] for t in targets.values())
    if not starts or seconds <= 0:
        return None
    started = sum(starts)
    median = statistics.median(starts)
    if started / seconds < NOTE_SHARE or median < NOTE_MEDIAN or started < NOTE_TOTAL:
        return None
    slowest = max(targets, key=lambda name: sum(targets[name]["starts"]))
    where = TIME_NOTE_WHERE.format(target=slowest) if len(targets) > 1 else ""
    if targets[slowest].get("command"):
        return TIME_NOTE_COMMAND.format(share=started / seconds, median=median, where=where)
    imported = targets[slowest].get("imported")
    notes = (costs or {}).get("not_preloaded", [])
    why = TIME_NOTE_WHY.format(notes="; ".join(notes)) if notes else ""
    manual = [repr(name) for name, t in targets.items() if not t.get("auto_preload", True)]
    why += TIME_NOTE_MANUAL.format(targets=", ".join(manual)) if manual else ""
    if imported:
        return TIME_NOTE_IMPORTED.format(share=started / seconds, median=median, where=where, why=why,
                                         preload=preload_tuple(imported))
    return TIME_NOTE.format(share=started / seconds, median=median, where=where, why=why)


def preload_tuple(modules: Sequence[str]) -> str:
    """``modules`` as the ``preload=`` value to write: ``("torch",)``, ``("torch", "transformers")``."""
    quoted = [f'"{name}"' for name in modules]
    return "(" + ", ".join(quoted) + ("," if len(quoted) == 1 else "") + ")"


def _write_json(tr: pytest.TerminalReporter, results: Sequence[CellJson], path: Path, seed: int) -> None:
    from pytest_resume_check.report import text as report

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.dump_json(results, seed))
    except OSError as exc:  # a report that cannot be written must not change the matrix's result
        tr.write_line(_cannot_write("JSON", path, exc, OPT_JSON), red=True)
    else:
        tr.write_line(JSON_WRITTEN.format(path=path))


def _write_html(tr: pytest.TerminalReporter, results: Sequence[CellJson], path: str, seed: int) -> None:
    from pytest_resume_check.report import html

    try:
        written = html.write_report(results, Path(path), seed=seed)
    except OSError as exc:
        tr.write_line(_cannot_write("HTML", path, exc, OPT_HTML), red=True)
    else:
        tr.write_line(HTML_WRITTEN.format(path=written))


def _say_repros(tr: pytest.TerminalReporter, results: Sequence[CellJson], path: str) -> None:
    """How many failing cells' reproductions were written, and why any could not be (in the process that
    ran the cell: an xdist worker's warnings would be lost)."""
    from pytest_resume_check.report.repro import CELL_ERROR_KEY, CELL_KEY

    written = sum(1 for r in results if r.get(CELL_KEY))
    if written:
        tr.write_line(REPRO_WRITTEN.format(count=written, s="" if written == 1 else "s", path=path))
    for error in dict.fromkeys(r[CELL_ERROR_KEY] for r in results if r.get(CELL_ERROR_KEY)):
        tr.write_line(error, yellow=True)


def _write_step_summary(tr: pytest.TerminalReporter, results: Sequence[CellJson], header: str, path: str) -> None:
    """Append the Markdown summary to ``path`` (GitHub's step summary), within what GitHub shows: a file
    that cannot be written, or an existing path that is no regular file (a FIFO would wait for a reader
    forever), is a warning naming it, never the session's failure; ``/dev/null`` takes none."""
    from pytest_resume_check.report import markdown

    if os.path.realpath(path) == os.devnull:  # the documented way to write none
        return
    try:
        fd = open_for_append(path)
    except NotRegular as exc:
        _warn(tr, ERR_STEP_SUMMARY_NOT_REGULAR.format(path=path, kind=exc.kind))
        return
    except OSError as exc:
        _warn(tr, ERR_STEP_SUMMARY.format(path=path, reason=exc.strerror or exc))
        return
    try:
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            size = os.fstat(fd).st_size
            room = markdown.GITHUB_LIMIT - size - 1  # its "\n"
            text = STEP_SUMMARY_FULL.format(header=header, limit=markdown.GITHUB_LIMIT // 1024)
            if room >= markdown.MAX_BYTES // 4:
                text = markdown.step_summary(results, header, width=MAX_WIDTH, max_bytes=min(markdown.MAX_BYTES, room),
                                             more_hint=OPT_JSON)
            elif room < len(text.encode()):
                return
            f.write(("\n" if size else "") + text)
    except OSError as exc:
        _warn(tr, ERR_STEP_SUMMARY.format(path=path, reason=exc.strerror or exc))


def _warn(tr: pytest.TerminalReporter, message: str) -> None:
    """``message`` as a pytest warning, or as a yellow line when warnings are errors (``-W error``): the
    summary is an extra, it must not end the session."""
    try:
        warnings.warn(pytest.PytestWarning(message), stacklevel=2)
    except Warning:
        tr.write_line(message, yellow=True)


def _cannot_write(kind: str, path: Any, exc: OSError, opt: str) -> str:
    return ERR_REPORT_WRITE.format(kind=kind, path=path, reason=exc.strerror or exc, opt=opt)


def print_problems(config: pytest.Config, problems: Sequence[str]) -> None:
    """Print each line in red, whatever the verbosity (a service that failed to stop, processes it left)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for problem in problems:
        if reporter is not None:
            reporter.write_line(problem, red=True)
        else:
            print(problem, file=sys.stderr)


def print_server_line(config: pytest.Config, line: str | None, worker: str | None = None) -> None:
    """Say whether the shared fork server (``--resume-matrix-server=on``) was found warm or started cold, and
    why: this session's, or an xdist ``worker``'s (said by its controller)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(f"resume-check: {worker + ': ' if worker else ''}{line}")
