"""Results as plain data: what a run did, what a verdict found, what a cell came to.

Defined below everything that produces or reads them: the supervisor fills :class:`RunRecord`, the
verdict makes :class:`Finding` and :class:`Verdict`, the engine wraps them in :class:`CellResult`, and
the reports read them. This module imports nothing that starts processes or judges anything.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_resume_check.categories import STATE_DIVERGED, VERDICT_CATEGORIES
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import DiskDamage
from pytest_resume_check.records.ledger import Ledger
from pytest_resume_check.records.plan import SIGNAL_TERM, KillSpec, RunPlan

if TYPE_CHECKING:
    from pytest_resume_check.cells.matrix import Cell

class Outcome(str, enum.Enum):
    """How a run ended. Each member is its value, so JSON and comparisons with strings read back from JSON
    see ``"done"``, ``"killed"``...; ``str()`` and f-strings give the value too (``enum.StrEnum`` needs
    Python 3.11, and the project supports 3.10)."""

    #: The target returned.
    DONE = "done"
    #: Killed by the harness at the planned point.
    KILLED = "killed"
    #: The target raised an exception.
    RAISED = "raised"
    #: The process died by itself (non-zero exit, signal) without reporting an error.
    CRASHED = "crashed"
    #: No event within the hang limit; killed.
    HUNG = "hung"
    #: A resumed run reached the reference's state and stopped; the rest is the reference's.
    CONVERGED = "converged"

    def __str__(self) -> str:
        return self.value


#: Outcomes of a run that got to the end of its training (itself, or by reaching the reference's state).
FINISHED = frozenset({Outcome.DONE, Outcome.CONVERGED})
#: Outcomes of a run that ended as the cell planned: finished, or killed at its kill point.
AS_PLANNED = FINISHED | {Outcome.KILLED}


@dataclass
class StepState:
    """A run's state after one step: digests by component and their leaves' digests by path (exact
    mode), or, under a tolerance, the first leaf of each component that is not close to the reference's
    (None when all are close; compared in the child)."""

    digests: dict[str, str] = field(default_factory=dict)
    leaves: dict[str, dict[str, str]] = field(default_factory=dict)
    compared: dict[str, str | None] = field(default_factory=dict)
    #: The process-global generators the harness captured as the next step took its first inputs (digests
    #: and leaves by generator): what a resume of this step continues from, whenever the trainer restored
    #: them before it took those inputs.
    before_next: dict[str, str] = field(default_factory=dict)
    before_next_leaves: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Final outputs only: the declared outputs the run did not deliver, each with where it was expected.
    missing: dict[str, str] = field(default_factory=dict)


def _merge(state: StepState, event: ev.Event) -> None:
    """Add a state event's components to ``state``."""
    if event.extra.get(ev.STATE_BEFORE_NEXT):
        state.before_next.update(event.extra.get(ev.STATE_DIGESTS, {}))
        state.before_next_leaves.update(event.extra.get(ev.STATE_LEAVES, {}))
        return
    state.digests.update(event.extra.get(ev.STATE_DIGESTS, {}))
    state.leaves.update(event.extra.get(ev.STATE_LEAVES, {}))
    state.compared.update(event.extra.get(ev.STATE_COMPARED, {}))
    state.missing.update(event.extra.get(ev.FINAL_MISSING, {}))


