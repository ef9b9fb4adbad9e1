"""Services a target's runs share: something started once per session (a Ray head, a database) instead
of once per run.

A target declares ``services=(factory, ...)``: each factory is called with no arguments in the process
that runs the cells (the pytest process, or each xdist worker) and returns a context manager. Entering it
starts the service and gives a mapping of environment variables; every run of the target gets them in
its environment (a command target's program too), which is how a run finds the service. A service is
started on the first run of a target that names it and stopped, in reverse order, when the session ends,
after Ctrl-C too. A factory that raises is not retried: every cell of its targets fails with one line
that names it.

A start has a limit (issue 26: a service that hung while starting hung the whole session): the factory's
own ``start_timeout`` attribute (seconds), else the target's hang limit. The start runs in a thread of its
own so that the limit can be kept; a start past its limit fails its targets' cells with one line and the
processes it had started are killed. What a service starts is tracked by process group and session (and
by parent for children that stay in ours): whatever of it is still running after it stopped is killed and
named in a warning, and a stop that raises is reported with the service's name.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from pytest_resume_check.targets import Target, TargetError, describe_error

ServiceFactory = Callable[[], AbstractContextManager[Mapping[str, str]]]

ERR_START = ("target {target!r}: its service {service} failed to start: {error}. The target's cells cannot run "
             "without it; fix the service (or its environment) and rerun")
ERR_ENV = ("target {target!r}: its service {service} gave {value!r} where it must give a mapping of environment "
           "variable names to str values")
ERR_STOP = "resume-check: service {service} raised while stopping: {error}"
#: Why a start failed that did not end within its limit.
ERR_START_LIMIT = ("it did not start within {limit:g} s (its start_timeout attribute, or the target's hang limit); "
                   "{killed}")
WARN_LEFT = ("resume-check: service {service} left {n} process{es} running after it stopped ({what}); they were "
             "killed. A service must end what it starts (start it in a process group of its own and end the group)")
PROC = "/proc"


def service_name(factory: Any) -> str:
    """How a service is named in messages: its module and qualified name."""
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    return f"{module}.{name}" if module else name


@dataclass
class _Started:
    """A running service: its context manager, its environment, and what it started (by process group and
    session when they are its own, by pid when they stay in ours)."""

    factory: Any
    manager: Any
    env: dict[str, str]
    groups: set[int] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)


class Services:
    """The services started in this process, by factory; :meth:`close` stops them all."""

    def __init__(self) -> None:
        self._running: list[_Started] = []
        self._env: dict[Any, dict[str, str]] = {}
        self._failed: dict[Any, str] = {}
        self._lock = threading.Lock()

    def env_for(self, target: Target, limit: float | None = None) -> dict[str, str]:
        """The environment the runs of ``target`` get from its services, starting those not yet running
        (each within its ``start_timeout``, else ``limit`` seconds). Raises :class:`TargetError` if one
        failed to start (now or earlier in the session)."""
        env: dict[str, str] = {}
        with self._lock:
            for factory in target.services:
                if factory in self._failed:
                    raise TargetError(ERR_START.format(target=target.name, service=service_name(factory),
                                                       error=self._failed[factory]))
                if factory not in self._env:
                    self._env[factory] = self._start(target, factory, limit)
                env.update(self._env[factory])
        return env

    def _start(self, target: Target, factory: Any, limit: float | None) -> dict[str, str]:
        name = service_name(factory)
        limit = float(getattr(factory, "start_timeout", None) or limit or 0) or None
        before = set(_children())
        outcome: dict[str, Any] = {}

        def start() -> None:
            try:
                manager = factory()
                outcome["value"] = manager.__enter__()
                outcome["manager"] = manager
            except BaseException as exc:  # reported by the caller
                outcome["error"] = exc

        thread = threading.Thread(target=start, name=f"resume-check-service:{name}", daemon=True)
        thread.start()
        thread.join(limit)
        started = _Started(factory, outcome.get("manager"), {})
        _note_processes(started, set(_children()) - before)
        if thread.is_alive():
            killed = _end(started)
            self._failed[factory] = ERR_START_LIMIT.format(limit=limit, killed=f"the {killed} process"
                                                           f"{'es' if killed != 1 else ''} it had started were killed"
                                                           if killed else "it had started no process")
            raise TargetError(ERR_START.format(target=target.name, service=name, error=self._failed[factory]))
        if "error" in outcome:
            _end(started)
            self._failed[factory] = describe_error(outcome["error"])
            raise TargetError(ERR_START.format(target=target.name, service=name, error=self._failed[factory]))
        value = {} if outcome["value"] is None else outcome["value"]
        self._running.append(started)
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            self._failed[factory] = f"it gave {value!r}"
            raise TargetError(ERR_ENV.format(target=target.name, service=name, value=value))
        started.env = dict(value)
        return started.env

    @property
    def running(self) -> int:
        """How many services are running."""
        return len(self._running)

    def close(self) -> list[str]:
        """Stop every service, the last started first, and end what each left running; returns what went
        wrong, one line each, naming the service."""
        with self._lock:
            running, self._running = self._running, []
            self._env.clear()
            self._failed.clear()
        problems = []
        for started in reversed(running):
            name = service_name(started.factory)
            try:
                started.manager.__exit__(None, None, None)
            except Exception as exc:
                problems.append(ERR_STOP.format(service=name, error=describe_error(exc)))
            left = _alive(started)
            if left:
                what = ", ".join(f"{pid} {_title(pid)}" for pid in sorted(left)[:3])
                what += ", ..." if len(left) > 3 else ""
                _end(started)
                problems.append(WARN_LEFT.format(service=name, n=len(left), es="es" if len(left) != 1 else "",
                                                 what=what))
        return problems


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent, process group, session) of ``pid`` from ``/proc`` (None: gone or unreadable)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _processes() -> dict[int, tuple[str, int, int, int]]:
    if not os.path.isdir(PROC):
        return {}
    out = {}
    for name in os.listdir(PROC):
        if name.isdigit() and (info := _stat(int(name))) is not None and info[0] not in ("Z", "X"):
            out[int(name)] = info
    return out


def _children() -> list[int]:
    me = os.getpid()
    return [pid for pid, (_, parent, _, _) in _processes().items() if parent == me]


def _note_processes(started: _Started, children: set[int]) -> None:
    """Remember the process groups and sessions of what the service started (those that are not ours)."""
    mine = {os.getpgid(0), os.getsid(0)}
    for pid in children:
        info = _stat(pid)
        if info is None:
            continue
        own = {info[2], info[3]} - mine
        started.groups |= own
        if not own:
            started.pids.add(pid)


def _alive(started: _Started) -> set[int]:
    """What the service started that still runs: its groups and sessions, and the descendants of its
    children that stayed in ours."""
    processes = _processes()
    found = {pid for pid, (_, _, group, session) in processes.items()
             if group in started.groups or session in started.groups}
    found |= {pid for pid in started.pids if pid in processes}
    grew = True
    while grew:  # descendants of those, wherever they are
        more = {pid for pid, (_, parent, _, _) in processes.items() if parent in found} - found
        found |= more
        grew = bool(more)
    found.discard(os.getpid())
    return found


def _end(started: _Started, timeout: float = 10.0) -> int:
    """SIGKILL what the service started until none of it is left; how many there were."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _alive(started)
        if not left:
            break
        for pid in left:
            killed.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap(left)
        time.sleep(0.01)
    return len(killed)


def _reap(pids: set[int]) -> None:
    """Reap those of ``pids`` that are this process's children (else they stay zombies of ours)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _title(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:60]
    except OSError:
        return ""
