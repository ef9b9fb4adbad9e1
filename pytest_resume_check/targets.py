"""Target declaration and discovery.

A target tells the harness how to build and drive one trainer. Declare it in a ``conftest.py``::

    from pytest_resume_check import resume_target

    @resume_target(steps=lambda case: 12, cases=[{"shuffle": False}, {"shuffle": True}])
    def my_trainer(run):
        ...  # build the trainer from run.case / run.seed, resume per run.resume_mode, train, report

or ship it from an installed package through the ``pytest_resume_check.targets`` entry-point group
(the entry point names a :class:`Target` or an iterable of them).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pytest_resume_check.records.environ import parse_names
from pytest_resume_check.records.errors import TargetError
from pytest_resume_check.records.faults import (  # noqa: F401  (re-exported: integrations.durable.leaves_incomplete)
    leaves_incomplete as fault_leaves_incomplete,
)
from pytest_resume_check.records.names import ISOLATION_FORKSERVER, ISOLATIONS, case_id
from pytest_resume_check.records.plan import (
    EARLY_STOP_EPOCH,
    EARLY_STOPS,
    LAUNCHER_HARNESS,
    LAUNCHER_TORCHRUN,
    LAUNCHERS,
    CommandSpec,
)
from pytest_resume_check.run import RESUME_AUTO, RESUME_MODES, RESUME_PATH, RunContext

ENTRY_POINT_GROUP = "pytest_resume_check.targets"

#: Isolation modes: children forked from a preloaded server, or fresh interpreters.


#: A target name or case id that cannot be a folder name (a target named ``..`` made the
#: harness work in, and delete, folders outside its session root).
ERR_TARGET_NAME = ("target {name!r}: the name {problem}; the harness makes a folder of it, so give a plain name "
                   "(letters, digits, '-', '_', '.'), e.g. name='my_trainer'")
ERR_CASE_ID = ("target {name!r}: case id {case_id!r} {problem}; the harness makes a folder of it, so give the case "
               "a plain id (letters, digits, '-', '_', '.'), e.g. {{'id': 'shuffle'}}")
ERR_CASE_TWICE = ("target {name!r}: cases {first} and {second} both get the id {case_id!r}; they would share one "
                  "reference and one folder. Give them distinct 'id' keys")
#: A case the run's process cannot get: each run gets its case as :mod:`pickle` copies it, and one that cannot be
#: copied so would fail in the new process before the harness's code runs (multiprocessing's traceback on the
#: terminal, and the run's death blamed on the trainer).
ERR_CASE_NOT_SENT = ("target {name!r}: case {case_id!r} cannot be sent to a run's process: copying it as pickle "
                     "does raised {error}; give cases of plain values (numbers, strings, lists, dicts) or of "
                     "objects that pickle can copy")
ERR_STEPS = ("target {name!r}: steps={steps!r} is not a number of steps; give the steps of an uninterrupted run "
             "(an int of at least 1, e.g. steps=12) or a function of the case that returns them")
ERR_EARLY_STOP = ("target {name!r}: early_stop={value!r} is not one of " + ", ".join(map(repr, EARLY_STOPS)) +
                  "; 'epoch' (the default) stops a resumed run whose state equals the reference's only at the end "
                  "of an epoch, 'any' at any step (its reported state is complete), 'never' runs it to the end")
ERR_CASES = "target {name!r}: reading its cases raised {error}; fix the cases= given to resume_target"
#: A function the target declared raised while the matrix was built (one failing item for the target).
ERR_RAISED = "target {name!r}: {function}(case {case_id!r}) raised {error}; fix the function given as {function}="
ERR_STEPS_RETURNED = ("target {name!r}: steps(case {case_id!r}) returned {value!r}; it must return the steps of an "
                      "uninterrupted run of the case, an int of at least 1")


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot name a folder of its own (None: it can)."""
    if text in ("", ".", ".."):
        return "is empty" if not text else f"is {text!r}"
    if "/" in text or "\\" in text:
        return "contains a path separator"
    if "\0" in text:
        return "contains a NUL character"
    if "[" in text or "]" in text:
        return "contains '[' or ']' (a cell is named target[case-mode-kill])"
    return None


