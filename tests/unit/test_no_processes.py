"""A test under tests/unit that starts a process fails, however it starts it and in whichever phase: the
guard tests/unit/conftest.py wraps around each test (``tests/support/no_processes.py``). Each test here tries
for real; without the guard it would start a short-lived child (which exits at once) and fail on
``pytest.raises``."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys

import pytest
from no_processes import STARTED_A_PROCESS, STARTERS, StartedAProcess, refused_process_starts


def refused(name: str):
    """``pytest.raises`` for the refusal of the starter ``name``, checked by its whole message."""
    return pytest.raises(StartedAProcess, match=re.escape(STARTED_A_PROCESS.format(name)))


def test_a_subprocess_fails_the_test():
    with refused("subprocess.Popen"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_fork_fails_the_test():
    with refused("os.fork"):
        pid = os.fork()
        if pid == 0:  # only without the guard: the child must not go on running the tests
            os._exit(0)
        os.waitpid(pid, 0)


def test_a_posix_spawn_and_a_shell_command_fail_the_test():
    with refused("os.posix_spawn"):
        pid = os.posix_spawn("/bin/true", ["true"], os.environ)
        os.waitpid(pid, 0)
    with refused("os.system"):
        os.system("true")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_process_fails_the_test_whatever_its_start_method(method):
    process = multiprocessing.get_context(method).Process(target=int)
    with refused("multiprocessing.Process.start"):
        process.start()
        process.join()


@pytest.fixture(scope="module")
def started_in_a_module_fixture():
    """What starting a process in a module-scoped fixture (set up before any function's) gave."""
    try:
        return subprocess.run(["true"], check=True)
    except StartedAProcess as refusal:
        return refusal


def test_a_process_started_by_a_module_scoped_fixture_is_refused_too(started_in_a_module_fixture):
    assert isinstance(started_in_a_module_fixture, StartedAProcess)


def test_a_refusal_is_no_exception_a_test_could_swallow():
    assert not issubclass(StartedAProcess, Exception)


def test_leaving_the_guard_restores_each_starter_as_it_was():
    def current():
        return {name: getattr(owner, attribute) for name, (owner, attribute) in STARTERS.items()}

    outer = current()
    with refused_process_starts():
        assert all(current()[name] is not outer[name] for name in outer)
    assert current() == outer
