"""Matrix axes and cells: which runs to make for a target, and where to kill them.

A cell is (target, case, resume mode, kill point). A kill point is a list of :class:`KillSpec`, one
per killed run; the run after the last kill goes to the end. Kill-point selection is boundary-aware:
``full`` takes every step; ``quick`` takes the first and last steps, each epoch boundary and the steps
beside it, and a seeded random sample of the rest.

Crash-consistency cells fault one save of the first case at its recorded file operations: every crash
point (``crash_save=(step, prior)``), or by default a few smoke cells (:func:`smoke_cells`). A save of several
ranks gets them rank by rank (:func:`ranked_plans`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_resume_check.records import faults
from pytest_resume_check.records.declaration import ERR_RAISED, ERR_STEPS_RETURNED, describe_error
from pytest_resume_check.records.kill_ids import cell_id, cell_name, kill_id
from pytest_resume_check.records.names import FULL, MODES, QUICK, case_id
from pytest_resume_check.records.plan import LAUNCHER_TORCHRUN, RESUME_AUTO, RESUME_PATH, SIGNAL_TERM, KillSpec
from pytest_resume_check.targets import Target, TargetError

#: In quick mode, how many further kill steps are drawn at random besides the boundary ones.
QUICK_RANDOM_SAMPLE = 3
#: In quick mode, at most this many steps where the trainer holds buffered inputs.
QUICK_BUFFERED_SAMPLE = 4
#: Runs of at most this many steps get every step as a kill point even in quick mode.
QUICK_EVERY_STEP_UP_TO = 12


@dataclass(frozen=True)
class Cell:
    """One test of the matrix."""

    target: Target
    case: Mapping[str, Any]
    resume_mode: str
    kills: tuple[KillSpec, ...]
    steps: int
    xfail_reason: str | None = None
    #: Earlier checkpoints the first run also writes (the case's other single-kill steps before the
    #: kill), as a trainer with a periodic schedule would. Lets cells share one run's prefix.
    prior_checkpoints: tuple[int, ...] = ()
    #: For crash-consistency cells: the recorded file operations of the save the fault hits.
    save_ops: tuple[faults.FileOp, ...] = ()

    @property
    def shares_prefix(self) -> bool:
        """A single kill right after a checkpoint: its first run is a prefix of its group's run."""
        k = self.kills[0]
        return (len(self.kills) == 1 and k.extra_steps == 0 and k.checkpoint_step > 0 and k.fault is None
                and k == KillSpec(k.checkpoint_step))  # a plain SIGKILL of every rank

    @property
    def group(self) -> tuple[str, str, str]:
        """Cells of one group differ only in where their single kill lands."""
        return (self.target.name, self.case_id, self.resume_mode)

    @property
    def case_id(self) -> str:
        """The id of the cell's case (see :func:`~pytest_resume_check.records.names.case_id`)."""
        return case_id(self.case)

    @property
    def kill_id(self) -> str:
        """The cell's kills as text: ``ckpt3``, ``ckpt1_ckpt7+1``, ``save3op4:power``."""
        return kill_id(self.kills)

    @property
    def id(self) -> str:
        """The cell's id within its target: ``shuffle-auto-ckpt3``."""
        return cell_id(self.case_id, self.resume_mode, self.kill_id)

    @property
    def name(self) -> str:
        """The cell's name: ``target[shuffle-auto-ckpt3]``."""
        return cell_name(self.target.name, self.case_id, self.resume_mode, self.kill_id)


def kill_steps(steps: int, boundaries: Sequence[int], mode: str, rng: random.Random,
               buffered: Sequence[int] = ()) -> list[int]:
    """Steps to checkpoint-and-kill at, for a run of ``steps`` steps."""
    every = list(range(1, steps + 1))
    if mode == FULL or steps <= QUICK_EVERY_STEP_UP_TO:
        return every
    chosen = {1, steps}
    for b in boundaries:
        chosen.update(s for s in (b - 1, b, b + 1) if 1 <= s <= steps)
    held = sorted(s for s in set(buffered) if 1 <= s <= steps and s not in chosen)
    chosen.update(held if len(held) <= QUICK_BUFFERED_SAMPLE else rng.sample(held, QUICK_BUFFERED_SAMPLE))
    rest = [s for s in every if s not in chosen]
    chosen.update(rng.sample(rest, min(QUICK_RANDOM_SAMPLE, len(rest))))
    return sorted(chosen)


