"""Services a target's runs share: something started once per session (a Ray head, a database) instead
of once per run.

A target declares ``services=(factory, ...)``: each factory is called with no arguments in the process
that runs the cells (the pytest process, or each xdist worker) and returns a context manager. Entering it
starts the service and gives a mapping of environment variables; every run of the target gets them in
its environment (a command target's program too), which is how a run finds the service. A service is
started on the first run of a target that names it and stopped, in reverse order, when the session ends,
after Ctrl-C too. A factory that raises is not retried: every cell of its targets fails with one line
that names it.

A start has a limit (a service that hung while starting hung the whole session): the factory's
own ``start_timeout`` attribute (seconds), else the target's hang limit. Each service lives in a thread of
its own, which enters its context manager, waits, and exits it (so the limit can be kept, and a start and
its stop share a thread; ``signal.signal`` cannot be called there); a start past its limit fails its
targets' cells with one line and the processes it had started are killed. What a service starts is
tracked by process group and session, by (pid, start time) for children that stay in ours, and by a token
in the environment of what it execs: whatever of it is still running after it stopped (or after a stop
that did not end within :data:`STOP_TIMEOUT`) is killed and named in a warning, and a stop that raises is
reported with the service's name.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from pytest_resume_check.process import sweep
from pytest_resume_check.records.declaration import describe_error
from pytest_resume_check.targets import Target, TargetError

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


#: In the environment of what a service's start execs (while it starts): finds its daemons however they
#: detach (a double fork and setsid leaves no process group or parent to go by).
SERVICE_TOKEN_ENV = "PYTEST_RESUME_CHECK_SERVICE"
#: Seconds a service gets to stop before what it started is killed and the stop is reported.
STOP_TIMEOUT = 120.0


class _Service:
    """One running service: a thread of its own enters its context manager, waits, and exits it, so a
    start and its stop run on the same thread (thread-bound resources: connections, event loops). What it
    started is remembered by process group and session when they are its own, by (pid, start time) when
    they stay in ours, and by the token in their environment."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory
        self.name = service_name(factory)
        self.token = uuid.uuid4().hex
        self.env: dict[str, str] = {}
        self.value: Any = None
        self.error: BaseException | None = None
        self.stop_error: BaseException | None = None
        self.groups: set[int] = set()
        self.pids: set[tuple[int, int]] = set()
        self._started = threading.Event()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._entered = False
        self._thread = threading.Thread(target=self._serve, name=f"resume-check-service:{self.name}", daemon=True)

    def start(self, limit: float | None) -> bool:
        """Start it; False if it did not within ``limit`` seconds (it goes on trying, unwatched)."""
        before = set(_children())
        with sweep.environment(SERVICE_TOKEN_ENV, self.token):  # what the start execs carries it
            self._thread.start()
            in_time = self._started.wait(limit)
        self._note(set(_children()) - before)
        return in_time

    def _serve(self) -> None:
        try:
            manager = self.factory()
            self.value = manager.__enter__()
            self._entered = True
        except BaseException as exc:  # reported by the caller
            self.error = exc
            self._started.set()
            self._stopped.set()
            return
        self._started.set()
        self._stop.wait()
        try:
            manager.__exit__(None, None, None)
        except BaseException as exc:
            self.stop_error = exc
        finally:
            self._stopped.set()

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Ask its thread to stop it (a start still under way exits once it is done); False if that did not
        end within ``timeout`` seconds."""
        self._stop.set()
        return self._stopped.wait(timeout if self._started.is_set() else 0.5)

    def _note(self, children: set[int]) -> None:
        mine = {os.getpgid(0), os.getsid(0)}
        for pid in children:
            info = _stat(pid)
            if info is None:
                continue
            own = {info[2], info[3]} - mine
            self.groups |= own
            if not own:
                self.pids.add((pid, info[4]))

    def alive(self) -> set[int]:
        """What it started that still runs: its groups and sessions, its children that stayed in ours (if
        still the same processes), what carries its token, and their descendants."""
        processes = _processes()
        found = {pid for pid, (_, _, group, session, _) in processes.items()
                 if group in self.groups or session in self.groups}
        found |= {pid for pid, started in self.pids if pid in processes and processes[pid][4] == started}
        found |= set(sweep.escaped(self.token, variable=SERVICE_TOKEN_ENV))
        grew = True
        while grew:  # descendants of those, wherever they are
            more = {pid for pid, (_, parent, _, _, _) in processes.items() if parent in found} - found
            found |= more
            grew = bool(more)
        found.discard(os.getpid())
        return found

    def end(self, timeout: float = 10.0) -> int:
        """SIGKILL what it started until none of it is left; how many there were."""
        return sweep.kill_until_gone(self.alive, timeout, reap=True)


class Services:
    """The services started in this process, by factory; :meth:`close` stops them all."""

    def __init__(self) -> None:
        self._running: list[_Service] = []
        #: Starts that did not end within their limit: stopped (if they ever start) and cleaned up at close.
        self._abandoned: list[_Service] = []
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
        service = _Service(factory)
        limit = float(getattr(factory, "start_timeout", None) or limit or 0) or None
        if not service.start(limit):
            self._abandoned.append(service)
            killed = service.end()
            self._failed[factory] = ERR_START_LIMIT.format(limit=limit, killed=f"the {killed} process"
                                                           f"{'es' if killed != 1 else ''} it had started were killed"
                                                           if killed else "it had started no process")
            raise TargetError(ERR_START.format(target=target.name, service=service.name, error=self._failed[factory]))
        if service.error is not None:
            service.end()
            self._failed[factory] = describe_error(service.error)
            raise TargetError(ERR_START.format(target=target.name, service=service.name, error=self._failed[factory]))
        self._running.append(service)
        value = {} if service.value is None else service.value
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            self._failed[factory] = f"it gave {value!r}"
            raise TargetError(ERR_ENV.format(target=target.name, service=service.name, value=value))
        service.env = dict(value)
        return service.env

    @property
    def running(self) -> int:
        """How many services are running."""
        return len(self._running)

    def close(self) -> list[str]:
        """Stop every service, the last started first (then the starts that ran out of time), and end what
        each left running; returns what went wrong, one line each, naming the service."""
        with self._lock:
            services, self._running, self._abandoned = [*reversed(self._running), *self._abandoned], [], []
            self._env.clear()
            self._failed.clear()
        problems = []
        for service in services:
            if not service.stop():
                problems.append(ERR_STOP.format(service=service.name, error=f"it did not stop within {STOP_TIMEOUT:g} s"
                                                if service._started.is_set() else "its start never ended"))
            elif service.stop_error is not None:
                problems.append(ERR_STOP.format(service=service.name, error=describe_error(service.stop_error)))
            left = service.alive()
            if left:
                what = ", ".join(f"{pid} {_title(pid)}" for pid in sorted(left)[:3])
                what += ", ..." if len(left) > 3 else ""
                service.end()
                problems.append(WARN_LEFT.format(service=service.name, n=len(left), es="es" if len(left) != 1 else "",
                                                 what=what))
        return problems


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, parent, process group, session, start time) of ``pid`` from ``/proc`` (None: gone)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _processes() -> dict[int, tuple[str, int, int, int, int]]:
    if not os.path.isdir(PROC):
        return {}
    out = {}
    for name in os.listdir(PROC):
        if name.isdigit() and (info := _stat(int(name))) is not None and info[0] not in ("Z", "X"):
            out[int(name)] = info
    return out


def _children() -> list[int]:
    me = os.getpid()
    return [pid for pid, info in _processes().items() if info[1] == me]


def _title(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:60]
    except OSError:
        return ""
