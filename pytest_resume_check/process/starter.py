"""How child processes start.

``forkserver`` (the default): children fork from a server process that imported the targets'
``preload`` modules once, so a run does not pay for importing torch or verl again. ``spawn``: a fresh
interpreter per run, for trainers that are not fork-safe.

A preload module that fails to import costs only the targets that name it: :func:`check_preload`
raises a :class:`~.targets.TargetError` naming the module and its exception for those, and the
server goes on serving the others (issue 13). So does a warm-up that leaves threads running in the
server (forked runs would hang); a warm-up that raises costs only speed and is a warning, once.

Without being asked (a target's ``auto_preload``, issue 29), the server also imports the modules that
declare the targets and, when torch is then imported, pays its first-use costs once. What it cannot do
so costs no error: a module that fails is left to the children (as before), and a server made unsafe by
it is started again without it; :func:`auto_preload_notes` says why.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.spawn
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pytest_resume_check.child.main import child_main
from pytest_resume_check.process import _server_setup
from pytest_resume_check.process._server_setup import WARMUP_ENV
from pytest_resume_check.process.sweep import environment
from pytest_resume_check.records.names import ISOLATION_FORKSERVER, ISOLATIONS, OPT_ISOLATION, RUN_TOKEN_ENV
from pytest_resume_check.records.plan import SIGNAL_TERM, RunPlan
from pytest_resume_check.targets import TargetError

_CHILD_MODULES = ("pytest_resume_check.child.main",)
_preload: list[str] = list(_CHILD_MODULES)
_server_started: tuple[Any, ...] = ()  # the preload the running fork server was started with
#: Preload modules that failed to import in the fork server: module -> what happened.
_failed: dict[str, str] = {}
#: Of those, modules whose import killed the server outright; they stay out of its preload list.
_fatal: dict[str, str] = {}
#: Warm-ups that raised in the fork server (spec -> error), and those that left threads running in it
#: (spec -> how many); see :mod:`._server_setup`.
_warmup_failed: dict[str, str] = {}
_warmup_threads: dict[str, int] = {}
#: Warm-up failures already warned about in this process (one warning each per session).
_warned: set[str] = set()
#: The modules that declare the targets (``auto_preload``): (module name, file), in the order asked for.
_auto: list[tuple[str, str]] = []
#: What ``auto_preload`` could not do in the server: module (or torch's warm-up) -> why.
_auto_failed: dict[str, str] = {}
#: Why ``auto_preload`` is off for the rest of this process's session (None: it is on): what it did made
#: the server unsafe to fork from, or the server died with it.
_auto_off: str | None = None
AUTO_DIED = "the fork server died while importing the modules that declare the targets"

ERR_PRELOAD = ("target {target!r}: preload module {module!r} failed to import in the fork server: {error}; fix the "
               "module, or remove it from the target's preload=")
ERR_SERVER_DIED = ("the fork server died while importing the preload modules {modules} or calling the warm-ups "
                   "{warmups}, and no module fails when imported alone; run with " + OPT_ISOLATION + "=spawn "
                   "to do without the fork server")
ERR_WARMUP_THREADS = ("target {target!r}: the warm-up {spec!r} left {n} more thread{s} running in the fork server; "
                      "a run forked from it inherits their locks but not the threads, and hangs (torch's thread pool "
                      "does). Make the warm-up start no thread (no loader workers or thread pools; torch runs it with "
                      "one intra-op thread already), or remove it from the target's preload=")
WARN_WARMUP = ("resume-check: target {target!r}: the warm-up {spec!r} failed in the fork server: {error}. Its runs "
               "still work, but each pays what the warm-up would have paid (often several times slower). {fix}")
FIX_WARMUP_IMPORT = ("The fork server imports with this session's sys.path: put the folder that holds {module!r} on it "
                     "(pytest's pythonpath ini option, or a conftest.py beside the module), or name the module by "
                     "its importable dotted path")
FIX_WARMUP_RAISED = "Fix the warm-up (it is called with no arguments), or remove it from the target's preload="


class ResumeCheckWarning(UserWarning):
    """Something that makes a matrix slower or less thorough without making it wrong."""


#: Imports one module in a fresh interpreter with the starter's sys.path: ``-c _IMPORT_ALONE path module``.
#: Ends with 0 also when the import raises (the server survives that): only a dying interpreter fails.
_IMPORT_ALONE = ("import importlib, json, sys\nsys.path[:] = json.loads(sys.argv[1])\n"
                 "try:\n    importlib.import_module(sys.argv[2])\nexcept (Exception, SystemExit):\n    pass\n")


_warmups: list[str] = []


def add_auto(module: str, file: str) -> None:
    """Ask the fork server to import ``module`` (from ``file``) as a child would find its target there, and
    to pay torch's first-use costs if torch is then imported (``auto_preload``)."""
    if (module, file) not in _auto:
        _auto.append((module, file))


