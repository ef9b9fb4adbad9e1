"""The unit wing's promise, kept while its tests run: no test under tests/unit starts a process.

``refused_process_starts()`` replaces every way Python starts one (``subprocess.Popen`` and all that goes through
it, ``os.fork``, ``os.forkpty``, ``os.posix_spawn``, ``os.system``, a ``multiprocessing`` process, which the
``spawn`` and ``forkserver`` start methods begin without ``os.fork``) with a call that raises
``StartedAProcess``; ``tests/unit/conftest.py`` wraps each phase of a unit test in it. A test that starts
processes belongs in another wing (CONTRIBUTING.md, "The test wings"), where it costs the fast loop nothing.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

#: What a unit test that starts a process fails with; ``{}`` is the call it made.
STARTED_A_PROCESS = ("a test under tests/unit started a process ({}): it belongs in tests/engine, tests/plugin, "
                     "tests/package, tests/docs or tests/verl (CONTRIBUTING.md, 'The test wings')")

#: ``(owner, attribute)`` of every way to start a process, with the name the message gives it. A ``Popen``
#: starts its child in ``_execute_child``, after it has set up what its cleanup needs (the class has no public
#: hook, and a replaced ``__new__`` cannot be put back as it was: ``object.__new__`` set on the class refuses
#: ``Popen``'s arguments).
STARTERS = {
    "subprocess.Popen": (subprocess.Popen, "_execute_child"),
    "os.fork": (os, "fork"),
    "os.forkpty": (os, "forkpty"),
    "os.posix_spawn": (os, "posix_spawn"),
    "os.posix_spawnp": (os, "posix_spawnp"),
    "os.system": (os, "system"),
    "multiprocessing.Process.start": (multiprocessing.process.BaseProcess, "start"),
}


class StartedAProcess(BaseException):
    """A unit test tried to start a process. Not an ``Exception``: a test's ``except Exception`` (a fallback
    when a tool is missing, say) must not swallow it and pass."""


def refusal(name: str) -> Callable[..., NoReturn]:
    """A stand-in for the starter ``name`` that raises instead of starting anything."""

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise StartedAProcess(STARTED_A_PROCESS.format(name))

    return refuse


@contextmanager
def refused_process_starts() -> Iterator[None]:
    """Within the block, every starter in ``STARTERS`` raises ``StartedAProcess``; after it, each is what it
    was."""
    with pytest.MonkeyPatch.context() as patch:
        for name, (owner, attribute) in STARTERS.items():
            if hasattr(owner, attribute):  # posix_spawn and forkpty are not on every platform
                patch.setattr(owner, attribute, refusal(name))
        yield
