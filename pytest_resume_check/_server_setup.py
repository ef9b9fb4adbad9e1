"""What the fork server does after its own modules are imported: become the subreaper of its children,
import its targets' modules (recording any that raise), run their warm-up functions, give back its
output and freeze its heap for the garbage collector.

Defining only: :mod:`._preload_end`, the last entry of the fork server's preload list, calls
:func:`finish`; :func:`send_failures` runs in a child forked from the server. Nothing here runs in any
other process.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import sys
import warnings
from typing import Any

from pytest_resume_check.targets import describe_error

#: The server's work, as JSON: ``{"import": [modules], "call": ["module:function" warm-ups], "path":
#: [the starter's sys.path]}``; set by the starter only in the environment it starts the server with.
WARMUP_ENV = "PYTEST_RESUME_CHECK_WARMUP"
#: Preloaded modules whose import raised in this server: module -> ``Type: message (at file:line)``.
#: Multiprocessing's own preload lets any exception but ImportError kill the server, and then every
#: child start fails with a bare EOFError (issue 13); imported here, one broken module costs only the
#: targets that name it.
FAILED: dict[str, str] = {}
PR_SET_CHILD_SUBREAPER = 36


def finish() -> None:
    """Called once, in the fork server, after its preload imports."""
    _become_subreaper()
    work = json.loads(os.environ.pop(WARMUP_ENV, "") or "{}")
    try:
        _import(work.get("path", []), work.get("import", []))
        _call(work.get("call", []))
    finally:
        _restore_output()
    # Without this the first garbage collection in every forked child walks (and so copies) every
    # object torch and verl left in the server: about 0.4 s per run with verl 0.8.
    gc.collect()
    gc.freeze()


def _become_subreaper() -> None:
    """Loader workers of a killed child are orphaned. Without a subreaper they go to PID 1, which on
    some machines reaps only every ~1.5 s, and the harness waits for them to vanish. As subreaper
    the server adopts them and its SIGCHLD handler reaps them at once."""
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: PID 1 reaps, only slower
        pass


def _restore_output() -> None:
    """Give the server its stdout and stderr back (silenced by ``_preload_begin`` during imports and
    warm-up)."""
    begin = sys.modules.get("pytest_resume_check._preload_begin")
    if begin is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(begin.SAVED_STDOUT, 1)
        os.dup2(begin.SAVED_STDERR, 2)


def send_failures(conn: Any) -> None:
    """In a child forked from the server: send the server's :data:`FAILED` to the starter."""
    conn.send(dict(FAILED))
    conn.close()


def _import(path: list[str], modules: list[str]) -> None:
    if path:  # the starter's sys.path, which its children get too: modules beside a conftest are found
        sys.path[:] = path
    for name in modules:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:
            FAILED[name] = describe_error(exc)


def _call(specs: list[str]) -> None:
    for spec in specs:
        module_name, _, func = spec.partition(":")
        try:
            getattr(importlib.import_module(module_name), func)()
        except (Exception, SystemExit):  # a failed warm-up only costs speed; each child still works
            pass
