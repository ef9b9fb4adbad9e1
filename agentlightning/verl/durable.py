"""Durable, atomic file writes: a reader sees either the old file or the complete new one, after a
kill or a power loss alike.

Every write goes to ``<path>.tmp`` through an open file object, is flushed and fsynced, and only then
moved to ``path`` with ``os.replace``; the folder is fsynced after the move so the new name survives a
power loss too. ``torch.save(obj, path)`` would write through C++ and never fsync, so objects are
serialized into memory first and written with one ``write`` call.

The temporary name is fixed (no process id): one trainer process writes a checkpoint folder, a file
left by a writer that was killed is simply overwritten by the next write, and the file operations of a
save are the same in every run (the crash-point matrix of ``pytest-resume-check`` relies on that).
On an exception the temporary file is removed and ``path`` is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from typing import Any

import torch

TEMP_SUFFIX = ".tmp"
# fsync of a directory is not supported everywhere (some file systems, Windows): skip it there, but let
# real I/O errors (EIO, ENOSPC) through, so a save that may not be durable fails loudly.
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES,
                          errno.EPERM, errno.EISDIR}


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