@dataclass
class RunRecord:
    """Everything observed of one child run."""

    plan: RunPlan
    events: list[ev.Event] = field(default_factory=list)
    outcome: Outcome = Outcome.CRASHED
    exitcode: int | None = None
    error: str | None = None
    seconds: float = 0.0
    hang_timeout: float | None = None
    pid: int | None = None
    isolation: str | None = None
    #: Seconds from starting the child to its first event (start-up cost of the run).
    first_event_seconds: float | None = None
    #: Seconds from starting the child to receiving its first ``step_end`` (rendezvous of ranks included).
    first_step_seconds: float | None = None
    #: What the harness did to the disk after the kill (power loss, torn files).
    damage: DiskDamage = field(default_factory=DiskDamage)
    #: Processes of the run that escaped its process group (setsid, double fork) and were killed after it.
    leftovers: int = 0
    #: A run with one rank killed alone: who ended the other ranks, and how fast.
    teardown: str | None = None
    #: A ``HUNG`` run that was not silent: what it failed to do within the hang limit (a rank that never
    #: reported the kill point's step end).
    stalled: str | None = None
    #: A ``HUNG`` run: each process that ran its target (its rank; None in a one-process run) and whether it
    #: wrote every thread's stack into the run's log before the run was killed (False: it had ended, or it
    #: had no handler to write them).
    stack_dumps: list[tuple[int | None, bool]] = field(default_factory=list)

    @property
    def stacks_in_log(self) -> list[int | None]:
        """The ranks (None: the one process of a one-process run) whose stacks are in the run's log."""
        return [rank for rank, wrote in self.stack_dumps if wrote]

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)  # a plain ``"done"`` (a test's, one read from JSON) becomes its member

    def _lead(self, kind: str) -> list[ev.Event]:
        """The run's events of ``kind`` from rank 0 (all of them in a one-process run): the ranks of a
        multi-rank run each report their steps and checkpoints, and rank 0 speaks for the run."""
        return [e for e in self.events if e.kind == kind and not e.rank]

    @property
    def resumed_by_rank(self) -> dict[int, tuple[int, str | None]]:
        """(step, path) each rank reported restoring (rank 0 in a one-process run)."""
        out: dict[int, tuple[int, str | None]] = {}
        for e in self.events:
            if e.kind == ev.RESUMED:
                out.setdefault(e.rank or 0, (e.step or 0, e.path))
        return dict(sorted(out.items()))

    @property
    def resumed_step(self) -> int | None:
        """Step of the checkpoint this run reported restoring (0: fresh), None if it never said."""
        return next((e.step for e in self._lead(ev.RESUMED)), None)

    @property
    def resumed_path(self) -> str | None:
        return next((e.path for e in self._lead(ev.RESUMED)), None)

    @property
    def published(self) -> list[tuple[int, str | None]]:
        """(step, path) of every checkpoint this run published, in order."""
        return [(e.step or 0, e.path) for e in self._lead(ev.CHECKPOINT)]

    @property
    def settings(self) -> dict[str, Any]:
        """How the framework in this run was set up, as its integration reported it (``run.settings``; rank 0
        speaks for the run, a later report of a name wins)."""
        out: dict[str, Any] = {}
        for e in self._lead(ev.SETTINGS):
            out.update(e.extra)
        return out

    @property
    def signalled(self) -> ev.Event | None:
        """The SIGTERM (or one rank's SIGKILL) the supervisor sent this run, if any."""
        return next((e for e in self.events if e.kind == ev.SIGNALLED), None)

    @property
    def states(self) -> dict[int, StepState]:
        """The state rank 0 (the only process of a one-process run) reported after each step, components of
        several calls merged."""
        return self.states_by_rank.get(0, {})

    @property
    def states_by_rank(self) -> dict[int, dict[int, StepState]]:
        """The state each rank reported after each step: rank -> step -> state.

        Of a killed run, what it reported for its kill step (and later) counts only as far as the kill's
        timing does not decide it: on a rank the kill waited for (the one at the kill point, the ranks an
        all-ranks kill waited for, every rank of a preempted run), what the rank sent before its
        ``step_end`` of that step; nothing of the other ranks. A rank the kill did not wait for, or a
        report after the step's end, may or may not have reached the channel before the SIGKILL."""
        cut = self._state_cut()
        ended: set[int] = set()
        out: dict[int, dict[int, StepState]] = {}
        for e in self.events:
            rank = e.rank or 0
            if cut is not None and e.kind == ev.STEP_END and (e.step or 0) >= cut[0]:
                ended.add(rank)
            if e.kind != ev.STATE or e.step is None:
                continue
            if cut is not None and e.step >= cut[0] and (rank in ended or (cut[1] is not None and rank not in cut[1])):
                continue
            _merge(out.setdefault(rank, {}).setdefault(e.step, StepState()), e)
        return dict(sorted(out.items()))

    def _state_cut(self) -> tuple[int, set[int] | None] | None:
        """A killed run's kill step and the ranks whose reports of it are complete up to their end of that
        step (None: every rank); None for a run that was not killed."""
        kill = self.plan.kill
        if self.outcome != Outcome.KILLED or kill is None:
            return None
        if kill.signal == SIGNAL_TERM:
            return kill.kill_step, None  # every rank gets SIGTERM and goes on to its step's end
        if kill.rank is not None and self.plan.world_size > 1:
            return kill.kill_step, {kill.rank}
        if kill.node is not None:  # the node's ranks: the first carried the kill point, the others may not be there
            return kill.kill_step, {self.plan.watched_rank}
        signalled = self.signalled
        past = signalled.extra.get("ranks_past", ()) if signalled is not None else ()
        return kill.kill_step, {0, *(int(r) for r in past)}

    @property
    def finals(self) -> dict[int, StepState]:
        """What each rank reported as the job's final outputs (``run.final``), by rank."""
        out: dict[int, StepState] = {}
        for e in self.events:
            if e.kind == ev.FINAL:
                _merge(out.setdefault(e.rank or 0, StepState()), e)
        return dict(sorted(out.items()))

    @property
    def environ_read(self) -> list[str]:
        """The environment variables the project's code read in this run (any rank), in the order first read."""
        return list(dict.fromkeys(e.text for e in self.events if e.kind == ev.ENVIRON and e.text))

    @property
    def ran_fresh(self) -> list[str]:
        """The ``env=`` variables for which this run's Python program ran in a fresh interpreter instead of the
        run's process (:data:`~pytest_resume_check.records.events.RAN_FRESH`; none: it did not)."""
        return [name for e in self.events if e.kind == ev.RAN_FRESH and e.text for name in e.text.split(",")]

    @property
    def imported(self) -> list[str] | None:
        """The packages this run's Python program imported that the fork server had not (None: not told;
        :data:`~pytest_resume_check.records.events.IMPORTED`)."""
        return next((list(e.extra[ev.IMPORTED_NAMES]) for e in self.events if e.kind == ev.IMPORTED), None)

    @property
    def converged_step(self) -> int | None:
        return next((e.step for e in self.events if e.kind == ev.CONVERGED), None)

    @property
    def steps_run(self) -> int:
        """Trainer steps this run executed (for cost accounting)."""
        return len(self._lead(ev.STEP_END))

    @property
    def last_step(self) -> int:
        steps = [e.step for e in self._lead(ev.STEP_END) if e.step is not None]
        return max(steps, default=0)

    def describe(self) -> str:
        """``killed right after checkpoint of step 3 was published`` and the like (``torchrun's restart 1:
        ran to the end`` for a restart torchrun made within a run)."""
        what = self._describe_outcome()
        return f"torchrun's restart {self.plan.restart}: {what}" if self.plan.restart else what

    def _kill_text(self) -> str | None:
        """What the process said where it was killed; in a save of several ranks, every rank's, the killed
        rank's first (``rank 1 killed before ...; rank 0 stopped before barrier() ...``)."""
        said = [e for e in self.events if e.kind == ev.KILL_READY and e.text]
        if len(said) > 1 and self.plan.faults is not None:
            fault = self.plan.faults
            killed = (fault.rank or 0, fault.lane or 0)
            said = sorted(said, key=lambda e: ((e.rank or 0, int(e.extra.get("lane") or 0)) != killed, e.rank or 0,
                                               int(e.extra.get("lane") or 0)))
            return "; ".join(e.text or "" for e in said)
        return said[0].text if said else None

    def _describe_outcome(self) -> str:
        if self.outcome == Outcome.KILLED and self.plan.kill is not None:
            text = self._kill_text()
            if self.plan.faults is not None and text:
                node = self.plan.faults.lost_ranks(self.plan.nproc_per_node)
                lost = "" if node is None else (f"; power lost on node {self.plan.faults.node} alone (rank"
                                                f"{'s' if len(node) > 1 else ''} {', '.join(map(str, node))}: the "
                                                "other nodes' writes kept)")
                return f"{text} (save of step {self.plan.kill.checkpoint_step}){lost}" + "".join(
                    f"; {n}" for n in self.damage.describe())
            return self.plan.kill.describe()
        if self.outcome == Outcome.DONE:
            return "ran to the end"
        if self.outcome == Outcome.CONVERGED:
            return f"reached the reference's exact state at step {self.converged_step} (the rest is the reference's)"
        if self.outcome == Outcome.RAISED:
            return "raised " + (self.error or "").strip().splitlines()[-1] if self.error else "raised"
        if self.outcome == Outcome.HUNG and self.stalled:
            return f"hung: {self.stalled}"
        if self.outcome == Outcome.HUNG:
            return f"hung after step {self.last_step}"
        return f"died by itself (exit code {self.exitcode}) after step {self.last_step}"


