"""Snapshots of a shared first run's checkpoint folder: what a kill at a pause would leave there, taken
without copying bytes where the file system allows it, and proved still so when the run has ended.

A regular file is cloned (a reflink, ``FICLONE``: the file system shares the blocks until either is written),
else hard-linked to the run's live file when it is big enough to matter (:data:`LINK_MIN_BYTES`), else
copied (a copy whose bytes did not change by the next snapshot is linked there). A link to the live file is
proved, not assumed (:class:`LiveLinks`): the inode's size, times and mode are recorded right after the link
and checked at the next snapshot and once the run has ended; when only the change time moved (a link made or
removed: a trainer deleting an old checkpoint), the hash taken at the link decides. A file the run rewrote in
place makes every snapshot holding it unusable (its cells run their own first runs: slower, never wrong) and
is copied from then on. Only regular files are read, each through a descriptor checked to be one; symbolic
links are copied as the links they are and FIFOs made anew. The harness itself never cuts a file another
path shares (:func:`~.records.regular_files.open_regular`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_resume_check.records.regular_files import (
    PRIVATE_SUFFIX,
    NotRegular,
    kind_of,
    open_regular,
    read_chunks,
)
from pytest_resume_check.records.state import new_hasher

#: An inode: its device and number.
Inode = tuple[int, int]


@dataclass(frozen=True)
class Copy:
    """A file as the last snapshot holds it: where, its size, time and mode, and its bytes' hash."""

    path: str
    stat: tuple[int, int, int]
    digest: bytes


class Unshareable(Exception):
    """The checkpoint folder holds a file a snapshot cannot hold as a kill would leave it (a device or a
    socket: only the kernel makes those; a file the run rewrote in place after a snapshot linked it); the
    cells killed there run their own first runs instead."""

    def __init__(self, rel: str, kind: str):
        super().__init__(f"{rel} is {kind}")
        self.rel = rel
        self.kind = kind


#: :class:`Unshareable`'s kind for a file the run wrote to after a snapshot held it as a link to the live file.
KIND_REWRITTEN = "a file the run rewrote in place after the snapshot"
#: :class:`Unshareable`'s kind for a file a cell's runs wrote to while a later snapshot shared it.
KIND_REWRITTEN_BY_CELL = "a file the runs of the cell killed at step {step} rewrote in place"

#: The ioctl that makes a file share another's blocks (``FICLONE``, Linux): a copy that costs no bytes until
#: either is written, where the file system can (btrfs, XFS, bcachefs; not ext4 or tmpfs).
FICLONE = 0x40049409

#: The smallest file a snapshot holds as a hard link to the run's live file; a smaller one is copied. Logs,
#: pointers, step counters, trackers and JSON states are small and often rewritten or appended to in place,
#: which would leave every snapshot linking them unusable (its cell then runs a first run of its own), and a
#: copy of them costs next to nothing; checkpoint blobs, the bytes worth not copying, are big and written once.
LINK_MIN_BYTES = 1 << 20

#: What proves an inode unchanged: its size, modification and change times (ns) and mode.
Times = tuple[int, int, int, int]


def times_of(info: os.stat_result) -> Times:
    """The size, modification and change times and mode of ``info``."""
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode


def unchanged(seen: Times, digest: bytes | None, fd: int) -> bool:
    """Whether the regular file open on ``fd`` still holds what was seen (``seen``, its bytes hashing to
    ``digest``): nothing moved its change time since, or only that (a link made or removed: a trainer that
    deletes an old checkpoint) and the bytes hash the same. The change time cannot be set by a process."""
    now = times_of(os.fstat(fd))
    if now == seen:
        return True
    if digest is None or (now[0], now[1], now[3]) != (seen[0], seen[1], seen[3]):
        return False
    os.lseek(fd, 0, os.SEEK_SET)
    return hash_of(fd) == digest


def unchanged_at(path: str, inode: Inode, seen: Times, digest: bytes | None) -> bool:
    """:func:`unchanged` for the file at ``path``, which must still be ``inode``."""
    try:
        fd = open_regular(path)
    except (OSError, NotRegular):
        return False
    try:
        info = os.fstat(fd)
        return (info.st_dev, info.st_ino) == inode and unchanged(seen, digest, fd)
    finally:
        os.close(fd)


@dataclass
class _Linked:
    """A live file of the run that snapshots hold as hard links: one such path and its relative name, what
    the inode was right after the harness last linked it, its bytes' hash then, the steps that hold it."""

    path: str
    rel: str
    seen: Times
    digest: bytes
    steps: list[int]