def describe_error(exc: BaseException) -> str:
    """``Type: message (at file:line)`` of an exception raised by a target's own code."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


def check_cases(name: str, cases: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`TargetError` if an explicit case ``id`` cannot name a folder, two cases get one id (they
    would share a reference and a folder, and one would be judged against the other's runs), or a case cannot
    be copied into a run's process (:data:`ERR_CASE_NOT_SENT`)."""
    seen: dict[str, Mapping[str, Any]] = {}
    for case in cases:
        if "id" in case:
            problem = name_problem(str(case["id"]))
            if problem:
                raise TargetError(ERR_CASE_ID.format(name=name, case_id=str(case["id"]), problem=problem))
        ident = case_id(case)
        if ident in seen:
            raise TargetError(ERR_CASE_TWICE.format(name=name, case_id=ident, first=dict(seen[ident]),
                                                    second=dict(case)))
        seen[ident] = case
        try:
            pickle.loads(pickle.dumps(dict(case)))
        except Exception as exc:
            raise TargetError(ERR_CASE_NOT_SENT.format(name=name, case_id=ident, error=describe_error(exc))) from exc


@dataclass(frozen=True)
class Contract:
    """What a target promises about its inputs across a resume.

    ``ordered``: the resumed sequence equals the reference sequence (else only the per-epoch multiset
    must match). ``ledgers``: which reported ledgers are judged (``consumed``, ``trained``).
    """

    ordered: bool = True
    ledgers: tuple[str, ...] = ("consumed",)

    def describe(self) -> str:
        if not self.ledgers:
            return "no inputs reported: the checkpoint each resume restored, crash consistency, final outputs"
        kind = "exactly-once, same order" if self.ordered else "exactly-once, any order"
        return f"{kind} on {' and '.join(self.ledgers)}"


EXACTLY_ONCE_ORDERED = Contract(ordered=True)
EXACTLY_ONCE = Contract(ordered=False)
#: A program that reports no inputs (a zero-change command target): no ledger is judged.
CHECKPOINTS_ONLY = Contract(ledgers=())


def _contract(value: Contract | str) -> Contract:
    if isinstance(value, Contract):
        return value
    named = {"exactly_once_ordered": EXACTLY_ONCE_ORDERED, "exactly_once": EXACTLY_ONCE}
    if value not in named:
        raise TargetError(f"unknown contract {value!r}: use one of {sorted(named)} or a Contract(...)")
    return named[value]


#: ``crash_save=`` of a target that declares none: a few crash-consistency cells on one save, so a save that is
#: not crash-safe fails without opting in; ``(step, prior)`` asks for every crash point of a save,
#: False for none.
CRASH_SMOKE = "smoke"


@dataclass(frozen=True)
class Target:
    """One trainer the harness can run.

    ``fn(run)`` runs inside the child process. ``steps(case)`` is the number of steps of an
    uninterrupted run of that case (the matrix needs it before any run). ``cases`` lists the case
    parameter dicts. ``buffered(case)`` optionally names steps after which the trainer holds buffered
    inputs (quick mode samples them). ``boundaries(case)`` optionally names the steps that end an epoch (kill points
    beside them are always sampled). ``preload`` names modules imported once in the fork server;
    ``auto_preload`` adds the module that declares ``fn`` and torch's warm-up (see the field).
    ``expected_failures`` pairs a predicate over a matrix ``Cell`` (``.case``, ``.resume_mode``,
    ``.kills``, ``.kill_id``) with a reason: matching cells are strict expected failures.
    """

    name: str
    fn: Callable[[RunContext], None]
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
        from dataclasses import replace

        return replace(self, **changes)


