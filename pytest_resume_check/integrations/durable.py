"""Making a framework's checkpoint durable before it is published (no framework imported).

Lightning, Accelerate and the Transformers ``Trainer`` write their checkpoint files in place and never
fsync them; the integrations flush them with these before telling the harness a checkpoint exists.
:func:`leaves_incomplete` is a predicate for ``expected_failures``: the crash cells in which a framework's
resume takes a folder whose completion file a crash emptied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_resume_check.targets import fault_leaves_incomplete

__all__ = ["fsync_path", "leaves_incomplete", "sync_tree"]


def fsync_path(path: Path) -> None:
    """fsync one file or folder (a folder's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(folder: Path, *, skip: str | None = None) -> None:
    """fsync every file under ``folder`` (except those named ``skip``), then its folders deepest first,
    ``folder`` itself and its parent, where its name lives."""
    paths = sorted(folder.rglob("*"))
    for path in paths:
        if path.is_file() and path.name != skip:
            fsync_path(path)
    for path in reversed(paths):
        if path.is_dir():
            fsync_path(path)
    fsync_path(folder)
    fsync_path(folder.parent)


def leaves_incomplete(cell: Any, name: str) -> bool:
    """Whether a crash cell (``cell.kills[0].fault`` inside the save whose file operations are
    ``cell.save_ops``) leaves the file called ``name`` of that save empty or cut: a kill after it was opened
    and up to its close, or a power loss after it was opened and up to its fsync (the save's end when it
    has none). False for a cell with no fault, or a save that never opens such a file. The report's known
    findings read the same rule (docs/findings.md)."""
    fault = cell.kills[0].fault if cell.kills else None
    return fault_leaves_incomplete(fault, cell.save_ops, name)
