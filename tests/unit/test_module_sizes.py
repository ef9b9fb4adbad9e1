"""The pytest side stays readable: no module of the plugin (its hooks, items, session, reports), the hook specs,
the cluster's pytest side or the target declaration grows past 300 lines; a module that does is split by what it
is responsible for (CONTRIBUTING.md, "Where a new module goes")."""

from __future__ import annotations

from pathlib import Path

import pytest_resume_check

PACKAGE = Path(pytest_resume_check.__file__).parent
#: The modules a newcomer reads to follow a cell from its pytest item to its report line.
PYTEST_SIDE = sorted([*(PACKAGE / "plugin").glob("*.py"), PACKAGE / "hookspecs.py", PACKAGE / "targets.py",
                      PACKAGE / "cluster" / "executor.py"])
MOST_LINES = 300


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_of_the_pytest_side_is_over_300_lines():
    assert len(PYTEST_SIDE) > 10  # the glob found the plugin package
    too_long = {str(p.relative_to(PACKAGE)): lines_of(p) for p in PYTEST_SIDE if lines_of(p) > MOST_LINES}
    assert not too_long, f"split these by responsibility (at most {MOST_LINES} lines each): {too_long}"
