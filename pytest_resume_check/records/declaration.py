"""The checks of a target's declaration: each option ``resume_target`` takes, refused with a message that says
what to fix, or returned in the form :class:`pytest_resume_check.targets.Target` holds it.

Plain rules over plain values (stdlib only), below the public API: ``targets`` builds the ``Target`` from
what :func:`checked_options` returns, and the matrix and the collector use the same messages and name checks
for what they find later (a function of the case that raises, a case id made by a hook).
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pytest_resume_check.records.environ import parse_names
from pytest_resume_check.records.errors import TargetError
from pytest_resume_check.records.names import ISOLATION_FORKSERVER, ISOLATIONS, case_id
from pytest_resume_check.records.plan import (
    EARLY_STOP_EPOCH,
    EARLY_STOPS,
    LAUNCHER_HARNESS,
    LAUNCHER_TORCHRUN,
    LAUNCHERS,
    RESUME_AUTO,
    RESUME_MODES,
    RESUME_PATH,
)

#: A target name or case id that cannot be a folder name (a target named ``..`` would make the harness work
#: in, and delete, folders outside its session root).
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

#: ``crash_save=`` of a target that declares none: a few crash-consistency cells on one save, so a save that is
#: not crash-safe fails without opting in; ``(step, prior)`` asks for every crash point of a save, False for none.
CRASH_SMOKE = "smoke"

#: The most ranks a run may have: they all run on this machine, each a process with its own rendezvous
#: connections (a world of 1000 ranks ran for minutes, leaving hundreds of zombies and no verdict).
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
ERR_CRASH_SAVE = ("target {name!r}: crash_save={value!r} is not one of {smoke!r} (the default: a few crash cells on "
                  "the save of checkpoint 2), (step, prior) (every crash point of the save of checkpoint step, with a "
                  "checkpoint of prior before it: whole numbers, 0 <= prior < step, e.g. crash_save=(2, 1)) or False "
                  "(no crash cells)")
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
ERR_RESOURCES = ("target {name!r}: resources={value!r} must map resource names to amounts one run needs, each a "
                 "number > 0 and GPU a whole number (a device is never shared), e.g. resources={{'CPU': 2, 'GPU': 1}}")
#: What one run needs when a target declares nothing.
DEFAULT_RESOURCES = {"CPU": 1.0}
ERR_PASS_ENV = ("target {name!r}: pass_env={value!r} must name environment variables (letters, digits and '_', not "
                "starting with a digit), e.g. pass_env=['TRAINER_MODE']; {bad!r} is not one")


def refuse_unknown(function: str, options: Mapping[str, Any], known: Collection[str]) -> None:
    """A keyword that is no option (not in ``known``) fails as Python fails a call with an unknown keyword."""
    for key in options:
        if key not in known:
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}")


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


def read_cases(name: str, cases: Any) -> tuple[dict[str, Any], ...]:
    """``cases`` as a tuple of dicts; an iterable that raises while read is the target's :data:`ERR_CASES`."""
    try:
        return tuple(dict(c) for c in cases)
    except Exception as exc:
        raise TargetError(ERR_CASES.format(name=name, error=describe_error(exc))) from exc


def checked_options(func: Callable[..., None], options: Mapping[str, Any],
                    contract_of: Callable[[Any], Any]) -> dict[str, Any]:
    """Every option of a declaration (``name`` and ``steps`` given; the others default as
    :class:`pytest_resume_check.targets.TargetOptions` says) checked and in the form the ``Target`` holds;
    ``contract_of`` resolves ``contract`` (its type is the public API's). The first option that is wrong, in
    the order of the ``Target``'s fields, raises :class:`TargetError` saying what to fix."""
    name = options["name"]
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
    steps = options["steps"]
    if isinstance(steps, bool) or (isinstance(steps, int) and steps < 1):
        raise TargetError(ERR_STEPS.format(name=name, steps=steps))
    steps_fn = (lambda case, _n=int(steps): _n) if isinstance(steps, int) else steps
    if not callable(steps_fn):
        raise TargetError(ERR_STEPS.format(name=name, steps=steps))
    cases = read_cases(name, options.get("cases", ({},)))
    if not cases:
        raise TargetError(f"target {name!r}: cases is empty; give at least one case dict (may be {{}})")
    check_cases(name, cases)
    modes = tuple(options.get("resume_modes", (RESUME_AUTO, RESUME_PATH)))
    bad = [m for m in modes if m not in RESUME_MODES]
    if bad:
        raise TargetError(f"target {name!r}: unknown resume mode(s) {bad}; use {list(RESUME_MODES)}")
    isolation = options.get("isolation", ISOLATION_FORKSERVER)
    if isolation not in ISOLATIONS:
        raise TargetError(f"target {name!r}: isolation must be one of {list(ISOLATIONS)}")
    crash_save = _crash_save(name, options.get("crash_save", CRASH_SMOKE))
    world, elastic = options.get("world_size", 1), options.get("elastic", ())
    return dict(
        name=name,
        steps=steps_fn,
        cases=cases,
        contract=contract_of(options.get("contract", "exactly_once_ordered")),
        boundaries=options.get("boundaries"),
        buffered=options.get("buffered"),
        resume_modes=modes,
        preload=tuple(options.get("preload", ())),
        auto_preload=_flag(name, "auto_preload", options.get("auto_preload", True)),
        isolation=isolation,
        expected_failures=tuple(options.get("expected_failures", ())),
        crash_save=crash_save,
        state_tolerance=_tolerance(name, options.get("state_tolerance")),
        hang_timeout=_hang_timeout(name, options.get("hang_timeout")),
        services=_services(name, options.get("services", ())),
        capture_rng=_flag(name, "capture_rng", options.get("capture_rng", True)),
        elastic_state=_flag(name, "elastic_state", options.get("elastic_state", False)),
        early_stop=_early_stop(name, options.get("early_stop", EARLY_STOP_EPOCH)),
        resources=_resources(name, options.get("resources")),
        pass_env=_pass_env(name, options.get("pass_env", ())),
        **_distributed(name, world, elastic, options.get("preemption", ())),
        **_launcher(name, options.get("launcher", LAUNCHER_HARNESS), options.get("max_restarts", 0),
                    options.get("nnodes", 1), world, elastic),
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


def _distributed(name: str, world: Any, elastic: Any, preemption: Any) -> dict[str, Any]:
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
    return {"world_size": world, "elastic": tuple(dict.fromkeys(sizes)), "preemption": tuple(dict.fromkeys(graces))}


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


def _pass_env(name: str, value: Any) -> tuple[str, ...]:
    """``pass_env`` as variable names, each once (a string may hold several, separated by commas or spaces)."""
    try:
        return parse_names(value)
    except TypeError:
        raise TargetError(ERR_PASS_ENV.format(name=name, value=value, bad=value)) from None
    except ValueError as exc:
        raise TargetError(ERR_PASS_ENV.format(name=name, value=value, bad=str(exc))) from None


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
