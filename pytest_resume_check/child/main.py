"""Child side of one run: builds the target, sends its events, obeys the plan.

This module is imported in every child process (and preloaded in the fork server); it imports
nothing heavy.
"""

from __future__ import annotations

import _thread
import collections
import dataclasses
import faulthandler
import fcntl
import importlib
import importlib.util
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Protocol

from pytest_resume_check.child import cpython
from pytest_resume_check.child.ending import report_end, write_quietly
from pytest_resume_check.child.environ import READS
from pytest_resume_check.child.loading import load_target_fn
from pytest_resume_check.child.process_groups import GroupKeeper
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.environ import harness_names
from pytest_resume_check.records.names import ATTEMPT_ENV, RUN_TOKEN_ENV
from pytest_resume_check.records.plan import LAUNCHER_TORCHRUN, RunPlan
from pytest_resume_check.run import ControlChannel, RunContext

if TYPE_CHECKING:  # imported where a crash cell needs it (see _recorder)
    from pytest_resume_check.child.recorder import Recorder

#: Events that are held back and sent with the next step boundary (one pipe write per step).
_BATCHED = frozenset({ev.CONSUMED, ev.TRAINED, ev.STATE, ev.LOG, ev.ENVIRON})
#: Seconds after which batched reports are written without waiting for a boundary: a step longer than
#: the hang limit that keeps reporting is alive, and the supervisor hears it at least this often.
LIFE_INTERVAL = 1.0


class EventConnection(Protocol):
    """The child's end of a run's event channel (a ``multiprocessing`` connection): whole messages
    written one at a time; the supervisor reads them as they come."""

    def send_bytes(self, buf: bytes) -> None: ...


class ConnectionSink:
    """Writes events to the event channel. Reports inside a step are batched and written together at
    the step's end (or any checkpoint, pause, kill point, error or exit), so a SIGKILL loses only what
    the step did after its last boundary - work a kill undoes anyway.

    Safe from any thread (a trainer may publish its checkpoints from a background saver) and from signal
    handlers (a SIGTERM handler that saves and publishes): a report call only appends to a
    queue, and a boundary waits until this process's writer thread has written everything queued before
    it. Only the writer touches the channel, so a handler that interrupts a report call on the main
    thread never waits for a lock that call holds, and no two writes interleave. Each thread's events
    arrive in the order it sent them; a handler's come after those of the call it interrupted that were
    queued before it ran.

    At each boundary it also holds the trainer's default ``torch.distributed`` group until the process ends,
    as a fresh interpreter does (:mod:`.process_groups`: otherwise a correct loop that ends with
    ``destroy_process_group()`` could hang in torch's teardown, and only under the harness)."""

    def __init__(self, conn: EventConnection, rank: int | None = None, lock_path: str | None = None,
                 attempt: int | None = None):
        self._conn = conn
        self._rank = rank
        self._attempt = attempt
        # Appends and pops of a deque and puts of a SimpleQueue are atomic and reentrant: a signal
        # handler may interrupt them and make its own.
        self._pending: collections.deque[bytes] = collections.deque()
        self._requests: queue.SimpleQueue[_thread.LockType | None] = queue.SimpleQueue()
        self._pid = 0  # the process whose writer thread serves this sink (0: none yet)
        self._failure: OSError | None = None
        self._written_at = time.monotonic()
        # The ranks of a run share one channel: each write holds an flock on a file descriptor of its
        # own, which a rank killed while holding it gives back by dying.
        self._lock_path = lock_path
        self._lock_fd = os.open(lock_path, os.O_RDONLY) if lock_path else None
        #: The process groups this process's trainer initialised, held until the process ends.
        self.groups = GroupKeeper()
        self._start()
        # A process forked from this one (a helper the trainer forks that reports too) gets a writer and
        # queues of its own at once: its parent's queued events and writer thread are not its.
        os.register_at_fork(after_in_child=self._start)

    def send(self, event: ev.Event) -> None:
        if self._rank is not None or self._attempt is not None:
            event = dataclasses.replace(event, rank=self._rank, attempt=self._attempt)
        self._pending.append(event.to_wire())
        if event.kind not in _BATCHED:
            self.groups.keep()  # a boundary comes after the trainer's init_process_group, before its end
            self.flush()
        elif time.monotonic() - self._written_at >= LIFE_INTERVAL:
            # A long step that keeps reporting is alive: write what it reported so far, without waiting.
            self._written_at = time.monotonic()
            self._requests.put(None)

    def flush(self) -> None:
        """Return once every event sent before this call is on the channel (raises the OSError of a
        channel that broke)."""
        self._written_at = time.monotonic()
        done = _thread.allocate_lock()
        done.acquire()
        self._requests.put(done)
        done.acquire()  # a signal interrupts this wait; its handler's own reports are written meanwhile
        if self._failure is not None:
            raise self._failure

    def _start(self) -> None:
        """A writer thread of this process's own, with its own queue: started when the sink is made (so no
        report call, and no handler interrupting one, ever starts it), and in a process forked from it
        right after the fork."""
        if self._pid:
            self._pending = collections.deque()
            self._requests = queue.SimpleQueue()
            self._failure = None
            if self._lock_path:  # an flock belongs to an open file: the parent's excludes nobody here
                self._lock_fd = os.open(self._lock_path, os.O_RDONLY)
        threading.Thread(target=self._write_loop, args=(self._requests,), name="resume-check-events",
                         daemon=True).start()
        self._pid = os.getpid()

    def _write_loop(self, requests: queue.SimpleQueue[_thread.LockType | None]) -> None:
        while True:
            done = requests.get()
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            try:
                if batch:
                    self._write(b"\n".join(batch))
            except OSError as exc:  # the supervisor is gone: the run is over anyway
                self._failure = exc
            except BaseException as exc:  # never leave a report call waiting
                self._failure = OSError(f"the event writer failed: {exc!r}")
            finally:
                if done is not None:
                    done.release()

    def _write(self, raw: bytes) -> None:
        if self._lock_fd is None:
            self._conn.send_bytes(raw)
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._conn.send_bytes(raw)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)