class LiveLinks:
    """How a group's snapshots hold the run's files without copying them: clones where the file system
    can, else hard links to the live files, each proved unchanged by :meth:`check` once the run has ended.
    ``clones`` and ``links`` count the files taken each way (what a test or a benchmark can see);
    ``digests`` holds the hash of every linked or copied file's bytes by inode (what lets a cell borrow one)."""

    def __init__(self) -> None:
        #: The snapshot being taken (set by the caller before each).
        self.step = 0
        self.clones = 0
        self.links = 0
        self.digests: dict[Inode, bytes] = {}
        self._linked: dict[Inode, _Linked] = {}
        self._rewritten: set[str] = set()  # relative paths the run rewrote in place: copied from then on
        self._broken: dict[int, Unshareable] = {}
        self._clone = True  # until the file system refuses one

    def take(self, fd: int, info: os.stat_result, name: str, dir_fd: int, target: str, rel: str) -> bool:
        """Put the regular file ``name`` (open on ``fd``, ``info`` its fstat) at ``target`` without a copy of
        its bytes; False when it has to be copied (a file the run rewrote in place, or no clone or link
        possible here)."""
        if rel in self._rewritten:
            return False
        if self._clone and clone(fd, target):
            os.chmod(target, stat.S_IMODE(info.st_mode))
            os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
            self.clones += 1
            return True
        self._clone = False
        if info.st_size < LINK_MIN_BYTES:
            return False
        inode = (info.st_dev, info.st_ino)
        linked = self._linked.get(inode)
        if linked is not None and not unchanged(linked.seen, linked.digest, fd):
            self._rewritten.add(rel)
            self._break(inode)
            return False
        # Hashed once, when first linked: what decides later whether only the change time moved.
        os.lseek(fd, 0, os.SEEK_SET)
        digest = linked.digest if linked is not None else hash_of(fd)
        try:
            # The inode itself, neither its mode nor its times set again (that would move its change time).
            os.link(name, target, src_dir_fd=dir_fd, follow_symlinks=False)
        except OSError:  # links not allowed here, or the name gone (a thread not stopped): copied from fd
            return False
        after = os.stat(target, follow_symlinks=False)
        # The same inode, and unchanged since it was hashed (a thread the supervisor did not stop): else a copy.
        if (after.st_ino, after.st_size, after.st_mtime_ns) != (info.st_ino, info.st_size, info.st_mtime_ns):
            os.unlink(target)
            if linked is not None:
                self._break(inode)
            return False
        if linked is None:
            linked = self._linked[inode] = _Linked(target, rel, times_of(after), digest, [])
        linked.path, linked.seen = target, times_of(after)  # the harness's own link moved the change time
        linked.steps.append(self.step)
        self.digests[inode] = digest
        self.links += 1
        return True

    def copied(self, copy: Copy) -> None:
        """Note a copy a snapshot made (its hash lets a cell borrow it)."""
        info = os.stat(copy.path, follow_symlinks=False)
        self.digests[(info.st_dev, info.st_ino)] = copy.digest

    def past_the_tick(self, folder: Path) -> None:
        """Return once the file system's clock has ticked past every change time recorded (it ticks every few
        milliseconds): a write the run makes after it goes on then moves a recorded time."""
        if not self._linked:
            return
        newest = max(linked.seen[2] for linked in self._linked.values())
        clock = folder / ".resume-check-clock"  # beside the snapshots, never in one
        clock.touch()
        for _ in range(10_000):
            os.utime(clock)  # stamped by the file system's own clock, as the run's writes are
            if os.stat(clock).st_ctime_ns > newest:
                return
            time.sleep(0.001)

    def check(self) -> dict[int, Unshareable]:
        """Once the run has ended: the snapshot steps that hold a live file the run changed after they linked
        it (not what a kill there left), each with the file that changed."""
        for inode, linked in list(self._linked.items()):
            if not unchanged_at(linked.path, inode, linked.seen, linked.digest):
                self._break(inode)
        return dict(self._broken)

    def _break(self, inode: Inode) -> None:
        linked = self._linked.pop(inode)
        self.digests.pop(inode, None)
        self._rewritten.add(linked.rel)
        for step in linked.steps:
            self._broken.setdefault(step, Unshareable(linked.rel, KIND_REWRITTEN))


def clone(fd: int, target: str) -> bool:
    """Make ``target`` a clone of the file open on ``fd`` (a reflink: no bytes copied); False where the file
    system cannot (nothing is left at ``target`` then)."""
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.ioctl(out, FICLONE, fd)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EPERM, errno.ENOSYS):
            raise
    finally:
        os.close(out)
    os.unlink(target)
    return False