def attempts_of(events: list[ev.Event]) -> list[int]:
    """The attempt each event belongs to (torchrun restarts the workers of a run within it): the
    attempt its worker stamped, or, for an event of the launcher or the supervisor, that of the event before
    it (the workers of one attempt are all gone before the next attempt's start, so the channel never mixes
    them)."""
    out, current = [], 0
    for e in events:
        if e.attempt is not None:
            current = e.attempt
        out.append(current)
    return out


def last_attempt(events: list[ev.Event]) -> list[ev.Event]:
    """The events of a run's last attempt (all of them in a run torchrun did not restart)."""
    tags = attempts_of(events)
    last = max(tags, default=0)
    return [e for e, a in zip(events, tags) if a == last]


def split_restarts(record: RunRecord) -> list[RunRecord]:
    """A run whose workers torchrun restarted within it, as the runs of an interrupted job: its first
    attempt (killed as the plan said, or ended by what its workers did), then each restart as a resumed
    run, the last one ending as the run did. What the other workers of a killed attempt raised after the
    kill (a collective whose peer died) is its consequence and left out. An attempt the supervisor ended for
    a rejoining node (held right after the checkpoint the cell names) counts as killed right after that
    checkpoint. A run without restarts: itself."""
    tags = attempts_of(record.events)
    attempts = sorted(set(tags))
    if attempts in ([], [0]):
        return [record]
    out = []
    for number, attempt in enumerate(attempts):
        events = [e for e, a in zip(record.events, tags) if a == attempt]
        # The world torchrun gave the attempt's workers (smaller once a node is gone).
        world = next((int(e.extra["world_size"]) for e in events if e.kind == ev.RANKS and "world_size" in e.extra),
                     record.plan.world_size)
        killed = next((i for i, e in enumerate(events) if e.kind == ev.SIGNALLED), None)
        rejoin = events[killed].extra.get("rejoin") if killed is not None else None
        plan = record.plan if attempt == 0 else replace(
            record.plan, kill=None if rejoin is None else KillSpec(int(rejoin), rejoin=int(rejoin)), is_resume=True,
            checkpoint_steps=frozenset(), pause_steps=frozenset(), faults=None, report_state=True, restart=number,
            world_size=world)
        if attempt == attempts[-1]:
            out.append(RunRecord(plan, events, record.outcome, record.exitcode, record.error,
                                 hang_timeout=record.hang_timeout, isolation=record.isolation,
                                 leftovers=record.leftovers, stalled=record.stalled))
            continue
        if killed is not None:
            events = events[:killed + 1] + [e for e in events[killed + 1:] if e.kind != ev.ERROR]
            outcome, error = Outcome.KILLED, None
        else:
            error = next((e.text for e in events if e.kind == ev.ERROR), None)
            outcome = Outcome.RAISED if error is not None else Outcome.CRASHED
        out.append(RunRecord(plan, events, outcome, None, error, hang_timeout=record.hang_timeout,
                             isolation=record.isolation, pid=record.pid,
                             first_event_seconds=record.first_event_seconds,
                             first_step_seconds=record.first_step_seconds))
    return out


