"""Imported last by the fork server: runs the targets' warm-up functions once, so lazy initialisation
(torch's first optimizer step takes ~1 s) is paid once per session instead of once per run.

The functions are named in the environment variable below as ``module:function`` entries; the
starter sets it just before the server starts.
"""

from __future__ import annotations

import importlib
import os

ENV = "PYTEST_RESUME_CHECK_WARMUP"


def _run_all() -> None:
    specs = [s for s in os.environ.get(ENV, "").split(",") if s]
    if not specs:
        return
    # Warnings printed while warming up would land in whichever test started the server.
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        _call(specs)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _call(specs: list[str]) -> None:
    for spec in specs:
        module_name, _, func = spec.partition(":")
        try:
            getattr(importlib.import_module(module_name), func)()
        except Exception:  # a failed warm-up only costs speed; each child still works
            pass


_run_all()
