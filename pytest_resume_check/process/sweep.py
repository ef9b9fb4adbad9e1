"""Finding and killing what runs leave behind: processes that escaped a run's process group. (The fork
server itself is stopped by its owner, :meth:`.fork_server.ForkServer.stop`.)

A run's process group covers the child and what it forks, but not a helper that calls ``setsid()`` or
double-forks into a daemon. Such escapees are found two ways after every run (Linux only: ``/proc``;
elsewhere the process group is all there is):

- **By parent.** The fork server is a subreaper: an orphan of a run it forked is re-parented to it,
  not to PID 1. Between runs the server has no children of its own, so every child it has then
  escaped a run.
- **By environment.** Each run carries a token in its environment (:data:`RUN_TOKEN_ENV`); a process
  that was *exec*'d from a run (a ``subprocess``, a spawned run's interpreter) shows it in
  ``/proc/PID/environ``, which holds the environment a process was exec'd with (forked children without
  an exec show their ancestor's, hence the first way).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator

from pytest_resume_check.records.names import RUN_TOKEN_ENV

#: The environment variable that marks every process of one run (value: the run's token).
PROC = "/proc"
PR_SET_NAME = 15


def escaped(token: str, server_pid: int | None = None, variable: str = RUN_TOKEN_ENV,
            shared: bool = False) -> list[int]:
    """Live pids (never this process, never zombies) carrying ``token`` in their environment (as
    ``variable``), or children of ``server_pid``; of a server ``shared`` by sessions (whose other children
    may be other sessions' live runs), those named :func:`run_name` instead."""
    if not os.path.isdir(PROC):
        return []
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
