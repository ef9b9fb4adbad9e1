"""Parent side of one run: start the child, read its events, kill it when the plan says, enforce the
hang limit. A run ends in one of the :class:`~pytest_resume_check.records.results.Outcome` values; no
process of the run outlives this call.

The event loop waits for the channel, the child's exit or the hang limit, and hands each event it reads
to the handler of its kind (:data:`HANDLERS`): a handler records the event, does what the kind asks of
the harness (wait for the other ranks, snapshot, kill) and says whether the run's reading ends.
"""

from __future__ import annotations

import collections
import errno
import functools
import os
import select
import signal
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait

from pytest_resume_check.child.main import REJOIN_SIGNAL, STACKS_SIGNAL
from pytest_resume_check.process import starter
from pytest_resume_check.process.fork_server import ForkServer, ForkServerDied
from pytest_resume_check.process.sweep import PROC, group_not_stopped, sweep
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import MODE_CRASH
from pytest_resume_check.records.names import DEFAULT_HANG_TIMEOUT, OPT_HANG
from pytest_resume_check.records.plan import LAUNCHER_TORCHRUN, SIGNAL_TERM, RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord, last_attempt


def supervise(plan: RunPlan, *, isolation: str, hang_timeout: float = DEFAULT_HANG_TIMEOUT,
              on_pause: Callable[[int], None] | None = None, fork_server: ForkServer | None = None) -> RunRecord:
    """Run ``plan`` in a child process (forked from ``fork_server`` under the ``forkserver`` isolation) and
    record what happened. ``on_pause(step)`` is called while the child waits at one of ``plan.pause_steps``
    (to copy its checkpoint directory)."""
    record = RunRecord(plan, hang_timeout=hang_timeout, isolation=isolation)
    started = time.monotonic()
    child = starter.start(plan, isolation, fork_server)
    record.pid = child.pid
    interrupted = True
    try:
        _read_events(_Watch(child, record, hang_timeout, on_pause, started, _Channel(child.conn.fileno())))
        interrupted = False
    except _BadFrame as bad:  # something wrote to the channel that is no event: the run's word is void
        record.events.append(ev.Event(ev.VIOLATION, text=ERR_BAD_FRAME.format(detail=bad)))
        record.outcome = Outcome.CRASHED
    finally:
        try:
            if not interrupted and record.outcome == Outcome.HUNG:
                dump_stacks(child, record)  # where it hung, for the report; a Ctrl-C meanwhile still kills
        finally:
            # Interrupted (Ctrl-C, an error in the parent): kill at once, never wait for a paused child.
            if interrupted or record.outcome in (Outcome.KILLED, Outcome.HUNG):
                child.kill()
                record.exitcode = child.process.exitcode
            else:
                record.exitcode = child.reap()
            server = fork_server.pid if fork_server is not None and isolation == starter.ISOLATION_FORKSERVER else None
            record.leftovers = sweep(plan.token, server, shared=fork_server is not None and fork_server.shared)
            record.seconds = time.monotonic() - started
    lost = next((e for e in record.events if e.kind == ev.LOG_LOST), None)
    if lost is not None:  # the run's log sits on a full disk: its evidence is lost, and so is its verdict
        code = int(lost.extra.get(ev.EXTRA_ERRNO, errno.ENOSPC))
        raise HarnessWriteError(code, os.strerror(code), lost.path)
    if record.outcome in (Outcome.CRASHED, Outcome.HUNG) and (end := child.server_died()) is not None:
        raise ForkServerDied(end)  # the run did not die: the harness lost what it was forked from
    if record.outcome == Outcome.CRASHED and record.exitcode == 0 and not record.events:
        record.error = "the child exited without sending any event"
    return record


class HarnessWriteError(OSError):
    """A file of the harness's own for a run (its log) could not be written: the disk under it is full."""


#: Seconds between checks that a silent child still lives.
LIVENESS_POLL = 0.5


@dataclass
class _Watch:
    """One run being supervised: its child, what has been recorded of it, and what the plan asks."""

    child: starter.Child
    record: RunRecord
    hang_timeout: float
    on_pause: Callable[[int], None] | None
    #: ``time.monotonic()`` when the child was started.
    started: float
    #: The run's event channel, read in bulk.
    channel: _Channel