def child_main(plan: RunPlan, conn: EventConnection, control: ControlChannel | None = None) -> None:
    """Entry point of a child process (started by :mod:`pytest_resume_check.process.starter`)."""
    READS.install()  # a spawned run's (a run forked from the fork server has the server's)
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
    _drop_fork_server_pipe()
    _redirect_output(plan.log_path)
    _install_stack_dump(plan.log_path)  # the ranks of a multi-rank run inherit it from here
    if plan.launcher == LAUNCHER_TORCHRUN:
        _launch_torchrun(plan, conn, control)
    if plan.world_size > 1:
        _launch_ranks(plan, conn, control)
    if plan.master_port:  # a distributed target on one rank (an elastic resume to 1) still gets its group
        os.environ.update(_rank_env(plan, 0))
    # The lock file also for one process: a helper it forks that reports writes to the same channel.
    _exit(_run_target(plan, ConnectionSink(conn, 0 if plan.master_port else None, plan.log_path), control))


def _drop_fork_server_pipe() -> None:
    """Close the fork server's liveness pipe, which multiprocessing hands every child it forks: a run does
    not start processes through the server (see above), and a trainer that writes to every descriptor it
    finds would otherwise make the server exit ("Not at EOF?") and fail every later run."""
    cpython.drop_forkserver_pipe()


