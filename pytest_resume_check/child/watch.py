"""Zero-change command targets: an unmodified Python program's checkpoint files are its reports.

A command target declared with ``checkpoints="step_*.pt"`` (a glob relative to the run's checkpoint folder)
makes no client calls. A :class:`Watcher` makes, from the program's own file operations, the reports the
program does not make. Where the program runs in the run's own process, :mod:`.command` installs it around
the program; where it is a process of its own, the harness puts ``startup/`` first on its ``PYTHONPATH``, whose
``sitecustomize`` calls :func:`install` when the interpreter starts, which connects to the harness:

- A checkpoint is **published** when a path matching the glob gets its final name: renamed or replaced into
  place (a file or a folder), closed after being written in place, or written by ``torch.save``. The n-th
  publication of a job is its step n: ``step_end(n)`` then ``checkpoint_published(n, path)``, so kills and
  snapshots happen right there, and the file operations since the previous publication are the save that
  crash cells fault.
- A program that **commits** each checkpoint through a pointer or tracker file (``commit="latest.txt"``,
  declared, or recognised in the uninterrupted run: :mod:`pytest_resume_check.records.commits`) publishes when
  that file gets its final name instead: the checkpoint published is the one its content names (else the
  newest one written since the previous commit), and whether that checkpoint was complete then is reported with
  it (a pointer written before its checkpoint names nothing a resume can load). A checkpoint getting its own
  name, or files written into a checkpoint folder, are then part of the save the next commit completes.
- The checkpoint a run **restored** is the last matching one it opened for reading before its own first
  publication (a program that falls back from a damaged checkpoint to an older one is credited with the older
  one; reading a pointer alone restores nothing), reported as ``resumed(k, path)`` before that publication
  (or at exit), k being its publication number. The numbers live in an index file beside the checkpoints
  (:data:`INDEX`), written by this module with the functions it does not wrap; a matching file the index does
  not know (a save that was never published) counts as the one after the newest it knows. A run that opened
  none resumed step 0.
- Without a commit point it also reports what the reference needs to recognise one: each small file that is no
  checkpoint and gets its final name naming a checkpoint (``POINTER``), and each checkpoint folder filled in place
  (``IN_PLACE``), which never gets a final name of its own.

Nothing else can be known without the program's own reports: no ledger of inputs, no state. What the job
delivers (``outputs=``) is digested by the harness after the program exits (:mod:`.command`). The watcher
acts only in the process that installed it (a forked worker inherits the wrappers, not the reports).
"""

from __future__ import annotations

import atexit
import builtins
import glob
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

from pytest_resume_check import client
from pytest_resume_check.child.recorder import WRITE_FLAGS, FileProxy
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.commits import MAX_POINTER_BYTES, holding, matches, named_checkpoint, pointer_text
from pytest_resume_check.records.regular_files import NotRegular, open_inside

#: The field of the run's context that holds the checkpoint glob (set only for zero-change targets).
CONTEXT_CHECKPOINTS = "checkpoints"
#: The field that holds the glob of the program's commit point (declared or recognised), if it has one.
CONTEXT_COMMIT = "commit"
#: The call the watcher makes for what it saw (:data:`pytest_resume_check.records.events.WATCHED_KINDS`).
CALL_WATCHED = "watched"
#: The index of published checkpoints, by path relative to the checkpoint folder, kept in that folder.
INDEX = ".resume-check-checkpoints.json"
INDEX_VERSION = 1
_WRITING = "wax+"

# The functions as they were before anything wrapped them: the index is written with these, so it is
# never an operation of the program's save.
_real_open = builtins.open
_real_replace = os.replace
_real_fsync = os.fsync


