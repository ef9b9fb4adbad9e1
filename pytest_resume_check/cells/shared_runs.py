"""Shared first runs: cells of one (target, case, resume mode) that are killed right after a checkpoint
differ only in the step, so one first run serves them all.

That run checkpoints at every kill step of the group and pauses after each while the harness takes a
snapshot of the checkpoint directory (exactly what a kill at that moment would leave on disk). A file
whose bytes did not change since the previous snapshot is a hard link to that snapshot's copy, so the
snapshots of a group cost the bytes its checkpoints hold once (linear in the kill steps, where a copy
per pause was quadratic); a cell that takes a snapshot over makes the files it still shares its own
before its runs may write to them in place. Each cell then
starts from its copy, with the first run's events up to its checkpoint as its own first run, and its
log up to there: the log's length at the pause, when a kill would have come (the run goes on writing
past it, to the group's later kill points, which never happened in this cell's job).

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
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RESUME_AUTO, KillSpec
from pytest_resume_check.records.regular_files import NotRegular, kind_of, open_regular, read_chunks
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.records.state import new_hasher


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


class SharedFirstRuns:
    """The first runs of the groups of a matrix, each run once, when its first cell needs it."""

    def __init__(self, runner: Runner, layout: Layout):
        self.runner = runner
        self.layout = layout
        self._steps: dict[tuple[str, str, str], list[int]] = {}
        self._prefixes: dict[tuple[str, str, str], _Prefix | None] = {}

    def register(self, cells: Sequence[Cell]) -> None:
        """Learn the whole matrix, so each group's run checkpoints at all of its cells' steps."""
        for cell in cells:
            if cell.shares_prefix:
                steps = self._steps.setdefault(cell.group, [])
                for step in (*cell.prior_checkpoints, cell.kills[0].checkpoint_step):
                    if step not in steps:
                        steps.append(step)

    def first_run(self, cell: Cell, workdir: Path) -> tuple[RunRecord, str | None] | None:
        """The first run of ``cell`` cut from its group's run, its files copied into ``workdir``, and
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
        out = Layout.out(workdir, cell.resume_mode)
        # Moved, not copied: each snapshot serves the one cell killed at its step, and a copy per cell
        # would keep the disk use of a group quadratic in its kill steps until the session ends.
        shutil.move(snapshot, out)
        _own_files(out)
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
        seen: dict[str, _Copy] = {}

        unshared: dict[int, Unshareable] = {}

        def snapshot(step: int) -> None:  # the run's processes are stopped meanwhile (supervisor)
            log_sizes[step] = _size(Path(plan.log_path))  # what a kill here would have left in the log
            try:
                _snapshot(live, Layout.snapshot(workdir, step), seen)
            except Unshareable as exc:  # its cell is killed for real: the folder is then what the kill left
                unshared[step] = exc

        record = self.runner.run(plan, cell.target, on_pause=snapshot)
        if record.outcome != Outcome.KILLED:
            return None
        return _Prefix(record, workdir, live, log_sizes, unshared)


@dataclass(frozen=True)
class _Copy:
    """A file as the last snapshot holds it: where, its size, time and mode, and its bytes' hash."""

    path: str
    stat: tuple[int, int, int]
    digest: bytes


class Unshareable(Exception):
    """The checkpoint folder holds a file a snapshot cannot hold as a kill would leave it (a device or a
    socket: only the kernel makes those); the cells killed there run their own first runs instead."""

    def __init__(self, rel: str, kind: str):
        super().__init__(f"{rel} is {kind}")
        self.rel = rel
        self.kind = kind


def _snapshot(live: Path, dest: Path, seen: dict[str, _Copy]) -> None:
    """Copy ``live`` to ``dest`` as a kill now would leave it (times and modes kept, symlinks as the links they
    are, never followed; a FIFO as a new FIFO, never opened); ``seen`` (by relative path, updated) holds the
    previous snapshot's files, and one that is the same again, bytes, time and mode, is linked, not copied.
    The bytes are compared, not only the time: a trainer may rewrite a file in place within one tick of the
    file clock. Only regular files are read, each through a descriptor checked to be one
    (:mod:`~.records.regular_files`); raises :class:`Unshareable` for a device or a socket."""
    dest.mkdir(parents=True)
    folders = []
    # fwalk: every name is looked at and opened relative to its folder's descriptor, so no folder on the way
    # can be swapped for a link out of ``live`` meanwhile.
    for root, dirs, files, root_fd in os.fwalk(live):
        rel_root = os.path.relpath(root, live)
        target_root = dest / rel_root
        folders.append((root, target_root))
        for name in [*dirs, *files]:
            target = str(target_root / name)
            rel = os.path.normpath(os.path.join(rel_root, name))
            try:
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    os.mkdir(target)
                elif stat.S_ISLNK(info.st_mode):  # fwalk does not descend into one: kept as the link it is
                    os.symlink(os.readlink(name, dir_fd=root_fd), target)
                elif stat.S_ISFIFO(info.st_mode):
                    os.mkfifo(target, stat.S_IMODE(info.st_mode))
                    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
                elif stat.S_ISREG(info.st_mode):
                    seen[rel] = _link_or_copy(name, root_fd, target, seen.get(rel))
                else:
                    raise Unshareable(rel, kind_of(info.st_mode))
            except NotRegular as changed:  # no longer a regular file when opened (a thread not stopped)
                raise Unshareable(rel, changed.kind) from None
            except FileNotFoundError:  # gone while walking (a thread of the run that was not stopped)
                seen.pop(rel, None)
    for folder, copy in reversed(folders):  # after their files: a trainer may sort folders by time
        shutil.copystat(folder, copy, follow_symlinks=False)


def _link_or_copy(name: str, dir_fd: int, target: str, before: _Copy | None) -> _Copy:
    fd = open_regular(name, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        key = (info.st_size, info.st_mtime_ns, info.st_mode)
        if before is not None and before.stat == key and _hash_of(fd) == before.digest:
            try:
                os.link(before.path, target)
                return replace(before, path=target)
            except OSError:  # links not allowed here: copied below
                pass
        os.lseek(fd, 0, os.SEEK_SET)  # read again from the start when it was hashed to compare
        digest = _hash_of(fd, copy_to=target)
    finally:
        os.close(fd)
    os.chmod(target, stat.S_IMODE(info.st_mode))
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    return _Copy(target, key, digest)


def _hash_of(fd: int, copy_to: str | None = None) -> bytes:
    """The hash of the bytes of the regular file open on ``fd``, written to ``copy_to`` on the way when given."""
    hasher = new_hasher()
    with open(copy_to or os.devnull, "wb") as out:
        for chunk in read_chunks(fd):
            hasher.update(chunk)
            if copy_to:
                out.write(chunk)
    return hasher.digest()


def _own_files(folder: Path) -> None:
    """Give each file under ``folder`` that is still a hard link shared with another snapshot a copy of
    its own, so a run that rewrites it in place changes this cell's file only."""
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if info.st_nlink > 1 and stat.S_ISREG(info.st_mode):
                private = path + ".resume-check-own"
                shutil.copy2(path, private)
                os.replace(private, path)


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
