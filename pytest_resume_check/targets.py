"""Target declaration: what a project writes to have a trainer checked.

A target tells the harness how to build and drive one trainer. Declare it in a ``conftest.py``::

    from pytest_resume_check import resume_target

    @resume_target(steps=lambda case: 12, cases=[{"shuffle": False}, {"shuffle": True}])
    def my_trainer(run):
        ...  # build the trainer from run.case / run.seed, resume per run.resume_mode, train, report

or ship it from an installed package through the ``pytest_resume_check.targets`` entry-point group.
:class:`TargetOptions` lists the options; :mod:`pytest_resume_check.records.declaration` checks them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, overload

from pytest_resume_check.records.declaration import (
    CRASH_SMOKE,
    DEFAULT_RESOURCES,
    ERR_PREEMPT_COMMAND,
    ERR_ZERO_CHANGE_RANKS,
    checked_options,
    read_cases,
    refuse_unknown,
)
from pytest_resume_check.records.errors import TargetError
from pytest_resume_check.records.faults import leaves_incomplete as fault_leaves_incomplete
from pytest_resume_check.records.names import ISOLATION_FORKSERVER
from pytest_resume_check.records.plan import EARLY_STOP_EPOCH, LAUNCHER_HARNESS, CommandSpec
from pytest_resume_check.run import RESUME_AUTO, RESUME_PATH, RunContext

if TYPE_CHECKING:
    # typing.Unpack is 3.11's; annotations are never evaluated here and type checkers ship typing_extensions.
    from typing_extensions import Unpack

__all__ = ["CHECKPOINTS_ONLY", "CRASH_SMOKE", "EXACTLY_ONCE", "EXACTLY_ONCE_ORDERED", "Contract", "Target",
           "TargetError", "TargetFunction", "TargetOptions", "command_target", "fault_leaves_incomplete",
           "resume_target", "run_resources"]

#: A target's function: it takes the run context, in the run's process.
TargetFunction = Callable[[RunContext], None]
#: A case's parameters, as the target's functions of the case receive them.
Case = Mapping[str, Any]
#: ``steps=``: the steps of an uninterrupted run, for every case or as a function of the case.
Steps = int | Callable[[Case], int]


@dataclass(frozen=True)
class Contract:
    """What a target promises about its inputs across a resume.

    ``ordered``: the resumed sequence equals the reference sequence (else only the per-epoch multiset
    must match). ``ledgers``: which reported ledgers are judged (``consumed``, ``trained``).
    """

    ordered: bool = True
    ledgers: tuple[str, ...] = ("consumed",)

    def describe(self) -> str:
        """The promise in words, for a report's header of the target."""
        if not self.ledgers:
            return "no inputs reported: the checkpoint each resume restored, crash consistency, final outputs"
        kind = "exactly-once, same order" if self.ordered else "exactly-once, any order"
        return f"{kind} on {' and '.join(self.ledgers)}"


EXACTLY_ONCE_ORDERED = Contract(ordered=True)
EXACTLY_ONCE = Contract(ordered=False)
#: A program that reports no inputs (a zero-change command target): no ledger is judged.
CHECKPOINTS_ONLY = Contract(ledgers=())


def _contract(value: Contract | str) -> Contract:
    """``contract=`` as a :class:`Contract` (a name of one of the two, or one given)."""
    if isinstance(value, Contract):
        return value
    named = {"exactly_once_ordered": EXACTLY_ONCE_ORDERED, "exactly_once": EXACTLY_ONCE}
    if value not in named:
        raise TargetError(f"unknown contract {value!r}: use one of {sorted(named)} or a Contract(...)")
    return named[value]


