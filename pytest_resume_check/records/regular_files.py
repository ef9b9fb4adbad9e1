"""Opening only regular files the harness has checked, and reading each within its size.

The harness reads files a trainer left behind: the checkpoint folder a shared first run's snapshot copies,
the final outputs a command target's run digests. Any of them can be something else than a file: a FIFO
(opening one to read waits for a writer, forever), a device (``/dev/zero`` never ends) or a symbolic link
leading out of the run's folder (the harness would read files that are not the run's). So every file is
looked at without following a link (``lstat``), opened with ``O_NOFOLLOW`` and ``O_NONBLOCK`` (a FIFO put in
its place meanwhile does not block the open), and the opened descriptor itself is checked to be that regular
file (``fstat``) before a byte is read: a check of the path alone leaves a gap in which the file can be
replaced. A read stops at the size the descriptor had when it was checked, so a file still growing ends too.

:func:`open_inside` resolves a path inside a folder one component at a time, each opened relative to the
folder above it, and follows a symbolic link only while where it leads stays inside that folder.
:func:`open_for_append` opens the step summary file the session writes at its end, a regular file only.
The same checks guard a file opened to be cut (a power loss's damage after a kill inside a save): it is
opened for writing, with no truncating flag, and cut only once the descriptor is known to be that file.
The harness never changes in place an inode another path shares: a file opened to be cut that has more than
one hard link (a shared first run's snapshot, a resume's kept evidence) first gets a copy of its own, put
under its name, and only that copy is cut.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

#: How many symbolic links :func:`open_inside` follows for one path (the kernel's own limit is 40).
MAX_LINKS = 40
#: Bytes read at a time.
CHUNK = 1 << 20

#: What a path is instead of a regular file, as :class:`NotRegular` names it.
KIND_FIFO = "a FIFO"
KIND_CHAR_DEVICE = "a character device"
KIND_BLOCK_DEVICE = "a block device"
KIND_SOCKET = "a socket"
KIND_FOLDER = "a folder"
KIND_LINK = "a symbolic link"
#: A symbolic link that leads out of the folder the path must stay in (``{target}``: what the link holds).
KIND_LINK_OUT = "a symbolic link to {target}, outside {folder}"
#: A symbolic link (or a chain of them) to a path that does not exist.
KIND_LINK_NOWHERE = "a symbolic link to {target}, which does not exist"
KIND_LINK_LOOP = "a chain of more than " + str(MAX_LINKS) + " symbolic links"
KIND_OTHER = "not a regular file (mode {mode:o})"
#: A file to be cut whose name led to another file by the time its copy was made (a process still running).
KIND_REPLACED = "a name another file took meanwhile"

#: ``os.open`` as it was when this module was imported: in a run's process the zero-change watcher wraps
#: ``os.open`` to see the program's reads, and the pointer files it reads itself through this module must not
#: count as the program's (the watcher imports this module before it wraps anything).
_os_open = os.open

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Opened to be cut with ``os.ftruncate``: ``O_NONBLOCK`` as above (a FIFO nobody reads fails with ``ENXIO``
#: instead of waiting), and no ``O_TRUNC``, which would cut a file before it is checked.
_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FOLDER = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class NotRegular(Exception):
    """A path the harness refuses to read: it is no regular file (``kind`` says what it is instead), or a
    symbolic link leading out of the folder it must stay in."""

    def __init__(self, path: str, kind: str):
        super().__init__(f"{path} is {kind}")
        self.path = path
        self.kind = kind


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (an ``st_mode``) is, as a refusal names it."""
    kinds = ((stat.S_ISFIFO, KIND_FIFO), (stat.S_ISCHR, KIND_CHAR_DEVICE), (stat.S_ISBLK, KIND_BLOCK_DEVICE),
             (stat.S_ISSOCK, KIND_SOCKET), (stat.S_ISDIR, KIND_FOLDER), (stat.S_ISLNK, KIND_LINK))
    return next((kind for test, kind in kinds if test(mode)), KIND_OTHER.format(mode=stat.S_IFMT(mode)))