def resume_target(
    fn: Callable[[RunContext], None] | None = None,
    *,
    name: str | None = None,
    steps: int | Callable[[Mapping[str, Any]], int],
    cases: Iterable[Mapping[str, Any]] = ({},),
    contract: Contract | str = EXACTLY_ONCE_ORDERED,
    boundaries: Callable[[Mapping[str, Any]], Sequence[int]] | None = None,
    buffered: Callable[[Mapping[str, Any]], Sequence[int]] | None = None,
    resume_modes: Iterable[str] = (RESUME_AUTO, RESUME_PATH),
    preload: Iterable[str] = (),
    auto_preload: bool = True,
    isolation: str = ISOLATION_FORKSERVER,
    expected_failures: Iterable[tuple[Callable[[Any], bool], str]] = (),
    crash_save: tuple[int, int] | str | bool | None = CRASH_SMOKE,
    state_tolerance: tuple[float, float] | None = None,
    hang_timeout: float | None = None,
    services: Iterable[Callable[[], Any]] = (),
    world_size: int = 1,
    elastic: Iterable[int] = (),
    preemption: Iterable[float] = (),
    capture_rng: bool = True,
    elastic_state: bool = False,
    early_stop: str = EARLY_STOP_EPOCH,
    launcher: str = LAUNCHER_HARNESS,
    max_restarts: int = 0,
    nnodes: int | tuple[int, int] = 1,
    resources: Mapping[str, float] | None = None,
    pass_env: Iterable[str] = (),
) -> Any:
    """Declare a target; usable as ``@resume_target(steps=...)`` or ``resume_target(fn, steps=...)``."""

    def build(func: Callable[[RunContext], None]) -> Target:
        return make_target(
            func,
            name=name or func.__name__,
            steps=steps,
            cases=cases,
            contract=contract,
            boundaries=boundaries,
            buffered=buffered,
            resume_modes=resume_modes,
            preload=preload,
            auto_preload=auto_preload,
            isolation=isolation,
            expected_failures=expected_failures,
            crash_save=crash_save,
            state_tolerance=state_tolerance,
            hang_timeout=hang_timeout,
            services=services,
            world_size=world_size,
            elastic=elastic,
            preemption=preemption,
            capture_rng=capture_rng,
            elastic_state=elastic_state,
            early_stop=early_stop,
            launcher=launcher,
            max_restarts=max_restarts,
            nnodes=nnodes,
            resources=resources,
            pass_env=pass_env,
        )

    return build(fn) if fn is not None else build


def make_target(func: Callable[[RunContext], None], **kw: Any) -> Target:
    """Validate a declaration and build the :class:`Target`; errors say what to fix."""
    name = kw["name"]
    if not callable(func):
        raise TargetError(f"target {name!r}: the target must be a function taking the run context")
    if "<locals>" in func.__qualname__ or "<lambda>" in func.__qualname__:
        raise TargetError(
            f"target {name!r}: {func.__qualname__} is not importable by name in a child process; "
            "define the target function at module level"
        )
    problem = name_problem(str(name))
    if problem:
        raise TargetError(ERR_TARGET_NAME.format(name=name, problem=problem))
    steps = kw["steps"]
    if isinstance(steps, bool) or (isinstance(steps, int) and steps < 1):
        raise TargetError(ERR_STEPS.format(name=name, steps=steps))
    steps_fn = (lambda case, _n=int(steps): _n) if isinstance(steps, int) else steps
    if not callable(steps_fn):
        raise TargetError(ERR_STEPS.format(name=name, steps=steps))
    try:
        cases = tuple(dict(c) for c in kw["cases"])
    except Exception as exc:
        raise TargetError(ERR_CASES.format(name=name, error=describe_error(exc))) from exc
    if not cases:
        raise TargetError(f"target {name!r}: cases is empty; give at least one case dict (may be {{}})")
    check_cases(name, cases)
    modes = tuple(kw["resume_modes"])
    bad = [m for m in modes if m not in RESUME_MODES]
    if bad:
        raise TargetError(f"target {name!r}: unknown resume mode(s) {bad}; use {list(RESUME_MODES)}")
    if kw["isolation"] not in ISOLATIONS:
        raise TargetError(f"target {name!r}: isolation must be one of {list(ISOLATIONS)}")
    crash_save = _crash_save(name, kw.get("crash_save", CRASH_SMOKE))
    return Target(
        name=name,
        fn=func,
        steps=steps_fn,
        cases=cases,
        contract=_contract(kw["contract"]),
        boundaries=kw["boundaries"],
        buffered=kw.get("buffered"),
        resume_modes=modes,
        preload=tuple(kw["preload"]),
        auto_preload=_flag(name, "auto_preload", kw.get("auto_preload", True)),
        isolation=kw["isolation"],
        expected_failures=tuple(kw["expected_failures"]),
        crash_save=crash_save,
        state_tolerance=_tolerance(name, kw.get("state_tolerance")),
        hang_timeout=_hang_timeout(name, kw.get("hang_timeout")),
        command=kw.get("command"),
        services=_services(name, kw.get("services", ())),
        capture_rng=_flag(name, "capture_rng", kw.get("capture_rng", True)),
        elastic_state=_flag(name, "elastic_state", kw.get("elastic_state", False)),
        early_stop=_early_stop(name, kw.get("early_stop", EARLY_STOP_EPOCH)),
        resources=_resources(name, kw.get("resources")),
        pass_env=_pass_env(name, kw.get("pass_env", ())),
        **_distributed(name, kw.get("world_size", 1), kw.get("elastic", ()), kw.get("preemption", ()),
                       crash_save),
        **_launcher(name, kw.get("launcher", LAUNCHER_HARNESS), kw.get("max_restarts", 0), kw.get("nnodes", 1),
                    kw.get("world_size", 1), kw.get("elastic", ())),
    )