@dataclass(frozen=True)
class Target:
    """One trainer the harness can run, its declaration checked (:func:`resume_target` makes it).

    ``fn(run)`` runs inside the run's process; ``steps(case)``: the steps of an uninterrupted run of the case
    (the matrix needs it before any run); ``boundaries(case)``, ``buffered(case)``: the steps that end an epoch,
    and those after which the trainer holds inputs it has not trained on (kill points beside them are sampled);
    ``expected_failures``: (predicate over a matrix cell, reason) pairs, the cells that must fail.
    """

    name: str
    fn: TargetFunction
    steps: Callable[[Mapping[str, Any]], int]
    cases: tuple[Mapping[str, Any], ...] = ({},)
    contract: Contract = EXACTLY_ONCE_ORDERED
    boundaries: Callable[[Mapping[str, Any]], Sequence[int]] | None = None
    buffered: Callable[[Mapping[str, Any]], Sequence[int]] | None = None
    resume_modes: tuple[str, ...] = (RESUME_AUTO, RESUME_PATH)
    preload: tuple[str, ...] = ()
    #: The fork server also imports the module that declares ``fn`` (and so what it imports), as a child
    #: would, and when torch is then imported pays its first-use costs once: a target declared
    #: without ``preload`` starts its runs as fast as a tuned one. A module that cannot be preloaded so is
    #: left to the children, as before. False: only ``preload`` (see process/_server_setup.py).
    auto_preload: bool = True
    isolation: str = ISOLATION_FORKSERVER
    expected_failures: tuple[tuple[Callable[[Any], bool], str], ...] = ()
    #: Crash-consistency cells (docs/crash-consistency.md). :data:`CRASH_SMOKE` (the default): a few crash
    #: cells on the save of checkpoint 2 of the first case, with checkpoint 1 before it, where they apply
    #: (one rank, auto resume, at least 2 steps); ``(step, prior)``: every crash point of the save of
    #: checkpoint ``step`` of the first case, with a checkpoint of ``prior`` before it; None: none
    #: (``crash_save=False`` in a declaration).
    crash_save: tuple[int, int] | str | None = CRASH_SMOKE
    #: (rtol, atol): compare reported state values under this tolerance instead of exact digests
    #: (None: exact, the default; see ``RunContext.state``).
    state_tolerance: tuple[float, float] | None = None
    #: Seconds without an event before a run of this target counts as HUNG (None: the session's
    #: setting; ``--resume-matrix-hang-timeout`` on the command line overrides this).
    hang_timeout: float | None = None
    #: A command target's program (see :func:`command_target`); None for a target function.
    command: CommandSpec | None = None
    #: Services the runs share, each a factory returning a context manager that yields environment
    #: variables for the runs (see :mod:`pytest_resume_check.process.services`).
    services: tuple[Callable[[], Any], ...] = ()
    #: Ranks per run (more than one: the harness launches them, see docs/distributed.md).
    world_size: int = 1
    #: World sizes a resume may take besides ``world_size`` (elastic cells; the contract is then each
    #: epoch's inputs exactly once, in any order, over all ranks).
    elastic: tuple[int, ...] = ()
    #: Grace periods (seconds) of preemption cells: SIGTERM to every rank, SIGKILL that long after. Only
    #: for trainers that save on SIGTERM.
    preemption: tuple[float, ...] = ()
    #: Record the process-global generators (Python ``random``, numpy's global generator, torch's CPU and
    #: CUDA generators) at every step end as state components of their own (see ``RunContext.step_end``).
    #: Off for a trainer that reseeds them on purpose between steps in a way a resume cannot repeat.
    capture_rng: bool = True
    #: The reported state does not depend on the world size (replicated, not sharded): compare it in
    #: elastic cells too, every rank of the resumed run against rank 0 of the reference.
    elastic_state: bool = False
    #: Where a resumed run may stop early once its state equals the reference's (see EARLY_STOPS).
    early_stop: str = EARLY_STOP_EPOCH
    #: Who starts the ranks of each run: the harness (a fork per rank) or ``torchrun`` (torch's elastic
    #: agent in the run's process, which starts and watches the workers; docs/distributed.md).
    launcher: str = LAUNCHER_HARNESS
    #: Under torchrun: how many times its agent may restart all workers within a run after one failed
    #: (``--max-restarts``). With 1 or more, a cell that kills one worker is judged through the restart.
    max_restarts: int = 0
    #: Under torchrun: simulated nodes, (least, most) as torchrun's ``--nnodes=MIN:MAX``: each run starts an
    #: agent per node on loopback, ``world_size // most`` workers each; with fewer least than most (and a
    #: restart allowed), cells kill the last node whole and the job goes on without it.
    nnodes: tuple[int, int] = (1, 1)
    #: What one run needs, in Ray's resource names (``CPU``, ``GPU``, custom ones), as sorted pairs;
    #: empty: one CPU. On a Ray cluster each task of this target's cells asks exactly this; with GPUs,
    #: each run sees only its own devices (``CUDA_VISIBLE_DEVICES``, docs/cluster.md).
    resources: tuple[tuple[str, float], ...] = ()
    #: Environment variables the runs read from the environment pytest is started in: on a Ray cluster
    #: their values here are set on the node for this target's runs, and a reproduction records them with
    #: their values (docs/cluster.md, "The runs' environment").
    pass_env: tuple[str, ...] = ()

    @property
    def ref(self) -> tuple[str, str, str]:
        """(module name, module file, attribute) that locate ``fn`` in a child process."""
        module = sys.modules.get(self.fn.__module__)
        path = getattr(module, "__file__", "") or ""
        return (self.fn.__module__, path, self.fn.__qualname__)

    def with_options(self, **changes: Any) -> Target:
        """A copy with some fields replaced (used by tests and to narrow axes)."""
        return replace(self, **changes)