def _read_events(watch: _Watch) -> None:
    """Record the run's events until it ends, is killed at its kill point, or sends nothing within the hang
    limit (``HUNG``)."""
    child, record = watch.child, watch.record
    sentinel = child.process.sentinel
    last_event = time.monotonic()
    while True:
        # Short waits: a process the run detached may hold the channel and the sentinel open after
        # the child died (spawn hands the sentinel down), so whether it lives is also asked directly.
        ready = [child.conn] if watch.channel.queued else wait([child.conn, sentinel], timeout=LIVENESS_POLL)
        if not ready:
            if child.process.exitcode is not None:
                ready = [sentinel]
            elif watch.hang_timeout and time.monotonic() - last_event > watch.hang_timeout:
                record.outcome = Outcome.HUNG
                record.error = f"no event for {watch.hang_timeout:g} s (hang limit) after step {record.last_step}"
                return
            else:
                continue
        if child.conn in ready:
            last_event = time.monotonic()
            if _dispatch_message(watch):
                return
        elif sentinel in ready:
            # The child is gone; its loader workers may still hold the channel open. Drain what
            # was written before the exit, then decide.
            _drain_written(watch)
            _finish(record)
            return


def _dispatch_message(watch: _Watch) -> bool:
    """Read the channel message that is ready and hand each of its events to the handler of its kind; True
    when the run's reading ends (the channel closed, or a handler ended it)."""
    try:
        received = watch.channel.receive(watch.hang_timeout)
    except (EOFError, OSError):
        _finish(watch.record)
        return True
    if watch.record.first_event_seconds is None:
        watch.record.first_event_seconds = time.monotonic() - watch.started
    for event in received:
        if HANDLERS.get(event.kind, _on_event)(watch, event):
            return True
    return False


def _on_event(watch: _Watch, event: ev.Event) -> bool:
    """Any kind without a handler of its own: recorded, and the reading goes on."""
    watch.record.events.append(event)
    return False


def _on_step_end(watch: _Watch, event: ev.Event) -> bool:
    """A step's end: recorded, and the first one's time kept (start-up cost, rendezvous of ranks included)."""
    watch.record.events.append(event)
    if watch.record.first_step_seconds is None:
        watch.record.first_step_seconds = time.monotonic() - watch.started
    return False


def _on_paused(watch: _Watch, event: ev.Event) -> bool:
    """The child waits at a checkpoint to be snapshot: wait for the other ranks to get past the step (what
    a kill here would leave), then, every process of the run stopped, call ``on_pause`` and let it go on.
    The event is recorded once the ranks are past; the reading ends when they never get there."""
    step = event.step or 0
    kill = watch.record.plan.kill
    if event.attempt and kill is not None and kill.rejoin == step:
        return _rejoin(watch, event, kill.node)
    if not _wait_for_peers(watch, step, "paused for a snapshot"):
        return True
    watch.record.events.append(event)
    if watch.on_pause is not None:
        with starter.frozen(watch.child.pid):
            watch.on_pause(step)
    watch.child.resume()
    return False


def _rejoin(watch: _Watch, event: ev.Event, node: int | None) -> bool:
    """The job that went on without a lost node published the checkpoint the cell brings the node back at,
    and rank 0 waits there: once its other ranks are past that step (as at a kill point), the attempt ends
    here, as killed right after that checkpoint (``SIGNALLED`` with ``rejoin``), and the node's next agent
    is woken. torchrun's agents then stop their workers for the new member (rank 0 is never let go on) and
    start the job again on every node: the next attempt, a resume. The reading goes on."""
    record, step = watch.record, event.step or 0
    world = next((int(e.extra["world_size"]) for e in record.events
                  if e.kind == ev.RANKS and e.attempt == event.attempt and "world_size" in e.extra), 1)
    plan = record.plan
    awaited = [r for r in (range(1, world) if plan.step_ranks is None else plan.step_ranks) if 0 < r < world]
    if not _wait_for_peers(watch, step, "waited to bring the lost node back", awaited, event.attempt):
        return True
    reserve = [int(e.extra["agent"]) for e in record.events if e.kind == ev.RANKS and e.extra.get("reserve")]
    record.events.append(event)
    record.events.append(ev.Event(ev.SIGNALLED, step=step, text="rejoin",
                                  extra={"signal": "rejoin", "rejoin": step, "node": node, "pids": reserve,
                                         "ranks_past": awaited, "restart": True}))
    _signal(reserve, REJOIN_SIGNAL)
    return False