def _flag(name: str, option: str, value: Any) -> bool:
    """A yes/no option: True or False, nothing else (``"no"`` would read as yes)."""
    if not isinstance(value, bool):
        raise TargetError(f"target {name!r}: {option}={value!r} must be True or False")
    return value


def _early_stop(name: str, value: Any) -> str:
    """``early_stop``: one of EARLY_STOPS."""
    if value not in EARLY_STOPS:
        raise TargetError(ERR_EARLY_STOP.format(name=name, value=value))
    return str(value)


#: The most ranks a run may have: they all run on this machine, each a process with its own rendezvous
#: connections (world_size=1000 ran 240 s with 955 zombies and no verdict).
MAX_WORLD_SIZE = 32
ERR_WORLD_SIZE = ("target {name!r}: world_size={value!r} must be a whole number of ranks from 1 to "
                  f"{MAX_WORLD_SIZE} (e.g. world_size=2): every rank is a process on this machine")
ERR_ELASTIC = ("target {name!r}: elastic={value!r} must list other world sizes a resume may take, each a whole "
               f"number from 1 to {MAX_WORLD_SIZE} and not the target's world_size {{world}} (e.g. elastic=[1, 3])")
ERR_PREEMPTION = ("target {name!r}: preemption={value!r} must list grace periods in seconds, each a number > 0 (e.g. "
                  "preemption=[5.0]); SIGTERM is sent, SIGKILL that long after")
ERR_PREEMPT_COMMAND = ("target {name!r}: preemption= is not supported on a command target yet (SIGTERM would reach the "
                       "harness's side of the run, not your program); declare it on a Python target")
ERR_ZERO_CHANGE_RANKS = ("target {name!r}: checkpoints= (a program that reports nothing) runs one process; for "
                         "ranks, report through pytest_resume_check.client (docs/recipes/command.md)")
ERR_CRASH_RANKS = ("target {name!r}: crash_save= is not supported with world_size > 1 (file faults are injected in one "
                   "process); declare the crash axis on a one-rank target")


ERR_CRASH_SAVE = ("target {name!r}: crash_save={value!r} is not one of {smoke!r} (the default: a few crash cells on "
                  "the save of checkpoint 2), (step, prior) (every crash point of the save of checkpoint step, with a "
                  "checkpoint of prior before it: whole numbers, 0 <= prior < step, e.g. crash_save=(2, 1)) or False "
                  "(no crash cells)")


