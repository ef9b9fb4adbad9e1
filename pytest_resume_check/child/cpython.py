"""The CPython-private names the harness relies on, in one place: no other module of the package touches a
private attribute of ``multiprocessing``, ``atexit`` or ``threading`` (tests/unit/test_cpython_adapter.py
walks the package and fails when one does).

Why private names at all: ``multiprocessing`` keeps its fork server and resource tracker as hidden singletons
with no public way to learn the server's pid, stop it, fork from a server another process started (one shared
by sessions), or close the liveness pipe every child forked from it inherits; a program run in a run's process
(``child.in_process``) must end as a fresh interpreter ends, which takes the exit functions ``atexit`` and
``threading`` keep and ``multiprocessing.util``'s own exit function.

Checked on CPython 3.10.13, 3.11.7, 3.12.1 and 3.13.0: each name below exists there with the meaning used
here (tests/engine/test_cpython_versions.py starts, reads and stops a fork server through this module in
every one of those interpreters it finds). The whole suite runs on 3.11. Python 3.14 changes the fork
server (an authentication key, ``forkserver`` the default start method) and is not checked.

``sys._getframe`` and ``sys._current_frames`` are documented functions of ``sys`` and are used where
they are needed; ``os._exit`` is public.

Importing this module imports only small standard-library modules; ``multiprocessing`` is imported by the
functions that need it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

#: Every private name this module reads or writes, by the module that holds it: what the version check
#: looks for, and what no other module of the package may name.
PRIVATE_NAMES: dict[tuple[str, str], tuple[str, ...]] = {
    ("multiprocessing.forkserver", ""): ("_forkserver",),
    ("multiprocessing.forkserver", "ForkServer"): ("_forkserver_pid", "_forkserver_address", "_forkserver_alive_fd"),
    ("multiprocessing.resource_tracker", ""): ("_resource_tracker",),
    ("multiprocessing.resource_tracker", "ResourceTracker"): ("_pid", "_fd"),
    ("multiprocessing.util", ""): ("_exit_function",),
    ("atexit", ""): ("_run_exitfuncs", "_clear"),
    ("threading", ""): ("_threading_atexits",),
}


def _server() -> Any:
    """multiprocessing's one fork server object of this process."""
    import multiprocessing.forkserver

    return multiprocessing.forkserver._forkserver


def forkserver_pid() -> int | None:
    """The pid multiprocessing keeps for its fork server (None before it starts and after it is stopped), or
    that of the server another process started that this one is attached to (:func:`attach_forkserver`)."""
    if _ATTACHED:
        return _ATTACHED[0]
    return getattr(_server(), "_forkserver_pid", None)


def forkserver_address() -> str | None:
    """The address of the fork server multiprocessing forks this process's children from."""
    return getattr(_server(), "_forkserver_address", None)


#: While this process forks its runs from a fork server it did not start: that server's pid.
_ATTACHED: list[int] = []


def attach_forkserver(address: str, pid: int, alive_fd: int) -> None:
    """Make multiprocessing fork this process's ``forkserver`` children from the server listening at ``address``
    (pid ``pid``), which another process started: CPython's client protocol needs only the socket and a
    descriptor to hand each child as its liveness pipe (``alive_fd``, which the child closes). multiprocessing
    asks ``waitpid`` whether its server lives, which only the server's parent may ask: while attached, only its
    resource tracker is made sure of. Stops this process's own server first."""
    import multiprocessing.resource_tracker

    kill_forkserver()
    server = _server()
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_fd
    server._forkserver_pid = None
    server.ensure_running = multiprocessing.resource_tracker.ensure_running  # an instance attribute: see detach
    _ATTACHED[:] = [pid]


def detach_forkserver() -> None:
    """Undo :func:`attach_forkserver` (the server is left running: it is not this process's); the descriptor
    handed to it is closed."""
    if not _ATTACHED:
        return
    server = _server()
    vars(server).pop("ensure_running", None)
    drop_forkserver_pipe()
    server._forkserver_address = server._forkserver_pid = None
    _ATTACHED.clear()


def stop_forkserver() -> bool:
    """End the fork server so that the next start begins a new one, never waiting on it: its liveness pipe
    closed, SIGKILLed, reaped and forgotten (:func:`kill_forkserver`). multiprocessing's own stop waits until
    the server sees the pipe close, which it never does while a process forked from this one after the server
    started (a loader's worker, a test's child) holds the pipe's other end: a restart hung there. False where
    this Python keeps no pid for its server (its runs then import what the server lacks)."""
    if not hasattr(_server(), "_forkserver_pid"):
        return False
    detach_forkserver()
    kill_forkserver()
    return True


def kill_forkserver() -> None:
    """Close the fork server's liveness pipe, SIGKILL it, reap it and forget it (and its socket file), without
    waiting on a server that something else keeps alive. One this process is only attached to is left
    running (:func:`detach_forkserver`)."""
    if _ATTACHED:
        detach_forkserver()
        return
    server = _server()
    address = getattr(server, "_forkserver_address", None)
    _kill(server, "_forkserver_pid", "_forkserver_alive_fd")
    if address and not address.startswith("\0"):  # an abstract socket has no file
        try:
            os.unlink(address)
        except OSError:
            pass
    server._forkserver_address = None


def kill_resource_tracker() -> None:
    """The same for multiprocessing's resource tracker of this process, if it started one."""
    import multiprocessing.resource_tracker

    _kill(multiprocessing.resource_tracker._resource_tracker, "_pid", "_fd")


def _kill(holder: object, pid_attr: str, fd_attr: str) -> None:
    """Close the pipe that keeps a helper process alive, SIGKILL it, reap it, forget it."""
    pid, fd = getattr(holder, pid_attr, None), getattr(holder, fd_attr, None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        setattr(holder, fd_attr, None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError, PermissionError):
            pass
        setattr(holder, pid_attr, None)


def drop_forkserver_pipe() -> None:
    """In a process forked from the fork server: close the server's liveness pipe that multiprocessing hands
    every child it forks (and forget it), so nothing the process runs can write to it."""
    server = _server()
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def multiprocessing_exit_function() -> Callable[[], None] | None:
    """The exit function ``multiprocessing.util`` registers when imported (it joins the children that are no
    daemons, terminates those that are and runs its finalizers), None while it is not imported."""
    util = sys.modules.get("multiprocessing.util")
    return getattr(util, "_exit_function", None) if util is not None else None


def threading_exit_hooks() -> list[Callable[[], None]]:
    """The hooks ``threading`` runs at exit before it waits for threads (``concurrent.futures`` finishes an
    executor's queue so), in the order they were registered."""
    import threading

    return list(getattr(threading, "_threading_atexits", ()))


def run_exit_functions() -> None:
    """Run the functions registered with ``atexit`` now, last registered first, and forget them."""
    import atexit

    atexit._run_exitfuncs()


def clear_exit_functions() -> None:
    """Forget every function registered with ``atexit`` (the fork server's are not a program's)."""
    import atexit

    atexit._clear()


def missing() -> list[str]:
    """The names of :data:`PRIVATE_NAMES` this interpreter lacks, as ``module.name`` or
    ``module.Class.name`` (empty where the harness works as checked)."""
    import importlib

    absent = []
    for (module_name, class_name), names in PRIVATE_NAMES.items():
        holder: Any = importlib.import_module(module_name)
        if class_name:  # an instance: these classes set their attributes in __init__ (a lock, no process)
            holder = getattr(holder, class_name)()
        where = ".".join(filter(None, (module_name, class_name)))
        absent += [f"{where}.{name}" for name in names if not hasattr(holder, name)]
    return absent