class TargetOptions(TypedDict, total=False):
    """Every option of a declaration besides ``name`` and ``steps``, once, with the types it accepts: what
    ``resume_target`` and ``resume_target.command`` take as keywords. Left out, an option has the default of
    the :class:`Target` field of the same name, which says what it means in the form the target holds it;
    docs/writing-a-target.md, "Declaring a target", explains each (a test keeps its table and this list equal)."""

    cases: Iterable[Case]
    contract: Contract | str
    boundaries: Callable[[Case], Sequence[int]] | None
    buffered: Callable[[Case], Sequence[int]] | None
    resume_modes: Iterable[str]
    preload: Iterable[str]
    auto_preload: bool
    isolation: str
    expected_failures: Iterable[tuple[Callable[[Any], bool], str]]
    crash_save: tuple[int, int] | str | bool | None
    state_tolerance: tuple[float, float] | None
    hang_timeout: float | None
    services: Iterable[Callable[[], Any]]
    world_size: int
    elastic: Iterable[int]
    preemption: Iterable[float]
    capture_rng: bool
    elastic_state: bool
    early_stop: str
    launcher: str
    max_restarts: int
    nnodes: int | tuple[int, int]
    resources: Mapping[str, float] | None
    pass_env: Iterable[str]


def command_target(
    argv: Sequence[str],
    *,
    name: str,
    steps: Steps,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    checkpoints: str | None = None,
    outputs: Sequence[str] = (),
    fresh_interpreter: bool = False,
    commit: str | None = None,
    **options: Unpack[TargetOptions],
) -> Target:
    """Declare a target that runs a program: ``resume_target.command(["{python}", "train.py", "--out",
    "{checkpoint_dir}"], name="script", steps=12)`` (docs/recipes/command.md).

    Each run starts ``argv`` with its placeholders filled (``{python}``, ``{checkpoint_dir}``,
    ``{resume_mode}``, ``{resume_path}``, ``{seed}``, ``{is_resume}``, ``{case_id}``, ``{case[key]}``) in
    ``cwd`` (relative to the folder of the file that declares the target; that folder by default) with
    ``env`` added to the environment. The program reports through :mod:`pytest_resume_check.client`; every
    other option is :func:`resume_target`'s. Without ``{resume_path}`` in the command it is resumed in
    ``auto`` mode only.

    A Python program that reports nothing (a *zero-change* target) names where its checkpoints appear,
    ``checkpoints="step_*.pt"``, and the pointer file that selects one, if it writes one, ``commit="latest.txt"``
    (globs relative to ``{checkpoint_dir}``; :mod:`pytest_resume_check.child.watch`): each checkpoint published
    is a step, and ``steps`` counts them. ``outputs``: the files the program delivers (globs), compared with
    the uninterrupted run's after it exits. A ``{python} script.py`` or ``{python} -m module`` command runs in
    the run's own process, forked from the fork server that preloaded what it imports, as a fresh interpreter
    would start it; ``fresh_interpreter=True`` starts a process of its own instead.
    """
    from pytest_resume_check.child.command import command_spec, run_command

    cases = options["cases"] = read_cases(name, options.get("cases", ({},)))
    declared_in = sys._getframe(1).f_globals.get("__file__")
    if not isinstance(fresh_interpreter, bool):
        raise TargetError(f"target {name!r}: fresh_interpreter={fresh_interpreter!r} must be True or False")
    spec = command_spec(name, argv, cwd, env, cases, declared_in, checkpoints, outputs, fresh_interpreter, commit)
    if options.get("preemption"):
        raise TargetError(ERR_PREEMPT_COMMAND.format(name=name))
    if spec.checkpoints is not None:
        if options.get("world_size", 1) != 1 or options.get("elastic"):
            raise TargetError(ERR_ZERO_CHANGE_RANKS.format(name=name))
        if "resume_modes" not in options and not any("{resume_path}" in a for a in spec.argv):
            options["resume_modes"] = (RESUME_AUTO,)  # the program cannot be told which checkpoint to take
        options.setdefault("contract", CHECKPOINTS_ONLY)
    target = resume_target(run_command, name=name, steps=steps, **options)
    return target.with_options(command=spec)