@dataclass(frozen=True)
class Finding:
    """One thing wrong, with the headline that says it."""

    category: str
    headline: str
    #: The ledger whose comparison found it (``consumed``, ``trained``); None: not about a ledger.
    ledger: str | None = None
    ids: tuple[Any, ...] = ()
    #: Where the compared sequences first differ (of the rank's own ledger, for a finding of one rank).
    position: int | None = None
    #: The step where the problem starts (the first differing entry's or state's step), when known.
    step: int | None = None
    #: The rank whose own ledger it is about, when the job's whole ledger agrees (multi-rank runs).
    rank: int | None = None
    #: A state finding: the components that differ at its step (the cause it names first).
    components: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """The two sequences a cell shows as evidence (the excerpt, the JSON's ledgers, the HTML timeline): those
    of the ledger its first finding about inputs is about, so a ``LOST ... [trained ledger]`` is shown on the
    trained ledger, never on a consumed ledger that agrees."""

    #: Which ledger ``reference`` and ``composite`` are (None: the cell judged none).
    ledger: str | None
    reference: Ledger
    composite: Ledger
    #: The finding is about this rank's own ledger (the job's whole ledger agrees): the excerpt shows its entries.
    rank: int | None = None
    #: The other ledgers that differ too, in the order of their findings (each finding's headline names its own).
    others: tuple[str, ...] = ()