def take_snapshot(live: Path, dest: Path, seen: dict[str, Copy], links: LiveLinks | None = None) -> None:
    """Copy ``live`` to ``dest`` as a kill now would leave it (times and modes kept, symlinks as the links they
    are, never followed; a FIFO as a new FIFO, never opened); ``seen`` (by relative path, updated) holds the
    previous snapshot's copies, and one that is the same again, bytes, time and mode, is linked, not copied.
    The bytes are compared, not only the time: a trainer may rewrite a file in place within one tick of the
    file clock. With ``links``, a regular file is cloned or linked to the live one instead where it can be
    (:class:`LiveLinks`). Only regular files are read, each through a descriptor checked to be one
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
                    copied = _take(name, root_fd, target, seen.get(rel), links, rel)
                    if copied is None:
                        seen.pop(rel, None)
                    else:
                        seen[rel] = copied
                else:
                    raise Unshareable(rel, kind_of(info.st_mode))
            except NotRegular as changed:  # no longer a regular file when opened (a thread not stopped)
                raise Unshareable(rel, changed.kind) from None
            except FileNotFoundError:  # gone while walking (a thread of the run that was not stopped)
                seen.pop(rel, None)
    for folder, copy in reversed(folders):  # after their files: a trainer may sort folders by time
        shutil.copystat(folder, copy, follow_symlinks=False)


def _take(name: str, dir_fd: int, target: str, before: Copy | None, links: LiveLinks | None,
          rel: str) -> Copy | None:
    """The regular file ``name`` at ``target``: cloned or linked to the live file (None), else a copy or a
    link to the previous snapshot's copy (its record)."""
    fd = open_regular(name, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if links is None:
            return _link_or_copy(fd, info, target, before)
        if links.take(fd, info, name, dir_fd, target, rel):
            return None
        os.lseek(fd, 0, os.SEEK_SET)
        copy = _link_or_copy(fd, info, target, before)
        links.copied(copy)
        return copy
    finally:
        os.close(fd)


def _link_or_copy(fd: int, info: os.stat_result, target: str, before: Copy | None) -> Copy:
    key = (info.st_size, info.st_mtime_ns, info.st_mode)
    if before is not None and before.stat == key and hash_of(fd) == before.digest:
        try:
            os.link(before.path, target)
            return replace(before, path=target)
        except OSError:  # links not allowed here: copied below
            pass
    os.lseek(fd, 0, os.SEEK_SET)  # read again from the start when it was hashed to compare
    digest = hash_of(fd, copy_to=target)
    os.chmod(target, stat.S_IMODE(info.st_mode))
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    return Copy(target, key, digest)


def hash_of(fd: int, copy_to: str | None = None) -> bytes:
    """The hash of the bytes of the regular file open on ``fd``, written to ``copy_to`` on the way when given."""
    hasher = new_hasher()
    with open(copy_to or os.devnull, "wb") as out:
        for chunk in read_chunks(fd):
            hasher.update(chunk)
            if copy_to:
                out.write(chunk)
    return hasher.digest()


#: How many times :func:`own_files` counts a file's links again when one went away while it counted.
OWN_ROUNDS = 3


def own_files(folder: Path, lendable: Callable[[os.stat_result, int], bool] = lambda info, discarded: False,
              discarded: Callable[[], Mapping[Inode, int]] = dict) -> list[tuple[str, os.stat_result]]:
    """Give each file under ``folder`` that is still a hard link shared with another snapshot a copy of its
    own (a clone where the file system can), so a run that rewrites it in place changes this cell's file
    only. ``discarded`` counts links by inode in folders being deleted, which nothing reads again: a file
    whose other links are all there is left as it is. A file ``lendable`` says only later snapshots share
    (given its discarded links) is left shared, and returned (its path and stat): the caller checks it once
    the cell's runs have ended."""
    shared = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if info.st_nlink > 1 and stat.S_ISREG(info.st_mode):
                shared.append((path, info))
    lent: list[tuple[str, os.stat_result]] = []
    owned: list[tuple[str, os.stat_result]] = []
    for _ in range(OWN_ROUNDS):
        # Counted after every st_nlink was read: a deletion since lowers a count, never raises it.
        gone = discarded() if shared else {}
        again: list[tuple[str, os.stat_result]] = []
        for path, info in shared:
            elsewhere = gone.get((info.st_dev, info.st_ino), 0)
            if info.st_nlink - elsewhere <= 1:
                continue
            if lendable(info, elsewhere):
                lent.append((path, info))
                continue
            now = os.lstat(path)
            # A link deleted between the two reads (the trash's thread at work): counted again, not copied.
            (again if now.st_nlink < info.st_nlink else owned).append((path, now))
        shared = again
    for path, _ in [*owned, *shared]:
        private = path + PRIVATE_SUFFIX
        if not _clone_path(path, private):
            shutil.copyfile(path, private)
        shutil.copystat(path, private)
        os.replace(private, path)
    return lent


def links_inside(folder: Path) -> dict[Inode, int]:
    """How many hard links to each inode of a regular file lie under ``folder`` (none when it is not there); a
    file deleted while the folder is walked is not counted."""
    found: dict[Inode, int] = {}
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                inode = (info.st_dev, info.st_ino)
                found[inode] = found.get(inode, 0) + 1
    return found


def _clone_path(source: str, target: str) -> bool:
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return clone(fd, target)
    finally:
        os.close(fd)