def open_regular(path: str, *, dir_fd: int | None = None, write: bool = False) -> int:
    """A descriptor open for reading (``write``: for writing, to cut it) on the regular file ``path``
    (relative to ``dir_fd`` when given), never through a symbolic link; raises :class:`NotRegular` for
    anything else, without opening a FIFO or a device that was one when looked at."""
    mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegular(path, kind_of(mode))
    try:
        fd = _os_open(path, _WRITE if write else _READ, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since it was looked at
            raise NotRegular(path, KIND_LINK) from None
        if exc.errno == errno.ENXIO:  # replaced by a FIFO nobody reads since it was looked at
            raise NotRegular(path, KIND_FIFO) from None
        raise
    fd = _checked(fd, path)
    if write and os.fstat(fd).st_nlink > 1:
        try:
            return _private(fd, path, dir_fd)
        finally:
            os.close(fd)
    return fd


#: The name a file to be cut is copied to, beside it, before the copy is renamed over it.
PRIVATE_SUFFIX = ".resume-check-own"


def _private(fd: int, path: str, dir_fd: int | None) -> int:
    """A descriptor for writing on a copy of the regular file ``path`` (open for writing on ``fd``, with more
    than one hard link): its bytes, mode and times, renamed over ``path``. Another link is another file's
    content (a snapshot other cells resume from, a resume's kept evidence) that cutting the shared inode would
    change too; a clone (reflink) is a private copy already, and has one link."""
    info = os.fstat(fd)
    source = _checked(_os_open(path, _READ, dir_fd=dir_fd), path)
    head, name = os.path.split(path)
    temporary = os.path.join(head, f".{name}{PRIVATE_SUFFIX}")
    try:
        if (os.fstat(source).st_dev, os.fstat(source).st_ino) != (info.st_dev, info.st_ino):
            raise NotRegular(path, KIND_REPLACED)  # another file under the name since it was opened: not cut
        out = _os_open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       stat.S_IMODE(info.st_mode), dir_fd=dir_fd)
        try:
            for chunk in read_chunks(source):
                while chunk:
                    chunk = chunk[os.write(out, chunk):]
            os.fchmod(out, stat.S_IMODE(info.st_mode))
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.replace(temporary, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.close(out)
            try:
                os.unlink(temporary, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(source)
    return out


def _checked(fd: int, path: str) -> int:
    """``fd`` if it is open on a regular file (what was opened, not what the path names now), else closed."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(path, kind_of(mode))
    return fd


def read_chunks(fd: int) -> Iterator[bytes]:
    """The bytes of the regular file open on ``fd`` from where it stands, up to the size it has now."""
    left = os.fstat(fd).st_size - os.lseek(fd, 0, os.SEEK_CUR)
    while left > 0:
        chunk = os.read(fd, min(left, CHUNK))
        if not chunk:  # cut shorter meanwhile
            return
        left -= len(chunk)
        yield chunk


def open_inside(folder: str, rel: str, *, write: bool = False) -> int:
    """A descriptor on what ``rel`` names inside ``folder``: a regular file open for reading (``write``: for
    writing, to cut it; a folder is then refused too), or a folder (a
    directory descriptor, for :func:`os.listdir`). Each component is opened relative to the one before it,
    never through a link; a symbolic link is followed by putting where it leads in its place, relative or
    absolute, as long as that stays inside ``folder`` (``..`` above ``folder`` does not). Raises
    :class:`NotRegular` for a FIFO, device or socket, and for a link leading out of ``folder``."""
    bases = (os.path.abspath(folder), os.path.realpath(folder))  # as named, and with its links resolved
    parts = _parts(rel)
    opened = [_os_open(folder, _FOLDER & ~os.O_NOFOLLOW)]  # the folder itself is the harness's: named as given
    links, target = 0, ""
    try:
        while parts:
            name = parts.pop()
            if name == "..":
                if len(opened) == 1:
                    raise NotRegular(rel, KIND_LINK_OUT.format(target=rel, folder=folder))
                os.close(opened.pop())
                continue
            try:
                mode = os.stat(name, dir_fd=opened[-1], follow_symlinks=False).st_mode
            except FileNotFoundError:
                if not links:  # the path itself is not there
                    raise
                raise NotRegular(rel, KIND_LINK_NOWHERE.format(target=target)) from None
            if stat.S_ISLNK(mode):
                links += 1
                if links > MAX_LINKS:
                    raise NotRegular(rel, KIND_LINK_LOOP)
                target = os.readlink(name, dir_fd=opened[-1])
                if os.path.isabs(target):  # inside only if it names a path below the folder
                    inner = next((r for r in (os.path.relpath(target, base) for base in bases)
                                  if r != ".." and not r.startswith("../")), None)
                    if inner is None:
                        raise NotRegular(rel, KIND_LINK_OUT.format(target=target, folder=folder))
                    while len(opened) > 1:
                        os.close(opened.pop())
                    target = inner
                parts.extend(_parts(target))
                continue
            if stat.S_ISDIR(mode) and (parts or not write):
                opened.append(_os_open(name, _FOLDER, dir_fd=opened[-1]))
            elif stat.S_ISREG(mode) and not parts:
                return open_regular(name, dir_fd=opened[-1], write=write)
            else:
                raise NotRegular(rel, kind_of(mode))
        if write:  # the folder itself: nothing to cut
            raise NotRegular(rel, KIND_FOLDER)
        return opened.pop()
    finally:
        for fd in opened:
            os.close(fd)


def _parts(path: str) -> list[str]:
    """The components of ``path`` in reverse (the next one last, to pop), without empty ones and ``.``."""
    return [p for p in reversed(path.split("/")) if p not in ("", ".")]


def open_for_append(path: str) -> int:
    """A descriptor appending to ``path``, created when it does not exist; an existing path (links
    followed: the path is the user's choice) must be a regular file. Raises :class:`NotRegular` without
    waiting for a FIFO's reader, and OSError when it cannot be opened."""
    try:
        fd = _os_open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads, or a device that is not there
            raise NotRegular(path, kind_of(os.stat(path).st_mode)) from None
        raise
    return _checked(fd, path)