def _crash_save(name: str, value: Any) -> tuple[int, int] | str | None:
    """``crash_save``: :data:`CRASH_SMOKE`, a (step, prior) pair of whole numbers with 0 <= prior < step, or
    None for False and None (no crash cells)."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        if value == CRASH_SMOKE:
            return CRASH_SMOKE
    else:
        try:
            step, prior = value
        except (TypeError, ValueError):
            step = prior = None
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (step, prior)) and 0 <= prior < step:
            return int(step), int(prior)
    raise TargetError(ERR_CRASH_SAVE.format(name=name, value=value, smoke=CRASH_SMOKE))


def _distributed(name: str, world: Any, elastic: Any, preemption: Any, crash_save: Any) -> dict[str, Any]:
    """``world_size``, ``elastic`` and ``preemption``, checked."""
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD_SIZE:
        raise TargetError(ERR_WORLD_SIZE.format(name=name, value=world))
    try:
        sizes = tuple(elastic)
    except TypeError:
        sizes = (None,)
    if any(isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WORLD_SIZE or w == world for w in sizes):
        raise TargetError(ERR_ELASTIC.format(name=name, value=elastic, world=world))
    try:
        graces = tuple(float(g) for g in preemption)
    except (TypeError, ValueError):
        graces = (0.0,)
    if any(not g > 0 or g == float("inf") for g in graces):
        raise TargetError(ERR_PREEMPTION.format(name=name, value=preemption))
    if isinstance(crash_save, tuple) and world > 1:  # the default smoke cells are left out instead
        raise TargetError(ERR_CRASH_RANKS.format(name=name))
    return {"world_size": world, "elastic": tuple(dict.fromkeys(sizes)), "preemption": tuple(dict.fromkeys(graces))}


ERR_LAUNCHER = ("target {name!r}: launcher={value!r} is not one of " + ", ".join(map(repr, LAUNCHERS))
                + " (the harness forks the ranks itself; torchrun runs torch's elastic agent, which starts them)")
ERR_MAX_RESTARTS = ("target {name!r}: max_restarts={value!r} must be a whole number from 0 to {most} (how many times "
                    "torchrun restarts the workers within a run), and needs launcher='torchrun'")
#: More restarts than this would only make a broken job take longer to fail.
MAX_RESTARTS = 10


ERR_NNODES = ("target {name!r}: nnodes={value!r} must be a number of nodes from 1 to {most} or a (least, most) pair "
              "of them (torchrun's --nnodes=MIN:MAX, e.g. nnodes=(1, 2)), needs launcher='torchrun', and its most "
              "must divide world_size ({world}): each node runs world_size / most workers")
#: Simulated nodes are torchrun agents on this machine, each with its workers.
MAX_NODES = 8


ERR_NODES_ELASTIC = ("target {name!r}: elastic= is not supported with several nodes (nnodes={value!r}); the cells that "
                     "lose a node are this target's elastic cells (declare nnodes=(least, most) with least < most)")


def _launcher(name: str, launcher: Any, restarts: Any, nnodes: Any = 1, world: Any = 1,
              elastic: Any = ()) -> dict[str, Any]:
    """``launcher`` and ``max_restarts``, checked. Where torch is missing, torchrun's cells fail with the
    fork server's line for a preload that cannot be imported (``torch.distributed.run``)."""
    if launcher not in LAUNCHERS:
        raise TargetError(ERR_LAUNCHER.format(name=name, value=launcher))
    if isinstance(restarts, bool) or not isinstance(restarts, int) or not 0 <= restarts <= MAX_RESTARTS or (
            restarts and launcher != LAUNCHER_TORCHRUN):
        raise TargetError(ERR_MAX_RESTARTS.format(name=name, value=restarts, most=MAX_RESTARTS))
    least, most = _nodes(nnodes)
    if not (0 < least <= most <= MAX_NODES and isinstance(world, int) and world % most == 0) or (
            most > 1 and launcher != LAUNCHER_TORCHRUN):
        raise TargetError(ERR_NNODES.format(name=name, value=nnodes, most=MAX_NODES, world=world))
    if most > 1 and elastic:
        raise TargetError(ERR_NODES_ELASTIC.format(name=name, value=nnodes))
    return {"launcher": str(launcher), "max_restarts": int(restarts), "nnodes": (least, most)}


def _nodes(value: Any) -> tuple[int, int]:
    """``nnodes`` as (least, most): a whole number for both, or a pair of them; (0, 0) for anything else."""
    pair = (value, value) if isinstance(value, int) else value
    try:
        least, most = pair
    except (TypeError, ValueError):
        return 0, 0
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (least, most)):
        return 0, 0
    return int(least), int(most)


