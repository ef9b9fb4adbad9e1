"""What the fork server does after its own modules are imported: become the subreaper of its children,
import its targets' modules (recording any that raise), set torch to one intra-op thread, run their
warm-up functions (recording any that raise or leave threads running), give back its output and
freeze its heap for the garbage collector.

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
#: Warm-ups (``module:function``) that raised or could not be found: spec -> ``Type: message``. They
#: cost only speed (each run then pays what the warm-up would have paid), so they are warnings.
WARMUP_FAILED: dict[str, str] = {}
#: Warm-ups after which more threads ran in the server than before: spec -> how many more. A process
#: forked while other threads run inherits their locks but not the threads, and torch's thread pool
#: then hangs every forked run (issue 14), so the targets naming such a warm-up are refused.
WARMUP_THREADS: dict[str, int] = {}
PR_SET_CHILD_SUBREAPER = 36


def finish() -> None:
    """Called once, in the fork server, after its preload imports."""
    _become_subreaper()
    work = json.loads(os.environ.pop(WARMUP_ENV, "") or "{}")
    try:
        _import(work.get("path", []), work.get("import", []))
        _single_threaded_torch()
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
    begin = sys.modules.get("pytest_resume_check.process._preload_begin")
    if begin is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(begin.SAVED_STDOUT, 1)
        os.dup2(begin.SAVED_STDERR, 2)


def _single_threaded_torch() -> None:
    """torch starts its intra-op thread pool at the first parallel operation (a warm-up's training step)
    and a child forked after that hangs in its first one. With one intra-op thread no pool is started;
    the children inherit the setting (a trainer may call ``torch.set_num_threads`` itself)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        try:
            torch.set_num_threads(1)
        except Exception:  # a half-imported torch: its import error is recorded already
            pass


def _thread_count() -> int:
    """Threads of this process as the kernel sees them (also those of C libraries)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def send_failures(conn: Any) -> None:
    """In a child forked from the server: send the server's failed imports and warm-ups to the starter."""
    conn.send({"import": dict(FAILED), "warmup": dict(WARMUP_FAILED), "threads": dict(WARMUP_THREADS)})
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
        before = _thread_count()
        try:
            function = getattr(importlib.import_module(module_name), func)
            _single_threaded_torch()  # also when this warm-up's module was the first to import torch
            function()
        except (Exception, SystemExit) as exc:  # only costs speed; each child still works
            WARMUP_FAILED[spec] = describe_error(exc)
        extra = _thread_count() - before
        if extra > 0:
            WARMUP_THREADS[spec] = extra