class Watcher:
    """Turns the file operations of one process into the reports of a command target (module docstring)."""

    def __init__(self, run: client.Run, pattern: str, recorder: Any = None, commit: str | None = None):
        self.run = run
        #: Crash cells: the recorder of the program's file operations (the client's, by default).
        self.recorder = recorder if recorder is not None else run._recorder
        self.pattern = pattern
        #: The glob of the program's commit point (None: its checkpoints publish themselves).
        self.commit = commit
        self.pid = os.getpid()
        self.root = os.path.realpath(run.checkpoint_dir or ".")
        self.roots = [self.root]  # where a restored checkpoint may lie: ours, and the folder a path resume names
        if run.resume_path:
            above = os.path.realpath(run.resume_path)
            for _ in range(pattern.count("/") + 1):
                above = os.path.dirname(above)
            if above != self.root:
                self.roots.append(above)
        self.prefixes = {os.path.abspath(r) for r in (run.checkpoint_dir or ".", *self.roots)} | set(self.roots)
        self.lock = threading.RLock()
        self.indexes: dict[str, dict[str, int]] = {}
        self.restored: tuple[str, str] | None = None  # (root, checkpoint relative to it)
        self.reported = False
        self.base = 0  # the step the run resumed at
        self.published = 0  # checkpoints this run published
        self.since_commit: list[str] = []  # checkpoints written since the previous commit, oldest first
        self.open_writes: dict[str, int] = {}  # checkpoint -> its files open for writing (commit point only)
        self.last_named: str | None = None  # the checkpoint the previous commit named
        self.filled: set[str] = set()  # checkpoint folders reported as filled in place
        self.pending: tuple[str, str] | None = None  # a pointer closed in place: reported unless renamed away
        #: ``saving`` is set in a thread while ``torch.save`` writes a path: the save is one publication.
        self.local = threading.local()

    # -- what a path is ------------------------------------------------------------------------------
    def _relative(self, path: Any) -> tuple[str, str] | None:
        """(root, path relative to it) for a path inside one of the roots, None otherwise (cheap for others)."""
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        absolute = os.path.abspath(text)
        if not any(absolute.startswith(p + os.sep) for p in self.prefixes):
            return None
        real = os.path.realpath(absolute)
        for root in self.roots:
            if real.startswith(root + os.sep):
                return root, os.path.relpath(real, root)
        return None

    def _own(self, path: Any) -> str | None:
        """``path`` relative to this run's checkpoint folder when it lies there and is not the index, else None."""
        found = self._relative(path) if self._ours() else None
        if found is None or found[0] != self.root or os.path.basename(found[1]).startswith(INDEX):
            return None
        return found[1]

    def _checkpoint_holding(self, rel: str) -> str | None:
        """The checkpoint ``rel`` is or lies in (a file of a checkpoint folder), None if none (the index is none)."""
        return None if os.path.basename(rel).startswith(INDEX) else holding(rel, self.pattern)

    def _ours(self) -> bool:
        return os.getpid() == self.pid

    def opened_for_writing(self, rel: str, mode: str) -> bool:
        """A file of this run's folder was opened for writing; whether it must be followed to its close: a
        checkpoint, and with a commit point that point and the files of checkpoint folders; without one, a text
        file that may be a pointer (a file of a checkpoint folder is reported as filling it in place)."""
        if self.commit is not None:
            return matches(rel, self.commit) or self._checkpoint_holding(rel) is not None
        holder = self._checkpoint_holding(rel)
        if holder is not None and holder != rel:
            self._filled(holder)
            return False
        return holder is not None or "b" not in mode

    # -- events --------------------------------------------------------------------------------------
    def opened_for_reading(self, path: Any) -> None:
        if self.published or self.reported or not self._ours():
            return
        found = self._relative(path)
        if found is None:
            return
        checkpoint = self._checkpoint_holding(found[1])
        if checkpoint is not None:
            with self.lock:
                self.restored = (found[0], checkpoint)

    def writing(self, rel: str, delta: int) -> None:
        """A file of this folder opened (+1) or closed (-1) for writing: a checkpoint with an open file is not
        complete."""
        holder = self._checkpoint_holding(rel) if self.commit is not None else None
        if holder is not None:
            with self.lock:
                self.open_writes[holder] = self.open_writes.get(holder, 0) + delta

    def wrote(self, path: Any, source: Any = None) -> None:
        """``path`` got its final name and content (renamed from ``source``, or written in place)."""
        rel = self._own(path)
        if rel is None:
            return
        with self.lock:
            if self.commit is not None:
                self._wrote_committing(rel)
                return
            if self.pending is not None and source is not None and self._own(source) == self.pending[0]:
                self.pending = None  # a temporary file renamed into place: the name it got counts
            self.flush_pointer()
            holder = self._checkpoint_holding(rel)
            if holder == rel:
                self._publish(rel)
            elif holder is not None:
                self._filled(holder)
            else:
                self._pointer(rel, renamed=source is not None)

    def _wrote_committing(self, rel: str) -> None:
        if matches(rel, self.commit or ""):
            self._commit(rel)
            return
        holder = self._checkpoint_holding(rel)
        if holder is not None:
            if holder in self.since_commit:
                self.since_commit.remove(holder)
            self.since_commit.append(holder)

    def _commit(self, rel: str) -> None:
        """The commit point ``rel`` got its final name: the checkpoint it names is published."""
        text = self._pointer_text(rel)
        named = named_checkpoint(text, rel, self.pattern, self._known(), self.root) if text is not None else None
        if named is None and self.since_commit:
            named = self.since_commit[-1]  # content that names nothing: the checkpoint it commits is the newest
        if named == self.last_named and not self.since_commit:
            return  # written again, naming the checkpoint it named: nothing new is committed
        complete = named is not None and os.path.exists(os.path.join(self.root, named)) and not self.open_writes.get(
            named)
        self.since_commit = []
        self.last_named = named
        self._publish(named, {ev.EXTRA_FILE: rel, ev.EXTRA_COMPLETE: bool(complete)})

    def _pointer(self, rel: str, renamed: bool) -> None:
        """Without a commit point: report a file naming a checkpoint (one written in place once it keeps its name)."""
        text = self._pointer_text(rel)
        named = named_checkpoint(text, rel, self.pattern, self._known(), self.root) if text is not None else None
        if named is None:
            return
        if renamed:
            self._watched(ev.POINTER, named, {ev.EXTRA_FILE: rel})
        else:
            self.pending = (rel, named)

    def flush_pointer(self) -> None:
        """Report the pointer closed in place, if any: nothing renamed it away."""
        with self.lock:
            if self.pending is not None:
                rel, named = self.pending
                self.pending = None
                self._watched(ev.POINTER, named, {ev.EXTRA_FILE: rel})

    def _filled(self, holder: str) -> None:
        with self.lock:
            if holder not in self.filled:
                self.filled.add(holder)
                self._watched(ev.IN_PLACE, holder)

    def _publish(self, rel: str | None, commit: dict[str, Any] | None = None) -> None:
        """Publish checkpoint ``rel`` (None: a commit that named none) as this run's next step."""
        self.report_resumed()
        self.published += 1
        step = self.base + self.published
        path = os.path.join(self.root, rel) if rel is not None else None
        if rel is not None:
            index = self._index(self.root)
            index[rel] = step
            self._write_index(index)
        if commit is not None:
            self._watched(ev.COMMIT, rel, commit, step)
        self.run.step_end(step)
        self.run.checkpoint_published(step, path)  # the recorder's save ends here
        if self.recorder is not None:
            self.recorder.start(step + 1)  # crash cells: what the program does next is the next save

    def _watched(self, kind: str, rel: str | None, extra: dict[str, Any] | None = None,
                 step: int | None = None) -> None:
        path = os.path.join(self.root, rel) if rel is not None else None
        self.run._call(CALL_WATCHED, kind=kind, step=step, path=path, extra=extra or {})

    def _pointer_text(self, rel: str) -> str | None:
        """The text of the pointer file ``rel`` (its first bytes), or None when it names nothing: gone, or
        no regular file inside the run's folder (a FIFO there would block this, the program's own thread)."""
        try:
            fd = open_inside(self.root, rel)
        except (OSError, NotRegular):
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder (or a link to one) holds no text
                return None
            return pointer_text(os.read(fd, MAX_POINTER_BYTES + 1))
        except OSError:
            return None
        finally:
            os.close(fd)

    def _known(self) -> list[str]:
        """The checkpoints in this run's folder (by name), then those written since the previous commit."""
        found = sorted(os.path.relpath(p, self.root) for p in glob.glob(os.path.join(glob.escape(self.root),
                                                                                   self.pattern)))
        return [c for c in found if c not in self.since_commit] + self.since_commit

    def report_resumed(self) -> None:
        """``resumed`` once: the checkpoint restored (see the module docstring), or step 0."""
        with self.lock:
            if self.reported:
                return
            self.reported = True
            if self.restored is None:
                self.run.resumed(0)
                return
            root, rel = self.restored
            index = self._index(root)
            self.base = index.get(rel) or max(index.values(), default=0) + 1
            self.run.resumed(self.base, os.path.join(root, rel))

    # -- the index -----------------------------------------------------------------------------------
    def _index(self, root: str) -> dict[str, int]:
        if root not in self.indexes:
            self.indexes[root] = read_index(root)
        return self.indexes[root]

    def _write_index(self, index: dict[str, int]) -> None:
        path = os.path.join(self.root, INDEX)
        temporary = f"{path}.{os.getpid()}.tmp"
        with _real_open(temporary, "w", encoding="utf-8") as f:
            json.dump({"version": INDEX_VERSION, "checkpoints": index}, f)
            f.flush()
            _real_fsync(f.fileno())
        _real_replace(temporary, path)

    # -- installation --------------------------------------------------------------------------------
    @staticmethod
    def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        setattr(owner, name, make(getattr(owner, name)))

    def install(self) -> None:
        """Wrap the file functions of this process (on top of the crash cells' recorder, which then sees
        every operation before the publication it completes)."""
        self._wrap(builtins, "open", self._open_wrapper)
        io.open = builtins.open  # one function, as in the interpreter
        self._wrap(os, "open", self._os_open_wrapper)
        for name in ("replace", "rename"):
            self._wrap(os, name, self._move_wrapper)
        if "torch" in sys.modules:
            self.wrap_torch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _WhenImported("torch", self.wrap_torch))

    def wrap_torch(self, torch: Any) -> None:
        if getattr(torch, "save", None) is not None:
            self._wrap(torch, "save", self._torch_save_wrapper)

    def _open_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            result = real(file, mode, *args, **kwargs)
            if isinstance(file, (str, bytes, os.PathLike)) and not getattr(self.local, "saving", False):
                if any(c in mode for c in _WRITING):
                    rel = self._own(file)
                    if rel is not None and self.opened_for_writing(rel, mode):
                        return _FinalOnClose(result, self, file, rel)
                else:
                    self.opened_for_reading(file)
            return result

        return open_

    def _os_open_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            fd = real(path, flags, *args, **kwargs)
            if not flags & WRITE_FLAGS:
                self.opened_for_reading(path)
            return int(fd)

        return os_open

    def _move_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real(src, dst, *args, **kwargs)
            self.wrote(dst, source=src)

        return move

    def _torch_save_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """A ``torch.save`` to a path publishes once in either format: the legacy one
        (``_use_new_zipfile_serialization=False``) writes through ``open``, whose close inside the save would
        publish the same checkpoint a second time, as the next step."""

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if not isinstance(f, (str, bytes, os.PathLike)):
                real(obj, f, *args, **kwargs)
                return
            self.local.saving = True
            try:
                real(obj, f, *args, **kwargs)
            finally:
                self.local.saving = False
            self.wrote(f)

        return save


