"""Imported last by the fork server: runs the targets' warm-up functions once, so lazy initialisation
(torch's first optimizer step takes ~1 s) is paid once per session instead of once per run.

The functions are named in the environment variable below as ``module:function`` entries; the
starter sets it just before the server starts.
"""

from __future__ import annotations

import importlib
import os
import sys

ENV = "PYTEST_RESUME_CHECK_WARMUP"


def _run_all() -> None:
    for spec in filter(None, os.environ.get(ENV, "").split(",")):
        module_name, _, func = spec.partition(":")
        try:
            getattr(importlib.import_module(module_name), func)()
        except Exception as exc:  # a failed warm-up only costs speed; each child still works
            print(f"pytest-resume-check: warm-up {spec} failed: {exc!r}", file=sys.stderr)


_run_all()
