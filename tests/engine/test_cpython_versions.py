"""The CPython-private names of ``child.cpython`` on every CPython 3.10-3.13 found on this machine (the
adapter's docstring names the versions it was checked on): each name is there, and a fork server is started,
found, stopped and gone through the adapter. Standard library only, so no packages are needed there."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_resume_check

ROOT = Path(pytest_resume_check.__file__).parent.parent
CHECKED = [(3, 10), (3, 11), (3, 12), (3, 13)]

#: Run by each interpreter with the checkout on its path: prints nothing and ends with 0 when all holds.
CHECK = """
import multiprocessing, os
from pytest_resume_check.child import cpython

assert cpython.missing() == [], cpython.missing()
ctx = multiprocessing.get_context("forkserver")
child = ctx.Process(target=os.getpid)
child.start()
child.join()
pid = cpython.forkserver_pid()
assert pid and os.waitpid(pid, os.WNOHANG) == (0, 0), pid
cpython.kill_forkserver()
cpython.kill_resource_tracker()
assert cpython.forkserver_pid() is None
try:
    os.kill(pid, 0)
    raise AssertionError("the fork server still runs")
except ProcessLookupError:
    pass
"""


def interpreters() -> dict[tuple[int, int], str]:
    """One interpreter of each checked version found here (on PATH or under pyenv), this one included."""
    found = {sys.version_info[:2]: sys.executable}
    candidates = [shutil.which(f"python{major}.{minor}") for major, minor in CHECKED]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    for path in filter(None, candidates):
        try:
            out = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.split():
            version = tuple(int(part) for part in out.stdout.split())
            if version in CHECKED:
                found.setdefault((version[0], version[1]), path)
    return found


@pytest.mark.parametrize("version, python", sorted(interpreters().items()), ids=lambda v: str(v))
def test_the_adapters_private_names_work_on_each_checked_python(version, python):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, f"Python {version}: {done.stderr}"
