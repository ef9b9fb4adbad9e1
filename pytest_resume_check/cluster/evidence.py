"""A failing cell's kept folders on their way from a cluster node to the session: packed on the node,
unpacked into the session's folder, entry by entry on both sides.

Kept folders hold what a trainer left, and a trainer leaves more than files: a ``latest`` link to its newest
checkpoint (often absolute), a FIFO, a socket. Both sides take only directories, regular files (a file with
several links in the archive once, its other names as hard links) and symbolic links that stay inside
their kept folder; each other entry is named as refused (:class:`Refused`) and the rest still travels, so
one odd entry never costs the cell its evidence.

* :func:`pack` (on the node) reads each regular file through
  :mod:`~pytest_resume_check.records.regular_files` (never a FIFO or a device that took its place), writes a
  link that leads inside its kept folder as a relative one (an absolute ``latest -> /tmp/.../step_3`` would
  name a path of the node), and leaves out a link leading out of it, a FIFO, a device and a socket.
* :func:`unpack` (in the session) reads the archive as a stream, one entry at a time, and writes each
  without following any link: every folder of its path is opened with ``O_NOFOLLOW``, each entry is put in
  place by a rename in that folder. It refuses a name that is absolute, holds ``..`` or lies outside the
  kept folders, a link whose target is absolute or leads out of its kept folder (judged again once all
  links are there: a later link can turn where an earlier one leads), and any other kind of entry. The
  bytes of regular files are counted as they are written, against the same copy limit the node checked
  (the sizes in the archive's headers are not trusted): at the limit the entry being written is removed
  and the archive is read no further, so a small archive that would unpack into a large one cannot fill the
  session's disk.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import stat
import tarfile
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_resume_check.process.layout import check_inside
from pytest_resume_check.records.regular_files import NotRegular, kind_of, open_regular, read_chunks

#: Where an entry was refused (:attr:`Refused.where`): while the node packed it, or while it was unpacked here.
ON_NODE, HERE = "node", "here"

#: Why an entry was refused (:attr:`Refused.why`); the kinds of other files read as
#: :func:`~pytest_resume_check.records.regular_files.kind_of` names them ("a FIFO", "a socket", ...).
WHY_LINK_OUT = "a symbolic link to {target}, outside its kept folder"
WHY_UNSAFE_NAME = "a name that is absolute or holds '..'"
WHY_OUTSIDE = "outside the kept folders"
WHY_OVER_LIMIT = "over the copy limit of {limit} bytes: the archive was read no further"
WHY_GREW = "over the copy limit of {limit} bytes (it grew since the folders were measured)"
WHY_TOO_MANY = "more than {count} entries: the archive was read no further"
WHY_IN_THE_WAY = "in the way here: {error}"
WHY_UNREADABLE = "unreadable: {error}"
WHY_NO_ORIGINAL = "a hard link to {target}, which was not copied"
WHY_BROKEN = "the archive could not be read on: {error}"
#: The path a refusal of the archive as a whole names.
THE_ARCHIVE = "(the rest of the archive)"

#: Entries one archive may hold: each costs the session's disk an inode whatever its size.
MAX_ENTRIES = 200_000
#: Bytes written at a time while unpacking.
CHUNK = 1 << 20


@dataclass(frozen=True)
class Refused:
    """One entry that was not copied back: its path relative to the session's folder, why, and where it was
    refused (:data:`ON_NODE` or :data:`HERE`)."""

    path: str
    why: str
    where: str

    def to_json(self) -> dict[str, str]:
        """Plain data, as a record carries it across Ray and a cell's JSON names it."""
        return {"path": self.path, "why": self.why, "where": self.where}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Refused:
        return cls(str(data.get("path", "")), str(data.get("why", "")), str(data.get("where", ON_NODE)))


@dataclass
class Packed:
    """What :func:`pack` made: the gzipped tar and the entries it left out."""

    data: bytes
    refused: list[Refused] = field(default_factory=list)


