"""The session summary's grid fits the terminal, whose width the plugin takes from pytest's public API
(``config.get_terminal_writer()``), never from the terminal reporter's private writer. No processes.
"""

from __future__ import annotations

from types import SimpleNamespace

from pytest_resume_check.cells import matrix
from pytest_resume_check.plugin import summary
from pytest_resume_check.plugin.settings import Settings
from pytest_resume_check.targets import resume_target

STEPS = 12


def never_run(run):  # only cells are generated; nothing runs a target
    raise AssertionError("not run")


LOOP = resume_target(never_run, name="loop", steps=STEPS, boundaries=lambda case: [6, 12],
                     cases=[{"id": "b4-take2-e2-shuffle"}, {"id": "b4-take3-e2"}])


class Reporter:
    """What ``write_summary`` may use of pytest's terminal reporter: its config and its write calls. It has
    no ``_tw``: reaching the private writer fails the test."""

    def __init__(self, width: int):
        writer = SimpleNamespace(fullwidth=width)
        self.config = SimpleNamespace(get_terminal_writer=lambda: writer,
                                      pluginmanager=SimpleNamespace(get_plugins=lambda: []))
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str, **markup: object) -> None:
        self.lines.append(title)

    def write_line(self, line: str, **markup: object) -> None:
        self.lines.append(line)


def cell_json(cell):
    return {"target": cell.target.name, "case_id": cell.case_id, "resume_mode": cell.resume_mode,
            "kill": cell.kill_id, "kills": [k.to_json() for k in cell.kills], "passed": True, "xfail_reason": None,
            "categories": []}


def test_the_summary_grid_takes_the_terminal_width_from_pytests_public_api():
    results = [cell_json(cell) for cell in matrix.cells(LOOP, matrix.FULL, seed=1)]
    settings = Settings(mode=matrix.FULL, seed=1, targets=(), cells=(), hang_timeout=60.0, json_path=None,
                        isolation=None)
    widths = {}
    for width in (40, 100):
        reporter = Reporter(width)
        summary.write_summary(reporter, results, [], settings)
        # The grids' column headers (the kill points, under the blank of the row labels) are cut to the width.
        widths[width] = max(len(line) for line in reporter.lines if line.startswith(" "))
    assert widths[40] <= 40 < widths[100] <= 100, widths
