"""The matrix's part of the terminal summary, its JSON and HTML files, and the red lines of services
that failed to stop."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_resume_check.plugin.options import OPT_HTML, OPT_JSON, OPT_STEP_SUMMARY, Settings

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
#: Said instead of the summary when the step's file has little room left under GitHub's limit.
STEP_SUMMARY_FULL = ("### {header}\n\nNo room for the grids and the failing cells: this step's summary is "
                     "nearly {limit} KiB, all GitHub shows.\n")
#: The summary grid is at most this wide.
MAX_WIDTH = 100


def write_summary(tr: Any, results: Sequence[dict[str, Any]], broken: Sequence[str], settings: Settings) -> None:
    """The header line, the grids and failing cells, then the JSON and HTML files asked for."""
    from pytest_resume_check import categories
    from pytest_resume_check.report import summary

    results = sorted(results, key=summary.cell_name)
    failed = [r for r in results if categories.fails(r)]  # an XPASS fails, as pytest counts it
    expected = [r for r in results if categories.status(r) == categories.XFAIL]
    some_broken = BROKEN.format(count=len(broken), s="s" if len(broken) > 1 else "") if broken else ""
    tr.write_sep("=", SUMMARY_HEADER.format(cells=len(results), failing=len(failed), expected=len(expected),
                                            broken=some_broken, seed=settings.seed))
    for line in summary.session_lines(results, width=min(MAX_WIDTH, tr._tw.fullwidth), more_hint=OPT_JSON):
        tr.write_line(line)
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


def _write_json(tr: Any, results: Sequence[dict[str, Any]], path: Path, seed: int) -> None:
    from pytest_resume_check.report import text as report

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.dump_json(results, seed))
    except OSError as exc:  # a report that cannot be written must not change the matrix's result
        tr.write_line(_cannot_write("JSON", path, exc, OPT_JSON), red=True)
    else:
        tr.write_line(JSON_WRITTEN.format(path=path))


def _write_html(tr: Any, results: Sequence[dict[str, Any]], path: str, seed: int) -> None:
    from pytest_resume_check.report import html

    try:
        written = html.write_report(results, Path(path), seed=seed)
    except OSError as exc:
        tr.write_line(_cannot_write("HTML", path, exc, OPT_HTML), red=True)
    else:
        tr.write_line(HTML_WRITTEN.format(path=written))


def _say_repros(tr: Any, results: Sequence[dict[str, Any]], path: str) -> None:
    """How many failing cells' reproductions were written, and why any could not be (in the process that
    ran the cell: an xdist worker's warnings would be lost)."""
    from pytest_resume_check.report.repro import CELL_ERROR_KEY, CELL_KEY

    written = sum(1 for r in results if r.get(CELL_KEY))
    if written:
        tr.write_line(REPRO_WRITTEN.format(count=written, s="" if written == 1 else "s", path=path))
    for error in dict.fromkeys(r[CELL_ERROR_KEY] for r in results if r.get(CELL_ERROR_KEY)):
        tr.write_line(error, yellow=True)


def _write_step_summary(tr: Any, results: Sequence[dict[str, Any]], header: str, path: str) -> None:
    """Append the Markdown summary to ``path`` (GitHub's step summary), within what GitHub shows: a file
    that cannot be written is a warning naming it, never the session's failure."""
    from pytest_resume_check.report import markdown

    try:
        room = markdown.GITHUB_LIMIT - (os.path.getsize(path) if os.path.isfile(path) else 0) - 1  # its "\n"
        text = STEP_SUMMARY_FULL.format(header=header, limit=markdown.GITHUB_LIMIT // 1024)
        if room >= markdown.MAX_BYTES // 4:
            text = markdown.step_summary(results, header, width=MAX_WIDTH, max_bytes=min(markdown.MAX_BYTES, room),
                                         more_hint=OPT_JSON)
        elif room < len(text.encode()):
            return
        with open(path, "a", encoding="utf-8") as f:
            f.write(("\n" if f.tell() else "") + text)
    except OSError as exc:
        message = ERR_STEP_SUMMARY.format(path=path, reason=exc.strerror or exc)
        try:
            warnings.warn(pytest.PytestWarning(message), stacklevel=1)
        except Warning:  # -W error: the summary is an extra, it must not end the session
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