class _Declaration:
    """The type of :data:`resume_target`: a decorator typed for both call forms, whose ``command`` declares a
    program (a function object cannot carry a typed attribute)."""

    @overload
    def __call__(self, fn: TargetFunction, *, name: str | None = None, steps: Steps,
                 **options: Unpack[TargetOptions]) -> Target: ...

    @overload
    def __call__(self, fn: None = None, *, name: str | None = None, steps: Steps,
                 **options: Unpack[TargetOptions]) -> Callable[[TargetFunction], Target]: ...

    def __call__(self, fn: TargetFunction | None = None, *, name: str | None = None, steps: Steps,
                 **options: Unpack[TargetOptions]) -> Target | Callable[[TargetFunction], Target]:
        """Declare a target; usable as ``@resume_target(steps=...)`` or ``resume_target(fn, steps=...)``.

        ``name`` defaults to the function's name; ``options`` are :class:`TargetOptions`. A wrong value raises
        :class:`TargetError` saying what to fix."""
        refuse_unknown("resume_target", options, TargetOptions.__optional_keys__)

        def build(func: TargetFunction) -> Target:
            declared = {**options, "name": name or func.__name__, "steps": steps}
            return Target(fn=func, **checked_options(func, declared, _contract))

        return build(fn) if fn is not None else build

    #: ``resume_target.command([...], ...)``: :func:`command_target`, the same declaration for a program.
    command = staticmethod(command_target)


resume_target = _Declaration()
"""Declare a target: ``@resume_target(steps=..., **options)`` or ``resume_target(fn, steps=...)`` (options:
:class:`TargetOptions`); ``resume_target.command([...], ...)`` declares a program (:func:`command_target`)."""


def run_resources(target: Target) -> dict[str, float]:
    """What one run of ``target`` needs (one CPU unless it declares otherwise)."""
    return dict(target.resources) if target.resources else dict(DEFAULT_RESOURCES)