def _on_kill_ready(watch: _Watch, event: ev.Event) -> bool:
    """The child is at the planned kill point: the run is ``KILLED``. A SIGTERM plan preempts every rank;
    a plan that kills one rank kills it alone; an all-ranks SIGKILL of a multi-rank run first waits for
    the other ranks to reach the kill point's step. A fault inside a save of several ranks stops every rank
    and thread of the save (records.faults): the run is killed once all of them wait (a plain kill of a
    torchrun job that restarts its workers: its workers, and the restart is read on). The caller SIGKILLs what
    is left; the reading ends."""
    record = watch.record
    record.events.append(event)
    kill = record.plan.kill
    if kill is not None and kill.fault is not None and record.plan.world_size > 1:
        lanes = {(e.rank or 0, int(e.extra.get("lane") or 0)): e for e in record.events if e.kind == ev.KILL_READY}
        wanted = {(r, ln) for r, ln, _ in kill.fault.stops or ()} or {(r, 0) for r in range(record.plan.world_size)}
        if not wanted <= set(lanes):
            return False  # the others are on their way to where they stop
        ready = {r: e for (r, ln), e in lanes.items() if ln == 0}
        if record.plan.restarts_in_job and kill.fault.mode == MODE_CRASH and kill.fault.rank in ready:
            # The workers die, not the job: torchrun's agent restarts them within the run, and they resume from
            # what is on disk. The killed rank dies where it stopped; the others, stopped right before a
            # collective it will never enter, have nothing left to write before they would fail in it (waiting
            # there for the agent to end them would take its 30 s shutdown timeout).
            record.outcome = Outcome.CRASHED
            pids = [int(e.extra["pid"]) for _, e in sorted(ready.items(), key=lambda item: item[0] or 0)]
            _signal(_with_programs(record, pids), signal.SIGKILL)
            record.events.append(ev.Event(ev.SIGNALLED, step=record.last_step, text="SIGKILL", extra={
                "signal": "kill", "rank": kill.fault.rank, "pids": pids, "restart": True}))
            return False
    record.outcome = Outcome.KILLED
    if kill is not None and event.extra.get("signal") == SIGNAL_TERM:
        _preempt(watch, kill.grace)
    elif kill is not None and (kill.node is not None or kill.rank is not None and record.plan.restarts_in_job):
        # torchrun restarts the workers within the run (without a lost node's): what they do next is the
        # resume, and the run's last word decides its outcome.
        record.outcome = Outcome.CRASHED
        pid = int(event.extra["pid"])
        pids = _with_programs(record, _node_pids(record, pid) if kill.node is not None else [pid])
        _signal(pids, signal.SIGKILL)
        who = {"node": kill.node, "pids": pids} if kill.node is not None else {"rank": kill.rank, "pid": pid}
        record.events.append(ev.Event(ev.SIGNALLED, step=record.last_step, text="SIGKILL",
                                      extra={"signal": "kill", **who, "restart": True}))
        return False
    elif kill is not None and kill.rank is not None and record.plan.world_size > 1:
        _kill_one_rank(watch, kill.rank, int(event.extra["pid"]))
    elif kill is not None and kill.agent:
        if _wait_for_peers(watch, kill.kill_step, "waited at the kill point"):
            _kill_agent(watch)
    elif kill is not None and kill.fault is None and record.plan.world_size > 1:
        if _wait_for_peers(watch, kill.kill_step, "waited at the kill point"):
            record.events.append(ev.Event(ev.SIGNALLED, step=record.last_step, text="SIGKILL",
                                          extra={"signal": "kill", "ranks_past": _awaited(record)}))
    return True


def _on_end(watch: _Watch, event: ev.Event) -> bool:
    """The run's last word (done, an error, converged): recorded, and the outcome decided from it. Under
    torchrun a worker's error is not: its agent may restart the workers, and the agent's own word (or its
    exit) ends the run."""
    watch.record.events.append(event)
    if watch.record.plan.launcher == LAUNCHER_TORCHRUN and event.rank is not None:
        return False
    _finish(watch.record)
    return True