@dataclass
class Unpacked:
    """What :func:`unpack` did: how many entries it put in place, and the entries it refused (an archive
    that could not be read on is one refusal naming :data:`THE_ARCHIVE`)."""

    placed: int = 0
    refused: list[Refused] = field(default_factory=list)


def folder_bytes(folders: Sequence[Path]) -> int:
    """Bytes of the regular files under ``folders``, a file with several links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder in folders:
        for path in [folder, *folder.rglob("*")]:
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


# -- on the node ---------------------------------------------------------------------------------------


def pack(folders: Sequence[Path], root: Path, limit: int) -> Packed:
    """``folders`` (each inside ``root``) as a gzipped tar, named relative to ``root``, with at most ``limit``
    bytes of regular files (one that grew past it since it was measured is refused)."""
    buffer = io.BytesIO()
    packer = _Packer(root, limit)
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1, format=tarfile.PAX_FORMAT) as tar:
        packer.tar = tar
        for folder in folders:
            folder = check_inside(Path(folder), root)
            packer.add(folder, folder)
    return Packed(buffer.getvalue(), packer.refused)


class _Packer:
    """The state of one :func:`pack`: the bytes packed so far, the files already in the archive (by inode),
    the entries refused."""

    def __init__(self, root: Path, limit: int):
        self.root = root
        self.limit = limit
        self.tar: tarfile.TarFile | None = None
        self.total = 0
        self.files: dict[tuple[int, int], str] = {}
        self.refused: list[Refused] = []

    def _refuse(self, path: Path, why: str) -> None:
        self.refused.append(Refused(str(path.relative_to(self.root)), why, ON_NODE))

    def add(self, path: Path, folder: Path) -> None:
        """``path`` (in its kept ``folder``), and what it holds when it is a folder."""
        assert self.tar is not None
        name = str(path.relative_to(self.root))
        try:
            st = path.lstat()
        except OSError as exc:
            return self._refuse(path, WHY_UNREADABLE.format(error=exc.strerror or exc))
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            self.tar.addfile(info)
            try:
                children = sorted(os.listdir(path))
            except OSError as exc:
                return self._refuse(path, WHY_UNREADABLE.format(error=exc.strerror or exc))
            for child in children:
                self.add(path / child, folder)
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            inside = _link_inside(path, target, folder)
            if inside is None:
                return self._refuse(path, WHY_LINK_OUT.format(target=target))
            info.type, info.linkname = tarfile.SYMTYPE, inside
            self.tar.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            self._add_file(path, info, (st.st_dev, st.st_ino))
        else:
            self._refuse(path, kind_of(st.st_mode))

    def _add_file(self, path: Path, info: tarfile.TarInfo, inode: tuple[int, int]) -> None:
        assert self.tar is not None
        if inode in self.files:  # another name of a file already packed
            info.type, info.linkname = tarfile.LNKTYPE, self.files[inode]
            self.tar.addfile(info)
            return
        try:
            fd = open_regular(str(path))
        except NotRegular as exc:  # replaced since it was looked at
            return self._refuse(path, exc.kind)
        except OSError as exc:
            return self._refuse(path, WHY_UNREADABLE.format(error=exc.strerror or exc))
        try:
            size = os.fstat(fd).st_size
            if self.total + size > self.limit:
                return self._refuse(path, WHY_GREW.format(limit=self.limit))
            data = b"".join(read_chunks(fd))  # up to its size when checked: a file still growing ends too
        except OSError as exc:
            return self._refuse(path, WHY_UNREADABLE.format(error=exc.strerror or exc))
        finally:
            os.close(fd)
        self.total += len(data)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        self.files[inode] = info.name


def _link_inside(link: Path, target: str, folder: Path) -> str | None:
    """What the link at ``link`` holding ``target`` is packed as: ``target`` itself when it is relative, a
    relative one for an absolute target that names a path inside ``folder`` (spelled as ``folder`` is, or
    with its links resolved); None when it leads out of ``folder`` (links on the way followed)."""
    here = os.path.dirname(os.path.abspath(link))
    if os.path.isabs(target):
        bases = (os.path.abspath(folder), os.path.realpath(folder))
        inner = next((r for r in (os.path.relpath(os.path.normpath(target), base) for base in bases)
                      if r != ".." and not r.startswith("../")), None)
        if inner is None:
            return None
        target = os.path.relpath(os.path.join(bases[0], inner), here)
    real, base = os.path.realpath(os.path.join(here, target)), os.path.realpath(folder)
    return target if real == base or real.startswith(base + os.sep) else None


# -- in the session ------------------------------------------------------------------------------------


def unpack(data: bytes, root: Path, folders: Sequence[str], limit: int) -> Unpacked:
    """Unpack ``data`` (a :func:`pack` archive) into ``root``, each entry inside one of ``folders`` (paths
    relative to ``root``), with at most ``limit`` bytes of regular files; see the module."""
    unpacker = _Unpacker(root, [tuple(_parts(f) or ()) for f in folders], limit)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar:
            unpacker.run(tar)
    except _Stop:
        pass
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        unpacker.refused.append(Refused(THE_ARCHIVE, WHY_BROKEN.format(error=exc), HERE))
    except OSError as exc:  # the session's own disk (full, read-only): nothing more can be placed
        unpacker.refused.append(Refused(THE_ARCHIVE, WHY_BROKEN.format(error=exc.strerror or exc), HERE))
    unpacker.check_links()
    return Unpacked(unpacker.placed, unpacker.refused)


class _Stop(Exception):
    """The archive is read no further (the copy limit, or too many entries); its refusal is already noted."""


class _InTheWay(Exception):
    """Something of the session's folder stands where an entry goes (a link or file where a folder must be)."""