def _auto_work() -> tuple[list[tuple[str, str]], bool]:
    """The declaring modules the server imports, and whether it warms torch up (nothing once it is off)."""
    if _auto_off is not None or not _auto:
        return [], False
    return list(_auto), True


def auto_preload_notes() -> list[str]:
    """What ``auto_preload`` could not do in this process's fork server, one line each (the runs of those
    targets import their modules themselves, as before)."""
    notes = [f"{module}: {why}" for module, why in _auto_failed.items()]
    return notes + ([_auto_off] if _auto_off else [])


def add_preload(entries: Any) -> None:
    """Ask the fork server to import these modules (``pkg.mod``) or to call these warm-up functions
    (``pkg.mod:function``) once. Effective only before its first child starts; later additions are
    imported by each child instead (slower, still correct)."""
    for entry in entries:
        target = _warmups if ":" in entry else _preload
        if entry not in target:
            target.append(entry)


@dataclass(frozen=True)
class ServerEnd:
    """How the fork server ended, as the kernel tells its parent: the signal that killed it, or its exit
    status (both None when that is no longer known)."""

    pid: int
    signal: int | None = None
    status: int | None = None

    @property
    def signal_name(self) -> str | None:
        """The killing signal's name (``SIGKILL``), None when no signal killed it."""
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"


class ForkServerDied(Exception):
    """The fork server a run was started from died under it: the harness's own failure, never the run's
    (:mod:`pytest_resume_check.judge.harness_errors` makes it the cell's ``HARNESS`` line)."""

    def __init__(self, end: ServerEnd):
        super().__init__(f"the fork server (pid {end.pid}) died: "
                         + (f"killed by {end.signal_name}" if end.signal_name else f"exit status {end.status}"))
        self.end = end


def server_end(pid: int) -> ServerEnd | None:
    """How the fork server ``pid`` (a child of this process) ended, None while it runs. Asked with
    ``WNOWAIT``, so it stays a zombie for multiprocessing to reap when it starts the next one."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already (or not ours): dead, how is not known
        return None if _alive(pid) else ServerEnd(pid)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return ServerEnd(pid, signal=info.si_status)
    return ServerEnd(pid, status=info.si_status)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts: only a signal's answer is asked)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@dataclass
class Child:
    """A started child: its process, the read end of its event channel, and the fork server it was forked
    from (None when it was spawned)."""

    process: Any
    conn: multiprocessing.connection.Connection
    control: multiprocessing.connection.Connection | None = None
    server: int | None = None

    def server_died(self) -> ServerEnd | None:
        """How the fork server this child was forked from ended, if it did (an exit status of 255 is then
        multiprocessing's way of saying it lost the server, not the child's)."""
        return server_end(self.server) if self.server is not None else None

    def resume(self) -> None:
        """Let a child paused at a snapshot point go on."""
        if self.control is not None:
            self.control.send_bytes(b"go")

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the child's process group (loader workers included), then the child itself."""
        kill_group(self.pid)
        self.wait_exit(30)
        wait_group_gone(self.pid)

    def reap(self, timeout: float = 30) -> int | None:
        """Wait for exit, kill what is left of its group, return the exit code."""
        self.wait_exit(timeout)
        if self.process.exitcode is None:
            kill_group(self.pid)
            self.wait_exit(30)
        else:
            kill_group(self.pid, only_group=True)
        wait_group_gone(self.pid)
        self.conn.close()
        if self.control is not None:
            self.control.close()
        return self.process.exitcode


    def wait_exit(self, timeout: float) -> None:
        """Wait until the child has exited. Polls its exit status rather than joining: a process it
        detached may hold the sentinel pipe (spawn hands it down), and a join would wait for that."""
        deadline = time.monotonic() + timeout
        while self.process.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.002)


