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
  last fsync (it keeps its name); :class:`DiskDamage` names those files. With a ``node`` (a torchrun target's
  simulated nodes), only the files of that node's ranks: its power alone was lost.
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

A rank's threads are numbered *lanes* (its main thread lane 0, a thread it starts in the save, such as an
asynchronous save's writer, lane 1 and on; the start is a :data:`START` op of lane 0), each with its own ops;
lane ``l`` of a rank is assumed to meet only lane ``l`` of the other ranks in its collectives (an
asynchronous save on a process group of its own, as torch advises), and the main thread's wait for a future
(``Future.result``, an :data:`AWAIT` op) to need the lanes it started before at their end.
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
#: The kind of the main thread's wait for a future in a multi-rank save (an asynchronous save's).
AWAIT = "await"
#: The kind of the main thread's start of a thread during a multi-rank save (its ``path``: ``thread 1``).
START = "start"
#: The kinds of op that only wait for, or start, another lane or rank.
SYNCS = (COLLECTIVE, AWAIT, START)

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
    #: Several ranks: the rank, and its lane (None: its main thread's), whose op ``op`` is the crash point
    #: (``op`` counts that lane's ops).
    rank: int | None = None
    lane: int | None = None
    #: Several ranks: (rank, lane, op) before which each lane stops (:func:`stops_at`), and (rank, lane, ops)
    #: how many ops each lane's save has (``total`` is the plan's own lane's).
    stops: tuple[tuple[int, int, int], ...] | None = None
    totals: tuple[tuple[int, int, int], ...] | None = None
    #: A power loss of this simulated node alone (a torchrun target's ``nnodes``): only its ranks' writes that
    #: were not fsynced are lost, the other nodes' are kept (None: every rank's, the machine's power).
    node: int | None = None

    def lost_ranks(self, per_node: int) -> range | None:
        """The ranks whose writes not fsynced a power loss takes, with ``per_node`` ranks a node (None: all)."""
        return None if self.node is None else range(self.node * per_node, (self.node + 1) * per_node)

    @property
    def completes_save(self) -> bool:
        """The fault lands after the save's last op (the save itself finished), on every rank."""
        if self.stops is not None:
            return self.stops == self.totals
        return self.total is not None and self.op == self.total

    def stop_of(self, rank: int | None, lane: int = 0) -> int | None:
        """Before which of its own ops a lane of ``rank`` stops (a plan of one rank: ``op``); for a rank the recorded
        save did not show, its main thread at its end, another thread of it nowhere (None)."""
        if self.stops is None:
            return self.op
        stop = next((at for r, ln, at in self.stops if r == (rank or 0) and ln == lane), None)
        return 0 if stop is None and lane == 0 else stop

    def total_of(self, rank: int | None, lane: int = 0) -> int | None:
        """How many ops a lane of ``rank`` made in the recorded save (None: not known)."""
        return next((n for r, ln, n in self.totals or () if r == (rank or 0) and ln == lane), None)

    def to_json(self) -> dict[str, Any]:
        """The structured form (``fault`` of a kill in a cell's JSON): the fields that are set."""
        return {k: ([list(x) for x in v] if isinstance(v, tuple) else v) for k, v in asdict(self).items()
                if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaultPlan:
        """Inverse of :meth:`to_json`."""
        fields: dict[str, Any] = {k: (tuple(tuple(x) for x in v) if isinstance(v, list) else v)
                                  for k, v in data.items()}
        return cls(**fields)


@dataclass(frozen=True)
class FileOp:
    """One recorded operation; paths relative to the checkpoint directory."""

    index: int
    kind: str
    path: str
    target: str | None = None
    #: The rank that made it, in a save of several ranks, and its lane there (None: the main thread's).
    rank: int | None = None
    lane: int | None = None

    def describe(self, root: str = "...") -> str:
        if self.kind == COLLECTIVE:
            return f"{self.path}() (a collective of every rank)"
        if self.kind == AWAIT:
            return f"{self.path}() (a wait for the save's other threads)"
        if self.kind == START:
            return f"the start of {self.path} of the save"
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


def lanes_of(ops: Sequence[FileOp]) -> dict[tuple[int, int], list[FileOp]]:
    """The ops of a save by (rank, lane) (every op of a one-rank save under (0, 0)), each lane's in its order."""
    out: dict[tuple[int, int], list[FileOp]] = {}
    for op in sorted(ops, key=lambda o: (o.rank or 0, o.lane or 0, o.index)):
        out.setdefault((op.rank or 0, op.lane or 0), []).append(op)
    return out


def stops_at(ops: Sequence[FileOp], rank: int, op: int, lane: int = 0) -> tuple[tuple[int, int, int], ...] | None:
    """Where every lane of a multi-rank save stops, as (rank, lane, op) in order, when lane ``lane`` of ``rank`` is
    stopped right before its op ``op`` (``op`` = its number of ops: after its last); None when no such point
    exists (that lane could not get there while the others are held back). A lane whose start the main thread
    does not get to is left out (it never runs).

    Every other lane goes as far as it can: to its end, or back to right before the first collective, wait or
    start it could not get past. A lane gets past its n-th collective only once lane ``l`` of every rank entered
    it; the main thread past a wait for a future only once the lanes it started before are at their end; and a
    lane runs at all only once the main thread started it. Moving lanes back until all three hold leaves each at
    the end of its part of the stretch the stopped lane is in; no lane then waits for one held further back."""
    lanes = lanes_of(ops)
    world = max((r for r, _ in lanes), default=0) + 1
    for r in range(world):
        lanes.setdefault((r, 0), [])  # a rank with no op still stops (at its end)
    at = {key: len(own) for key, own in lanes.items()}
    at[(rank, lane)] = op
    starts = {(r, int(o.path.split()[-1])): o.index for (r, ln), own in lanes.items() if ln == 0
              for o in own if o.kind == START}

    def passed(key: tuple[int, int], kind: str) -> list[int]:
        return [o.index for o in lanes[key][:at[key]] if o.kind == kind]

    moved = True
    while moved:
        moved = False
        for key in lanes:
            back = at[key]
            least = min(len(passed(k, COLLECTIVE)) for k in lanes if k[1] == key[1])  # one not started: none
            collectives = passed(key, COLLECTIVE)
            if len(collectives) > least:
                back = collectives[least]
            for wait in passed(key, AWAIT):
                started = [k for k in lanes if k[0] == key[0] and k[1] and starts.get(k, at[key]) < wait]
                if any(at[k] < len(lanes[k]) for k in started):
                    back = min(back, wait)
                    break
            if key[1] and at[(key[0], 0)] <= starts.get(key, -1):
                back = 0  # never started
            if back < at[key]:
                if key == (rank, lane):
                    return None
                at[key], moved = back, True
    return tuple((r, ln, at[(r, ln)]) for r, ln in sorted(lanes)
                 if ln == 0 or at[(r, 0)] > starts.get((r, ln), -1))


def merge_kill_extras(ready: Sequence[tuple[int | None, Mapping[str, Any]]],
                      lost: Sequence[int] | None = None) -> dict[str, Any]:
    """What the damage after a kill needs from the kill-ready words (rank, extra) of every lane of a run: the files
    any rank left not durable, each rank as its latest word (the most ops done) says (a file two ranks wrote
    keeps the fewer fsynced bytes), and the file to tear. ``lost``: only those ranks' files not durable (the
    ranks of a node whose power alone is lost)."""
    latest: dict[int | None, Mapping[str, Any]] = {}
    for rank, extra in ready:
        if rank not in latest or extra.get(EXTRA_OPS_DONE, 0) >= latest[rank].get(EXTRA_OPS_DONE, 0):
            latest[rank] = extra
    merged: dict[str, Any] = {}
    unsynced: dict[str, int] = {}
    for _, extra in ready:
        if extra.get(EXTRA_TORN):
            merged[EXTRA_TORN] = extra[EXTRA_TORN]
    for rank, extra in latest.items():
        if lost is not None and (rank or 0) not in lost:
            continue  # its node kept its power: what it wrote reaches the disk
        for rel, kept in extra.get(EXTRA_UNSYNCED, {}).items():
            unsynced[rel] = min(int(kept), unsynced.get(rel, int(kept)))
    if unsynced:
        merged[EXTRA_UNSYNCED] = unsynced
    return merged
