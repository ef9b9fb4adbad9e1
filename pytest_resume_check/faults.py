"""File operations of a checkpoint save: recording, crash points, I/O errors, power loss, torn files.

Runs inside the child. While the target saves the watched checkpoint (from ``should_checkpoint(step)``
answering yes to ``checkpoint_published(step)``), every file operation under the run's checkpoint
directory is an *op*: ``open`` for writing, each ``write``, ``close``, ``fsync``, ``replace``/``rename``,
``mkdir``, ``remove``/``unlink``/``rmtree`` and ``torch.save`` to a path. Audit hooks do not see fsync,
write or close, so the functions are wrapped instead (module attributes of ``os``, ``builtins``,
``io``, ``shutil`` and ``torch``).

A :class:`FaultPlan` then says what happens at op ``i`` of that save:

- ``record``: nothing; the ops are reported (``file_op`` events) so the matrix can enumerate them.
- ``crash``: the run is SIGKILLed right before op ``i`` (``i == len(ops)``: after the last op, before
  the checkpoint is reported).
- ``power``: like ``crash``, then every file of the save loses what was written to it after its
  last fsync (it keeps its name); the kill report names those files.
- ``torn``: like ``crash``, then the named file is cut to half its bytes under its final name.
- ``error``: op ``i`` raises ``OSError(errno)`` instead of happening (and every later op too when
  ``persistent``): the save must fail loudly.
"""

from __future__ import annotations

import builtins
import errno as errno_codes
import io
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RECORD = "record"
CRASH = "crash"
POWER = "power"
TORN = "torn"
ERROR = "error"
MODES = (RECORD, CRASH, POWER, TORN, ERROR)

ERRNOS = {"enospc": errno_codes.ENOSPC, "eio": errno_codes.EIO}
#: Marker in injected errors, so the verdict can tell them from the target's own failures.
INJECTED = "[injected by pytest-resume-check]"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass(frozen=True)
class FaultPlan:
    """What to do during the save of checkpoint ``step``."""

    step: int
    mode: str = RECORD
    op: int | None = None
    errno: int | None = None
    persistent: bool = False
    file: str | None = None  # torn: the path (relative to the checkpoint dir) to cut
    total: int | None = None  # ops of this save as recorded (known when the matrix is built)

    @property
    def label(self) -> str:
        """``@4``, ``@4:power``, ``@4:enospc+`` ... (the kill id after ``save{step}``)."""
        if self.mode == TORN:
            return f"@{self.op}:torn:{self.file}"
        suffix = {CRASH: "", POWER: ":power", RECORD: ":record"}.get(self.mode)
        if suffix is None:
            name = next((k for k, v in ERRNOS.items() if v == self.errno), str(self.errno))
            suffix = f":{name}{'+' if self.persistent else ''}"
        return f"@{self.op}{suffix}"


def parse_label(step: int, text: str) -> FaultPlan:
    """Inverse of :attr:`FaultPlan.label` (without file and total)."""
    op, _, kind = text.lstrip("@").partition(":")
    if kind.startswith("torn:"):
        return FaultPlan(step, TORN, int(op), file=kind[len("torn:"):])
    if kind in ("", "power", "record"):
        return FaultPlan(step, {"": CRASH}.get(kind, kind), int(op))
    persistent = kind.endswith("+")
    return FaultPlan(step, ERROR, int(op), ERRNOS[kind.rstrip("+")], persistent)


