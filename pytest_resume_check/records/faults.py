"""Faults in a checkpoint save, as the parent plans them and as it applies their after-effects.

While a target saves the watched checkpoint, every file operation under the run's checkpoint directory
is an *op*: ``open`` for writing, each ``write``, ``close``, ``fsync``, ``replace``/``rename``,
``mkdir``, ``remove``/``unlink``/``rmtree`` and ``torch.save`` to a path. The child side, which sees
and counts those ops, is :mod:`pytest_resume_check.child.recorder`; this module is the parent side and plain
data.

A :class:`FaultPlan` says what happens at op ``i`` of that save:

- ``record``: nothing; the ops are reported (``file_op`` events) so the matrix can enumerate them.
- ``crash``: the run is SIGKILLed right before op ``i`` (``i == len(ops)``: after the last op, before
  the checkpoint is reported).
- ``power``: like ``crash``, then every file of the save loses what was written to it after its
  last fsync (it keeps its name); :class:`DiskDamage` names those files.
- ``torn``: like ``crash``, then the named file is cut to half its bytes under its final name.
- ``error``: op ``i`` raises ``OSError(errno)`` instead of happening (and every later op too when
  ``persistent``): the save must fail loudly.

In a run of several ranks every rank records its own ops, numbered from 0 on that rank, and the
collectives it enters during the save (``barrier``, ``gather_object``, ...) are ops too: a rank can get past
the n-th collective only once every rank entered it. A multi-rank plan stops *every* rank (``stops``: before
which op of its own each stops), all at points no rank needs another rank to pass: the plan's ``rank``
before its op ``op``, every other rank at the end of its part of the same stretch between two collectives
(:func:`stops_at`). Once all of them wait there, the run is killed whole. Which ops a rank does depends only
on its own code, not on how the ranks interleave, so the cells are the same in every run.
"""

from __future__ import annotations

import errno as errno_codes
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_resume_check.records.regular_files import NotRegular, open_inside

#: What a :class:`FaultPlan` does at its op (the values appear in cell JSON and kill ids: never change them).
MODE_RECORD = "record"
MODE_CRASH = "crash"
MODE_POWER = "power"
MODE_TORN = "torn"
MODE_ERROR = "error"
MODES = (MODE_RECORD, MODE_CRASH, MODE_POWER, MODE_TORN, MODE_ERROR)

#: The I/O errors a ``error`` plan injects, by the name kill ids and reports give them.
ERRNOS = {"enospc": errno_codes.ENOSPC, "eio": errno_codes.EIO}
#: Marker in injected errors, so the verdict can tell them from the target's own failures.
INJECTED = "[injected by pytest-resume-check]"
#: A file the damage after a kill left alone: it is no regular file inside the run's folder (``{refusal}``
#: names it and what it is), which the harness never opens to write.
NOT_CUT = "not cut: {refusal} (the harness cuts only regular files inside the run's checkpoint folder)"

#: The kind of a recorded collective of a multi-rank save (its ``path`` is the function's name).
COLLECTIVE = "collective"

#: Keys of the ``extra`` of a kill-ready event sent from inside a watched save.
EXTRA_OPS_DONE = "ops_done"
EXTRA_UNSYNCED = "unsynced"  # {relative path: bytes fsynced}, for power loss
EXTRA_TORN = "torn"  # relative path of the file to tear


