"""Start and supervise the runs of a session: plans with their paths, the cost counters (trainer steps,
and where the runs' time went: before their first step or after)."""

from __future__ import annotations

import math
import random
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_resume_check.child.command import program_imports, python_program
from pytest_resume_check.process import devices
from pytest_resume_check.process import supervisor as sv
from pytest_resume_check.process.fork_server import ForkServer
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.services import Services
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import FaultPlan
from pytest_resume_check.records.names import DEFAULT_HANG_TIMEOUT, case_id
from pytest_resume_check.records.plan import LAUNCHER_HARNESS, LAUNCHER_TORCHRUN, RESUME_AUTO, KillSpec, RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.targets import Target, TargetError, run_resources

#: The longest hang limit a run can wait for (about 23 days): ``poll()`` takes at most 2**31 - 1 ms, and a
#: longer wait crashed every cell. Longer limits, ``inf`` and 0 (both: no limit) become this.
MAX_HANG_TIMEOUT = 2_000_000.0


def hang_limit(seconds: float) -> float:
    """``seconds`` as a hang limit the process layer accepts; nan and negative values raise ValueError."""
    seconds = float(seconds)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"hang_timeout={seconds!r} must be a number of seconds >= 0 (0 or inf: no limit)")
    return MAX_HANG_TIMEOUT if seconds == 0 else min(seconds, MAX_HANG_TIMEOUT)


@dataclass
class StartCosts:
    """Where the runs' time went, per target: each run's seconds before its first step (all of it for a
    run that took none: a resume at the end, a trainer that failed to start) and the seconds of all its
    runs. Hung runs are left out: their time is the hang limit, not the trainer's."""

    #: target -> seconds before the first step, one per counted run.
    starts: dict[str, list[float]] = field(default_factory=dict)
    #: target -> seconds of its counted runs, start to exit.
    seconds: dict[str, float] = field(default_factory=dict)
    #: Targets declared with ``auto_preload=False``.
    manual: set[str] = field(default_factory=set)
    #: Command targets whose program is a process of its own each run (no preload of ours can spare its
    #: imports; a Python program run in the run's process gets them preloaded).
    commands: set[str] = field(default_factory=set)
    #: target -> the packages its Python program imported in a run that the fork server had not (told once).
    imported: dict[str, list[str]] = field(default_factory=dict)

    def add(self, target: Target, record: RunRecord) -> None:
        """Count one finished run of ``target``."""
        if record.imported is not None:
            self.imported.setdefault(target.name, record.imported)
        if record.outcome == Outcome.HUNG or record.seconds <= 0:
            return
        start = record.first_step_seconds if record.first_step_seconds is not None else record.seconds
        self.starts.setdefault(target.name, []).append(min(start, record.seconds))
        self.seconds[target.name] = self.seconds.get(target.name, 0.0) + record.seconds
        if not target.auto_preload:
            self.manual.add(target.name)
        if target.command is not None and python_program(target.command) is None:
            self.commands.add(target.name)

    def to_json(self, notes: Sequence[str] = ()) -> dict[str, Any]:
        """Plain data (it may cross a process boundary): ``{"targets": {name: {"starts": [...], "seconds":
        s, "auto_preload": bool, "command": bool, "imported": [package, ...]}}, "not_preloaded": [what
        auto_preload could not do, one line each]}``; ``imported`` only for a target whose runs told it."""
        targets: dict[str, dict[str, Any]] = {
            name: {"starts": [round(x, 4) for x in starts], "seconds": round(self.seconds[name], 4),
                   "auto_preload": name not in self.manual, "command": name in self.commands}
            for name, starts in self.starts.items()}
        for name, packages in self.imported.items():
            if name in targets:
                targets[name]["imported"] = list(packages)
        return {"targets": targets, "not_preloaded": list(notes)}


