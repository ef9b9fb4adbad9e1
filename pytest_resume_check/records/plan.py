"""What the parent tells a child run: where to kill it and everything else it needs to start (plain,
picklable data; imported by both sides of the pipe)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_resume_check.records.faults import MODE_CRASH, MODE_ERROR, MODE_POWER, MODE_TORN, FaultPlan

#: Resume modes a target must understand.
RESUME_AUTO = "auto"
RESUME_PATH = "path"
RESUME_DISABLED = "disabled"
RESUME_MODES = (RESUME_AUTO, RESUME_PATH, RESUME_DISABLED)

#: Kill signals: SIGKILL at the kill point, or SIGTERM there and SIGKILL after a grace period (preemption).
SIGNAL_KILL = "kill"
SIGNAL_TERM = "term"

#: Who starts the ranks of a run: the harness itself (a fork per rank), or torchrun (torch's elastic agent,
#: run in the run's process, which forks its workers).
LAUNCHER_HARNESS = "harness"
LAUNCHER_TORCHRUN = "torchrun"
LAUNCHERS = (LAUNCHER_HARNESS, LAUNCHER_TORCHRUN)


@dataclass(frozen=True)
class KillSpec:
    """Where one run is killed.

    ``checkpoint_step``: the harness asks the trainer to checkpoint at this step (0: no checkpoint).
    ``extra_steps``: 0 kills right after that checkpoint is published; m > 0 kills at the end of step
    ``checkpoint_step + m``, so m steps of work were done but never saved and must be redone.
    """

    checkpoint_step: int
    extra_steps: int = 0
    #: A fault during the save of ``checkpoint_step`` (crash point, I/O error, power loss, torn file).
    fault: FaultPlan | None = None
    #: ``kill`` (SIGKILL) or ``term`` (SIGTERM to every rank, SIGKILL to the run ``grace`` seconds later).
    signal: str = SIGNAL_KILL
    grace: float = 0.0
    #: Multi-rank runs: kill only this rank (its launcher must end the others); None kills all at once.
    rank: int | None = None
    #: Elastic resume: the run after this kill has this many ranks (None: the same as the killed run).
    resume_world_size: int | None = None
    #: Simulated nodes of a torchrun target: kill this node whole (its agent and its workers); torchrun's
    #: agents on the other nodes go on without it at a smaller world size (None: no node).
    node: int | None = None
    #: torchrun targets: SIGKILL to the agent of node 0 alone (its workers get SIGINT from the kernel, the
    #: parent-death signal torch gives them) instead of to every process of the run.
    agent: bool = False
    #: With ``node``: the lost node comes back. Its agent starts again once the job that went on without it
    #: has published the checkpoint of this step (the job held there, as at a kill point); torchrun's agents
    #: then stop their workers for the new member and the job goes on on every node (None: it never does).
    #: Without ``node``: the attempt of a torchrun job that was stopped there for the node
    #: (:func:`~pytest_resume_check.records.results.split_restarts`).
    rejoin: int | None = None

    @property
    def kill_step(self) -> int:
        """The step during which the kill happens."""
        return self.checkpoint_step + self.extra_steps

    def to_json(self) -> dict[str, Any]:
        """The structured form reports carry (``kills`` of a cell's JSON)."""
        data: dict[str, Any] = {"checkpoint_step": self.checkpoint_step, "extra_steps": self.extra_steps}
        if self.fault is not None:
            data["fault"] = self.fault.to_json()
        if self.signal != SIGNAL_KILL:
            data["signal"], data["grace"] = self.signal, self.grace
        if self.rank is not None:
            data["rank"] = self.rank
        if self.resume_world_size is not None:
            data["resume_world_size"] = self.resume_world_size
        if self.node is not None:
            data["node"] = self.node
        if self.agent:
            data["agent"] = True
        if self.rejoin is not None:
            data["rejoin"] = self.rejoin
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KillSpec:
        """Inverse of :meth:`to_json`."""
        fault = data.get("fault")
        rank, world, node = data.get("rank"), data.get("resume_world_size"), data.get("node")
        rejoin = data.get("rejoin")
        return cls(int(data["checkpoint_step"]), int(data.get("extra_steps", 0)),
                   FaultPlan.from_json(fault) if fault else None, str(data.get("signal", SIGNAL_KILL)),
                   float(data.get("grace", 0.0)), None if rank is None else int(rank),
                   None if world is None else int(world), None if node is None else int(node),
                   bool(data.get("agent", False)), None if rejoin is None else int(rejoin))

    def describe(self) -> str:
        """Words for reports: ``killed after checkpoint 3 was published``."""
        text = self._describe_point()
        if self.signal == SIGNAL_TERM:
            text = text.replace("killed", f"sent SIGTERM (SIGKILL {self.grace:g} s later)", 1)
        if self.rank is not None:
            text = text.replace("killed", f"rank {self.rank} alone killed", 1)
        if self.node is not None:
            text = text.replace("killed", f"node {self.node} killed whole (its torchrun agent and workers)", 1)
        if self.agent:
            text = text.replace("killed", "torchrun's agent alone killed", 1)
        if self.rejoin is not None and self.node is None:
            text = text.replace("killed", "stopped by torchrun for the lost node's return", 1)
        elif self.rejoin is not None:
            text += f"; it rejoined after the job without it published checkpoint {self.rejoin}"
        if self.resume_world_size is not None:
            text += f"; resumed with {self.resume_world_size} rank{'' if self.resume_world_size == 1 else 's'}"
        return text

    def _describe_point(self) -> str:
        if self.fault is not None:
            f = self.fault
            what = {MODE_CRASH: "killed", MODE_POWER: "killed with power loss", MODE_TORN: "killed leaving a torn file",
                    MODE_ERROR: "I/O error injected"}.get(f.mode, f.mode)
            return f"{what} at file operation {f.op} of the save of step {self.checkpoint_step}"
        if self.extra_steps == 0:
            return f"killed right after checkpoint of step {self.checkpoint_step} was published"
        if self.checkpoint_step == 0:
            return f"killed at the end of step {self.kill_step}, before any checkpoint"
        return (
            f"killed at the end of step {self.kill_step}, "
            f"{self.extra_steps} unsaved step(s) after checkpoint {self.checkpoint_step}"
        )


#: Where a resumed run whose state equals the reference's may stop early (``early_stop`` of a target):
#: only at a step that ends an epoch (the default: what a loader keeps only within an epoch, its workers'
#: generators and prefetched batches, is rebuilt at the next from state that is compared), at any step
#: (the target's reported state is complete), or never (every resumed run trains to the end).
EARLY_STOP_EPOCH = "epoch"
EARLY_STOP_ANY = "any"
EARLY_STOP_NEVER = "never"
EARLY_STOPS = (EARLY_STOP_EPOCH, EARLY_STOP_ANY, EARLY_STOP_NEVER)


@dataclass(frozen=True)
class CommandSpec:
    """How a command target starts its program (see :mod:`pytest_resume_check.child.command`)."""

    argv: tuple[str, ...]
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    #: Zero-change targets: the glob (relative to the checkpoint folder) of the checkpoints the program
    #: publishes without reporting (see :mod:`pytest_resume_check.child.watch`); None: the program reports.
    checkpoints: str | None = None
    #: Files the program delivers (globs relative to the checkpoint folder), digested after it exits as the
    #: run's final outputs.
    outputs: tuple[str, ...] = ()
    #: Start ``{python} script.py`` as a process of its own even though it could run in the run's process,
    #: forked from the preloaded server (see :func:`pytest_resume_check.child.command.python_program`).
    fresh_interpreter: bool = False
    #: Zero-change targets that commit each checkpoint through a pointer or tracker file: its glob (relative to
    #: the checkpoint folder), as declared (``commit=``); None: declared none (one may be recognised, see
    #: :attr:`RunPlan.commit`).
    commit: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """Everything a child needs to start one run (picklable, sent to the child)."""

    target_name: str
    target_ref: tuple[str, str, str]
    case: Mapping[str, Any]
    seed: int
    checkpoint_dir: str
    log_path: str
    resume_mode: str = RESUME_AUTO
    resume_path: str | None = None
    checkpoint_steps: frozenset[int] = frozenset()
    kill: KillSpec | None = None
    is_resume: bool = False
    #: The reference's component digests by step: a resumed run whose state equals them stops early.
    converge: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    #: The reference's consumed inputs by step (:func:`~pytest_resume_check.records.ledger.step_inputs_digest`),
    #: up to the step after its last ``converge`` step: a resumed run whose state equals the reference's at
    #: step s stops only if it took the same inputs at each of its steps and takes step s + 1's next (its
    #: position in the epoch matches too: no replay pending, no longer epoch).
    converge_inputs: Mapping[int, str] = field(default_factory=dict)
    #: Whether ``run.state`` digests what the target reports (reference and resumed runs; a first run's
    #: state is never compared, so it costs nothing there).
    report_state: bool = False
    #: (rtol, atol): compare state values under this tolerance instead of digests.
    state_tolerance: tuple[float, float] | None = None
    #: Record the process-global generators at every step end (runs whose state is compared).
    capture_rng: bool = True
    #: The target's state does not depend on the world size: judged in elastic cells too.
    elastic_state: bool = False
    #: Tolerance mode: where this run writes its state values per step (the first reference run) and
    #: where the reference's values are that this run compares with.
    state_values_dir: str | None = None
    state_reference_dir: str | None = None
    #: Marks every process of this run (its environment), so escaped ones can be found and killed.
    token: str = ""
    #: A run that goes on past this step is stopped and judged PROTOCOL (None: no limit). Three times the
    #: case's steps: a resume that replays inputs legitimately runs past the last step, and its verdict
    #: (DUPLICATED) must come from its ledger; only a run that never stops is cut off.
    step_limit: int | None = None
    #: Steps after whose checkpoint the child pauses until the supervisor has copied the directory.
    pause_steps: frozenset[int] = frozenset()
    #: File-operation faults during one save (see :mod:`pytest_resume_check.records.faults`).
    faults: FaultPlan | None = None
    #: A command target's program (None: the target function is the trainer).
    command: CommandSpec | None = None
    #: A zero-change program's commit point, the glob of the file whose final name publishes a checkpoint: the
    #: declared one, or the one recognised in the target's uninterrupted run (None: checkpoints publish
    #: themselves; see :mod:`pytest_resume_check.records.commits`).
    commit: str | None = None
    #: Environment variables the run gets from the target's services (see :mod:`..services`).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Ranks of this run: more than one makes the child their launcher (see :mod:`..child`), with the
    #: rendezvous on loopback at ``master_port`` (free when the plan was made).
    world_size: int = 1
    master_port: int = 0
    #: The ranks besides rank 0 that report their steps (learned from a finished run of the target; None:
    #: all). An all-ranks kill and a snapshot wait until each has reported the kill point's step end.
    step_ranks: tuple[int, ...] | None = None
    #: Who starts the ranks (:data:`LAUNCHERS`); under torchrun, how many times its agent may restart the
    #: workers inside the run (``--max-restarts``).
    launcher: str = LAUNCHER_HARNESS
    max_restarts: int = 0
    #: Set in a torchrun worker that its agent restarted: the restart's number (the kill was the first
    #: attempt's; the state of every restart is compared, as a resumed run's).
    restart: int = 0
    #: Under torchrun: the nodes of a run, (least, most) as ``--nnodes=MIN:MAX``; a run starts an agent for
    #: each of the most on loopback, ``world_size // most`` workers each.
    nnodes: tuple[int, int] = (1, 1)
    #: A command target's Python program run in the run's process tells which packages it imported that the
    #: fork server had not (asked until one run of the target has told; :data:`~.events.IMPORTED`).
    report_imports: bool = False

    @property
    def restarts_in_job(self) -> bool:
        """A one-rank kill of this run is followed by torchrun restarting the workers within the run."""
        return self.launcher == LAUNCHER_TORCHRUN and self.max_restarts > 0

    @property
    def nproc_per_node(self) -> int:
        """Ranks (torchrun workers) on each simulated node."""
        return max(1, self.world_size // self.nnodes[1])

    @property
    def watched_rank(self) -> int:
        """The rank whose report calls carry the kill point (rank 0 unless one rank or node alone is killed:
        that rank, or the node's first)."""
        if self.kill is not None and self.kill.node is not None:
            return self.kill.node * self.nproc_per_node
        return self.kill.rank if self.kill is not None and self.kill.rank is not None else 0
