"""Child side of one run: builds the target, sends its events, obeys the plan.

This module is imported in every child process (and preloaded in the fork server); it imports
nothing heavy.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
import sys
import threading
import traceback
from typing import Any

from pytest_resume_check import events as ev
from pytest_resume_check.plan import RunPlan
from pytest_resume_check.run import Converged, RunContext
from pytest_resume_check.sweep import RUN_TOKEN_ENV
from pytest_resume_check.targets import load_target_fn

#: Exit code of a child whose target raised.
EXIT_TARGET_RAISED = 70


#: Events that are held back and sent with the next step boundary (one pipe write per step).
_BATCHED = frozenset({ev.CONSUMED, ev.TRAINED, ev.STATE, ev.LOG})


class ConnectionSink:
    """Writes events to the event channel. Reports inside a step are batched and written together at
    the step's end (or any checkpoint, pause, kill point, error or exit), so a SIGKILL loses only what
    the step did after its last boundary - work a kill undoes anyway.

    Safe from any thread (a trainer may publish its checkpoints from a background saver): one lock
    orders the events of all threads, so each thread's events arrive in the order it sent them and no
    two writes to the channel interleave."""

    def __init__(self, conn: Any):
        self._conn = conn
        self._pending: list[bytes] = []
        self._lock = threading.Lock()

    def send(self, event: ev.Event) -> None:
        raw = event.to_wire()
        with self._lock:
            self._pending.append(raw)
            if event.kind not in _BATCHED:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._conn.send_bytes(b"\n".join(self._pending))
            self._pending = []


def child_main(plan: RunPlan, conn: Any, control: Any = None) -> None:
    """Entry point of a child process (started by :mod:`pytest_resume_check.starter`)."""
    os.environ.update(plan.env)  # what the target's services tell its runs (e.g. where a shared server is)
    if plan.token:  # inherited by every process the run starts, so escaped ones are found later
        os.environ[RUN_TOKEN_ENV] = plan.token
    try:
        # Own process group, so one killpg also ends the loader workers this run forks.
        os.setpgid(0, 0)
    except OSError:
        pass
    # multiprocessing gives the child its parent's start method; a trainer started by hand would
    # see the platform default, so loader workers must not go through the fork server.
    multiprocessing.set_start_method(None, force=True)
    _redirect_output(plan.log_path)
    sink = ConnectionSink(conn)
    code = 0
    try:
        recorder = _recorder(plan, sink)
        fn = load_target_fn(plan.target_ref)
        run = RunContext(plan, sink, control, recorder)
        if recorder is not None:
            recorder.on_kill = run._await_kill
        fn(run)
        sink.send(ev.Event(ev.DONE))
    except Converged:
        sink.flush()
    except BaseException:  # report everything, SystemExit included: the parent decides what it means
        text = traceback.format_exc()
        try:  # the pipe first: on a full disk the log write below fails, the pipe does not
            sink.send(ev.Event(ev.ERROR, text=text))
        except OSError:
            pass
        _write_quietly(sys.stderr, text)
        code = EXIT_TARGET_RAISED
    _write_quietly(sys.stdout, "")
    _write_quietly(sys.stderr, "")
    # Skip interpreter teardown: atexit handlers of a half-built trainer must not block the exit.
    os._exit(code)


def _write_quietly(stream: Any, text: str) -> None:
    """Write and flush, ignoring a log that cannot take it (a full disk)."""
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass


def _recorder(plan: RunPlan, sink: ConnectionSink) -> Any:
    """The file-operation recorder of a run with a fault plan (None otherwise)."""
    if plan.faults is None:
        return None
    from pytest_resume_check.recorder import Recorder

    if importlib.util.find_spec("torch") is not None:
        importlib.import_module("torch")  # so torch.save to a path is wrapped too

    def report(op: Any) -> None:
        sink.send(ev.Event(ev.FILE_OP, path=op.path, text=op.kind,
                           extra={"index": op.index, "target": op.target}))

    recorder = Recorder(plan.faults, plan.checkpoint_dir, report, lambda why, extra: None)
    recorder.install()
    return recorder


def _redirect_output(log_path: str) -> None:
    """Send the child's stdout and stderr (also of C code and loader workers) to its log file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
