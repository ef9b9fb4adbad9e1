"""Matrix axes and cells: which runs to make for a target, and where to kill them.

A cell is (target, case, resume mode, kill point). A kill point is a list of :class:`KillSpec`, one
per killed run; the run after the last kill goes to the end. Kill-point selection is boundary-aware:
``full`` takes every step; ``quick`` takes the first and last steps, each epoch boundary and the steps
beside it, and a seeded random sample of the rest.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_resume_check.run import RESUME_AUTO, RESUME_PATH, KillSpec
from pytest_resume_check.targets import Target

QUICK = "quick"
FULL = "full"
MODES = (QUICK, FULL)

#: In quick mode, how many further kill steps are drawn at random besides the boundary ones.
QUICK_RANDOM_SAMPLE = 3
#: In quick mode, at most this many steps where the trainer holds buffered inputs.
QUICK_BUFFERED_SAMPLE = 4
#: Runs of at most this many steps get every step as a kill point even in quick mode.
QUICK_EVERY_STEP_UP_TO = 12


def case_id(case: Mapping[str, Any]) -> str:
    """Readable id of a case: its ``id`` key, or ``key=value`` pairs joined by commas."""
    if "id" in case:
        return str(case["id"])
    if not case:
        return "default"
    return ",".join(f"{k}={_short(v)}" for k, v in case.items())


def _short(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def kill_id(kills: Sequence[KillSpec]) -> str:
    """``ckpt3`` (killed right after checkpoint 3), ``ckpt3+1`` (one unsaved step later),
    ``ckpt2,ckpt5`` (killed twice)."""
    return ",".join(
        f"ckpt{k.checkpoint_step}" + (f"+{k.extra_steps}" if k.extra_steps else "") for k in kills
    )


def parse_kill_id(text: str) -> tuple[KillSpec, ...]:
    """Inverse of :func:`kill_id`; raises ValueError with the expected form."""
    kills = []
    for part in text.split(","):
        part = part.strip()
        if not part.startswith("ckpt"):
            raise ValueError(f"kill point {text!r}: each part must look like ckpt3 or ckpt3+1")
        step, _, extra = part[4:].partition("+")
        kills.append(KillSpec(int(step), int(extra or 0)))
    return tuple(kills)


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

    @property
    def shares_prefix(self) -> bool:
        """A single kill right after a checkpoint: its first run is a prefix of its group's run."""
        return len(self.kills) == 1 and self.kills[0].extra_steps == 0 and self.kills[0].checkpoint_step > 0

    @property
    def group(self) -> tuple[str, str, str]:
        """Cells of one group differ only in where their single kill lands."""
        return (self.target.name, self.case_id, self.resume_mode)

    @property
    def case_id(self) -> str:
        return case_id(self.case)

    @property
    def kill_id(self) -> str:
        return kill_id(self.kills)

    @property
    def id(self) -> str:
        return f"{self.case_id}-{self.resume_mode}-{self.kill_id}"


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
    (including one before any checkpoint) and a double kill. Explicit-path resume gets a few of each.
    """
    selected = kill_steps(steps, boundaries, mode, rng, buffered)
    points: list[tuple[str, tuple[KillSpec, ...]]] = []
    if RESUME_AUTO in resume_modes:
        points += [(RESUME_AUTO, (KillSpec(k),)) for k in selected]
        unsaved = [0, steps // 2] if mode == QUICK else list(range(0, steps - 1))
        points += [(RESUME_AUTO, (KillSpec(k, 1 if k else 2),)) for k in sorted(set(unsaved)) if k + 2 <= steps]
        points += [(RESUME_AUTO, kills) for kills in _double_kills(steps, mode)]
    if RESUME_PATH in resume_modes:
        mid = max(1, steps // 2)
        points += [(RESUME_PATH, (KillSpec(k),)) for k in sorted({1, mid}) if k <= steps]
        if mode == FULL:
            points += [(RESUME_PATH, (KillSpec(k, 1),)) for k in range(1, steps - 1)]
        points += [(RESUME_PATH, kills) for kills in _double_kills(steps, QUICK)]
    return points


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
        steps = int(target.steps(case))
        boundaries = list(target.boundaries(case)) if target.boundaries else []
        rng = random.Random(f"{seed}:{target.name}:{case_id(case)}")
        buffered = list(target.buffered(case)) if target.buffered else []
        points = kill_points(steps, boundaries, mode, rng, target.resume_modes, buffered)
        singles = {(m, k[0].checkpoint_step) for m, k in points if len(k) == 1 and k[0].extra_steps == 0}
        for resume_mode, kills in points:
            cell = Cell(target, case, resume_mode, kills, steps)
            if cell.shares_prefix:
                at = kills[0].checkpoint_step
                prior = tuple(sorted(s for m, s in singles if m == resume_mode and 0 < s < at))
                cell = Cell(target, case, resume_mode, kills, steps, None, prior)
            reason = next((why for pred, why in target.expected_failures if pred(cell)), None)
            out.append(Cell(target, case, resume_mode, kills, steps, reason, cell.prior_checkpoints))
    return out