#: What the event loop does with each kind of event (other kinds: :func:`_on_event`); a handler returns
#: True when the run's reading ends.
HANDLERS: Mapping[str, Callable[[_Watch, ev.Event], bool]] = {
    ev.STEP_END: _on_step_end,
    ev.PAUSED: _on_paused,
    ev.KILL_READY: _on_kill_ready,
    ev.DONE: _on_end,
    ev.ERROR: _on_end,
    ev.CONVERGED: _on_end,
}


#: Seconds a multi-rank run's launcher gets to end the other ranks after one was killed.
TEARDOWN_TIMEOUT = 10.0


def _rank_pids(child: starter.Child, record: RunRecord) -> list[int]:
    """The processes of the run's ranks (the child itself in a one-process run)."""
    return [pid for _, pid in _rank_processes(child, record)]


def _rank_processes(child: starter.Child, record: RunRecord) -> list[tuple[int | None, int]]:
    """(rank, pid) of each process that runs the target: the ranks of a multi-rank run, or the child
    itself (rank None; also a launcher whose ranks' pids never came)."""
    by_rank: dict[int, int] = {}
    for e in record.events:  # the harness's launcher lists them; each torchrun worker reports its own
        if e.kind == ev.RANKS:
            by_rank.update(enumerate(int(p) for p in e.extra.get("pids", ())))
            if "pid" in e.extra:
                by_rank[e.rank or 0] = int(e.extra["pid"])  # a restart's worker replaces the one before
    return sorted(by_rank.items()) if by_rank else [(None, child.pid)]


def _agent_pids(child: starter.Child, record: RunRecord) -> list[int]:
    """The torchrun agents of a run: the run's process (node 0) and the one each other simulated node's agent
    reported."""
    return [child.pid, *(int(e.extra["agent"]) for e in record.events
                         if e.kind == ev.RANKS and e.rank is None and "agent" in e.extra)]


def _node_pids(record: RunRecord, worker: int) -> list[int]:
    """The processes of the simulated node that runs torchrun worker ``worker``: its agent and the workers
    that agent started last."""
    parents = {int(e.extra["pid"]): int(e.extra["agent"]) for e in record.events
               if e.kind == ev.RANKS and "pid" in e.extra and "agent" in e.extra}
    agent = parents.get(worker)
    if agent is None:
        return [worker]
    return [agent, *(pid for pid, parent in parents.items() if parent == agent)]


def _with_programs(record: RunRecord, pids: list[int]) -> list[int]:
    """``pids`` and the programs of those that are workers of a torchrun command target, which stand for
    them: a killed worker's program dies with it, as the worker would have."""
    programs = [int(e.extra["program"]) for e in record.events
                if e.kind == ev.RANKS and "program" in e.extra and int(e.extra["worker"]) in pids]
    return [*pids, *programs]


#: Seconds a hung run's processes get, in all, to write their stacks into its log before they are killed.
#: It bounds only what the report shows (the run is ``HUNG`` already); writing takes milliseconds.
STACKS_TIMEOUT = 2.0


def dump_stacks(child: starter.Child, record: RunRecord, timeout: float = STACKS_TIMEOUT) -> None:
    """Before a hung run is killed: each process that runs its target writes the Python stack of
    every thread into the run's log, under a line that names its rank and pid (``events.stacks_header``), so
    the report can say where it hung. Every process of the run is stopped first and each is continued only
    to write its stacks, so nothing else writes into the log meanwhile and no two dumps interleave; the
    handler (``child.main``) stops the process again once it has written them, which is how this knows they
    are complete. A process without the handler (a program run as a command, a child that hung before it
    installed it) just stops, and the report shows no stacks for it. ``record.stack_dumps`` says, for each of
    those processes (a rank that had ended too), whether its stacks are in the log: the verdict's headline
    names the log when they are. The caller kills the run afterwards."""
    deadline = time.monotonic() + timeout
    try:
        os.killpg(child.pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return
    _wait_until(lambda: not group_not_stopped(child.pid), deadline)
    log_path = record.plan.log_path
    for rank, pid in _rank_processes(child, record):
        wrote = False
        try:
            if os.getpgid(pid) != child.pid:  # a rank that ended: its pid may be another process's by now
                continue
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"\n{ev.stacks_header(rank, pid)}\n")
            headed = os.path.getsize(log_path)
            os.kill(pid, signal.SIGCONT)  # continued first: a SIGCONT discards a pending stop signal
            os.kill(pid, STACKS_SIGNAL)
            _wait_until(functools.partial(_stopped, pid), deadline)
            wrote = os.path.getsize(log_path) > headed  # a process without the handler just stops
        except ProcessLookupError:
            continue
        except OSError:  # the log cannot take it (a full disk): no stacks, the run is killed as before
            return
        finally:
            record.stack_dumps.append((rank, wrote))