def command_target(
    argv: Sequence[str],
    *,
    name: str,
    steps: int | Callable[[Mapping[str, Any]], int],
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    checkpoints: str | None = None,
    outputs: Sequence[str] = (),
    fresh_interpreter: bool = False,
    commit: str | None = None,
    **options: Any,
) -> Target:
    """Declare a target that runs a program: ``resume_target.command(["{python}", "train.py", "--out",
    "{checkpoint_dir}"], name="script", steps=12)``.

    Each run starts ``argv`` with its placeholders filled (``{python}``, ``{checkpoint_dir}``,
    ``{resume_mode}``, ``{resume_path}``, ``{seed}``, ``{is_resume}``, ``{case_id}``, ``{case[key]}``) in
    ``cwd`` (relative to the folder of the file that declares the target; that folder by default) with
    ``env`` added to the environment. The program reports through :mod:`pytest_resume_check.client` (or
    its line protocol). Every other option is :func:`resume_target`'s; ``preload`` is rarely useful, as
    the program is a fresh process.

    A Python program that reports nothing (a *zero-change* target) names instead where its checkpoints
    appear, ``checkpoints="step_*.pt"`` (a glob relative to ``{checkpoint_dir}``): each checkpoint it
    publishes is a step, it is killed at those, and the checkpoint it restores is the one it opens (see
    :mod:`pytest_resume_check.child.watch`); ``steps`` is then the number of checkpoints an uninterrupted run
    publishes. A program that makes each checkpoint selectable by writing a pointer or tracker file naming it
    (DeepSpeed's ``latest``, Megatron-LM's and verl's ``latest_checkpointed_iteration.txt``) names it with
    ``commit="latest.txt"`` (a glob relative to ``{checkpoint_dir}``): its publications, kills and saves follow
    that file, and the checkpoint published is the one it names; undeclared, such a file is recognised in the
    uninterrupted run (:mod:`pytest_resume_check.records.commits`). Without ``{resume_path}`` in the command it
    is resumed in ``auto`` mode only. ``outputs``:
    the files the program delivers (globs relative to ``{checkpoint_dir}``), compared with the
    uninterrupted run's after the program exits, for any command target.

    A command ``{python} script.py ...`` or ``{python} -m module ...`` whose program reports through the
    client (or reports nothing) runs in the run's own process, forked from the fork server that preloaded
    what the script imports, as a fresh interpreter would start it (``sys.argv``, ``__main__``, working
    folder, environment; see :func:`pytest_resume_check.child.command.python_program`);
    ``fresh_interpreter=True`` starts it as a process of its own instead (a script that needs a pristine
    interpreter: one it re-executes, say).
    """
    import sys as _sys

    from pytest_resume_check.child.command import command_spec, run_command

    cases = options.pop("cases", ({},))
    try:
        cases = tuple(dict(c) for c in cases)
    except Exception as exc:
        raise TargetError(ERR_CASES.format(name=name, error=describe_error(exc))) from exc
    declared_in = _sys._getframe(1).f_globals.get("__file__")
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
    target: Target = resume_target(run_command, name=name, steps=steps, cases=cases, **options)
    return target.with_options(command=spec)


#: ``resume_target.command([...], ...)``: the same declaration for a program instead of a function.
resume_target.command = command_target  # type: ignore[attr-defined]


