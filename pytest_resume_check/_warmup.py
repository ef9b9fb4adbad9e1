"""Imported last by the fork server: runs the targets' warm-up functions once, so lazy initialisation
(torch's first optimizer step takes ~1 s) is paid once per session instead of once per run.

The functions are named in the environment variable below as ``module:function`` entries; the
starter sets it just before the server starts.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import sys
import warnings

ENV = "PYTEST_RESUME_CHECK_WARMUP"
PR_SET_CHILD_SUBREAPER = 36


def _run_all() -> None:
    _become_subreaper()
    specs = [s for s in os.environ.get(ENV, "").split(",") if s]
    try:
        _call(specs)
    finally:
        _restore_stderr()
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


def _restore_stderr() -> None:
    """Give the server its stdout and stderr back (silenced by ``_preload_begin`` during imports and
    warm-up)."""
    begin = sys.modules.get("pytest_resume_check._preload_begin")
    if begin is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(begin.SAVED_STDOUT, 1)
        os.dup2(begin.SAVED_STDERR, 2)


def _call(specs: list[str]) -> None:
    for spec in specs:
        module_name, _, func = spec.partition(":")
        try:
            getattr(importlib.import_module(module_name), func)()
        except Exception:  # a failed warm-up only costs speed; each child still works
            pass


_run_all()