def kill_points(steps: int, boundaries: Sequence[int], mode: str, rng: random.Random,
                resume_modes: Sequence[str], buffered: Sequence[int] = ()) -> list[tuple[str, tuple[KillSpec, ...]]]:
    """(resume mode, kills) for one case.

    Auto resume gets every selected step killed right after its checkpoint, an unsaved-steps kill
    (including one before any checkpoint) and a double kill. Explicit-path resume gets the first and
    middle steps and each epoch boundary, an unsaved step after each boundary (every step in ``full``)
    and a double kill.
    """
    selected = kill_steps(steps, boundaries, mode, rng, buffered)
    points: list[tuple[str, tuple[KillSpec, ...]]] = []
    if RESUME_AUTO in resume_modes:
        points += [(RESUME_AUTO, (KillSpec(k),)) for k in selected]
        unsaved = [0, steps // 2] if mode == QUICK else list(range(0, steps - 1))
        points += [(RESUME_AUTO, (KillSpec(k, 1 if k else 2),)) for k in sorted(set(unsaved)) if k + 2 <= steps]
        points += [(RESUME_AUTO, kills) for kills in _double_kills(steps, mode)]
    if RESUME_PATH in resume_modes:
        # Epoch boundaries in both modes: that is where loaders go wrong, whichever way a resume finds
        # its checkpoint (a path-only target with a boundary bug passed every quick cell).
        edges = {b for b in boundaries if 1 <= b <= steps}
        points += [(RESUME_PATH, (KillSpec(k),)) for k in sorted({1, max(1, steps // 2)} | edges) if k <= steps]
        after = list(range(1, steps - 1)) if mode == FULL else sorted(b for b in edges if b < steps - 1)
        points += [(RESUME_PATH, (KillSpec(k, 1),)) for k in after]
        points += [(RESUME_PATH, kills) for kills in _double_kills(steps, QUICK)]
    return points


def distributed_points(steps: int, boundaries: Sequence[int], mode: str, world_size: int, elastic: Sequence[int],
                       preemption: Sequence[float], lost_node: int | None = None,
                       agent: bool = False) -> list[tuple[str, tuple[KillSpec, ...]]]:
    """(resume mode, kills) of the distributed kinds, all in auto mode.

    One rank alone (the last) killed right after a checkpoint and one unsaved step later, at the middle
    and each epoch boundary; SIGTERM with each grace period at the end of a step with unsaved work (the
    first, the middle, each boundary; every step in ``full``); a resume at each other world size from a
    checkpoint at each boundary and the middle of each epoch (where a world size divides the data of a
    typical target), and one unsaved step after the first middle; the same points for ``lost_node``, a
    simulated node of a torchrun target killed whole (the last), the job going on without it, and that node
    lost at the first of them (each, in ``full``) and rejoining as many steps later as there are nodes; with
    ``agent``, torchrun's agent alone killed right after the middle checkpoint and one unsaved step later.
    """
    edges = sorted({b for b in boundaries if 1 <= b <= steps})
    middle = max(1, steps // 2)
    points: list[tuple[str, tuple[KillSpec, ...]]] = []
    if world_size > 1:
        last = world_size - 1
        points += [(RESUME_AUTO, (KillSpec(k, 0, rank=last),)) for k in sorted({middle, *edges}) if k < steps]
        points += [(RESUME_AUTO, (KillSpec(middle, 1, rank=last),))] if middle + 1 <= steps else []
    for grace in preemption:
        ends = range(1, steps + 1) if mode == FULL else sorted({1, middle + 1, *edges})
        points += [(RESUME_AUTO, (KillSpec(k - 1, 1, signal=SIGNAL_TERM, grace=grace),)) for k in ends
                   if 1 <= k <= steps]
    middles, before = [], 0
    for edge in edges or [steps]:
        middles.append(max(1, before + (edge - before) // 2))
        before = edge
    for world in elastic:
        at = sorted({*middles, *(b for b in edges if b < steps)})
        points += [(RESUME_AUTO, (KillSpec(k, 0, resume_world_size=world),)) for k in at]
        points += [(RESUME_AUTO, (KillSpec(middles[0], 1, resume_world_size=world),))] if middles[0] < steps else []
    if lost_node is not None:
        at = sorted({*middles, *(b for b in edges if b < steps)})
        points += [(RESUME_AUTO, (KillSpec(k, 0, node=lost_node),)) for k in at]
        points += [(RESUME_AUTO, (KillSpec(middles[0], 1, node=lost_node),))] if middles[0] < steps else []
        # The last of N nodes lost and back after N steps without it: the inputs taken meanwhile, N - 1 nodes' N
        # steps, divide among the N nodes again (a typical target resumes only at a position its world divides).
        nodes = lost_node + 1
        for k in at if mode == FULL else at[:1]:
            points += [(RESUME_AUTO, (KillSpec(k, 0, node=lost_node, rejoin=k + nodes),))] if k + nodes < steps else []
    if agent:
        points += [(RESUME_AUTO, (KillSpec(middle, 0, agent=True),))] if middle < steps else []
        points += [(RESUME_AUTO, (KillSpec(middle, 1, agent=True),))] if middle + 1 <= steps else []
    return points


def at_checkpoints(points: Sequence[tuple[str, tuple[KillSpec, ...]]]) -> list[tuple[str, tuple[KillSpec, ...]]]:
    """The kill points of a zero-change target, whose steps are its checkpoints: each kill moved to the checkpoint
    it follows (a kill between two checkpoints is a crash point of the next save, which crash cells cover), those
    before any checkpoint dropped, each point once, in order."""
    out: list[tuple[str, tuple[KillSpec, ...]]] = []
    for mode, kills in points:
        moved = tuple(replace(k, extra_steps=0) for k in kills)
        if all(k.checkpoint_step > 0 for k in moved) and (mode, moved) not in out:
            out.append((mode, moved))
    return out


def _double_kills(steps: int, mode: str) -> list[tuple[KillSpec, ...]]:
    """Runs killed twice: the second kill lands in the already resumed run."""
    if steps < 3:
        return []
    pairs = [(1, steps - 1)] if mode == QUICK else [(a, b) for a in range(1, steps) for b in (a + 1,)]
    return [(KillSpec(a), KillSpec(b, 1 if b < steps else 0)) for a, b in pairs]


def cells(target: Target, mode: str, seed: int) -> list[Cell]:
    """All cells of one target, in a stable order (the same on every xdist worker)."""
    if mode not in MODES:
        raise ValueError(f"matrix mode must be one of {list(MODES)}, not {mode!r}")
    out = []
    for case in target.cases:
        steps = _steps(target, case)
        boundaries = list(_ask(target, "boundaries", case, target.boundaries, case)) if target.boundaries else []
        rng = random.Random(f"{seed}:{target.name}:{case_id(case)}")
        buffered = list(_ask(target, "buffered", case, target.buffered, case)) if target.buffered else []
        points = kill_points(steps, boundaries, mode, rng, target.resume_modes, buffered)
        least, most = target.nnodes
        # A node lost for good: the job goes on on the others (torchrun restarts them at a smaller world).
        lost = most - 1 if least < most and target.max_restarts else None
        torchrun = target.launcher == LAUNCHER_TORCHRUN
        if target.world_size > 1 or target.elastic or target.preemption or lost is not None or torchrun:
            points += distributed_points(steps, boundaries, mode, target.world_size, target.elastic,
                                         target.preemption, lost, torchrun)
        if target.command is not None and target.command.checkpoints is not None:
            points = at_checkpoints(points)
        singles = {(m, k[0].checkpoint_step) for m, k in points
                   if len(k) == 1 and k[0] == KillSpec(k[0].checkpoint_step)}
        for resume_mode, kills in points:
            cell = Cell(target, case, resume_mode, kills, steps)
            if cell.shares_prefix:
                at = kills[0].checkpoint_step
                prior = tuple(sorted(s for m, s in singles if m == resume_mode and 0 < s < at))
                cell = Cell(target, case, resume_mode, kills, steps, None, prior)
            reason = next((why for pred, why in target.expected_failures
                           if _ask(target, "expected_failures", case, pred, cell)), None)
            out.append(Cell(target, case, resume_mode, kills, steps, reason, cell.prior_checkpoints))
    return out


def _ask(target: Target, function: str, case: Mapping[str, Any], fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)``, one of the target's own functions (named ``function``, asked about ``case``); what it
    raises becomes a :class:`TargetError` naming the target, the function and the case, so one broken
    target cannot abort the session."""
    try:
        return fn(arg)
    except Exception as exc:
        raise TargetError(ERR_RAISED.format(name=target.name, function=function, case_id=case_id(case),
                                            error=describe_error(exc))) from exc


def _steps(target: Target, case: Mapping[str, Any]) -> int:
    """``target.steps(case)``, which must be a whole number of at least 1."""
    value = _ask(target, "steps", case, target.steps, case)
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = 0
    if steps < 1 or steps != value:
        raise TargetError(ERR_STEPS_RETURNED.format(name=target.name, case_id=case_id(case), value=value))
    return steps


#: In quick mode, how many op indices get each I/O error kind besides ENOSPC-once (which gets all).
QUICK_ERROR_SAMPLE = 3


def tearable_files(ops: Sequence[faults.FileOp]) -> list[tuple[str, int]]:
    """(final path, index of the op that gave it its final name and content) of every file the save
    wrote *without* making its content durable first. Only such a file can be found torn (half
    written) under its final name after a crash: one written in place, renamed before an fsync, or
    written by ``torch.save(path)`` (which never fsyncs). Files fsynced before their rename cannot."""
    written: dict[str, tuple[int, bool]] = {}  # path -> (finalising op, durable)
    for op in ops:
        if op.kind in ("open", "torch.save"):
            written[op.path] = (op.index, False)
        elif op.kind == "fsync" and op.path in written:
            written[op.path] = (written[op.path][0], True)
        elif op.kind == "close" and op.path in written:
            written[op.path] = (op.index, written[op.path][1])
        elif op.kind in ("replace", "rename") and op.path in written and op.target:
            durable = written.pop(op.path)[1]
            written[op.target] = (op.index, durable)
    return sorted(((p, i) for p, (i, durable) in written.items() if not durable), key=lambda item: item[1])


def crash_points(ops: Sequence[faults.FileOp], mode: str) -> list[int]:
    """Op indices to fault. ``full``: every op and the end. ``quick``: every op that is not a write,
    the first and last write of each run of writes to one file, and the end."""
    total = len(ops)
    if mode == FULL:
        return list(range(total + 1))
    chosen = {total}
    for op in ops:
        if op.kind != "write":
            chosen.add(op.index)
            continue
        before = ops[op.index - 1] if op.index else None
        after = ops[op.index + 1] if op.index + 1 < total else None
        if not (before and before.kind == "write" and before.path == op.path) or not (
                after and after.kind == "write" and after.path == op.path):
            chosen.add(op.index)
    return sorted(chosen)


def crash_cells(target: Target, case: Mapping[str, Any], ops: Sequence[faults.FileOp], step: int, prior: int,
                mode: str, rng: random.Random) -> list[Cell]:
    """Cells of the crash-consistency axis for the save of checkpoint ``step`` (a checkpoint of
    ``prior`` exists before it): a kill before each chosen op and after the last (plain and with
    power loss), a half-written copy of every file that was not durable when it got its final name,
    and I/O errors at the ops (ENOSPC at each chosen op; EIO and persistent ENOSPC at a sample in
    quick mode, at every op in full mode). A save of several ranks: :func:`ranked_plans` of every rank's
    crash points."""
    if any(op.rank is not None for op in ops):
        plans = ranked_plans(ops, step, mode, smoke=False, nodes=simulated_nodes(target))
        return _fault_cells(target, case, ops, step, prior, plans)
    total = len(ops)
    points = crash_points(ops, mode)
    at_ops = [i for i in points if i < total]
    sample = at_ops if mode == FULL else sorted(rng.sample(at_ops, min(QUICK_ERROR_SAMPLE, len(at_ops))))
    plans = [faults.FaultPlan(step, faults.MODE_CRASH, i, total=total) for i in points]
    plans += [faults.FaultPlan(step, faults.MODE_POWER, i, total=total) for i in points]
    plans += [faults.FaultPlan(step, faults.MODE_TORN, min(i + 1, total), file=path, total=total)
              for path, i in tearable_files(ops)]
    plans += [faults.FaultPlan(step, faults.MODE_ERROR, i, faults.ERRNOS["enospc"], total=total) for i in at_ops]
    plans += [faults.FaultPlan(step, faults.MODE_ERROR, i, faults.ERRNOS["eio"], total=total) for i in sample]
    plans += [faults.FaultPlan(step, faults.MODE_ERROR, i, faults.ERRNOS["enospc"], True, total=total) for i in sample]
    return _fault_cells(target, case, ops, step, prior, plans)


def simulated_nodes(target: Target) -> int:
    """How many nodes a run of ``target`` is spread over (torchrun's ``nnodes``, at most; 1 for other launchers)."""
    return target.nnodes[1] if target.launcher == LAUNCHER_TORCHRUN else 1


def ranked_plans(ops: Sequence[faults.FileOp], step: int, mode: str, smoke: bool,
                 nodes: int = 1) -> list[faults.FaultPlan]:
    """The faults of a save of several ranks (``ops`` carry their rank and lane), lane by lane; each stops every
    lane (:func:`~pytest_resume_check.records.faults.stops_at`) and is kept once however many lanes' points give
    its stops.

    ``smoke``: for each lane, a kill right before its last file op and a power loss right after its last write
    (unless that is its last op), then a power loss once every lane did its last op, then each lane's last
    file that was not durable when it got its final name, torn. But where no rank entered a collective, the
    ranks wait for each other (if they do) by means the recorder does not see, and a rank stopped alone could
    leave the others waiting for it: only the power loss after every lane's last op. Otherwise each lane's
    :func:`crash_points` with a kill and a power loss, and every such file of each lane torn. Injected I/O
    errors are left to saves of one rank.

    Over several simulated ``nodes``, each node's power is also lost alone (its ranks' writes not fsynced, the
    others' kept): after every lane's last op in smoke cells, at every power loss's point otherwise."""
    lanes = faults.lanes_of(ops)
    totals = tuple((r, ln, len(own)) for (r, ln), own in sorted(lanes.items()))
    if not lanes:
        return []
    if smoke and not any(op.kind == faults.COLLECTIVE for op in ops):
        return _node_losses([faults.FaultPlan(step, faults.MODE_POWER, totals[0][2], total=totals[0][2], rank=0,
                                              stops=totals, totals=totals)], nodes, smoke)
    points: list[tuple[int, int, str, int, str | None]] = []  # (rank, lane, mode, op, torn file)
    torn: list[tuple[int, int, str, int, str | None]] = []
    for (rank, lane), own in sorted(lanes.items()):
        total = len(own)
        writes = [op.index for op in own if op.kind in ("write", "torch.save")]
        tearable = tearable_files(own)
        if smoke:
            files = [op.index for op in own if op.kind not in faults.SYNCS]
            points += [(rank, lane, faults.MODE_CRASH, files[-1], None)] if files else []
            points += ([(rank, lane, faults.MODE_POWER, writes[-1] + 1, None)]
                       if writes and writes[-1] + 1 < total else [])
            tearable = tearable[-1:]
        else:
            chosen = crash_points(own, mode)
            points += [(rank, lane, faults.MODE_CRASH, i, None) for i in chosen]
            points += [(rank, lane, faults.MODE_POWER, i, None) for i in chosen]
        torn += [(rank, lane, faults.MODE_TORN, min(at + 1, total), path) for path, at in tearable]
    if smoke:
        points.append((0, 0, faults.MODE_POWER, len(lanes.get((0, 0), [])), None))
    plans, seen = [], set()
    for rank, lane, kind, op, path in points + torn:
        stops = faults.stops_at(ops, rank, op, lane)
        if stops is None or (kind, stops, path) in seen:
            continue  # a point no run can reach (past a wait for a thread that is held back), or one already kept
        seen.add((kind, stops, path))
        plans.append(faults.FaultPlan(step, kind, op, file=path, total=len(lanes.get((rank, lane), [])), rank=rank,
                                      lane=lane or None, stops=stops, totals=totals))
    return _node_losses(plans, nodes, smoke)


def _node_losses(plans: list[faults.FaultPlan], nodes: int, smoke: bool) -> list[faults.FaultPlan]:
    """``plans`` and, over several nodes, each power loss (in smoke cells only the one after the whole save) again
    for each node alone."""
    if nodes <= 1:
        return plans
    power = [p for p in plans if p.mode == faults.MODE_POWER and (p.completes_save or not smoke)]
    return plans + [replace(p, node=node) for p in power for node in range(nodes)]


def _fault_cells(target: Target, case: Mapping[str, Any], ops: Sequence[faults.FileOp], step: int, prior: int,
                 plans: Sequence[faults.FaultPlan]) -> list[Cell]:
    """A crash cell per plan, resumed automatically, with the target's expected failures applied."""
    steps = _steps(target, case)
    out = []
    for plan in plans:
        cell = Cell(target, case, RESUME_AUTO, (KillSpec(step, 0, plan),), steps, None, (prior,), tuple(ops))
        reason = next((why for pred, why in target.expected_failures
                       if _ask(target, "expected_failures", case, pred, cell)), None)
        out.append(replace(cell, xfail_reason=reason))
    return out


#: The save the default crash smoke cells fault: checkpoint 2, with checkpoint 1 before it to fall back to.
SMOKE_SAVE = (2, 1)


@dataclass(frozen=True)
class CrashAxis:
    """Which save of a target's first case its crash cells fault, and how many cells: every crash point
    (``crash_save=(step, prior)``) or the smoke cells (the default)."""

    step: int
    prior: int
    smoke: bool


def crash_axis(target: Target) -> CrashAxis | None:
    """The crash cells ``target`` gets, None for none: ``crash_save=False``; or the default smoke cells where
    they cannot apply: no ``auto`` resume (a crash cell resumes from what the crash left in the run's own
    folder), or a first case of fewer than 2 steps (no checkpoint before the faulted save)."""
    declared = target.crash_save
    if not declared:
        return None
    if not isinstance(declared, str):
        step, prior = declared
        return CrashAxis(int(step), int(prior), smoke=False)
    step, prior = SMOKE_SAVE  # CRASH_SMOKE, the default
    if RESUME_AUTO not in target.resume_modes:
        return None
    if _steps(target, target.cases[0]) < step:
        return None
    return CrashAxis(step, prior, smoke=True)


def smoke_plans(ops: Sequence[faults.FileOp], step: int) -> list[faults.FaultPlan]:
    """The faults of the smoke cells of the save of checkpoint ``step`` with file operations ``ops``, in
    this order:

    - a kill right before its last operation: the save is incomplete, so a resume must fall back to the
      checkpoint before it (fails a save that names the new checkpoint before it is complete);
    - a power loss right after its last write (``write`` or ``torch.save``), unless that is its last
      operation: what was not fsynced is lost (fails a save that makes a checkpoint selectable before its
      data is durable);
    - a power loss after its last operation (fails a save that is complete but not durable);
    - if the save left a file that was not durable when it got its final name, the last such file torn
      (half its bytes, right after it was written: fails a save written in place).

    None for a save with no operation the recorder saw."""
    total = len(ops)
    if not total:
        return []
    writes = [op.index for op in ops if op.kind in ("write", "torch.save")]
    plans = [faults.FaultPlan(step, faults.MODE_CRASH, total - 1, total=total)]
    if writes and writes[-1] + 1 < total:
        plans.append(faults.FaultPlan(step, faults.MODE_POWER, writes[-1] + 1, total=total))
    plans.append(faults.FaultPlan(step, faults.MODE_POWER, total, total=total))
    tearable = tearable_files(ops)
    if tearable:
        path, at = tearable[-1]
        plans.append(faults.FaultPlan(step, faults.MODE_TORN, min(at + 1, total), file=path, total=total))
    return plans


def smoke_cells(target: Target, case: Mapping[str, Any], ops: Sequence[faults.FileOp], step: int,
                prior: int) -> list[Cell]:
    """The crash smoke cells of the save of checkpoint ``step`` (a checkpoint of ``prior`` before it): those
    of :func:`smoke_plans` (of :func:`ranked_plans` for a save of several ranks), resumed automatically, with
    the target's expected failures applied."""
    ranked = any(op.rank is not None for op in ops)
    plans = ranked_plans(ops, step, QUICK, smoke=True, nodes=simulated_nodes(target)) if ranked \
        else smoke_plans(ops, step)
    return _fault_cells(target, case, ops, step, prior, plans)
