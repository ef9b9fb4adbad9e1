"""Parent side of one run: start the child, read its events, kill it when the plan says, enforce the
hang limit. A run ends in one of the outcomes below; no process of the run outlives this call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.connection import wait

from pytest_resume_check import events as ev
from pytest_resume_check import starter
from pytest_resume_check.plan import RunPlan
from pytest_resume_check.results import (
    CONVERGED,
    CRASHED,
    DEFAULT_HANG_TIMEOUT,
    DONE,
    HUNG,
    KILLED,
    RAISED,
    RunRecord,
)
from pytest_resume_check.sweep import sweep


def supervise(plan: RunPlan, *, isolation: str, hang_timeout: float = DEFAULT_HANG_TIMEOUT,
              on_pause: Callable[[int], None] | None = None) -> RunRecord:
    """Run ``plan`` in a child process and record what happened. ``on_pause(step)`` is called while
    the child waits at one of ``plan.pause_steps`` (to copy its checkpoint directory)."""
    record = RunRecord(plan, hang_timeout=hang_timeout, isolation=isolation)
    started = time.monotonic()
    child = starter.start(plan, isolation)
    record.pid = child.pid
    interrupted = True
    try:
        _read_events(child, record, hang_timeout, on_pause, started)
        interrupted = False
    finally:
        # Interrupted (Ctrl-C, an error in the parent): kill at once, never wait for a paused child.
        if interrupted or record.outcome in (KILLED, HUNG):
            child.kill()
            record.exitcode = child.process.exitcode
        else:
            record.exitcode = child.reap()
        server = starter.server_pid() if isolation == starter.ISOLATION_FORKSERVER else None
        record.leftovers = sweep(plan.token, server)
        record.seconds = time.monotonic() - started
    if record.outcome == CRASHED and record.exitcode == 0 and not record.events:
        record.error = "the child exited without sending any event"
    return record


#: Seconds between checks that a silent child still lives.
LIVENESS_POLL = 0.5


def _read_events(child: starter.Child, record: RunRecord, hang_timeout: float,
                 on_pause: Callable[[int], None] | None, started: float) -> None:
    sentinel = child.process.sentinel
    last_event = time.monotonic()
    while True:
        # Short waits: a process the run detached may hold the channel and the sentinel open after
        # the child died (spawn hands the sentinel down), so whether it lives is also asked directly.
        ready = wait([child.conn, sentinel], timeout=LIVENESS_POLL)
        if not ready:
            if child.process.exitcode is not None:
                ready = [sentinel]
            elif hang_timeout and time.monotonic() - last_event > hang_timeout:
                record.outcome = HUNG
                record.error = f"no event for {hang_timeout:g} s (hang limit) after step {record.last_step}"
                return
            else:
                continue
        if child.conn in ready:
            last_event = time.monotonic()
            try:
                raw = child.conn.recv_bytes()
            except (EOFError, OSError):
                _finish(record)
                return
            if record.first_event_seconds is None:
                record.first_event_seconds = time.monotonic() - started
            for event in _decode(raw):
                record.events.append(event)
                if event.kind == ev.PAUSED:
                    if on_pause is not None:
                        on_pause(event.step or 0)
                    child.resume()
                elif event.kind == ev.KILL_READY:
                    record.outcome = KILLED
                    return
                elif event.kind in (ev.DONE, ev.ERROR, ev.CONVERGED):
                    _finish(record)
                    return
        elif sentinel in ready:
            # The child is gone; its loader workers may still hold the channel open. Drain what
            # was written before the exit, then decide.
            while child.conn.poll(0):
                try:
                    record.events.extend(_decode(child.conn.recv_bytes()))
                except (EOFError, OSError):
                    break
            _finish(record)
            return


def _decode(raw: bytes) -> list[ev.Event]:
    """One channel message holds one or more events, one JSON object a line."""
    return [ev.Event.from_wire(line) for line in raw.split(b"\n") if line]


def _finish(record: RunRecord) -> None:
    kinds = [e.kind for e in record.events]
    if ev.ERROR in kinds:
        record.outcome = RAISED
        record.error = next(e.text for e in record.events if e.kind == ev.ERROR)
    elif ev.DONE in kinds:
        record.outcome = DONE
    elif ev.CONVERGED in kinds:
        record.outcome = CONVERGED
    else:
        record.outcome = CRASHED