class Runner:
    """Makes the plan of each run and runs it; counts the trainer steps they execute (for benchmarks) and
    where the runs' time went (:class:`StartCosts`)."""

    def __init__(self, seed: int, hang_timeout: float = DEFAULT_HANG_TIMEOUT, isolation: str | None = None,
                 hang_forced: bool = False, fork_server: ForkServer | None = None):
        self.seed = seed
        #: The fork server the runs are forked from (the engine's; a runner made alone has its own).
        self.fork_server = fork_server if fork_server is not None else ForkServer()
        self.hang_timeout = hang_limit(hang_timeout)
        #: The session's limit was given on the command line: it wins over the targets' own.
        self.hang_forced = hang_forced
        self.isolation = isolation
        self.steps_executed = 0
        self.costs = StartCosts()
        #: The targets' shared services, started on a target's first plan (:meth:`close` stops them).
        self.services = Services()
        #: (target, world size) -> the ranks besides rank 0 that reported step ends in a finished run.
        self._step_ranks: dict[tuple[str, int], tuple[int, ...]] = {}
        #: (target, case id) -> the commit point recognised in the case's uninterrupted run (zero-change
        #: targets that declare none; :meth:`recognise`).
        self._commits: dict[tuple[str, str], str] = {}

    def recognise(self, target: Target, case: Mapping[str, Any], commit: str) -> None:
        """From now on, runs of ``target`` in ``case`` follow the commit point ``commit`` (recognised in the
        case's uninterrupted run)."""
        self._commits[(target.name, case_id(case))] = commit

    def commit_of(self, target: Target, case: Mapping[str, Any]) -> str | None:
        """The commit point the runs of ``target`` in ``case`` follow: declared, or recognised; None for none."""
        command = target.command
        if command is None or command.checkpoints is None:
            return None
        return command.commit or self._commits.get((target.name, case_id(case)))

    def plan(self, target: Target, case: Mapping[str, Any], workdir: Path, index: int, *, out: Path | None = None,
             resume_mode: str = RESUME_AUTO, resume_path: str | None = None, kill: KillSpec | None = None,
             checkpoint_steps: Sequence[int] = (), is_resume: bool = False,
             converge: Mapping[int, Mapping[str, str]] | None = None,
             converge_inputs: Mapping[int, str] | None = None, pause_steps: Sequence[int] = (),
             faults: FaultPlan | None = None, report_state: bool = False, state_values_dir: str | None = None,
             state_reference_dir: str | None = None, world_size: int | None = None) -> RunPlan:
        """A plan for run ``index`` of ``target`` whose files live under ``workdir`` (checkpoints in
        ``out``, by default the layout's for ``resume_mode``). ``report_state``: the run digests the state
        the target reports (reference and resumed runs); the target's ``state_tolerance`` comes along.
        ``world_size``: the run's ranks (the target's by default; another number after an elastic kill)."""
        ckpt = out if out is not None else Layout.out(workdir, resume_mode, index)
        ckpt.mkdir(parents=True, exist_ok=True)
        if kill is not None and kill.checkpoint_step:
            checkpoint_steps = (*checkpoint_steps, kill.checkpoint_step)
        world = int(world_size or target.world_size)
        distributed = world > 1 or target.world_size > 1 or bool(target.elastic) or target.launcher != LAUNCHER_HARNESS
        if distributed:
            # One rank stopping early would leave the others waiting in a collective; after an elastic
            # resume the state cannot equal the reference's.
            converge = converge_inputs = None
        return RunPlan(
            target_name=target.name, target_ref=target.ref, case=dict(case), seed=self.seed,
            checkpoint_dir=str(ckpt), log_path=str(Layout.log(workdir, index)),
            resume_mode=resume_mode, resume_path=resume_path, checkpoint_steps=frozenset(checkpoint_steps),
            kill=kill, is_resume=is_resume, converge=dict(converge or {}), converge_inputs=dict(converge_inputs or {}),
            pause_steps=frozenset(pause_steps),
            faults=faults if faults is not None else (kill.fault if kill is not None else None),
            report_state=report_state, state_tolerance=target.state_tolerance,
            capture_rng=target.capture_rng and target.command is None, elastic_state=target.elastic_state,
            state_values_dir=state_values_dir,
            state_reference_dir=state_reference_dir, token=uuid.uuid4().hex, step_limit=_step_limit(target, case),
            command=target.command, commit=self.commit_of(target, case),
            report_imports=target.command is not None and target.name not in self.costs.imported,
            env={**_devices(target), **self.services.env_for(target, self.hang_limit_of(target))},
            world_size=world, master_port=free_port() if distributed else 0,
            step_ranks=self._step_ranks.get((target.name, world)), launcher=target.launcher,
            max_restarts=target.max_restarts, nnodes=target.nnodes,
        )

    def run(self, plan: RunPlan, target: Target, on_pause: Callable[[int], None] | None = None) -> RunRecord:
        """One supervised child run."""
        isolation = self.isolation or target.isolation
        if target.command is not None and target.auto_preload:  # what a Python program imports, as for a module
            for module, file in program_imports(target.command):
                self.fork_server.add_auto(module, file)
        # Adds them to the server's preload (and the module that declares the target, with auto_preload).
        preload = target.preload + (("torch.distributed.run",) if target.launcher == LAUNCHER_TORCHRUN else ())
        self.fork_server.check_preload(target.name, preload, isolation,
                                       declared_in=target.ref[:2] if target.auto_preload else None)
        record = sv.supervise(plan, isolation=isolation, hang_timeout=self.hang_limit_of(target), on_pause=on_pause,
                              fork_server=self.fork_server)
        self.steps_executed += record.steps_run
        self.costs.add(target, record)
        if plan.world_size > 1 and record.outcome == Outcome.DONE:  # which ranks report steps (the reference says)
            ranks = {e.rank for e in record.events if e.kind == ev.STEP_END and e.rank}
            self._step_ranks.setdefault((target.name, plan.world_size), tuple(sorted(r for r in ranks if r)))
        return record

    def start_costs(self) -> dict[str, Any]:
        """Where this runner's runs spent their time, with what auto_preload could not do (plain data)."""
        return self.costs.to_json(self.fork_server.auto_preload_notes())

    def close(self) -> list[str]:
        """Stop the services this runner started; returns what went wrong (one line each)."""
        return self.services.close()

    def hang_limit_of(self, target: Target) -> float:
        """The hang limit of ``target``'s runs: its own, unless the command line set the session's."""
        if target.hang_timeout is None or self.hang_forced:
            return self.hang_timeout
        return hang_limit(target.hang_timeout)


