"""Installing the plugin costs a project that does not use the matrix almost nothing: a pytest run
without ``--resume-matrix`` imports only the handful of our modules the always-on hooks need (the
options, the settings, the fixture, the hook specs and the names they spell), as pytest-xdist imports
its distributed session only when it distributes. A project outside this repository, where the plugin is
loaded from its ``pytest11`` entry point; pytest in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: The most of our modules a pytest run that does not use the matrix may import: what the always-on hooks
#: need, measured (8, and pytest-xdist's seed handoff when xdist is installed). Loading the whole plugin
#: imported 34.
MOST_MODULES = 9

#: Records, as the session ends, which of our modules the run imported.
CONFTEST = """
import json
import sys


def pytest_sessionfinish(session):
    ours = sorted(name for name in sys.modules if name.split(".")[0] == "pytest_resume_check")
    with open("imported.json", "w") as out:
        json.dump(ours, out)
"""


def test_a_run_without_the_matrix_imports_only_a_handful_of_our_modules(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    # Options the surrounding session was given must not reach the project's pytest.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    imported = json.loads((tmp_path / "imported.json").read_text())
    assert "pytest_resume_check.plugin" in imported, "the plugin was not loaded from its entry point"
    assert len(imported) <= MOST_MODULES, (
        f"a pytest run without the matrix imported {len(imported)} of our modules (at most {MOST_MODULES}): "
        + ", ".join(imported))