def kill_group(pid: int, only_group: bool = False) -> None:
    """SIGKILL process group ``pid``; fall back to the process if the group does not exist yet."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not only_group:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


#: Seconds a stopped process group gets to come to rest (a thread in the middle of a disk write stops when
#: the write returns); generous, it only bounds a wait that normally takes a millisecond.
FREEZE_TIMEOUT = 30.0


@contextlib.contextmanager
def frozen(pgid: int) -> Iterator[None]:
    """Every process of group ``pgid`` stopped (SIGSTOP) while the block runs, then continued: what is on
    disk then is exactly what a SIGKILL at that moment would leave, whatever threads and ranks of the run
    were still writing (issue 26)."""
    from pytest_resume_check.process.sweep import group_not_stopped

    try:
        os.killpg(pgid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        yield
        return
    try:
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while group_not_stopped(pgid) and time.monotonic() < deadline:
            time.sleep(0.001)
        yield
    finally:
        try:
            os.killpg(pgid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass


def wait_group_gone(pgid: int, timeout: float = 10.0) -> bool:
    """Wait until no process of group ``pgid`` is left (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.005)
    return False


def _ensure_server(ctx: Any) -> None:
    """Start the fork server with every preload asked for so far; restart it when a later target
    asked for more (a session that ran one target and then another would otherwise pay the second
    target's imports in every child)."""
    global _server_started
    auto, warm_torch = _auto_work()
    wanted = (*_preload, *_warmups, *auto, warm_torch)
    if _server_started == wanted and _server_alive():
        return
    if _server_started and not _server_alive():
        _server_started = ()  # it died (something killed it): ensure_running below reaps and restarts it
    if _server_started:
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stop is None:  # cannot restart on this Python: children import the rest themselves
            return
        stop()
    # The server imports the targets' modules itself (multiprocessing's preload would die of the first
    # one that raises); they, the warm-ups and this sys.path reach it through its environment, set only
    # while it starts: a later subprocess of this process (a test's interpreter, a user's script) must
    # not inherit it.
    ctx.set_forkserver_preload(["pytest_resume_check.process._preload_begin",
                                "pytest_resume_check.process._preload_end"])
    modules = [m for m in _preload if m not in _fatal]
    work = {"import": modules, "call": _warmups, "path": _sys_path(), "auto": auto, "warm_torch": warm_torch}
    with environment(WARMUP_ENV, json.dumps(work)):
        multiprocessing.forkserver.ensure_running()
    _server_started = wanted
    _learn_failures(ctx, modules, bool(auto))


def _server_alive() -> bool:
    """Whether the fork server this process started still runs (a dead one is a zombie until reaped)."""
    pid = _forkserver_pid()
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return _alive(pid)


def _sys_path() -> list[str]:
    """This process's sys.path as its children get it (the empty entry made absolute)."""
    return list(multiprocessing.spawn.get_preparation_data("ignore")["sys_path"])


def _learn_failures(ctx: Any, modules: list[str], auto: bool = False) -> None:
    """Ask the new server (through a child forked from it, which starts once the imports are done)
    which modules failed to import. If the server died instead (a module exited or crashed the
    interpreter), import each module alone to find which, and start the server again without it.
    ``auto``: the server imported the modules that declare the targets; when that made it unsafe, or it
    died, it is started again without them (before any explicit module is suspected)."""
    global _failed, _server_started, _auto_off
    reader, writer = ctx.Pipe(duplex=False)
    probe = ctx.Process(target=_server_setup.send_failures, args=(writer,), name="resume-check:preload-check")
    try:
        probe.start()
        writer.close()
        failed = reader.recv()
        probe.join()
    except (EOFError, OSError):  # the server is gone
        failed = None
    finally:
        reader.close()
    if failed is not None:
        _failed = {**_fatal, **failed["import"]}
        _warmup_failed.update(failed["warmup"])
        _warmup_threads.update(failed["threads"])
        _auto_failed.update(failed["auto"])
        if failed["unsafe"] and _auto_off is None:
            _auto_off = "; ".join(failed["unsafe"])
            _ensure_server(ctx)  # it serves no child: started again without what made it unsafe
        return
    if auto and _auto_off is None:
        _auto_off = AUTO_DIED
        _restart(ctx)
        return
    fatal = {m: error for m in modules if (error := _import_alone(m))}
    if not fatal:
        raise RuntimeError(ERR_SERVER_DIED.format(modules=", ".join(modules), warmups=", ".join(_warmups) or "(none)"))
    _fatal.update(fatal)
    _restart(ctx)


def _restart(ctx: Any) -> None:
    """Start the server again after it died, with what is asked for now."""
    global _server_started
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:  # reap the dead server (else the next start finds it soon enough)
        stop()
    _server_started = ()
    _ensure_server(ctx)


def _import_alone(module: str) -> str | None:
    """How importing ``module`` in a fresh interpreter kills it, if it does."""
    env = {k: v for k, v in os.environ.items() if k != WARMUP_ENV}
    code = subprocess.run([sys.executable, "-c", _IMPORT_ALONE, json.dumps(_sys_path()), module],
                          capture_output=True, env=env).returncode
    if code == 0:
        return None
    if code < 0:
        return f"importing it killed the interpreter ({signal.strsignal(-code) or f'signal {-code}'})"
    return f"importing it ended the interpreter with exit code {code}"


