"""Making a framework's checkpoint durable before it is published (stdlib only).

Lightning, Accelerate and the Transformers ``Trainer`` write their checkpoint files in place and never
fsync them; the integrations flush them with these before telling the harness a checkpoint exists.
"""

from __future__ import annotations

import os
from pathlib import Path


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
