"""How child processes start.

``forkserver`` (the default): children fork from a server process that imported the targets'
``preload`` modules once, so a run does not pay for importing torch or verl again. ``spawn``: a fresh
interpreter per run, for trainers that are not fork-safe.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from pytest_resume_check._server_setup import WARMUP_ENV
from pytest_resume_check.child import child_main
from pytest_resume_check.plan import RunPlan
from pytest_resume_check.targets import ISOLATION_FORKSERVER, ISOLATIONS

_CHILD_MODULES = ("pytest_resume_check.child",)
_preload: list[str] = list(_CHILD_MODULES)
_server_started: tuple[str, ...] = ()  # the preload the running fork server was started with


_warmups: list[str] = []


def add_preload(entries: Any) -> None:
    """Ask the fork server to import these modules (``pkg.mod``) or to call these warm-up functions
    (``pkg.mod:function``) once. Effective only before its first child starts; later additions are
    imported by each child instead (slower, still correct)."""
    for entry in entries:
        target = _warmups if ":" in entry else _preload
        if entry not in target:
            target.append(entry)


@dataclass
class Child:
    """A started child: its process, the read end of its event channel."""

    process: Any
    conn: multiprocessing.connection.Connection
    control: multiprocessing.connection.Connection | None = None

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
        self.process.join(timeout=30)
        wait_group_gone(self.pid)

    def reap(self, timeout: float = 30) -> int | None:
        """Wait for exit, kill what is left of its group, return the exit code."""
        self.process.join(timeout=timeout)
        if self.process.exitcode is None:
            kill_group(self.pid)
            self.process.join(timeout=30)
        else:
            kill_group(self.pid, only_group=True)
        wait_group_gone(self.pid)
        self.conn.close()
        if self.control is not None:
            self.control.close()
        return self.process.exitcode


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
    wanted = (*_preload, *_warmups)
    if _server_started == wanted:
        return
    if _server_started:
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stop is None:  # cannot restart on this Python: children import the rest themselves
            return
        stop()
    ctx.set_forkserver_preload(["pytest_resume_check._preload_begin", *_preload, "pytest_resume_check._preload_end"])
    # The warm-up list reaches the server through its environment, set only while it starts: a later
    # subprocess of this process (a test's interpreter, a user's script) must not inherit it.
    saved = os.environ.get(WARMUP_ENV)
    os.environ[WARMUP_ENV] = ",".join(_warmups)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop(WARMUP_ENV, None)
        else:
            os.environ[WARMUP_ENV] = saved
    _server_started = wanted


def start(plan: RunPlan, isolation: str = ISOLATION_FORKSERVER) -> Child:
    """Start one child running ``plan``."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {list(ISOLATIONS)}, not {isolation!r}")
    ctx = multiprocessing.get_context(isolation)
    if isolation == ISOLATION_FORKSERVER:
        _ensure_server(ctx)
    reader, writer = ctx.Pipe(duplex=False)
    control_reader, control_writer = ctx.Pipe(duplex=False) if plan.pause_steps else (None, None)
    process = ctx.Process(target=child_main, args=(plan, writer, control_reader),
                          name=f"resume-check:{plan.target_name}")
    process.start()
    writer.close()  # the child holds the only write end: EOF means it (and its workers) are gone
    if control_reader is not None:
        control_reader.close()
    return Child(process, reader, control_writer)
