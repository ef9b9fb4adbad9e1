"""The child side of fault injection: record the file operations of the watched save and apply a
:class:`~pytest_resume_check.records.faults.FaultPlan` to them.

Audit hooks do not see ``fsync``, ``write`` or ``close``, so the file functions themselves are wrapped
(module attributes of ``os``, ``builtins``, ``io``, ``shutil`` and ``torch``; in a rank of a multi-rank run
also the collectives of ``torch.distributed``, :data:`COLLECTIVES`). :meth:`Recorder.install`
wraps them in the calling process and :meth:`Recorder.uninstall` puts the originals back; a child run
installs once and never uninstalls (the process ends with the run), an in-process test uses the
recorder as a context manager.
"""

from __future__ import annotations

import builtins
import errno as errno_codes
import io
import os
import shutil
import sys
import threading
from collections.abc import Callable
from typing import Any

from pytest_resume_check.records.faults import (
    COLLECTIVE,
    EXTRA_OPS_DONE,
    EXTRA_TORN,
    EXTRA_UNSYNCED,
    INJECTED,
    MODE_CRASH,
    MODE_ERROR,
    MODE_POWER,
    MODE_TORN,
    FaultPlan,
    FileOp,
)

#: The ``os.open`` flags of an open for writing.
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_KILLING = (MODE_CRASH, MODE_POWER, MODE_TORN)
#: The functions of ``torch.distributed`` a rank's save may wait in for the other ranks, recorded as ops of a
#: multi-rank save (the ranks stop between them: see :mod:`pytest_resume_check.records.faults`). Called from
#: within ``torch.distributed``'s own module, one collective uses another unseen: each call is one op.
COLLECTIVES = ("barrier", "monitored_barrier", "all_reduce", "reduce", "broadcast", "all_gather", "gather",
               "scatter", "reduce_scatter", "all_to_all", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list")


class Recorder:
    """Wraps file functions in this process and applies a :class:`FaultPlan` during the watched save.

    ``on_op(op)`` is called for every op that happens; ``on_kill(op_text, extra)`` when the plan
    says to be killed here (it does not return). ``rank``: this process's rank in a run of several ranks
    (None in a run of one), which stops where the plan says that rank stops.
    """

    def __init__(self, plan: FaultPlan, root: str, on_op: Callable[[FileOp], None],
                 on_kill: Callable[[str, dict[str, Any]], None], rank: int | None = None):
        self.plan = plan
        self.rank = rank
        #: Before which of this process's ops it is stopped (killing plans).
        self.stop = plan.stop_of(rank)
        self.root = os.path.realpath(root)
        self.on_op = on_op
        self.on_kill = on_kill
        self.active = False
        self.ops: list[FileOp] = []
        self.written: dict[str, int] = {}  # path -> bytes written in this save
        self.synced: dict[str, int] = {}  # path -> bytes made durable by fsync
        self._failing = False
        self._originals: list[tuple[Any, str, Any]] = []
        #: ``saving`` is set in a thread while ``torch.save`` writes a path (see :func:`_torch_save_wrapper`).
        self._local = threading.local()

    # -- the watched window ----------------------------------------------------------------------
    def start(self, step: int) -> None:
        if step == self.plan.step:
            self.active = True

    def finish(self, step: int) -> None:
        """At ``checkpoint_published(step)``: the point after the last op."""
        if step == self.plan.step and self.active:
            # A rank of several is stopped here also when its save did fewer ops than recorded: the other ranks
            # wait where they stop, and a rank that went on would wait for them in its next collective.
            if self.plan.mode in _KILLING and self.stop is not None and (
                    self.stop == len(self.ops) or self.rank is not None and self.stop > len(self.ops)):
                self._kill("after the last file operation of the save, before it was reported")
            self.active = False

    # -- op bookkeeping --------------------------------------------------------------------------
    def _rel(self, path: Any) -> str | None:
        try:
            real = os.path.realpath(os.fspath(path))
        except TypeError:
            return None
        if real == self.root or real.startswith(self.root + os.sep):
            return os.path.relpath(real, self.root)
        return None

    def op(self, kind: str, path: Any, target: Any = None) -> str | None:
        """Called before an operation happens; the path relative to the root when the operation is
        watched, None when it is not. May kill or raise."""
        rel = self._rel(path) if self.active and not getattr(self._local, "saving", False) else None
        if rel is None:
            return None
        index = len(self.ops)
        op = FileOp(index, kind, rel, self._rel(target) if target is not None else None, self.rank)
        plan = self.plan
        if plan.mode in _KILLING and self.stop == index:
            self._kill(f"before {op.describe()}")
        self.ops.append(op)  # counted even when it fails: "once" must hit exactly one op
        mine = plan.rank is None or plan.rank == self.rank
        if plan.mode == MODE_ERROR and mine and (index == plan.op or (plan.persistent and self._failing)):
            self._failing = True
            code = plan.errno or errno_codes.EIO
            raise OSError(code, f"{os.strerror(code)} {INJECTED} at {op.describe()}", os.fspath(path))
        self.on_op(op)
        return rel

    def collective(self, name: str) -> None:
        """Called before a collective of a rank of several: an op of the watched save (never of a one-rank run)."""
        if self.rank is None or not self.active or getattr(self._local, "saving", False):
            return
        index = len(self.ops)
        op = FileOp(index, COLLECTIVE, name, None, self.rank)
        if self.plan.mode in _KILLING and self.stop == index:
            self._kill(f"before {op.describe()}")
        self.ops.append(op)
        self.on_op(op)

    def _kill(self, where: str) -> None:
        extra: dict[str, Any] = {EXTRA_OPS_DONE: len(self.ops)}
        if self.plan.mode == MODE_POWER:
            extra[EXTRA_UNSYNCED] = {p: self.synced.get(p, 0) for p, n in self.written.items()
                                     if n > self.synced.get(p, 0)}
        if self.plan.mode == MODE_TORN and self.plan.file and self.plan.rank in (None, self.rank):
            extra[EXTRA_TORN] = self.plan.file
        if self.rank is None:
            self.on_kill(f"killed {where}", extra)
        elif self.rank == self.plan.rank:
            self.on_kill(f"rank {self.rank} killed {where}", extra)
        else:  # stopped where it no longer needs the killed rank, then killed with it
            self.on_kill(f"rank {self.rank} stopped {where}", extra)

    # -- durability tracking ---------------------------------------------------------------------
    def wrote(self, rel: str, n: int) -> None:
        self.written[rel] = self.written.get(rel, 0) + n

    def fsynced(self, rel: str) -> None:
        self.synced[rel] = self.written.get(rel, 0)

    def moved(self, src: str | None, dst: str | None) -> None:
        if src is None or dst is None:
            return
        for table in (self.written, self.synced):
            if src in table:
                table[dst] = table.pop(src)

    # -- installation ----------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def uninstall(self) -> None:
        """Put back the functions :meth:`install` wrapped."""
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals = []

    def _wrap(self, owner: Any, name: str, wrapper: Any) -> None:
        self._originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def install(self) -> None:
        """Wrap the file functions of this process (see the module docstring)."""
        open_ = _open_wrapper(self, builtins.open)
        wrappers = [(builtins, "open", open_), (io, "open", open_),
                    (os, "open", _os_open_wrapper(self, os.open)), (os, "mkdir", _mkdir_wrapper(self, os.mkdir)),
                    (os, "fsync", _fsync_wrapper(self, os.fsync)),
                    (os, "replace", _path_wrapper(self, "replace", os.replace, moves=True)),
                    (os, "rename", _path_wrapper(self, "rename", os.rename, moves=True)),
                    (os, "remove", _path_wrapper(self, "remove", os.remove)),
                    (os, "unlink", _path_wrapper(self, "unlink", os.unlink)),
                    (shutil, "rmtree", _path_wrapper(self, "rmtree", shutil.rmtree))]
        torch = sys.modules.get("torch")
        if torch is not None:
            wrappers.append((torch, "save", _torch_save_wrapper(self, torch.save)))
        distributed = sys.modules.get("torch.distributed")
        if self.rank is not None and distributed is not None:
            wrappers += [(distributed, name, _collective_wrapper(self, name, getattr(distributed, name)))
                         for name in COLLECTIVES if callable(getattr(distributed, name, None))]
        for owner, name, wrapper in wrappers:
            self._wrap(owner, name, wrapper)


def _path_wrapper(rec: Recorder, kind: str, real: Callable[..., Any], moves: bool = False) -> Callable[..., Any]:
    """A wrapper of a function whose first argument is the path it acts on (and, when it ``moves``,
    whose second is where the path goes)."""

    def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
        target = (args[0] if args else kwargs.get("dst")) if moves else None
        watched = rec.op(kind, path, target) is not None
        result = real(path, *args, **kwargs)
        if watched and moves:
            rec.moved(rec._rel(path), rec._rel(target))
        return result

    return wrapper


def _open_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        writing = isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+")
        rel = rec.op("open", file) if writing else None
        if rel is not None:
            if "a" not in mode:
                rec.written[rel] = 0
                rec.synced[rel] = 0
            return _TrackedFile(real(file, mode, *args, **kwargs), rec, rel)
        return real(file, mode, *args, **kwargs)

    return open_


def _os_open_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & WRITE_FLAGS:
            rec.op("open", path)
        return real(path, flags, *args, **kwargs)

    return os_open


def _mkdir_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        # makedirs(exist_ok=True) probes existing folders: not an op. On a rank of several, every call is one:
        # whether another rank made the folder first depends on how the ranks interleave, not on this rank.
        if rec.rank is not None or not os.path.isdir(path):
            rec.op("mkdir", path)
        real(path, *args, **kwargs)

    return mkdir


def _collective_wrapper(rec: Recorder, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def collective(*args: Any, **kwargs: Any) -> Any:
        rec.collective(name)
        return real(*args, **kwargs)

    return collective


def _fsync_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    def fsync(fd: Any) -> None:
        number = fd if isinstance(fd, int) else fd.fileno()
        try:
            path: str | None = os.readlink(f"/proc/self/fd/{number}")
        except OSError:
            path = None
        rel = rec.op("fsync", path) if path is not None else None
        real(fd)
        if rel is not None:
            rec.fsynced(rel)

    return fsync


def _torch_save_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.save`` to a path is one op in either format: the zip format writes from C++, the legacy one
    (``_use_new_zipfile_serialization=False``) through Python's ``open``, whose ops inside the save are not
    counted again (they made one save two ops and more, and its crash cells differ by format)."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        rel = rec.op("torch.save", f) if isinstance(f, (str, os.PathLike)) else None
        if rel is not None:
            rec._local.saving = True
            try:
                real(obj, f, *args, **kwargs)
            finally:
                rec._local.saving = False
            # torch writes paths from C++ and never fsyncs them: nothing of it is durable.
            rec.written[rel] = max(1, os.path.getsize(f))
            rec.synced[rel] = 0
            return
        real(obj, f, *args, **kwargs)

    return save


class FileProxy:
    """A file object that stands for ``raw``: everything but ``close`` (and what a subclass adds) goes to it,
    and ``with`` closes through :meth:`close`."""

    def __init__(self, raw: Any):
        self._raw = raw

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> FileProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Any:
        return iter(self._raw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _TrackedFile(FileProxy):
    """A file object whose write, fsync-relevant size and close are recorded."""

    def __init__(self, raw: Any, rec: Recorder, rel: str | None):
        super().__init__(raw)
        self._rec = rec
        self._rel = rel

    def write(self, data: Any) -> int:
        self._rec.op("write", self._raw.name)
        n = self._raw.write(data)
        if self._rel is not None:
            self._rec.wrote(self._rel, len(data) if n is None else n)
        return n

    def close(self) -> None:
        if self._raw.closed:
            return
        try:
            self._rec.op("close", self._raw.name)
        except OSError:
            _close_dropping_buffer(self._raw)
            raise
        self._raw.close()


def _close_dropping_buffer(raw: Any) -> None:
    """Close ``raw`` now, losing what it still buffers, as a close whose flush fails does.

    Leaving it open instead made the outcome of an injected error at ``close`` depend on the garbage
    collector: the buffered bytes reached the file whenever the abandoned object was collected before
    the child exited, and not otherwise, so one cell passed or failed with what ran before it.
    The descriptor is pointed at ``/dev/null`` first, so the flush goes nowhere.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, raw.fileno())
    finally:
        os.close(devnull)
    raw.close()