#: Rendezvous ports are drawn below the kernel's ephemeral range (where the ranks' own connections get
#: their ports), so no connection can take one between the draw and rank 0 binding it.
PORT_FLOOR = 10000
#: The OS's randomness: a test session that seeds ``random`` the same in every xdist worker must not
#: make the workers draw the same ports.
_PORTS = random.SystemRandom()


def free_port() -> int:
    """A TCP port on loopback that is free now (the rendezvous port of one multi-rank run)."""
    low = _ephemeral_low()
    for _ in range(50):
        port = _PORTS.randrange(PORT_FLOOR, low) if low > PORT_FLOOR else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free TCP port on 127.0.0.1 between {PORT_FLOOR} and {low} for a rendezvous")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _devices(target: Target) -> dict[str, str]:
    """The GPUs a run of ``target`` may use (none asked: nothing); :class:`TargetError` where there are too few."""
    try:
        return devices.device_env(target.name, run_resources(target).get("GPU", 0.0))
    except ValueError as exc:
        raise TargetError(str(exc)) from None


#: A run may take this many times its case's steps before it is stopped as a runaway.
STEP_LIMIT_FACTOR = 3


def _step_limit(target: Target, case: Mapping[str, Any]) -> int | None:
    """The step no run may pass (None if the case's steps cannot be asked)."""
    try:
        return STEP_LIMIT_FACTOR * int(target.steps(case))
    except Exception:  # a broken steps() is reported where the matrix is built
        return None