def _stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped or gone (True without ``/proc``: cannot tell)."""
    try:
        tasks = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"{PROC}/{pid}/task/{task}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] not in (b"T", b"t", b"Z", b"X"):
                    return False
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return True


def _wait_until(done: Callable[[], bool], deadline: float) -> None:
    while not done() and time.monotonic() < deadline:
        time.sleep(0.002)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _preempt(watch: _Watch, grace: float) -> None:
    """Preemption: SIGTERM to every rank (to torchrun's agent, which forwards it to its workers), let the
    reporting call return, and keep recording what the run does until it exits or ``grace`` seconds have
    passed (the caller then SIGKILLs its group)."""
    child, record = watch.child, watch.record
    pids = _agent_pids(child, record) if record.plan.launcher == LAUNCHER_TORCHRUN else _rank_pids(child, record)
    _signal(pids, signal.SIGTERM)
    record.events.append(ev.Event(ev.SIGNALLED, step=record.last_step, text="SIGTERM",
                                  extra={"signal": SIGNAL_TERM, "grace": grace, "pids": pids}))
    child.resume()
    _drain_until(watch, time.monotonic() + grace)


def _kill_one_rank(watch: _Watch, rank: int, pid: int) -> None:
    """SIGKILL one rank alone and give the launcher :data:`TEARDOWN_TIMEOUT` to end the others, as
    torchrun's agent does; ``record.teardown`` says who ended them (the caller kills what is left)."""
    child, record = watch.child, watch.record
    _signal([pid], signal.SIGKILL)
    started = time.monotonic()
    record.events.append(ev.Event(ev.SIGNALLED, step=record.last_step, text="SIGKILL",
                                  extra={"signal": "kill", "rank": rank, "pid": pid}))
    _drain_until(watch, started + TEARDOWN_TIMEOUT)
    if child.process.exitcode is not None:
        took = time.monotonic() - started
        record.teardown = f"the launcher ended the other ranks {took:.2f} s after rank {rank} died"
    else:
        record.teardown = (f"the launcher had not ended the other ranks {TEARDOWN_TIMEOUT:g} s after rank {rank} died; "
                           "the harness killed them")


def _kill_agent(watch: _Watch) -> None:
    """SIGKILL torchrun's agent alone (the run's process) and give its workers :data:`TEARDOWN_TIMEOUT` to end
    by themselves: torch gives each the parent-death signal SIGINT; ``record.teardown`` says whether and how
    fast they ended (the caller kills what is left)."""
    child, record = watch.child, watch.record
    workers = _rank_pids(child, record)
    _signal([child.pid], signal.SIGKILL)
    started = time.monotonic()
    record.events.append(ev.Event(ev.SIGNALLED, step=record.last_step, text="SIGKILL",
                                  extra={"signal": "kill", "agent": child.pid, "ranks_past": _awaited(record)}))
    while time.monotonic() < started + TEARDOWN_TIMEOUT and not all(map(_ended, workers)):
        _drain_written(watch)
        time.sleep(0.01)
    _drain_written(watch)
    if all(map(_ended, workers)):
        record.teardown = f"the workers ended {time.monotonic() - started:.2f} s after their agent died"
    else:
        record.teardown = (f"the workers had not ended {TEARDOWN_TIMEOUT:g} s after their agent died; the harness "
                           "killed them")


def _ended(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _awaited(record: RunRecord) -> list[int]:
    """The ranks besides rank 0 whose step ends an all-ranks kill or a snapshot waits for: those that
    report steps (learned from a finished run of the target; all of them until one finished), but not a
    rank that said it resumed from another step than rank 0 (its steps are not rank 0's: the verdict says
    STALE_RESUME, and waiting for a step it may never number so would only delay that)."""
    plan = record.plan
    ranks = range(1, plan.world_size) if plan.step_ranks is None else plan.step_ranks
    resumed = record.resumed_by_rank
    lead = resumed.get(0, (None, None))[0]
    return sorted(r for r in ranks if 0 < r < plan.world_size and resumed.get(r, (lead, None))[0] == lead)


def _wait_for_peers(watch: _Watch, step: int, doing: str, peers: Iterable[int] | None = None,
                    attempt: int | None = None) -> bool:
    """Before killing every rank at once, or copying what a shared first run saved: wait until every other
    rank that reports steps has reported the end of ``step`` (the kill point's), so all their reports up
    to the kill point are on the channel and their part of its checkpoint is written (a fixed
    wait of 2 s lost rank 1's last step on a loaded machine). In a loop whose ranks run the same code
    they get there while rank 0 waits. True when they did; otherwise the run's outcome says what
    happened instead (it ended by itself, or a rank did not get there within the hang limit: ``HUNG``).
    ``peers``: those ranks (else :func:`_awaited`); ``attempt``: only the reports of that attempt of a torchrun
    job count."""
    child, record, hang_timeout = watch.child, watch.record, watch.hang_timeout
    awaited = set(_awaited(record) if peers is None else peers)

    def missing() -> list[int]:
        return sorted(awaited - {e.rank for e in record.events if e.kind == ev.STEP_END and (e.step or 0) >= step
                                 and (attempt is None or e.attempt == attempt)})

    if not missing():
        return True
    _drain_until(watch, time.monotonic() + hang_timeout, lambda: not missing())
    late = missing()
    if not late:
        return True
    if child.process.exitcode is not None:  # a rank died meanwhile and the launcher ended the run
        _finish(record)
        return False
    record.outcome = Outcome.HUNG
    record.stalled = ERR_PEERS.format(ranks=", ".join(map(str, late)), s="s" if len(late) > 1 else "",
                                      step=step, limit=hang_timeout, doing=doing)
    return False


#: A rank that never reached the step of rank 0's kill point (or snapshot).
ERR_PEERS = ("rank{s} {ranks} did not report the end of step {step} within the hang limit ({limit:g} s) while "
             "rank 0 {doing}; every rank must report run.step_end(step) before it needs rank 0 again (in the "
             "next step's collectives), or raise the limit with " + OPT_HANG)


def _drain_until(watch: _Watch, deadline: float, until: Callable[[], bool] | None = None) -> None:
    """Record the run's events until its process exits, ``deadline`` passes or ``until()`` holds."""
    child, record, channel = watch.child, watch.record, watch.channel
    sentinel = child.process.sentinel
    while time.monotonic() < deadline and not (until is not None and until()):
        ready = [child.conn] if channel.queued else wait(
            [child.conn, sentinel], timeout=min(LIVENESS_POLL, max(0.0, deadline - time.monotonic())))
        if child.conn in ready:
            try:
                record.events.extend(channel.receive(max(LIVENESS_POLL, deadline - time.monotonic())))
            except (EOFError, OSError):  # every process of the run closed the channel: it is exiting
                child.wait_exit(max(0.0, deadline - time.monotonic()))
                return
        elif sentinel in ready or child.process.exitcode is not None:
            _drain_written(watch)
            return


def _drain_written(watch: _Watch) -> None:
    """Record what an exited child wrote to the channel before it went (without waiting for more)."""
    while watch.channel.queued or watch.child.conn.poll(0):
        try:
            watch.record.events.extend(watch.channel.receive(LIVENESS_POLL, alive=False))
        except (EOFError, OSError):
            break


#: The largest message the channel takes: a step's batch of reports is far smaller (batches are written at
#: least once a second); a larger length is something else writing to the channel.
MAX_FRAME = 256 * 1024 * 1024
ERR_BAD_FRAME = ("wrote something to the harness's event channel that is no event ({detail}); the channel's "
                 "descriptor belongs to the harness: a trainer must not write to descriptors it did not open")


class _BadFrame(Exception):
    """What came over the channel is not a message of events."""


#: Bytes one read of the event channel takes at most: every message written since the last read, at once.
CHUNK = 1 << 20


class _Channel:
    """The read end of a run's event channel, read in bulk: one read takes every message written so far (a
    trivial step's few events are several messages), and :meth:`receive` hands them out one at a time, in
    order, so a handler that reads on (waiting for the other ranks) sees what it saw when each read took one
    message. Messages are framed as multiprocessing frames them (a 4-byte big-endian length, -1 and 8 more
    bytes for longer ones); a message cut at the end of a read stays in the buffer for the next."""

    def __init__(self, fd: int, chunk: int = CHUNK):
        self.fd = fd
        self.chunk = chunk
        self._buffer = bytearray()
        self._messages: collections.deque[bytes | _BadFrame] = collections.deque()
        self._broken = False

    @property
    def queued(self) -> bool:
        """Whether a message read already waits to be received (the descriptor may have nothing more)."""
        return bool(self._messages)

    def receive(self, timeout: float, alive: bool = True) -> list[ev.Event]:
        """The events of the next message (one is queued, or ready to be read); raises EOFError when the
        channel is closed and :class:`_BadFrame` when the message is no events: a length beyond
        :data:`MAX_FRAME`, bytes that do not decode, or a message that does not arrive in full within
        ``timeout`` seconds while the run lives (a length made up by something else writing to the channel),
        so no read waits longer than ``timeout``. Of a run that exited (``alive`` False), a cut message is its
        end."""
        deadline = time.monotonic() + timeout
        while not self._messages:
            self._read(deadline, alive)
        message = self._messages.popleft()
        if isinstance(message, _BadFrame):
            raise message
        try:
            return _decode(message)
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            raise _BadFrame(f"{len(message)} bytes: {type(exc).__name__}: {str(exc)[:120]}") from None

    def _read(self, deadline: float, alive: bool) -> None:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            if alive:
                raise _BadFrame(f"a message of {self._wanted()} bytes that did not arrive in full")
            raise EOFError("the run ended in the middle of a message")
        chunk = os.read(self.fd, self.chunk)
        if not chunk:
            raise EOFError("the channel closed in the middle of a message" if self._buffer else "the channel closed")
        if not self._broken:
            self._buffer += chunk
            self._split()

    def _split(self) -> None:
        """Move every whole message of the buffer to the queue; a cut one stays."""
        buffer, start = self._buffer, 0
        while len(buffer) - start >= 4:
            size, head = struct.unpack_from("!i", buffer, start)[0], 4
            if size == -1:
                if len(buffer) - start < 12:
                    break
                size, head = struct.unpack_from("!Q", buffer, start + 4)[0], 12
            if not 0 <= size <= MAX_FRAME:  # nothing after it can be framed: the run's word ends here
                self._messages.append(_BadFrame(f"a message length of {size} bytes"))
                self._broken, start = True, len(buffer)
                break
            if len(buffer) - start < head + size:
                break
            self._messages.append(bytes(buffer[start + head:start + head + size]))
            start += head + size
        del buffer[:start]

    def _wanted(self) -> int:
        """The length of the message cut at the end of the buffer (of its length field while that is cut)."""
        buffer = self._buffer
        if len(buffer) < 4:
            return 4
        size = struct.unpack_from("!i", buffer)[0]
        if size != -1:
            return size
        return struct.unpack_from("!Q", buffer, 4)[0] if len(buffer) >= 12 else 8


def _decode(raw: bytes) -> list[ev.Event]:
    """One channel message holds one or more events, one JSON object a line."""
    return [ev.Event.from_wire(line) for line in raw.split(b"\n") if line]


def _finish(record: RunRecord) -> None:
    """The outcome of a run that ended by itself, from its last words: an error, done, or converged (of
    its last attempt, when torchrun restarted its workers within the run)."""
    # A restart torchrun made after the plan's kill is a resume; any other restart hides a failure.
    events = last_attempt(record.events) if record.plan.kill is not None else record.events
    kinds = [e.kind for e in events]
    if ev.ERROR in kinds:
        record.outcome = Outcome.RAISED
        errors = [e.text or "" for e in events if e.kind == ev.ERROR]
        # A worker's traceback, and last what its launcher made of it (torchrun: gave up after N restarts).
        launcher = [e.text or "" for e in events if e.kind == ev.ERROR and e.rank is None and e.extra.get("launcher")]
        record.error = "\n".join([errors[0], *launcher]) if launcher and errors[0] not in launcher else errors[0]
    elif ev.DONE in kinds:
        record.outcome = Outcome.DONE
    elif ev.CONVERGED in kinds:
        record.outcome = Outcome.CONVERGED
    else:
        record.outcome = Outcome.CRASHED