class _Unpacker:
    """The state of one :func:`unpack`: the bytes written, the regular files and links placed, the refusals."""

    def __init__(self, root: Path, folders: list[tuple[str, ...]], limit: int):
        self.root = root
        self.folders = [f for f in folders if f]
        self.limit = limit
        self.written = 0
        self.entries = 0
        self.placed = 0
        self.files: set[str] = set()
        self.links: list[tuple[str, tuple[str, ...]]] = []
        self.refused: list[Refused] = []

    def _refuse(self, name: str, why: str) -> None:
        self.refused.append(Refused(name, why, HERE))

    def run(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            self.entries += 1
            if self.entries > MAX_ENTRIES:
                self._refuse(member.name, WHY_TOO_MANY.format(count=MAX_ENTRIES))
                raise _Stop
            parts = _parts(member.name)
            if parts is None:
                self._refuse(member.name, WHY_UNSAFE_NAME)
                continue
            folder = next((f for f in self.folders if tuple(parts[:len(f)]) == f), None)
            if folder is None:
                self._refuse(member.name, WHY_OUTSIDE)
                continue
            name = "/".join(parts)
            try:
                self._place(tar, member, name, parts, folder)
            except _InTheWay as exc:
                self._refuse(name, WHY_IN_THE_WAY.format(error=exc))
            except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
                self._refuse(name, WHY_IN_THE_WAY.format(error=exc.strerror or exc))

    def _place(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, parts: list[str],
               folder: tuple[str, ...]) -> None:
        """Put one entry in place, never through a link; refusals of its kind are noted here."""
        if not (member.isdir() or member.isreg() or member.issym() or member.islnk()):
            self._refuse(name, kind_of(_TAR_MODES.get(member.type, 0)))
            return
        if member.issym():
            where = posixpath.normpath(posixpath.join(*parts[:-1], member.linkname) if len(parts) > 1
                                       else member.linkname)
            if posixpath.isabs(member.linkname) or tuple(_parts(where) or ())[:len(folder)] != folder:
                self._refuse(name, WHY_LINK_OUT.format(target=member.linkname))
                return
        if member.islnk() and "/".join(_parts(member.linkname) or ()) not in self.files:
            self._refuse(name, WHY_NO_ORIGINAL.format(target=member.linkname))
            return
        parent = self._open_folders(parts[:-1])
        try:
            if member.isdir():
                self._make_folder(parent, parts[-1])
            elif member.issym():
                self._put(parent, parts[-1], lambda tmp: os.symlink(member.linkname, tmp, dir_fd=parent))
                self.links.append((name, folder))
            elif member.islnk():
                original = str(self.root.joinpath(*_parts(member.linkname) or ()))
                self._put(parent, parts[-1], lambda tmp: os.link(original, tmp, dst_dir_fd=parent,
                                                                  follow_symlinks=False))
            else:
                self._put(parent, parts[-1], lambda tmp: self._write(tar, member, name, parent, tmp))
                self.files.add(name)
        finally:
            os.close(parent)
        self.placed += 1

    def _open_folders(self, parts: list[str]) -> int:
        """A descriptor on the folder ``parts`` names below the root, each made when missing; a link or a file
        on the way is :class:`_InTheWay` (never followed)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                self._make_folder(fd, part)
                try:
                    inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    raise _InTheWay(f"{part} is no folder") from exc
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _make_folder(parent: int, name: str) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise _InTheWay(f"{name} is no folder") from None

    @staticmethod
    def _put(parent: int, name: str, make: Any) -> None:
        """Make the entry under a temporary name in its folder, then rename it over ``name`` (a file or a link
        there is replaced, a folder is not)."""
        tmp = f".{name[:100]}.{uuid.uuid4().hex[:12]}.part"
        try:
            make(tmp)
            if stat.S_ISDIR(_lstat_mode(name, parent)):
                raise IsADirectoryError(0, f"{name} is a folder here")
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except FileNotFoundError:
                pass
            raise

    def _write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, parent: int, tmp: str) -> None:
        """The regular file's bytes, counted against the limit as they are written."""
        source = tar.extractfile(member)
        assert source is not None
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
        try:
            for chunk in _chunks(source):
                self.written += len(chunk)
                if self.written > self.limit:
                    self._refuse(name, WHY_OVER_LIMIT.format(limit=self.limit))
                    raise _Stop
                os.write(fd, chunk)
            os.fchmod(fd, member.mode & 0o755 | 0o600)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)

    def check_links(self) -> None:
        """Remove each link placed that now leads out of its kept folder (a link placed later can change
        where an earlier one leads), until none does."""
        real_root = os.path.realpath(self.root)
        while True:
            out = []
            for name, folder in self.links:
                base = os.path.join(real_root, *folder)
                real = os.path.realpath(os.path.join(real_root, name))
                if real != base and not real.startswith(base + os.sep):
                    out.append((name, folder))
            if not out:
                return
            for name, folder in out:
                self.links.remove((name, folder))
                target = os.readlink(os.path.join(self.root, name))
                os.unlink(os.path.join(self.root, name))
                self.placed -= 1
                self._refuse(name, WHY_LINK_OUT.format(target=target))


#: The file type a tar entry's type stands for, so a refusal names it as a file of that kind would be.
_TAR_MODES = {tarfile.FIFOTYPE: stat.S_IFIFO, tarfile.CHRTYPE: stat.S_IFCHR, tarfile.BLKTYPE: stat.S_IFBLK}


def _parts(name: str) -> list[str] | None:
    """The components of a relative, clean name (``.`` dropped); None for an absolute one, one with ``..``,
    an empty one or one holding a NUL."""
    if not name or name.startswith("/") or "\0" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return None if not parts or ".." in parts else parts


def _lstat_mode(name: str, parent: int) -> int:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return 0


def _chunks(source: Any) -> Iterator[bytes]:
    while True:
        chunk = source.read(CHUNK)
        if not chunk:
            return
        yield chunk