def check_preload(target: str, entries: Any, isolation: str, declared_in: tuple[str, str] | None = None) -> None:
    """Add ``entries`` (the preload of ``target``) to the fork server's, and raise
    :class:`~.targets.TargetError` if the server failed to import one of them (starting the server
    first if it is not running with them). ``declared_in``: (module, file) that declares the target, for
    ``auto_preload`` (what the server cannot do with it raises nothing)."""
    add_preload(entries)
    if declared_in is not None:
        add_auto(*declared_in)
    if isolation != ISOLATION_FORKSERVER:
        return
    _ensure_server(multiprocessing.get_context(isolation))
    for entry in entries:
        if entry in _failed:
            raise TargetError(ERR_PRELOAD.format(target=target, module=entry, error=_failed[entry]))
        if entry in _warmup_threads:
            n = _warmup_threads[entry]
            raise TargetError(ERR_WARMUP_THREADS.format(target=target, spec=entry, n=n, s="" if n == 1 else "s"))
        if entry in _warmup_failed and entry not in _warned:
            _warned.add(entry)
            warnings.warn(warmup_warning(target, entry, _warmup_failed[entry]), ResumeCheckWarning, stacklevel=2)


def warmup_warning(target: str, spec: str, error: str) -> str:
    """The warning for a warm-up that raised: what it raised and what to do about it."""
    module = spec.partition(":")[0]
    missing = error.startswith("ModuleNotFoundError") and repr(module.split(".")[0]) in error
    fix = FIX_WARMUP_IMPORT.format(module=module) if missing else FIX_WARMUP_RAISED
    return WARN_WARMUP.format(target=target, spec=spec, error=error, fix=fix)


def start(plan: RunPlan, isolation: str = ISOLATION_FORKSERVER) -> Child:
    """Start one child running ``plan``."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {list(ISOLATIONS)}, not {isolation!r}")
    ctx = _context(isolation)
    server = None
    if isolation == ISOLATION_FORKSERVER:
        _ensure_server(ctx)
        server = _forkserver_pid()
    reader, writer = ctx.Pipe(duplex=False)
    # Rank 0 waits on it at a snapshot's checkpoint, for SIGTERM's grace, and where a lost node rejoins.
    wants_control = plan.pause_steps or (plan.kill is not None and (plan.kill.signal == SIGNAL_TERM
                                                                    or plan.kill.rejoin is not None))
    control_reader, control_writer = ctx.Pipe(duplex=False) if wants_control else (None, None)
    process = ctx.Process(target=child_main, args=(plan, writer, control_reader),
                          name=f"resume-check:{plan.target_name}")
    if isolation == ISOLATION_FORKSERVER:
        try:
            process.start()
        except (OSError, EOFError) as exc:  # the server died between the check above and the fork
            end = server_end(server) if server is not None else None
            if end is not None:
                raise ForkServerDied(end) from exc
            raise
    else:  # a spawned interpreter is exec'd with the token, so its forked descendants show it too
        # The resource tracker first, without the token: started inside, it would carry this run's token,
        # the sweep after the run would kill it, and every later spawn warned "resource_tracker: process died
        # unexpectedly ... might leak" (issue 26).
        multiprocessing.resource_tracker.ensure_running()
        with environment(RUN_TOKEN_ENV, plan.token):
            process.start()
    writer.close()  # the child holds the only write end: EOF means it (and its workers) are gone
    if control_reader is not None:
        control_reader.close()
    return Child(process, reader, control_writer, server)


def _context(isolation: str) -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """The multiprocessing context of ``isolation``, one of :data:`ISOLATIONS` (the literal names pick
    typeshed's typed overloads)."""
    if isolation == ISOLATION_FORKSERVER:
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def server_pid() -> int | None:
    """The running fork server's pid (it adopts orphans of the runs it forked), if there is one."""
    return _forkserver_pid() if _server_started else None


def _forkserver_pid() -> int | None:
    """The pid multiprocessing keeps for its fork server (None before it starts)."""
    # A private attribute of CPython's ForkServer, which typeshed does not declare.
    return multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


def stop_server() -> None:
    """End of a session: stop the fork server (and the resource tracker) this process started."""
    global _server_started
    if _server_started:
        from pytest_resume_check.process.sweep import stop_servers

        stop_servers()
        _server_started = ()