def apply_after_kill(root: str, extra: dict[str, Any]) -> list[str]:
    """What a power loss or torn write does to the disk after the kill; returns notes for the report."""
    notes = []
    for rel, synced in sorted(extra.get("unsynced", {}).items()):
        path = os.path.join(root, rel)
        if os.path.exists(path):
            with open(path, "r+b") as f:
                f.truncate(int(synced))
            notes.append(f"not durable: {rel} (cut to its {synced} fsynced bytes)")
    torn = extra.get("torn")
    if torn:
        path = os.path.join(root, torn)
        if os.path.exists(path):
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                f.truncate(size // 2)
            notes.append(f"torn: {torn} cut from {size} to {size // 2} bytes")
    return notes


@dataclass(frozen=True)
class FileOp:
    """One recorded operation; paths relative to the checkpoint directory."""

    index: int
    kind: str
    path: str
    target: str | None = None

    def describe(self, root: str = "...") -> str:
        if self.target is not None:
            return f"{self.kind}({root}/{self.path} -> {root}/{self.target})"
        return f"{self.kind}({root}/{self.path})"


class Recorder:
    """Wraps file functions in this process and applies a :class:`FaultPlan` during the watched save.

    ``on_op(op)`` is called for every op that happens; ``on_kill(op_text, extra)`` when the plan
    says to be killed here (it does not return).
    """

    def __init__(self, plan: FaultPlan, root: str, on_op: Callable[[FileOp], None],
                 on_kill: Callable[[str, dict[str, Any]], None]):
        self.plan = plan
        self.root = os.path.realpath(root)
        self.on_op = on_op
        self.on_kill = on_kill
        self.active = False
        self.ops: list[FileOp] = []
        self.written: dict[str, int] = {}  # path -> bytes written in this save
        self.synced: dict[str, int] = {}  # path -> bytes made durable by fsync
        self._failing = False

    # -- the watched window ----------------------------------------------------------------------
    def start(self, step: int) -> None:
        if step == self.plan.step:
            self.active = True

    def finish(self, step: int) -> None:
        """At ``checkpoint_published(step)``: the point after the last op."""
        if step == self.plan.step and self.active:
            if self.plan.mode in (CRASH, POWER, TORN) and self.plan.op == len(self.ops):
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

    def op(self, kind: str, path: Any, target: Any = None) -> bool:
        """Called before an operation happens; True when it is watched. May kill or raise."""
        rel = self._rel(path) if self.active else None
        if rel is None:
            return False
        index = len(self.ops)
        op = FileOp(index, kind, rel, self._rel(target) if target is not None else None)
        plan = self.plan
        if plan.mode in (CRASH, POWER, TORN) and plan.op == index:
            self._kill(f"before {op.describe()}")
        self.ops.append(op)  # counted even when it fails: "once" must hit exactly one op
        if plan.mode == ERROR and (index == plan.op or (plan.persistent and self._failing)):
            self._failing = True
            code = plan.errno or errno_codes.EIO
            raise OSError(code, f"{os.strerror(code)} {INJECTED} at {op.describe()}", os.fspath(path))
        self.on_op(op)
        return True

    def _kill(self, where: str) -> None:
        extra: dict[str, Any] = {"ops_done": len(self.ops)}
        if self.plan.mode == POWER:
            extra["unsynced"] = {p: self.synced.get(p, 0) for p, n in self.written.items()
                                 if n > self.synced.get(p, 0)}
        if self.plan.mode == TORN and self.plan.file:
            extra["torn"] = self.plan.file
        self.on_kill(f"killed {where}", extra)

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
    def install(self) -> None:
        """Wrap the file functions of this (child) process."""
        rec = self
        real_open, real_os_open = builtins.open, os.open
        real_replace, real_rename = os.replace, os.rename
        real_remove, real_unlink, real_mkdir = os.remove, os.unlink, os.mkdir
        real_fsync, real_rmtree = os.fsync, shutil.rmtree

        def fd_path(fd: int) -> str | None:
            try:
                return os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                return None

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            writing = isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+")
            if writing and rec.op("open", file):
                rel = rec._rel(file)
                if "a" not in mode:
                    rec.written[rel] = 0
                    rec.synced[rel] = 0
                return _TrackedFile(real_open(file, mode, *args, **kwargs), rec, rel)
            return real_open(file, mode, *args, **kwargs)

        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & _WRITE_FLAGS:
                rec.op("open", path)
            return real_os_open(path, flags, *args, **kwargs)

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            watched = rec.op("replace", src, dst)
            real_replace(src, dst, *args, **kwargs)
            if watched:
                rec.moved(rec._rel(src), rec._rel(dst))

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            watched = rec.op("rename", src, dst)
            real_rename(src, dst, *args, **kwargs)
            if watched:
                rec.moved(rec._rel(src), rec._rel(dst))

        def remove(path: Any, *args: Any, **kwargs: Any) -> None:
            rec.op("remove", path)
            real_remove(path, *args, **kwargs)

        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            rec.op("unlink", path)
            real_unlink(path, *args, **kwargs)

        def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            if not os.path.isdir(path):
                rec.op("mkdir", path)
            real_mkdir(path, *args, **kwargs)

        def fsync(fd: Any) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            path = fd_path(number)
            watched = path is not None and rec.op("fsync", path)
            real_fsync(fd)
            if watched:
                rec.fsynced(rec._rel(path))

        def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
            rec.op("rmtree", path)
            real_rmtree(path, *args, **kwargs)

        builtins.open = io.open = open_
        os.open, os.replace, os.rename = os_open, replace, rename
        os.remove, os.unlink, os.mkdir, os.fsync = remove, unlink, mkdir, fsync
        shutil.rmtree = rmtree
        torch = sys.modules.get("torch")
        if torch is not None:
            real_save = torch.save

            def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
                if isinstance(f, (str, os.PathLike)) and rec.op("torch.save", f):
                    rel = rec._rel(f)
                    real_save(obj, f, *args, **kwargs)
                    # torch writes paths from C++ and never fsyncs them: nothing of it is durable.
                    rec.written[rel] = max(1, os.path.getsize(f))
                    rec.synced[rel] = 0
                    return
                real_save(obj, f, *args, **kwargs)

            torch.save = save


class _TrackedFile:
    """A file object whose write, fsync-relevant size and close are recorded."""

    def __init__(self, raw: Any, rec: Recorder, rel: str | None):
        self._raw = raw
        self._rec = rec
        self._rel = rel

    def write(self, data: Any) -> int:
        self._rec.op("write", self._raw.name)
        n = self._raw.write(data)
        if self._rel is not None:
            self._rec.wrote(self._rel, len(data) if n is None else n)
        return n

    def close(self) -> None:
        if not self._raw.closed:
            self._rec.op("close", self._raw.name)
        self._raw.close()

    def __enter__(self) -> _TrackedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Any:
        return iter(self._raw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