@dataclass
class Verdict:
    """The judgement of one cell."""

    findings: list[Finding] = field(default_factory=list)
    #: The reference's and the composite ledger of the contract's first kind (``consumed`` by default).
    reference: Ledger = field(default_factory=Ledger)
    composite: Ledger = field(default_factory=Ledger)
    resumed_from: list[int] = field(default_factory=list)
    resume_labels: list[str] = field(default_factory=list)
    #: Every judged ledger's (reference, composite) by kind, in the contract's order.
    ledgers: dict[str, tuple[Ledger, Ledger]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def categories(self) -> list[str]:
        return sorted({f.category for f in self.findings}, key=VERDICT_CATEGORIES.index)

    @property
    def headline(self) -> str:
        return self.findings[0].headline if self.findings else "PASSED"

    @property
    def state_diverged(self) -> int | None:
        """The first step whose training state differs from the reference's after a resume, if any."""
        return next((f.step for f in self.findings if f.category == STATE_DIVERGED), None)

    def evidence(self) -> Evidence:
        """What the cell shows: the ledger of the first finding about a judged ledger, with the other ledgers
        that differ too; without such a finding, the contract's first ledger (or ``reference`` and
        ``composite`` as they are, for a verdict that judged no ledger)."""
        about = [f for f in self.findings if f.ledger is not None and f.ledger in self.ledgers]
        if about:
            first = about[0]
            reference, composite = self.ledgers[str(first.ledger)]
            others = tuple(dict.fromkeys(str(f.ledger) for f in about if f.ledger != first.ledger))
            return Evidence(first.ledger, reference, composite, first.rank, others)
        return Evidence(next(iter(self.ledgers), None), self.reference, self.composite)


@dataclass
class CellResult:
    """Everything about one judged cell: the verdict, all runs, and where their files are."""

    cell: Cell
    verdict: Verdict
    #: The case's first reference run (None when the harness failed before it had one).
    reference: RunRecord | None
    runs: list[RunRecord] = field(default_factory=list)
    workdir: Path | None = None
    seed: int | None = None
    #: Seconds this cell spent on its case's reference runs (the first cell of a case in a process pays
    #: for them; the others find them made).
    reference_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.verdict.passed