def _rank_env(plan: RunPlan, rank: int) -> dict[str, str]:
    """What ``torch.distributed``'s ``env://`` rendezvous (and torchrun's workers) read."""
    return {"WORLD_SIZE": str(plan.world_size), "LOCAL_WORLD_SIZE": str(plan.world_size), "RANK": str(rank),
            "LOCAL_RANK": str(rank), "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(plan.master_port)}


def _run_target(plan: RunPlan, sink: ConnectionSink, control: ControlChannel | None, rank: int = 0) -> int:
    """Build and drive the target in this process and report how it ended; returns the exit code."""
    def drive() -> None:
        READS.attach(lambda name: sink.send(ev.Event(ev.ENVIRON, text=name)), harness_names(plan))
        recorder = _recorder(plan, sink, rank)
        fn = load_target_fn(plan.target_ref)
        run = RunContext(plan, sink, control, recorder, rank)
        if recorder is not None:
            recorder.on_kill, recorder.on_ready = run._await_kill, run._say_ready
        fn(run)

    return report_end(plan, sink, drive)


def _exit(code: int) -> None:
    """Skip interpreter teardown: atexit handlers of a half-built trainer must not block the exit."""
    os._exit(code)


#: Exit code of a launcher whose rank died (it ended the other ranks, as torchrun's agent does).
EXIT_RANK_DIED = 71
LOOPBACK = "127.0.0.1"


def _launch_ranks(plan: RunPlan, conn: EventConnection, control: ControlChannel | None) -> None:
    """The launcher of a multi-rank run (this process, never returns): fork one process per rank with
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and a loopback ``MASTER_ADDR``/``MASTER_PORT``; report their
    pids; when one rank dies (a signal or a non-zero exit) kill the others, as torchrun's agent does; when
    all ranks finished, report ``done``. The ranks stay in this process group, so a group kill ends all."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # preemption is for the ranks; SIGKILL still ends us
    pids: dict[int, int] = {}
    for rank in range(plan.world_size):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.environ.update(_rank_env(plan, rank))
            _exit(_run_target(plan, ConnectionSink(conn, rank, plan.log_path), control if rank == 0 else None, rank))
        pids[pid] = rank
    sink = ConnectionSink(conn, None, plan.log_path)
    sink.send(ev.Event(ev.RANKS, extra={"pids": sorted(pids, key=pids.__getitem__)}))
    failed = False
    while pids:
        pid, status = os.wait()
        ended = pids.pop(pid, None)  # the rank that ended (None: an orphan this process adopted)
        if ended is None or os.waitstatus_to_exitcode(status) == 0 or failed:
            continue
        failed = True
        how = os.waitstatus_to_exitcode(status)
        what = f"signal {-how}" if how < 0 else f"exit code {how}"
        write_quietly(sys.stderr, f"[launcher] rank {ended} ended with {what}; ending ranks "
                                  f"{sorted(pids.values())}\n")
        for other in pids:
            try:
                os.kill(other, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if not failed:
        sink.send(ev.Event(ev.DONE))
    os._exit(EXIT_RANK_DIED if failed else 0)


#: The script torchrun's agent runs in each worker (``--run-path``, in the worker forked from the agent):
#: it calls :func:`torchrun_worker`.
TORCHRUN_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_worker.py")
#: The run a torchrun agent in this process drives: (plan, event channel, control channel). Set before the
#: agent starts; its workers, forked from it, find it here.
_torchrun_job: tuple[RunPlan, EventConnection, ControlChannel | None] | None = None
#: torch's switch off the rendezvous store its agent shares with the workers (see :func:`_launch_torchrun`).
TORCHRUN_STORE_SHARING = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
#: The signals torchrun's agent handles (it raises in its own process); a worker gets the default actions
#: back, as the fresh interpreter torchrun starts by default would have.
_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


#: torchrun's rendezvous settings for simulated nodes: a round that has its least nodes closes 1 s later,
#: and a node whose agent sent no heartbeat for 3 s is gone (by default 30 s and 15 s: a lost node would
#: stall the job that long). Only a rendezvous reads them: while the job trains nobody is declared dead.
NODES_RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
#: The same where a lost node rejoins, but a round with its least nodes waits 3 s for more: the rejoining agent
#: waits for the round on torch's wait list, which it reads once a second, while node 0 joins the round as soon
#: as it has stopped its workers; 1 s would leave the node out of it when its read came late (a loaded machine).
REJOIN_RDZV_CONF = NODES_RDZV_CONF.replace("last_call_timeout=1", "last_call_timeout=3")


def node_address(node: int) -> str:
    """The loopback address simulated node ``node`` gives torchrun as its own (``--local-addr``): torchrun
    numbers the nodes of a rendezvous in the order of their addresses (then of their agents' pids, which
    the kernel may reuse out of order), so node N is always group rank N, and node 0, whose agent is the
    run's process and hosts the rendezvous store, is never the node a cell loses."""
    return f"127.0.0.{node + 1}"


def torchrun_argv(plan: RunPlan, log_dir: str, node: int = 0) -> list[str]:
    """torchrun's command line for node ``node`` of a run of ``plan``: ``--nnodes`` as declared (one node by
    default), ``--nproc-per-node`` the ranks of a node, c10d rendezvous on loopback at the run's port (its
    token as the rendezvous id; node 0 hosts its store), the node's own address (:func:`node_address`), the
    declared ``--max-restarts``, workers forked from
    the agent (``--start-method=fork --run-path``, so they start from the preloaded server's imports in
    milliseconds instead of a fresh interpreter's seconds), torchrun's own files under ``log_dir`` (in the
    cell's folder; by default it makes a folder in /tmp per run)."""
    least, most = plan.nnodes
    rejoins = plan.kill is not None and plan.kill.rejoin is not None
    conf = f"is_host={int(node == 0)}" + (f",{REJOIN_RDZV_CONF if rejoins else NODES_RDZV_CONF}" if most > 1 else "")
    return [f"--nnodes={least}:{most}" if least != most else f"--nnodes={most}",
            f"--nproc-per-node={plan.nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={LOOPBACK}:{plan.master_port}", f"--rdzv-id={plan.token or 'resume-check'}",
            f"--rdzv-conf={conf}", f"--local-addr={node_address(node)}", f"--max-restarts={plan.max_restarts}",
            "--monitor-interval=0.1",
            "--start-method=fork", f"--log-dir={log_dir}", "--run-path", TORCHRUN_WORKER]


def _launch_torchrun(plan: RunPlan, conn: EventConnection, control: ControlChannel | None) -> None:
    """This process as torchrun's agent of node 0 (never returns), and one more agent forked per simulated
    node: torchrun's own entry point (``torch.distributed.run.main``) with :func:`torchrun_argv`; each
    agent rendezvouses, starts its workers, watches them, restarts all of them when one fails while
    ``--max-restarts`` allows (at a smaller world size once a node is gone), forwards SIGTERM to them and
    tears them down. A cell whose lost node rejoins also forks that node's next agent now, waiting
    (:func:`_reserve_agent`). Node 0 reports ``done`` when the job succeeded and the other agents ended; when
    torchrun gave up (a worker failed with no restart left), an error saying so. Everything stays in this
    process group."""
    global _torchrun_job
    _torchrun_job = (plan, conn, control)
    # torchrun's agent shares its rendezvous store with the workers by default, and a restart's workers then
    # find the keys of the attempt before (the addresses of its dead ranks: gloo fails to connect, or not,
    # as the timing falls; pytorch/pytorch#135712). A store per rendezvous round, as torch advises, unless
    # the target's environment chose otherwise.
    os.environ.setdefault(TORCHRUN_STORE_SHARING, "1")
    _note_rounds()
    sink = ConnectionSink(conn, None, plan.log_path)  # a forked agent gets a writer of its own (at fork)
    agents = []
    for node in range(1, plan.nnodes[1]):
        pid = os.fork()
        if pid == 0:
            _exit(_run_agent(plan, sink, node))
        agents.append(pid)
    reserve = None
    if plan.kill is not None and plan.kill.node is not None and plan.kill.rejoin is not None:
        woke_reader, woke_writer = os.pipe()
        reserve = os.fork()
        if reserve == 0:
            os.close(woke_reader)
            _exit(_reserve_agent(plan, sink, plan.kill.node, woke_writer))
        os.close(woke_writer)
    code = _run_agent(plan, sink, 0)
    for pid in agents:  # a node the harness killed is reaped at once
        os.waitpid(pid, 0)
    if reserve is not None:
        # The reserve says when it wakes, before it joins: a job that ended without it never woke it.
        os.set_blocking(woke_reader, False)
        try:
            woke = bool(os.read(woke_reader, 1))
        except BlockingIOError:
            woke = False
        if not woke:
            os.kill(reserve, signal.SIGKILL)
        os.waitpid(reserve, 0)
    if code == 0:
        sink.send(ev.Event(ev.DONE))
    _exit(code)


#: The signal the supervisor wakes a lost node's next agent with (:func:`_reserve_agent`): nothing else
#: sends it to a run, and it is blocked in that agent until then.
REJOIN_SIGNAL = signal.SIGUSR2


def _reserve_agent(plan: RunPlan, sink: ConnectionSink, node: int, woke: int) -> int:
    """The agent node ``node`` starts with when it rejoins, forked with the run and waiting for
    :data:`REJOIN_SIGNAL` (a signal wait, not a stop: a snapshot's freeze and thaw of the run's processes
    must not wake it). The supervisor sends it once the job that went on without the node has published the
    checkpoint the cell names; it then tells node 0 it woke (through ``woke``) and joins the rendezvous as a
    new member, and torchrun's agents stop their workers and start the job again on every node."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {REJOIN_SIGNAL})
    sink.send(ev.Event(ev.RANKS, extra={"agent": os.getpid(), "node": node, "reserve": True}))
    signal.sigwait({REJOIN_SIGNAL})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {REJOIN_SIGNAL})
    os.write(woke, b"1")
    os.close(woke)
    return _run_agent(plan, sink, node)


#: The rendezvous round this agent's workers were started in (torchrun numbers a job's rendezvous rounds;
#: set in the agent by :func:`_note_rounds`, read in the workers it forks). None: not known.
_joined_round: int | None = None


def _note_rounds() -> None:
    """Keep the round of each rendezvous this process's agents join (:data:`_joined_round`). A worker stamps
    its events with it: torchrun's restart count grows only when a worker failed, not when a node joins
    (its agent restarts the workers for the new member with the same count, and the new node's agent gives
    its own 0), while every attempt of the job is a round of its rendezvous, the same number on every node.
    Reads torch's rendezvous handler; where it has no rounds, the restart count stands."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:
        return
    handler = dynamic_rendezvous.DynamicRendezvousHandler
    joined = handler.next_rendezvous
    if getattr(joined, "_resume_check_rounds", False):
        return

    def next_rendezvous(self: Any) -> Any:
        global _joined_round
        info = joined(self)
        state = getattr(getattr(self, "_state_holder", None), "state", None)
        number = getattr(state, "round", None)
        _joined_round = number if isinstance(number, int) else None
        return info

    next_rendezvous._resume_check_rounds = True  # type: ignore[attr-defined]
    handler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]