class _FinalOnClose(FileProxy):
    """A file written in place in the checkpoint folder: it has its final name and content when it is closed."""

    def __init__(self, raw: Any, watcher: Watcher, path: Any, rel: str):
        super().__init__(raw)
        self._watcher = watcher
        self._path = path
        self._rel = rel
        watcher.writing(rel, +1)

    def close(self) -> None:
        if self._raw.closed:
            return
        self._raw.close()
        self._watcher.writing(self._rel, -1)
        self._watcher.wrote(self._path)

    def __del__(self) -> None:  # a program that leaves closing to the garbage collector
        raw = self.__dict__.get("_raw")
        if raw is not None and not raw.closed:
            self.close()


class _WhenImported(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` has been executed (torch, imported by the program
    after start-up: importing it here would cost every run a second)."""

    def __init__(self, name: str, then: Callable[[Any], None]):
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        then = self.then

        def exec_module(module: Any) -> None:
            execute(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def read_index(root: str) -> dict[str, int]:
    """The publication numbers of the checkpoints in ``root`` (empty when it has no index)."""
    try:
        with _real_open(os.path.join(root, INDEX), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    found = data.get("checkpoints") if isinstance(data, dict) else None
    if not isinstance(found, dict):
        return {}
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int)}


def install() -> Watcher | None:
    """Start watching this process when the harness started it as a zero-change target (None otherwise:
    outside the harness, or in a program the watched one starts)."""
    if not os.environ.get(client.CONTEXT_ENV) or not os.environ.get(client.FD_ENV):
        return None
    try:
        context = json.loads(os.environ[client.CONTEXT_ENV])
        pattern, commit = context.get(CONTEXT_CHECKPOINTS), context.get(CONTEXT_COMMIT)
    except (ValueError, AttributeError):
        return None
    if not pattern:
        return None
    return start(client.connect(), str(pattern), commit=str(commit) if commit else None)


def start(run: client.Run, pattern: str, recorder: Any = None, commit: str | None = None) -> Watcher:
    """Watch this process for ``run`` from now on: its file functions wrapped, the save of checkpoint 1
    watched in crash cells (a faulted run starts fresh), what it resumed reported at exit if nothing did
    before. ``commit``: the glob of the program's commit point, if it has one."""
    watcher = Watcher(run, pattern, recorder, commit)
    if watcher.recorder is not None:
        watcher.recorder.start(1)
    watcher.install()
    atexit.register(_at_exit, watcher)
    return watcher


def _at_exit(watcher: Watcher) -> None:
    if watcher._ours():
        try:
            watcher.flush_pointer()
            watcher.report_resumed()
        except client.ProtocolError:
            pass


def run_hidden_sitecustomize(own_file: str) -> None:
    """Take our folder off ``sys.path`` and run the ``sitecustomize`` it hid, if there is one."""
    folder = os.path.dirname(os.path.abspath(own_file))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != folder]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)