@dataclass(frozen=True)
class FaultPlan:
    """What to do during the save of checkpoint ``step`` (its text in a kill id, ``op4:power``, is
    :func:`pytest_resume_check.records.kill_ids.fault_label`)."""

    step: int
    mode: str = MODE_RECORD
    op: int | None = None
    errno: int | None = None
    persistent: bool = False
    file: str | None = None  # torn: the path (relative to the checkpoint dir) to cut
    total: int | None = None  # ops of this save as recorded (known when the matrix is built)
    #: Several ranks: the rank whose op ``op`` is the crash point (``op`` counts that rank's ops).
    rank: int | None = None
    #: Several ranks: before which of its own ops each rank stops (:func:`stops_at`), and how many ops each
    #: rank's save has (``total`` is the plan's ``rank``'s).
    stops: tuple[int, ...] | None = None
    totals: tuple[int, ...] | None = None

    @property
    def completes_save(self) -> bool:
        """The fault lands after the save's last op (the save itself finished), on every rank."""
        if self.stops is not None:
            return self.stops == self.totals
        return self.total is not None and self.op == self.total

    def stop_of(self, rank: int | None) -> int | None:
        """Before which op of its own ``rank`` stops (a plan of one rank: ``op``; a rank the recorded save did
        not show: at its end)."""
        if self.stops is None:
            return self.op
        return self.stops[rank or 0] if (rank or 0) < len(self.stops) else 0

    def to_json(self) -> dict[str, Any]:
        """The structured form (``fault`` of a kill in a cell's JSON): the fields that are set."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaultPlan:
        """Inverse of :meth:`to_json`."""
        fields: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
        return cls(**fields)


@dataclass(frozen=True)
class FileOp:
    """One recorded operation; paths relative to the checkpoint directory."""

    index: int
    kind: str
    path: str
    target: str | None = None
    #: The rank that made it, in a save of several ranks.
    rank: int | None = None

    def describe(self, root: str = "...") -> str:
        if self.kind == COLLECTIVE:
            return f"{self.path}() (a collective of every rank)"
        if self.target is not None:
            return f"{self.kind}({root}/{self.path} -> {root}/{self.target})"
        return f"{self.kind}({root}/{self.path})"


@dataclass(frozen=True)
class DiskDamage:
    """What the harness did to the disk after a kill inside a save, to stand for a power loss or a
    torn write: files cut back to their fsynced bytes, and a file cut to half its size."""

    #: (relative path, bytes kept) of every file that lost unsynced data.
    not_durable: tuple[tuple[str, int], ...] = ()
    #: (relative path, size before, size after) of the torn file.
    torn: tuple[str, int, int] | None = None
    #: Why each file the damage names was left as it is (a FIFO, a link out of the folder), as reports say it.
    refused: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.not_durable or self.torn)

    def describe(self) -> list[str]:
        """Lines for reports."""
        lines = [f"not durable: {rel} (cut to its {kept} fsynced bytes)" for rel, kept in self.not_durable]
        if self.torn:
            rel, size, cut = self.torn
            lines.append(f"torn: {rel} cut from {size} to {cut} bytes")
        return lines + [NOT_CUT.format(refusal=refusal) for refusal in self.refused]


def apply_after_kill(root: str, extra: Mapping[str, Any]) -> DiskDamage:
    """Apply what a power loss or torn write does to the files under ``root`` after the kill, as the
    kill-ready event's ``extra`` describes it. Only regular files inside ``root`` are opened (the names
    come from the run's process, and the trainer may have left a FIFO or a link out of the folder there);
    :attr:`DiskDamage.refused` names the others. A file another path shares by hard link (a later snapshot,
    a resume's kept evidence) is given a copy of its own first, and only that is cut."""
    cut: list[tuple[str, int]] = []
    refused: list[str] = []
    for rel, synced in sorted(extra.get(EXTRA_UNSYNCED, {}).items()):
        if _cut(root, rel, int(synced), refused) is not None:
            cut.append((rel, int(synced)))
    torn = None
    rel = extra.get(EXTRA_TORN)
    if rel:
        size = _cut(root, rel, None, refused)
        if size is not None:
            torn = (rel, size, size // 2)
    return DiskDamage(tuple(cut), torn, tuple(refused))


def _cut(root: str, rel: str, keep: int | None, refused: list[str]) -> int | None:
    """Cut the regular file ``rel`` inside ``root`` to ``keep`` bytes (None: half its size) and return the
    size it had; None when it is not there, or is refused (then said in ``refused``)."""
    try:
        fd = open_inside(root, rel, write=True)
    except FileNotFoundError:
        return None
    except NotRegular as exc:
        refused.append(str(exc))
        return None
    try:
        size = os.fstat(fd).st_size
        os.ftruncate(fd, size // 2 if keep is None else keep)
    finally:
        os.close(fd)
    return size


def leaves_incomplete(fault: FaultPlan | None, ops: Sequence[FileOp], name: str) -> bool:
    """Whether ``fault``, in the save whose file operations are ``ops``, leaves the file called ``name`` (its
    base name) of that save empty or cut: a kill after the file was opened and up to its close, or a power
    loss after it was opened and up to its fsync (the save's end when it has none); in a save of several ranks,
    such a file of the fault's rank. False without a fault, or for a save that never opens such a file."""
    if fault is None:
        return False
    mine = [op for op in ops if os.path.basename(op.path) == name and op.rank == fault.rank]  # the fault's rank's
    opened = next((op.index for op in mine if op.kind == "open"), None)
    if fault.op is None or opened is None:
        return False
    closed = next((op.index for op in mine if op.kind == "close"), opened)
    synced = next((op.index for op in mine if op.kind == "fsync"), len(ops))
    if fault.mode == MODE_POWER:
        return opened < fault.op <= synced
    return fault.mode == MODE_CRASH and opened < fault.op <= closed


def ranks_of(ops: Sequence[FileOp]) -> dict[int, list[FileOp]]:
    """The ops of a save by rank (every op of a one-rank save under rank 0), each rank's in its order."""
    out: dict[int, list[FileOp]] = {}
    for op in sorted(ops, key=lambda o: (o.rank or 0, o.index)):
        out.setdefault(op.rank or 0, []).append(op)
    return out


def stops_at(ops: Sequence[FileOp], rank: int, op: int) -> tuple[int, ...]:
    """Before which of its own ops each rank of a multi-rank save stops when ``rank`` is stopped right before its
    op ``op`` (``op`` = its number of ops: after its last): every other rank at the end of its part of the same
    stretch between two collectives, right before the collective that ends it (after its last op when there is
    none). No rank then waits for a rank that is stopped further back, so all of them get to where they stop."""
    mine = ranks_of(ops)
    passed = sum(1 for o in mine.get(rank, [])[:op] if o.kind == COLLECTIVE)
    stops = []
    for r in range(max(mine, default=0) + 1):
        own = mine.get(r, [])
        if r == rank:
            stops.append(op)
            continue
        collectives = [o.index for o in own if o.kind == COLLECTIVE]
        stops.append(collectives[passed] if passed < len(collectives) else len(own))
    return tuple(stops)


def merge_kill_extras(extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the damage after a kill needs from the kill-ready events of every rank of a run: the files any rank
    left not durable (a file two ranks wrote keeps the fewer fsynced bytes) and the file to tear."""
    merged: dict[str, Any] = {}
    unsynced: dict[str, int] = {}
    for extra in extras:
        for rel, kept in extra.get(EXTRA_UNSYNCED, {}).items():
            unsynced[rel] = min(int(kept), unsynced.get(rel, int(kept)))
        if extra.get(EXTRA_TORN):
            merged[EXTRA_TORN] = extra[EXTRA_TORN]
    if unsynced:
        merged[EXTRA_UNSYNCED] = unsynced
    return merged
