"""The child side of fault injection: record the file operations of the watched save and apply a
:class:`~pytest_resume_check.records.faults.FaultPlan` to them.

Audit hooks do not see ``fsync``, ``write`` or ``close``, so the file functions themselves are wrapped
(module attributes of ``os``, ``builtins``, ``io``, ``shutil`` and ``torch``; in a rank of a multi-rank run
also the collectives of ``torch.distributed``, :data:`COLLECTIVES`, ``threading.Thread.start`` and
``concurrent.futures.Future.result``). :meth:`Recorder.install`
wraps them in the calling process and :meth:`Recorder.uninstall` puts the originals back; a child run
installs once and never uninstalls (the process ends with the run), an in-process test uses the
recorder as a context manager.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import errno as errno_codes
import io
import os
import shutil
import sys
import threading
from collections.abc import Callable
from typing import Any

from pytest_resume_check.records.faults import (
    AWAIT,
    COLLECTIVE,
    EXTRA_OPS_DONE,
    EXTRA_TORN,
    EXTRA_UNSYNCED,
    INJECTED,
    MODE_CRASH,
    MODE_ERROR,
    MODE_POWER,
    MODE_RECORD,
    MODE_TORN,
    START,
    FaultPlan,
    FileOp,
)

#: The ``os.open`` flags of an open for writing.
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_KILLING = (MODE_CRASH, MODE_POWER, MODE_TORN)
#: The attribute that holds the lane of a thread the main thread started during the save.
_LANE = "_resume_check_lane"
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

    On a rank of several, each thread's ops are numbered on their own, its *lane*: the main thread's lane 0,
    and each thread the main thread starts during the save (an asynchronous save's background writer) lanes 1,
    2, ... in that order; its start is an op of lane 0. Other threads' ops are not watched (a writer of an
    earlier save still at work). A started thread's lane stays watched after the save was published (its
    background write goes on); every lane stops where the plan says, and one that the plan lets run to its end
    says so without stopping (``on_ready``), since another may wait for it (the future of an asynchronous
    save). The main thread's waits for a future (``Future.result``) are ops too.
    """

    def __init__(self, plan: FaultPlan, root: str, on_op: Callable[[FileOp], None],
                 on_kill: Callable[[str, dict[str, Any]], None], rank: int | None = None,
                 on_ready: Callable[[str, dict[str, Any]], None] | None = None):
        self.plan = plan
        self.rank = rank
        self.root = os.path.realpath(root)
        self.on_op = on_op
        self.on_kill = on_kill
        self.on_ready = on_ready
        self.active = False
        #: Every op of this process, in the order they happened.
        self.ops: list[FileOp] = []
        #: A rank of several: each lane's ops, the lane of each thread that made one, the threads started
        #: during the save, and the lanes that said they reached their end.
        self._lane_ops: dict[int, list[FileOp]] = {}
        self._born: dict[int, threading.Thread] = {}
        self._ended: set[int] = set()
        self._lock = threading.Lock()
        self.written: dict[str, int] = {}  # path -> bytes written in this save
        self.synced: dict[str, int] = {}  # path -> bytes made durable by fsync
        self._failing = False
        self._originals: list[tuple[Any, str, Any]] = []
        #: ``saving`` is set in a thread while ``torch.save`` writes a path (see :func:`_torch_save_wrapper`).
        self._local = threading.local()

    # -- the watched window ----------------------------------------------------------------------
    @property
    def stop(self) -> int | None:
        """Before which of its own ops this process (its main thread's lane, on a rank of several) is stopped."""
        return self.plan.stop_of(self.rank)

    def start(self, step: int) -> None:
        if step == self.plan.step:
            self.active = True

    def finish(self, step: int) -> None:
        """At ``checkpoint_published(step)``: the point after the last op (of the main thread's lane)."""
        if step == self.plan.step and self.active:
            if self.plan.mode == MODE_RECORD and self.rank is not None:
                self._join_born()
            main = self._lane_ops.get(0, []) if self.rank is not None else self.ops
            # A rank of several is stopped here also when its save did fewer ops than recorded: the other ranks
            # wait where they stop, and a rank that went on would wait for them in its next collective.
            if self.plan.mode in _KILLING and self.stop is not None and (
                    self.stop == len(main) or self.rank is not None and self.stop > len(main)):
                self._kill("after the last file operation of the save, before it was reported")
            self.active = False

    def _join_born(self) -> None:
        """Recording a save of several ranks: wait for the threads the save started (an asynchronous save's
        writer), so that their ops are all recorded however the background write and the kill after this
        publication would race."""
        for thread in list(self._born.values()):
            if thread is not threading.current_thread():
                thread.join()

    def _lane(self) -> int | None:
        """This thread's lane (0 in a run of one rank), None when its ops are not watched now: the main thread's
        outside the save, and those of a thread the main thread did not start during the save."""
        if self.rank is None or threading.current_thread() is threading.main_thread():
            return 0 if self.active else None
        return getattr(threading.current_thread(), _LANE, None)

    def starting(self, thread: threading.Thread) -> None:
        """The main thread starts ``thread``: during the save of a rank of several, it gets the next lane, and its
        start is an op of lane 0 (stopped before it when the plan says so)."""
        if not self.active or self.rank is None or threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            lane = len(self._born) + 1
            self._born[lane] = thread
        self.sync(START, f"thread {lane}")
        setattr(thread, _LANE, lane)

    def _next(self, lane: int, kind: str, path: str, target: str | None) -> FileOp:
        """The op this lane is about to make, stopped right before it when the plan says so; recorded."""
        own = self._lane_ops.setdefault(lane, []) if self.rank is not None else self.ops
        op = FileOp(len(own), kind, path, target, self.rank, lane or None)
        if self.plan.mode in _KILLING and self.plan.stop_of(self.rank, lane) == op.index:
            self._kill(f"before {op.describe()}", lane)
        if self.rank is not None:
            own.append(op)
        self.ops.append(op)  # counted even when it fails: "once" must hit exactly one op
        return op

    def done(self) -> None:
        """Called after an op happened: a lane besides the main thread's that the plan lets run to its end says
        it got there once its last op is done, and runs on."""
        if self.rank is None or self.plan.mode not in _KILLING or self.on_ready is None:
            return
        lane = getattr(threading.current_thread(), _LANE, None)
        if lane is None or lane in self._ended:
            return
        stop = self.plan.stop_of(self.rank, lane)
        if stop == self.plan.total_of(self.rank, lane) and len(self._lane_ops.get(lane, [])) == stop:
            self._ended.add(lane)
            self.on_ready(f"rank {self.rank} thread {lane} did its last file operation of the save",
                          {**self._damage(), "lane": lane})

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
        lane = None if getattr(self._local, "saving", False) else self._lane()
        rel = self._rel(path) if lane is not None else None
        if lane is None or rel is None:
            return None
        op = self._next(lane, kind, rel, self._rel(target) if target is not None else None)
        plan = self.plan
        mine = plan.rank is None or (plan.rank == self.rank and (plan.lane or 0) == lane)
        if plan.mode == MODE_ERROR and mine and (op.index == plan.op or (plan.persistent and self._failing)):
            self._failing = True
            code = plan.errno or errno_codes.EIO
            raise OSError(code, f"{os.strerror(code)} {INJECTED} at {op.describe()}", os.fspath(path))
        self.on_op(op)
        return rel

    def sync(self, kind: str, name: str) -> None:
        """Called before a collective (``kind`` :data:`COLLECTIVE`), or the main thread's wait for a future
        (:data:`AWAIT`), on a rank of several: an op of the watched save (never of a one-rank run)."""
        if self.rank is None or getattr(self._local, "saving", False):
            return
        lane = self._lane()
        if lane is None or (kind in (AWAIT, START) and lane != 0):
            return
        self.on_op(self._next(lane, kind, name, None))

    def _damage(self) -> dict[str, Any]:
        """What the damage after a kill needs from this process now (``ops_done`` tells which of its ranks'
        words is the latest)."""
        extra: dict[str, Any] = {EXTRA_OPS_DONE: len(self.ops)}
        if self.plan.mode == MODE_POWER:
            extra[EXTRA_UNSYNCED] = {p: self.synced.get(p, 0) for p, n in self.written.items()
                                     if n > self.synced.get(p, 0)}
        if self.plan.mode == MODE_TORN and self.plan.file and self.plan.rank in (None, self.rank):
            extra[EXTRA_TORN] = self.plan.file
        return extra

    def _kill(self, where: str, lane: int = 0) -> None:
        extra = self._damage()
        who = f"rank {self.rank}" + (f" thread {lane}" if lane else "")
        if self.rank is None:
            self.on_kill(f"killed {where}", extra)
        elif self.rank == self.plan.rank and lane == (self.plan.lane or 0):
            self.on_kill(f"{who} killed {where}", {**extra, "lane": lane})
        else:  # stopped where it no longer needs the killed rank, then killed with it
            self.on_kill(f"{who} stopped {where}", {**extra, "lane": lane})

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
        def then(real: Callable[..., Any]) -> Callable[..., Any]:
            return _then_done(self, real)

        open_ = _open_wrapper(self, then(builtins.open))
        wrappers: list[tuple[Any, str, Callable[..., Any]]] = [(builtins, "open", open_), (io, "open", open_),
                    (os, "open", _os_open_wrapper(self, then(os.open))),
                    (os, "mkdir", _mkdir_wrapper(self, then(os.mkdir))),
                    (os, "fsync", _fsync_wrapper(self, then(os.fsync))),
                    (os, "replace", _path_wrapper(self, "replace", then(os.replace), moves=True)),
                    (os, "rename", _path_wrapper(self, "rename", then(os.rename), moves=True)),
                    (os, "remove", _path_wrapper(self, "remove", then(os.remove))),
                    (os, "unlink", _path_wrapper(self, "unlink", then(os.unlink))),
                    (shutil, "rmtree", _path_wrapper(self, "rmtree", then(shutil.rmtree)))]
        torch = sys.modules.get("torch")
        if torch is not None:
            wrappers.append((torch, "save", _torch_save_wrapper(self, then(torch.save))))
        distributed = sys.modules.get("torch.distributed")
        if self.rank is not None:
            wrappers += [(threading.Thread, "start", _start_wrapper(self, threading.Thread.start)),
                         (concurrent.futures.Future, "result", _result_wrapper(self, concurrent.futures.Future.result))]
            if distributed is not None:
                wrappers += [(distributed, name, _collective_wrapper(self, name, then(getattr(distributed, name))))
                             for name in COLLECTIVES if callable(getattr(distributed, name, None))]
        for owner, name, wrapper in wrappers:
            self._wrap(owner, name, wrapper)


def _then_done(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, then :meth:`Recorder.done` (also when it raises)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        finally:
            rec.done()

    return call


def _start_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    def start(self: threading.Thread) -> None:
        rec.starting(self)
        real(self)

    return start


def _result_wrapper(rec: Recorder, real: Callable[..., Any]) -> Callable[..., Any]:
    def result(self: concurrent.futures.Future[Any], timeout: float | None = None) -> Any:
        rec.sync(AWAIT, "Future.result")
        return real(self, timeout)

    return result


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
        rec.sync(COLLECTIVE, name)
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
        try:
            n = self._raw.write(data)
        finally:
            self._rec.done()
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
        try:
            self._raw.close()
        finally:
            self._rec.done()


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
