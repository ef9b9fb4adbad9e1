"""Shared first runs: cells of one (target, case, resume mode) that are killed right after a checkpoint
differ only in the step, so one first run serves them all.

That run checkpoints at every kill step of the group and pauses after each while the harness takes a
snapshot of the checkpoint directory (exactly what a kill at that moment would leave on disk:
:mod:`~.cells.snapshots`, which copies no bytes where a clone or a proved link to the live file does), so the
snapshots of a group cost the bytes its checkpoints hold once. Each cell then starts from its snapshot,
with the first run's events up to its checkpoint as its own first run, and its log up to there: the log's
length at the pause, when a kill would have come (the run goes on writing past it, to the group's later
kill points, which never happened in this cell's job).

A cell that takes a snapshot over makes its own (a clone where possible) each file it shares with anything
but a later snapshot, before its runs may write to it in place: a failing cell's kept folder, a resume's kept
evidence. A file only later snapshots share is lent instead: once the cell's runs have ended
(:meth:`SharedFirstRuns.release`), it is checked as a link to the live file is; a cell that wrote to it makes
those snapshots unusable, and their cells run their own first runs, as for a file the run rewrote in place.
A snapshot holding a file lent to a cell whose runs have not ended is not used either.

A snapshot reads only regular files, each through a descriptor checked to be one: symbolic links are copied
as the links they are and FIFOs made anew, neither ever opened, so a FIFO a trainer leaves in its folder
cannot stop the session. A device or a socket cannot be copied as a kill leaves it; the cells killed at that
checkpoint then run their own first runs, killed for real.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.cells.snapshots import (
    KIND_REWRITTEN_BY_CELL,
    Copy,
    Inode,
    LiveLinks,
    Times,
    Unshareable,
    links_inside,
    own_files,
    take_snapshot,
    times_of,
    unchanged_at,
)
from pytest_resume_check.process.layout import Layout, remove_inside
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RESUME_AUTO, KillSpec
from pytest_resume_check.records.results import Outcome, RunRecord


@dataclass
class _Prefix:
    """The shared first run of a group: its record, its folder (with snapshot copies), the checkpoint
    directory it wrote to and, by snapshot step, how many bytes its log held at that pause."""

    record: RunRecord
    workdir: Path
    live: Path
    log_sizes: dict[int, int] = field(default_factory=dict)
    #: The snapshot steps whose folder held a file no snapshot can hold (:class:`Unshareable`).
    unshared: dict[int, Unshareable] = field(default_factory=dict)
    #: Each file several snapshots hold: by inode, the paths of its links by step.
    holders: dict[Inode, dict[int, list[str]]] = field(default_factory=dict)
    #: The hash of each such file's bytes, by inode (a file without one is never lent).
    digests: dict[Inode, bytes] = field(default_factory=dict)
    #: The steps whose snapshot a cell has taken over.
    taken: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _Loan:
    """A file a cell's folder shares with later snapshots: the inode, what it was when lent, its bytes' hash
    and the later steps that hold it."""

    inode: Inode
    seen: Times
    digest: bytes
    steps: tuple[int, ...]


class SharedFirstRuns:
    """The first runs of the groups of a matrix, each run once, when its first cell needs it."""

    def __init__(self, runner: Runner, layout: Layout):
        self.runner = runner
        self.layout = layout
        self._steps: dict[tuple[str, str, str], list[int]] = {}
        self._prefixes: dict[tuple[str, str, str], _Prefix | None] = {}
        self._loans: dict[str, tuple[_Prefix, int, list[_Loan]]] = {}  # by the borrowing cell's folder

    def register(self, cells: Sequence[Cell]) -> None:
        """Learn the whole matrix, so each group's run checkpoints at all of its cells' steps."""
        for cell in cells:
            if cell.shares_prefix:
                steps = self._steps.setdefault(cell.group, [])
                for step in (*cell.prior_checkpoints, cell.kills[0].checkpoint_step):
                    if step not in steps:
                        steps.append(step)

    def first_run(self, cell: Cell, workdir: Path) -> tuple[RunRecord, str | None] | None:
        """The first run of ``cell`` cut from its group's run, its snapshot moved into ``workdir``, and
        the checkpoint path it published last; None when the cell cannot share (it runs on its own)."""
        if not (cell.shares_prefix and cell.group in self._steps):
            return None
        prefix = self._prefix(cell)
        if prefix is None:
            return None
        step = cell.kills[0].checkpoint_step
        snapshot = Layout.snapshot(prefix.workdir, step)
        if step in prefix.unshared or not snapshot.exists():
            return None
        lent = {loan.inode for _, _, loans in self._loans.values() for loan in loans}
        if any(step in by_step for inode, by_step in prefix.holders.items() if inode in lent):
            return None  # a cell whose runs have not ended may still write to one of its files
        out = Layout.out(workdir, cell.resume_mode)
        # Moved, not copied: each snapshot serves the one cell killed at its step, and a copy per cell
        # would keep the disk use of a group quadratic in its kill steps until the session ends.
        shutil.move(snapshot, out)
        prefix.taken.add(step)
        self._lend(prefix, step, out, workdir)
        events, published = [], None
        # Up to the pause at this checkpoint: by then every rank had reported the step's end (what a kill
        # there would have left on the channel, too).
        for event in prefix.record.events:
            if event.kind == ev.PAUSED:
                if event.step == step:
                    break
                continue
            if event.path and event.path.startswith(str(prefix.live)):
                event = replace(event, path=str(out) + event.path[len(str(prefix.live)):])
            events.append(event)
            if event.kind == ev.CHECKPOINT and event.step == step and not event.rank:
                published = event.path
        kill = cell.kills[0]
        events.append(ev.Event(ev.KILL_READY, text=kill.describe()))
        log = Layout.log(workdir, 0)  # the shared run's output up to this cell's kill, kept with the cell
        _copy_head(Layout.log(prefix.workdir, 0), log, prefix.log_sizes.get(step))
        plan = replace(prefix.record.plan, checkpoint_dir=str(out), log_path=str(log),
                       kill=kill, checkpoint_steps=frozenset((*cell.prior_checkpoints, step)), pause_steps=frozenset())
        record = RunRecord(plan, events, Outcome.KILLED, prefix.record.exitcode, None, 0.0, prefix.record.hang_timeout,
                           prefix.record.pid, prefix.record.isolation)
        return record, published

    def _lend(self, prefix: _Prefix, step: int, out: Path, workdir: Path) -> None:
        def later(inode: Inode) -> list[int]:
            return [s for s in prefix.holders.get(inode, {}) if s not in prefix.taken and s not in prefix.unshared]

        def lendable(info: os.stat_result, discarded: int) -> bool:
            # Only this folder, later snapshots and folders being deleted link it (no kept folder, no
            # evidence), and its hash is known.
            inode = (info.st_dev, info.st_ino)
            by_step = prefix.holders.get(inode, {})
            mine = len(by_step.get(step, [])) + sum(len(by_step[s]) for s in later(inode))
            return inode in prefix.digests and info.st_nlink <= mine + discarded and bool(later(inode))

        loans = []
        # A passed cell's folder in the trash (an earlier cell was lent the same files) is read by nothing.
        for _, info in own_files(out, lendable, lambda: links_inside(self.layout.trash.folder)):
            inode = (info.st_dev, info.st_ino)
            loans.append(_Loan(inode, times_of(info), prefix.digests[inode], tuple(later(inode))))
        if loans:
            self._loans[str(workdir)] = (prefix, step, loans)

    def release(self, workdir: Path) -> None:
        """The runs of the cell in ``workdir`` have ended: each file it was lent is checked (unchanged, or only
        its links changed and its bytes hash the same); the later snapshots holding one its runs wrote to
        are unusable, and their cells run their own first runs."""
        prefix, step, loans = self._loans.pop(str(workdir), (None, 0, []))
        if prefix is None:
            return
        for loan in loans:
            later = [s for s in loan.steps if s not in prefix.taken and s not in prefix.unshared]
            if not later:
                continue
            paths = prefix.holders[loan.inode][later[0]]
            if unchanged_at(paths[0], loan.inode, loan.seen, loan.digest):
                continue
            rel = os.path.relpath(paths[0], Layout.snapshot(prefix.workdir, later[0]))
            for s in later:
                prefix.unshared.setdefault(s, Unshareable(rel, KIND_REWRITTEN_BY_CELL.format(step=step)))
                remove_inside(Layout.snapshot(prefix.workdir, s), self.layout.root, ignore_errors=True)

    def _prefix(self, cell: Cell) -> _Prefix | None:
        if cell.group not in self._prefixes:
            self._prefixes[cell.group] = self._run_prefix(cell)
        return self._prefixes[cell.group]

    def _run_prefix(self, cell: Cell) -> _Prefix | None:
        steps = sorted(self._steps[cell.group])
        workdir = self.layout.fresh(self.layout.prefix(cell.target.name, cell.case_id, cell.resume_mode))
        plan = self.runner.plan(cell.target, cell.case, workdir, 0, out=Layout.out(workdir, cell.resume_mode),
                                resume_mode=RESUME_AUTO, kill=KillSpec(steps[-1]), checkpoint_steps=steps,
                                pause_steps=steps)
        live = Path(plan.checkpoint_dir)
        log_sizes: dict[int, int] = {}
        seen: dict[str, Copy] = {}
        links = LiveLinks()

        unshared: dict[int, Unshareable] = {}

        def snapshot(step: int) -> None:  # the run's processes are stopped meanwhile (supervisor)
            log_sizes[step] = _size(Path(plan.log_path))  # what a kill here would have left in the log
            links.step = step
            try:
                take_snapshot(live, Layout.snapshot(workdir, step), seen, links)
            except Unshareable as exc:  # its cell is killed for real: the folder is then what the kill left
                unshared[step] = exc
            links.past_the_tick(workdir)

        record = self.runner.run(plan, cell.target, on_pause=snapshot)
        if record.outcome != Outcome.KILLED:
            return None
        # The run has ended: what its live files hold now is final. A snapshot a later write reached is not
        # what the kill left; its cells run their own first runs.
        for step, exc in links.check().items():
            unshared.setdefault(step, exc)
            remove_inside(Layout.snapshot(workdir, step), self.layout.root, ignore_errors=True)
        # The live names go, so a file still linked is one a later snapshot shares (own_files copies only
        # those), and the disk holds the bytes no longer than the cells need them.
        remove_inside(live, self.layout.root, ignore_errors=True)
        holders = _holders({step: Layout.snapshot(workdir, step) for step in steps if step not in unshared})
        return _Prefix(record, workdir, live, log_sizes, unshared, holders, links.digests)


def _holders(snapshots: dict[int, Path]) -> dict[Inode, dict[int, list[str]]]:
    """Each regular file that has more than one link: by inode, its paths in ``snapshots`` by step."""
    holders: dict[Inode, dict[int, list[str]]] = {}
    for step, folder in snapshots.items():
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                info = os.lstat(path)
                if info.st_nlink > 1 and stat.S_ISREG(info.st_mode):
                    holders.setdefault((info.st_dev, info.st_ino), {}).setdefault(step, []).append(path)
    return holders


def _size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # no output yet
        return 0


def _copy_head(source: Path, dest: Path, size: int | None) -> None:
    """Copy the first ``size`` bytes of ``source`` to ``dest`` (all of it for None)."""
    if size is None:
        shutil.copyfile(source, dest)
        return
    with open(source, "rb") as src, open(dest, "wb") as out:
        while size > 0:
            chunk = src.read(min(size, 1 << 20))
            if not chunk:
                break
            out.write(chunk)
            size -= len(chunk)
