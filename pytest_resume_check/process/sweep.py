"""Finding and killing what runs leave behind: processes that escaped a run's process group. (The fork
server itself is stopped by its owner, :meth:`.fork_server.ForkServer.stop`.)

A run's process group covers the child and what it forks, but not a helper that calls ``setsid()`` or
double-forks into a daemon. Such escapees are found two ways after every run (Linux only: ``/proc``;
elsewhere the process group is all there is):

- **By descent.** The fork server is a subreaper: an orphan of a run it forked is re-parented to it,
  not to PID 1, and a process that escaped the run's group but still has a live parent stays below it.
  Between runs the server has no children of its own, so every descendant it has then escaped a run.
  They are read from the kernel's lists of each process's children (``/proc/PID/task/TID/children``),
  so the sweep after a run reads only the server's own tree, however many processes the machine runs.
- **By environment.** Each run carries a token in its environment (:data:`RUN_TOKEN_ENV`); a process
  that was *exec*'d from a run (a ``subprocess``, a spawned run's interpreter) shows it in
  ``/proc/PID/environ``, which holds the environment a process was exec'd with (forked children without
  an exec show their ancestor's, hence the first way). This reads every process of ``/proc``: it is
  the search for spawned runs (their orphans go to PID 1, not to a server), and for forked ones when the
  server's tree cannot be read (a kernel without the children lists, a server that died: its orphans
  went elsewhere too).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from pytest_resume_check.records.names import RUN_TOKEN_ENV

#: The environment variable that marks every process of one run (value: the run's token).
PROC = "/proc"
PR_SET_NAME = 15


def escaped(token: str, server_pid: int | None = None, variable: str = RUN_TOKEN_ENV,
            shared: bool = False) -> list[int]:
    """Live pids (never this process, never zombies) that escaped a run: with ``server_pid``, the
    descendants of that fork server (:func:`descendants`); without it, or when the server's tree cannot be
    read, those carrying ``token`` in their environment (as ``variable``) or children of ``server_pid``,
    searched in all of ``/proc``. Of a server ``shared`` by sessions (whose other descendants may be other
    sessions' live runs), those named :func:`run_name` or carrying the token, searched in all of ``/proc``."""
    if not os.path.isdir(PROC):
        return []
    if server_pid and not shared:
        below = descendants(server_pid)
        if below is not None:
            return [pid for pid in below if pid != os.getpid() and _alive(pid)]
    return _search(token, server_pid, variable, shared)


def descendants(pid: int) -> list[int] | None:
    """Every process below ``pid`` (children before grandchildren, zombies included), from the kernel's
    lists of children; None when they cannot be read: no such process, or a kernel without the lists
    (``CONFIG_PROC_CHILDREN``). A list is read per thread (a child belongs to the thread that forked it,
    an adopted orphan to any thread of its new parent)."""
    if not _children_listed():
        return None
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop(0)
        try:
            tasks = os.listdir(f"{PROC}/{parent}/task")
        except OSError:
            if parent == pid:
                return None
            continue  # gone meanwhile, with its children re-parented to one already read or to be read
        for task in tasks:
            try:
                with open(f"{PROC}/{parent}/task/{task}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
            new = [k for k in kids if k not in found]
            found += new
            parents += new
    return found


@functools.cache
def _children_listed() -> bool:
    """Whether this kernel lists each thread's children in ``/proc`` (Linux 3.5 with ``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"{PROC}/self/task/{threading.get_native_id()}/children")


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has: its parent reaps it)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _search(token: str, server_pid: int | None, variable: str, shared: bool) -> list[int]:
    """Live pids carrying ``token`` in their environment (as ``variable``), or children of ``server_pid``
    (named :func:`run_name` instead when the server is ``shared``): every process of ``/proc`` read."""
    needle = f"{variable}={token}".encode() + b"\0" if token else None
    comm = run_name(token).encode()
    me = os.getpid()
    found = []
    for name in os.listdir(PROC):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"{PROC}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if fields[0] == b"Z":
                continue  # dead already; its parent reaps it
            if shared and token:
                with open(f"{PROC}/{name}/comm", "rb") as f:
                    if f.read().rstrip(b"\n") == comm:
                        found.append(int(name))
                        continue
            elif server_pid and int(fields[1]) == server_pid:
                found.append(int(name))
                continue
            if needle is not None:
                with open(f"{PROC}/{name}/environ", "rb") as f:
                    if needle in f.read() + b"\0":
                        found.append(int(name))
        except (OSError, IndexError, ValueError):  # gone, or another user's process
            continue
    return found


def run_name(token: str) -> str:
    """The process name (``comm``, 15 bytes at most) a run forked from a shared server takes: every process
    it forks inherits it, so what the run detached without an ``exec`` is found by it (:func:`escaped`)."""
    return f"rc-{token}"[:15]


def name_process(name: str) -> None:
    """Give this process the name ``name`` (``prctl(PR_SET_NAME)``; nothing where that does not exist)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of process group ``pgid``; empty without ``/proc``."""
    if not os.path.isdir(PROC):
        return []
    members = []
    for name in os.listdir(PROC):
        try:
            with open(f"{PROC}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if name.isdigit() and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                members.append(int(name))
        except (OSError, IndexError, ValueError):  # not a process, or gone meanwhile
            continue
    return members


def group_not_stopped(pgid: int) -> list[int]:
    """Threads (by id) of the processes of group ``pgid`` that are neither stopped nor dead. Empty
    without ``/proc``: the caller then cannot check and goes on."""
    if not os.path.isdir(PROC):
        return []
    running = []
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        try:
            with open(f"{PROC}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if int(fields[2]) != pgid:
                continue
            for task in os.listdir(f"{PROC}/{name}/task"):
                with open(f"{PROC}/{name}/task/{task}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[-1].split()[0]
                if state not in (b"T", b"t", b"Z", b"X"):
                    running.append(int(task))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return running


def sweep(token: str, server_pid: int | None = None, timeout: float = 10.0, shared: bool = False) -> int:
    """SIGKILL every process :func:`escaped` finds until none is left; return how many there were."""
    return kill_until_gone(lambda: escaped(token, server_pid, shared=shared), timeout)


def kill_until_gone(find: Callable[[], Iterable[int]], timeout: float = 10.0, reap: bool = False) -> int:
    """SIGKILL what ``find()`` returns until it returns nothing (or ``timeout`` passes); how many were
    killed. ``reap``: also reap those that are this process's children (else they stay its zombies)."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = set(find())
        if not alive:
            break
        for pid in alive:
            killed.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if reap:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        time.sleep(0.01)
    return len(killed)


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment while the block runs: what is exec'd meanwhile
    inherits it (a run's or a service's token, the fork server's preload list)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
