"""The environment variables a run's own code reads, noted as it reads them (docs/cluster.md, "The runs'
environment"): a run on a cluster node that read a variable the machine pytest runs on has with another
value ran another configuration, and a reproduction says which variables its run depended on.

:meth:`Reads.install` makes ``os.environ`` note each name read through it (``os.environ[...]``, ``.get``,
``in``, ``setdefault``, ``os.getenv``); the fork server installs it before it imports the targets' modules,
so what a module reads when imported counts and every run forked from it inherits those names, and a
spawned run installs it at its start. :meth:`Reads.attach`, in the run, sends each name that counts
(:func:`pytest_resume_check.records.environ.counts`) once, those read before first.

A read counts only when the code that made it is the project's: a file outside the standard library,
the installed distributions and this package. Importing torch alone reads some 360 variables, none of
which a project sets; what the project's code reads through a framework is not seen (declare those).
Reads from C (``getenv``) are not seen either. Writing to ``os.environ`` is untouched.

The fork server also keeps every name any code read while it imported and warmed up (:meth:`Reads.seal`): a
command target whose ``env=`` gives one of them another value cannot run in the run's process as a fresh
interpreter would (:meth:`Reads.read_when_imported`).
"""

from __future__ import annotations

import _collections_abc
import os
import site
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

from pytest_resume_check.records.environ import counts

#: Files whose frames stand between a read and the code that asked for it (``os.getenv`` calls
#: ``environ.get``, which calls ``__getitem__``); frozen modules name their code ``<frozen os>``.
_PLUMBING = frozenset(filter(None, (getattr(os, "__file__", None), getattr(_collections_abc, "__file__", None),
                                    __file__)))


class Reads:
    """The names the project's code read in this process, and where to send new ones (one object per
    process: :data:`READS`)."""

    def __init__(self) -> None:
        self._names: dict[str, None] = {}
        self._lock = threading.Lock()
        self._send: Callable[[str], None] | None = None
        self._skip: frozenset[str] = frozenset()
        self._outside: tuple[str, ...] = ()
        self._project: dict[str, bool] = {}  # a code file -> whether it is the project's
        self._busy = threading.local()
        self._every: set[str] | None = set()  # every name read by any code until :meth:`seal`
        self._sealed: dict[str, str | None] = {}

    def install(self) -> None:
        """Make ``os.environ`` note reads (once; not when something else already replaced its class)."""
        if type(os.environ) is not os._Environ:
            return
        self._outside = library_folders()  # reads the environment itself: before the class changes
        # A process forked while another thread held the lock (a loader's worker) gets a lock of its own.
        os.register_at_fork(after_in_child=self._fresh_lock)
        os.environ.__class__ = _NotingEnviron

    def _fresh_lock(self) -> None:
        self._lock = threading.Lock()

    def attach(self, send: Callable[[str], None], skip: Iterable[str] = ()) -> None:
        """From now on send each name that counts (not among ``skip``, what the harness set for the run) to
        ``send``, once; those read before this call first."""
        with self._lock:
            self._skip = frozenset(skip)
            self._send = send
            earlier = [name for name in self._names if counts(name, self._skip)]
        for name in earlier:
            send(name)

    def seal(self) -> None:
        """In the fork server, once its imports and warm-ups are done: keep every name any code read so far
        (libraries included) with its value then, for :meth:`read_when_imported`."""
        every, self._every = self._every or set(), None
        self._sealed = {name: os.environ.get(name) for name in sorted(every)}

    def sealed(self) -> dict[str, str | None]:
        """What :meth:`seal` kept: every name read before it, with its value then (None: unset)."""
        return dict(self._sealed)

    def read_when_imported(self, env: Iterable[tuple[str, str]]) -> list[str]:
        """The names among ``env`` (a command target's ``env=``) that code the fork server imported read, when
        the server had another value for them: in a process forked from the server that code keeps the value
        it read, where a fresh interpreter's import would read the target's."""
        return [name for name, value in env if name in self._sealed and self._sealed[name] != value]

    def note(self, key: object) -> None:
        """Called for every read: keep ``key`` if the project's code read it, and send it if it counts."""
        every = self._every
        if every is not None and isinstance(key, str):
            every.add(key)
        if not isinstance(key, str) or key in self._names or getattr(self._busy, "on", False):
            return
        self._busy.on = True  # what a send does never comes back here
        try:
            frame: FrameType | None = sys._getframe(2)  # past this method and __getitem__
            while frame is not None and (frame.f_code.co_filename in _PLUMBING
                                         or frame.f_code.co_filename.startswith("<frozen ")):
                frame = frame.f_back
            if frame is None or not self._is_project(frame.f_code.co_filename):
                return
            with self._lock:
                if key in self._names:
                    return
                self._names[key] = None
                send = self._send if counts(key, self._skip) else None
            if send is not None:
                send(key)
        except Exception:  # noting must never change what the read does
            pass
        finally:
            self._busy.on = False

    def _is_project(self, filename: str) -> bool:
        known = self._project.get(filename)
        if known is None:
            path = os.path.realpath(filename) if not filename.startswith("<") else ""
            known = bool(path) and not path.startswith(self._outside) and not any(
                f"{os.sep}{folder}{os.sep}" in path for folder in _INSTALLED)
            self._project[filename] = known
        return known


class _NotingEnviron(os._Environ[str]):
    """``os.environ`` that notes the names read through it (:data:`READS`)."""

    def __getitem__(self, key: str) -> str:
        READS.note(key)
        return super().__getitem__(key)


#: Folders that hold installed distributions wherever they are (an environment may see another's through a
#: ``.pth`` file): code under one is not the project's.
_INSTALLED = ("site-packages", "dist-packages")


def library_folders() -> tuple[str, ...]:
    """Folders whose code is not the project's: the standard library, the installed distributions (the
    environment's and the user's) and this package, each resolved and ending in a separator."""
    paths = sysconfig.get_paths()
    folders = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    folders += [*site.getsitepackages(), site.getusersitepackages(), str(Path(__file__).resolve().parents[1])]
    return tuple(dict.fromkeys(os.path.realpath(f) + os.sep for f in folders if f))


#: This process's reads: the fork server's, inherited by the runs forked from it.
READS = Reads()
