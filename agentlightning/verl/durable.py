"""Durable, atomic file writes: a reader sees either the old file or the complete new one, after a
kill or a power loss alike; and the bounded read of a file a checkpoint folder holds.

Every write goes to ``<path>.tmp`` through an open file object, is flushed and fsynced, and only then
moved to ``path`` with ``os.replace``; the folder is fsynced after the move so the new name survives a
power loss too. ``torch.save(obj, path)`` would write through C++ and never fsync, so objects are
serialized into memory first and written with one ``write`` call.

The temporary name is fixed (no process id): one trainer process writes a checkpoint folder, a file
left by a writer that was killed is simply overwritten by the next write, and the file operations of a
save are the same in every run (the crash-point matrix of ``pytest-resume-check`` relies on that).
On an exception the temporary file is removed and ``path`` is left as it was.

Reads (:func:`read_regular`) take only a regular file, and only up to a size: a checkpoint folder is
somebody else's input, and a name in it may be a FIFO (an open blocks forever), a link to ``/dev/zero``
(a read never ends) or a huge sparse file. What it is instead is checked before any byte is
read, and errors never quote the file's bytes.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from typing import Any

import torch

TEMP_SUFFIX = ".tmp"
# fsync of a directory is not supported everywhere (some file systems, Windows): skip it there, but let
# real I/O errors (EIO, ENOSPC) through, so a save that may not be durable fails loudly.
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES,
                          errno.EPERM, errno.EISDIR}


class NotReadable(ValueError):
    """A file :func:`read_regular` refuses: what it is instead, as words for an error message."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of ``path`` (a symlink is followed) if it is a regular file of at most ``limit`` bytes.
    Raises :class:`NotReadable` (``is a FIFO, not a regular file``, ``is 3 GiB, more than ...``) before
    reading anything, and OSError when it cannot be opened or read."""
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):  # never opened: opening a FIFO blocks, a device may act on it
        raise NotReadable(f"is {_kind(before.st_mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        opened = os.fstat(fd)  # what was opened, should the name have changed meanwhile
        if not stat.S_ISREG(opened.st_mode):
            raise NotReadable(f"is {_kind(opened.st_mode)}, not a regular file")
        if opened.st_size > limit:
            raise NotReadable(f"is {_size(opened.st_size)}, more than the {_size(limit)} such a file may have")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise NotReadable(f"grew past {_size(limit)} while it was read")
    finally:
        os.close(fd)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def temp_path(path: str) -> str:
    """The temporary name ``path`` is written under before it is moved into place."""
    return f"{path}{TEMP_SUFFIX}"


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename inside it survives a power loss (skipped where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        if err.errno in _DIR_FSYNC_UNSUPPORTED:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """fsync a file another writer wrote in place (verl's ``torch.save(obj, path)``)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write_bytes(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` atomically and durably (temp file, fsync, ``os.replace``, fsync folder).

    Creates the folder if needed. On any exception the temporary file is removed and ``path`` is
    unchanged.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temp = temp_path(path)
    try:
        with open(temp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.lexists(temp):
            with contextlib.suppress(OSError):
                os.remove(temp)
        raise
    fsync_dir(folder)


def atomic_write_text(text: str, path: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically and durably; see :func:`atomic_write_bytes`."""
    atomic_write_bytes(text.encode("utf-8"), path)


def torch_bytes(obj: Any) -> bytes:
    """``obj`` as ``torch.save`` writes it to a file object (archive name ``archive``)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` ``obj`` to ``path`` so that readers only ever see a complete, durable file."""
    atomic_write_bytes(torch_bytes(obj), path)
