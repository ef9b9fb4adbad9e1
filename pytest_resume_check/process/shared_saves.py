"""Recorded saves shared by the xdist workers of one session: each save is recorded once per session.

Every xdist worker collects the whole matrix, and a target's crash cells are built from its save's recorded
file operations, which recording runs the trainer once to get. Without sharing, each worker ran that recording
itself (two ranks and a process group per recording for a multi-rank target), at collection, where every
worker waits for it. Here a recording is kept in a folder all workers of the session see (beside their own
base temporary folders, in the controller's, named by xdist's test-run id), under a lock per save: the first
worker to take the lock records and keeps the ops; another one waiting on it reads them. The workers take the
saves in different orders (:func:`rotated`), so two workers record two saves at once.

Only a recording that succeeded is kept for the others: a failing one is recorded again by each worker, which
says why in its own collection (in one process, its error is raised again, not recorded twice). Nothing here is
ever deleted by the harness: pytest's retention of base temporary folders removes the folder with the
session's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from pytest_resume_check.records.faults import FileOp

T = TypeVar("T")

#: Format of a kept recording; a file of another version is recorded again.
VERSION = 1


class SharedSaves:
    """Recorded ops by save, in this process, and kept in ``folder`` for the other workers when given."""

    def __init__(self, folder: Path | None = None):
        self.folder = folder
        self._ops: dict[str, list[FileOp]] = {}
        self._failed: dict[str, Exception] = {}

    def get(self, key: str, record: Callable[[], list[FileOp]]) -> list[FileOp]:
        """The ops of the save ``key`` (a target, case, step and prior checkpoint spelled out): recorded by
        ``record`` unless this process or another worker of the session already did."""
        if key in self._failed:  # not run twice in one process, a hang least of all
            raise self._failed[key]
        if key not in self._ops:
            try:
                self._ops[key] = record() if self.folder is None else _shared(self.folder, key, record)
            except Exception as exc:
                self._failed[key] = exc
                raise
        return self._ops[key]


def _shared(folder: Path, key: str, record: Callable[[], list[FileOp]]) -> list[FileOp]:
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / hashlib.sha256(key.encode()).hexdigest()[:32]
    kept = stem.with_suffix(".json")
    with open(stem.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        ops = _read(kept, key)
        if ops is None:
            ops = record()
            _write(kept, key, ops)
        return ops


def _read(path: Path, key: str) -> list[FileOp] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != key:
        return None
    try:
        return [FileOp(*op) for op in data["ops"]]
    except (KeyError, TypeError):  # not a list of ops as _write writes them: recorded again
        return None


def _write(path: Path, key: str, ops: Sequence[FileOp]) -> None:
    fields = [[op.index, op.kind, op.path, op.target, op.rank, op.lane] for op in ops]
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"version": VERSION, "key": key, "ops": fields}))
    os.replace(partial, path)  # read whole or not at all, also by a worker that never took the lock


def rotated(items: Sequence[T], worker: int, workers: int) -> list[T]:
    """``items`` starting at worker ``worker``'s share of ``workers``: each worker records its own saves
    first and finds the others' recorded by the time it reaches them."""
    if workers <= 1 or not items:
        return list(items)
    start = len(items) * worker // workers
    return [*items[start:], *items[:start]]


def worker_folder(basetemp: Path, run_id: str) -> Path:
    """Where the workers of the xdist run ``run_id`` keep their recordings: in the controller's base temporary
    folder, which holds each worker's own."""
    return basetemp.parent / f"resume-matrix-saves-{run_id}"
