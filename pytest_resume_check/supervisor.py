"""Parent side of one run: start the child, read its events, kill it when the plan says, enforce the
hang limit. A run ends in one of the outcomes below; no process of the run outlives this call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from pytest_resume_check import events as ev
from pytest_resume_check import starter
from pytest_resume_check.run import RunPlan

#: Run outcomes.
DONE = "done"  # the target returned
KILLED = "killed"  # killed by the harness at the planned point
RAISED = "raised"  # the target raised an exception
CRASHED = "crashed"  # the process died by itself (non-zero exit, signal) without reporting an error
HUNG = "hung"  # no event within the hang limit; killed
CONVERGED = "converged"  # a resumed run reached the reference's state and stopped; the rest is the reference's
FINISHED = (DONE, CONVERGED)

DEFAULT_HANG_TIMEOUT = 60.0


@dataclass
class RunRecord:
    """Everything observed of one child run."""

    plan: RunPlan
    events: list[ev.Event] = field(default_factory=list)
    outcome: str = CRASHED
    exitcode: int | None = None
    error: str | None = None
    seconds: float = 0.0
    hang_timeout: float | None = None
    pid: int | None = None
    isolation: str | None = None
    #: Seconds from starting the child to its first event (start-up cost of the run).
    first_event_seconds: float | None = None
    #: What the harness did to the disk after the kill (power loss, torn files), for the report.
    notes: list[str] = field(default_factory=list)

    @property
    def resumed_step(self) -> int | None:
        """Step of the checkpoint this run reported restoring (0: fresh), None if it never said."""
        for e in self.events:
            if e.kind == ev.RESUMED:
                return e.step
        return None

    @property
    def resumed_path(self) -> str | None:
        for e in self.events:
            if e.kind == ev.RESUMED:
                return e.path
        return None

    @property
    def published(self) -> list[tuple[int, str | None]]:
        """(step, path) of every checkpoint this run published, in order."""
        return [(e.step or 0, e.path) for e in self.events if e.kind == ev.CHECKPOINT]

    @property
    def converged_step(self) -> int | None:
        return next((e.step for e in self.events if e.kind == ev.CONVERGED), None)

    @property
    def steps_run(self) -> int:
        """Trainer steps this run executed (for cost accounting)."""
        return sum(1 for e in self.events if e.kind == ev.STEP_END)

    @property
    def last_step(self) -> int:
        steps = [e.step for e in self.events if e.kind == ev.STEP_END and e.step is not None]
        return max(steps, default=0)

    def describe(self) -> str:
        """``killed right after checkpoint of step 3 was published`` and the like."""
        if self.outcome == KILLED and self.plan.kill is not None:
            text = next((e.text for e in self.events if e.kind == ev.KILL_READY and e.text), None)
            if self.plan.faults is not None and text:
                return f"{text} (save of step {self.plan.kill.checkpoint_step})" + "".join(
                    f"; {n}" for n in self.notes)
            return self.plan.kill.describe()
        if self.outcome == DONE:
            return "ran to the end"
        if self.outcome == CONVERGED:
            return f"reached the reference's exact state at step {self.converged_step} (the rest is the reference's)"
        if self.outcome == RAISED:
            return "raised " + (self.error or "").strip().splitlines()[-1] if self.error else "raised"
        if self.outcome == HUNG:
            return f"hung after step {self.last_step}"
        return f"died by itself (exit code {self.exitcode}) after step {self.last_step}"


def supervise(plan: RunPlan, *, isolation: str, hang_timeout: float = DEFAULT_HANG_TIMEOUT,
              on_pause: Callable[[int], None] | None = None) -> RunRecord:
    """Run ``plan`` in a child process and record what happened. ``on_pause(step)`` is called while
    the child waits at one of ``plan.pause_steps`` (to copy its checkpoint directory)."""
    record = RunRecord(plan, hang_timeout=hang_timeout, isolation=isolation)
    started = time.monotonic()
    child = starter.start(plan, isolation)
    record.pid = child.pid
    try:
        _read_events(child, record, hang_timeout, on_pause, started)
    finally:
        if record.outcome in (KILLED, HUNG):
            child.kill()
            record.exitcode = child.process.exitcode
        else:
            record.exitcode = child.reap()
        record.seconds = time.monotonic() - started
    if record.outcome == CRASHED and record.exitcode == 0 and not record.events:
        record.error = "the child exited without sending any event"
    return record


def _read_events(child: starter.Child, record: RunRecord, hang_timeout: float,
                 on_pause: Callable[[int], None] | None, started: float) -> None:
    sentinel = child.process.sentinel
    while True:
        ready = wait([child.conn, sentinel], timeout=hang_timeout)
        if not ready:
            record.outcome = HUNG
            record.error = f"no event for {hang_timeout:g} s (hang limit) after step {record.last_step}"
            return
        if child.conn in ready:
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