def _hang_timeout(name: str, value: Any) -> float | None:
    """``hang_timeout`` as seconds >= 0 (0 or inf: no limit), or None."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not seconds >= 0:  # also refuses nan
        raise TargetError(f"target {name!r}: hang_timeout={value!r} is not a number of seconds >= 0; give e.g. "
                          "hang_timeout=300 (0 or float('inf'): no limit), or leave it out for the session's")
    return seconds


def _services(name: str, value: Any) -> tuple[Callable[[], Any], ...]:
    """``services`` as a tuple of callables (factories of context managers)."""
    try:
        factories = tuple(value)
    except TypeError:
        factories = (value,)
    bad = [f for f in factories if not callable(f)]
    if bad or isinstance(value, (str, bytes)):
        raise TargetError(f"target {name!r}: services={value!r} must be a list of functions, each returning a "
                          "context manager that starts the service and yields environment variables for the runs, "
                          "e.g. services=[my_database]")
    return factories


ERR_RESOURCES = ("target {name!r}: resources={value!r} must map resource names to amounts one run needs, each a "
                 "number > 0 and GPU a whole number (a device is never shared), e.g. resources={{'CPU': 2, 'GPU': 1}}")
#: What one run needs when a target declares nothing.
DEFAULT_RESOURCES = {"CPU": 1.0}


def _resources(name: str, value: Any) -> tuple[tuple[str, float], ...]:
    """``resources`` as sorted (name, amount) pairs; empty for None (one CPU)."""
    if value is None:
        return ()
    try:
        pairs = sorted((str(k), float(v)) for k, v in dict(value).items()
                       if isinstance(k, str) and k and not isinstance(v, bool))
        if len(pairs) != len(dict(value)):
            raise ValueError
    except (TypeError, ValueError):
        raise TargetError(ERR_RESOURCES.format(name=name, value=value)) from None
    if any(not 0 < amount < float("inf") for _, amount in pairs) or not dict(pairs).get("GPU", 1.0).is_integer():
        raise TargetError(ERR_RESOURCES.format(name=name, value=value))
    return tuple(pairs)


ERR_PASS_ENV = ("target {name!r}: pass_env={value!r} must name environment variables (letters, digits and '_', not "
                "starting with a digit), e.g. pass_env=['TRAINER_MODE']; {bad!r} is not one")


def _pass_env(name: str, value: Any) -> tuple[str, ...]:
    """``pass_env`` as variable names, each once (a string may hold several, separated by commas or spaces)."""
    try:
        return parse_names(value)
    except TypeError:
        raise TargetError(ERR_PASS_ENV.format(name=name, value=value, bad=value)) from None
    except ValueError as exc:
        raise TargetError(ERR_PASS_ENV.format(name=name, value=value, bad=str(exc))) from None


def run_resources(target: Target) -> dict[str, float]:
    """What one run of ``target`` needs (one CPU unless it declares otherwise)."""
    return dict(target.resources) if target.resources else dict(DEFAULT_RESOURCES)


def _tolerance(name: str, value: Any) -> tuple[float, float] | None:
    """``state_tolerance`` as (rtol, atol): two finite numbers >= 0, or None."""
    if value is None:
        return None
    try:
        rtol, atol = (float(v) for v in value)
    except (TypeError, ValueError):
        rtol = atol = -1.0
    if not (0 <= rtol < float("inf") and 0 <= atol < float("inf")):
        raise TargetError(f"target {name!r}: state_tolerance={value!r} is not (rtol, atol); give two finite "
                          "numbers >= 0, e.g. state_tolerance=(1e-5, 1e-8), or leave it out for exact comparison")
    return rtol, atol


def targets_in_module(module: Any) -> list[Target]:
    """The targets a module (a conftest) declares: module-level :class:`Target` objects, in definition
    order, plus those listed in a module-level ``RESUME_TARGETS`` sequence."""
    found = [v for v in vars(module).values() if isinstance(v, Target)]
    for v in getattr(module, "RESUME_TARGETS", ()):
        if not isinstance(v, Target):
            raise TargetError(f"{module.__name__}.RESUME_TARGETS holds {type(v).__name__}, not a Target")
        if v not in found:
            found.append(v)
    return found


def entry_point_targets() -> list[Target]:
    """Targets shipped by installed packages through the entry-point group."""
    found: list[Target] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = ep.load()
        except Exception as exc:  # a broken plugin must not hide the others' targets silently
            raise TargetError(
                f"entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP} failed to load: "
                f"{type(exc).__name__}: {exc}; fix or uninstall the package that declares it"
            ) from exc
        values = [value] if isinstance(value, Target) else list(value)
        for v in values:
            if not isinstance(v, Target):
                raise TargetError(
                    f"entry point {ep.name!r} ({ep.value}) gave {type(v).__name__}, not a Target; "
                    "point it at a resume_target(...) object or a list of them"
                )
        found.extend(values)
    return found


def load_target_fn(ref: tuple[str, str, str]) -> Callable[[RunContext], None]:
    """Import the target function in a child from its (module, file, qualname) reference."""
    module_name, path, qualname = ref
    obj: Any = target_module(module_name, path)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, Target):
        obj = obj.fn
    return obj


def target_module(module_name: str, path: str) -> Any:
    """The module ``module_name`` whose file is ``path``: by name when that finds this file, else loaded
    from the file (a conftest.py is imported by pytest under a name another conftest may hold). The same
    in a child and in the fork server that preloads it (``auto_preload``): a module either imported is
    found in ``sys.modules``, and only with the right file (the server may hold two conftest modules)."""
    by_path = _module_name_of_file(path) if path else None
    for name in (module_name, by_path):
        module = sys.modules.get(name) if name else None
        if module is not None and _is_file(module, path):
            return module
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    if module is not None and _is_file(module, path):
        return module
    if by_path is None:
        raise TargetError(f"cannot import module {module_name!r} of the target")
    spec = importlib.util.spec_from_file_location(by_path, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load the target's module from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(spec.name, None)  # as an import that raises: nothing half-made is found later
        raise
    return module


def _is_file(module: Any, path: str) -> bool:
    """Whether ``module`` was loaded from ``path`` (any module, when no file is known)."""
    if not path:
        return True
    file = getattr(module, "__file__", "") or ""
    try:
        return Path(file) == Path(path) or (bool(file) and os.path.samefile(file, path))
    except OSError:
        return False


def _module_name_of_file(path: str) -> str:
    """The name a target's module loaded from its file gets (the same in every process: a digest)."""
    import hashlib

    return "_resume_check_target_" + hashlib.sha1(path.encode(errors="surrogateescape")).hexdigest()[:16]
