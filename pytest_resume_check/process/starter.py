"""How child processes start.

``forkserver`` (the default): children fork from the engine's :class:`~.fork_server.ForkServer`, a server
process that imported the targets' ``preload`` modules once, so a run does not pay for importing torch or
verl again. ``spawn``: a fresh interpreter per run, for trainers that are not fork-safe. Also killing and
stopping (freezing) a run's process group.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.resource_tracker
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pytest_resume_check.child.main import child_main
from pytest_resume_check.process.fork_server import ForkServer, ForkServerDied, ServerEnd, check_main, server_end
from pytest_resume_check.process.sweep import environment, name_process, run_name
from pytest_resume_check.records.names import ISOLATION_FORKSERVER, ISOLATIONS, RUN_TOKEN_ENV
from pytest_resume_check.records.plan import SIGNAL_TERM, RunPlan


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


#: :func:`start` was asked to fork a run with no :class:`~.fork_server.ForkServer` to fork it from.
ERR_NO_SERVER = "a run started with isolation='forkserver' needs the ForkServer it is forked from"


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
    were still writing."""
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


def start(plan: RunPlan, isolation: str = ISOLATION_FORKSERVER, fork_server: ForkServer | None = None) -> Child:
    """Start one child running ``plan``, forked from ``fork_server`` (started first if it does not run with
    everything asked of it) or spawned."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {list(ISOLATIONS)}, not {isolation!r}")
    ctx = _context(isolation)
    server = None
    if isolation == ISOLATION_FORKSERVER:
        if fork_server is None:
            raise ValueError(ERR_NO_SERVER)
        server = fork_server.ensure()
    else:
        check_main()
    reader, writer = ctx.Pipe(duplex=False)
    # Rank 0 waits on it at a snapshot's checkpoint, for SIGTERM's grace, and where a lost node rejoins.
    wants_control = plan.pause_steps or (plan.kill is not None and (plan.kill.signal == SIGNAL_TERM
                                                                    or plan.kill.rejoin is not None))
    control_reader, control_writer = ctx.Pipe(duplex=False) if wants_control else (None, None)
    if fork_server is not None and isolation == ISOLATION_FORKSERVER and fork_server.shared:
        # A shared server was started with another session's environment: the run gets this one's.
        process = ctx.Process(target=child_in, args=(dict(os.environ), plan, writer, control_reader),
                              name=f"resume-check:{plan.target_name}")
    else:
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
        # unexpectedly ... might leak".
        multiprocessing.resource_tracker.ensure_running()
        with environment(RUN_TOKEN_ENV, plan.token):
            process.start()
    writer.close()  # the child holds the only write end: EOF means it (and its workers) are gone
    if control_reader is not None:
        control_reader.close()
    return Child(process, reader, control_writer, server)


def child_in(environ: dict[str, str], plan: RunPlan, conn: Any, control: Any = None) -> None:
    """Entry point of a run forked from a shared fork server: the environment of the session that started the
    run (the server has the one of the session that started it) and the process name every process it forks
    inherits (:func:`~.sweep.run_name`), then :func:`~.child.main.child_main`."""
    for name in [name for name in os.environ if name not in environ]:
        del os.environ[name]
    os.environ.update(environ)
    # The server's other children may be other sessions' runs: what this run detaches is found by its name.
    name_process(run_name(plan.token))
    child_main(plan, conn, control)


def _context(isolation: str) -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """The multiprocessing context of ``isolation``, one of :data:`ISOLATIONS` (the literal names pick
    typeshed's typed overloads)."""
    if isolation == ISOLATION_FORKSERVER:
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")