def _run_agent(plan: RunPlan, sink: ConnectionSink, node: int) -> int:
    """torchrun's agent of one node, in this process; its exit code. The agents besides node 0's report their
    pid (the harness kills a node whole, and preempts every agent)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if node:
        sink.send(ev.Event(ev.RANKS, extra={"agent": os.getpid(), "node": node}))
    where = f"{os.path.basename(plan.log_path)}.torchrun" + (f"-node{node}" if node else "")
    try:
        torchrun.main(torchrun_argv(plan, os.path.join(os.path.dirname(plan.log_path), where), node))
    except ChildFailedError as failed:
        # The agent gives up only once its restarts are used up: it made all of them.
        rank, failure = failed.get_first_failure()
        how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        text = (f"torchrun gave up after {plan.max_restarts} restart(s) (--max-restarts={plan.max_restarts}): "
                f"rank {rank} ended with {how}")
        write_quietly(sys.stderr, f"[launcher] {text}\n")
        if not node:
            sink.send(ev.Event(ev.ERROR, text=text, extra={"launcher": LAUNCHER_TORCHRUN}))
        return EXIT_RANK_DIED
    except BaseException as exc:  # torchrun itself failed, or its agent was signalled (preemption)
        write_quietly(sys.stderr, f"[launcher] torchrun raised {exc!r}\n{traceback.format_exc()}")
        return EXIT_RANK_DIED
    return 0


def torchrun_worker() -> None:
    """One worker of a torchrun job, forked from its agent: the run's plan with the world size torchrun gave
    it (after a restart, also a resume's: no kill, no pause, its state compared, ``restart`` set), a channel
    stamped with its rank and attempt (the rendezvous round, :func:`_note_rounds`), its pid, agent and node
    reported, the target run; returns to torchrun when it finished, exits with the code otherwise. In a cell
    whose lost node rejoins, the job without it checkpoints at the step the cell names and rank 0 waits
    there, as at a kill point, for the supervisor to bring the node back."""
    if _torchrun_job is None:
        raise RuntimeError("torchrun_worker.py runs only in a worker of a torchrun job the harness started")
    plan, conn, control = _torchrun_job
    for signum in _AGENT_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    attempt = _joined_round if _joined_round is not None else restart
    os.environ[ATTEMPT_ENV] = str(attempt)  # a program run by the worker learns it too
    # A restart without the lost node that the cell brings back: its checkpoint, where rank 0 waits.
    kill = plan.kill
    back = kill.rejoin if attempt and kill is not None and kill.node is not None and world < plan.world_size else None
    held = frozenset() if back is None else frozenset({back})
    plan = dataclasses.replace(plan, world_size=world)
    if attempt:
        plan = dataclasses.replace(plan, kill=None, pause_steps=held, checkpoint_steps=held,
                                   report_state=True, faults=None, restart=attempt)
    sink = ConnectionSink(conn, rank, plan.log_path, attempt=attempt or None)
    sink.send(ev.Event(ev.RANKS, extra={"pid": os.getpid(), "agent": os.getppid(), "world_size": world,
                                        "node": int(os.environ.get("GROUP_RANK") or 0)}))
    code = _run_target(plan, sink, control if rank == 0 and (not attempt or held) else None, rank)
    if code:
        _exit(code)


def _recorder(plan: RunPlan, sink: ConnectionSink, rank: int) -> Recorder | None:
    """The file-operation recorder of a run with a fault plan (None otherwise); in a run of several ranks, of
    this process's ``rank``."""
    if plan.faults is None:
        return None
    from pytest_resume_check.child.recorder import Recorder

    if importlib.util.find_spec("torch") is not None:
        importlib.import_module("torch")  # so torch.save to a path is wrapped too

    def report(op: Any) -> None:
        sink.send(ev.Event(ev.FILE_OP, path=op.path, text=op.kind,
                           extra={"index": op.index, "target": op.target, "lane": op.lane}))

    recorder = Recorder(plan.faults, plan.checkpoint_dir, report, lambda why, extra: None,
                        rank if plan.world_size > 1 else None)
    recorder.install()
    return recorder


#: The signal that makes a run's process write the Python stack of each of its threads into the run's log
#: (the supervisor sends it to a hung run's processes before it kills them). Its default action
#: stops the process, and the handler ends by restoring that action and raising the signal again, so the
#: process stops once its stacks are written: that is how the supervisor knows they are complete. Nothing
#: else sends SIGTTOU to a run: it is the signal for a background write to a terminal, and a run writes to
#: its log file. A program run as a command starts without the handler (exec resets it).
STACKS_SIGNAL = signal.SIGTTOU
def _install_stack_dump(log_path: str) -> None:
    """On :data:`STACKS_SIGNAL`, write every thread's Python stack into the run's log and stop. Installed in
    the process that starts the target (after the fork from the server, which never has it), through a
    descriptor of its own: the trainer's stdout and stderr may be closed or redirected by then. A stack is
    written from C, so it comes also when the thread that holds the interpreter is stuck in a C call (a
    collective that never returns)."""
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return
    try:
        # The action the handler chains to: stop (a session started in the background may ignore it).
        signal.signal(STACKS_SIGNAL, signal.SIG_DFL)
        faulthandler.register(STACKS_SIGNAL, file=fd, all_threads=True, chain=True)
    except (OSError, RuntimeError, ValueError):  # no handler: the report shows no stacks, nothing else changes
        os.close(fd)


def _redirect_output(log_path: str) -> None:
    """Send the child's stdout and stderr (also of C code and loader workers) to its log file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
