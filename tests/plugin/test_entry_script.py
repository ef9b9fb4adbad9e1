"""The script a session was started as (``pytest``, a console script) is imported once, by the fork server,
not again by every run.

Python's multiprocessing runs its starter's ``__main__`` script again in every process it starts, unless
that process already has it as ``__main__``; started as ``pytest``, every run imported ``_pytest.config``
(about 0.1 s of CPU each, which made README's main job 1.3x slower than ``python -m pytest``). With
``auto_preload`` the server imports a script that only imports, once; the runs find it there. Checked
here from a console script of our own whose one import leaves the pid of each process that imports it
(the session, then the server only), against the same project with ``auto_preload=False``, whose runs each
import it again: the verdicts of the two are the same cell by cell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from project_session import write_project

pytestmark = pytest.mark.slow

#: What pip writes for an entry point, and one import that notes the process it runs in.
SCRIPT = """\
import re
import sys
import noting_import
from pytest import console_main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(console_main())
"""
NOTING = """\
import os
with open(os.environ["NOTED_PIDS"], "a") as noted:
    noted.write(f"{os.getpid()}\\n")
"""


def session(project: Path, noted: Path, *args: str) -> tuple[list[str], dict]:
    """Run the project's matrix from the console script; the pids that imported it, and the cells' verdicts."""
    noted.write_text("")
    report = project / "cells.json"
    done = subprocess.run(
        [sys.executable, str(project / "console_pytest"), "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "--resume-matrix", "-m", "resume_matrix", "--resume-matrix-server=off", f"--resume-matrix-json={report}",
         *args], cwd=project, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(project), "NOTED_PIDS": str(noted)})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # the planted case fails
    cells = {(c["case_id"], c["resume_mode"], json.dumps(c["kill"])): (c["status"], c["categories"], c["headline"])
             for c in json.loads(report.read_text())["cells"]}
    return noted.read_text().split(), cells


def test_runs_do_not_run_the_sessions_console_script_again_and_verdicts_are_unchanged(tmp_path):
    fast = write_project(tmp_path / "fast")
    slow = write_project(tmp_path / "slow", auto_preload="False")
    for project in (fast, slow):
        (project / "console_pytest").write_text(SCRIPT)
        (project / "noting_import.py").write_text(NOTING)
    noted_fast, cells_fast = session(fast, tmp_path / "fast.pids")
    noted_slow, cells_slow = session(slow, tmp_path / "slow.pids")
    runs = len(cells_slow)  # at least one run a cell
    # Imported by the session and by its fork server, and by no run.
    assert len(set(noted_fast)) == len(noted_fast) == 2, noted_fast
    # Without the automatic preload each run imports it again (the path this one saves).
    assert len(set(noted_slow)) > runs, (len(noted_slow), runs)
    assert cells_fast == cells_slow
    assert {status for status, _, _ in cells_fast.values()} == {"PASSED", "LOST"}  # the planted case fails
