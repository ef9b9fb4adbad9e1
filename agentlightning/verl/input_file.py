"""``agentlightning_input.pt``: the file that holds the async input position in each step folder.

This module owns the file's bytes: writing them atomically and durably, and reading them back safely.
What the file holds (entries, format versions, checks) is :mod:`agentlightning.verl.input_format`;
how numpy values are stored is :mod:`agentlightning.verl.value_encoding`; its name and place are
:mod:`agentlightning.verl.verl_layout`; its errors are :mod:`agentlightning.verl.errors`.

Safety: the file holds only tensors and plain Python values, so ``torch.load(weights_only=True)`` reads
it with no allow-list and no pickled code from a checkpoint is ever executed. Before torch sees a file,
:mod:`agentlightning.verl.input_bounds` reads its zip directory and the opcodes of its pickle without
running them: a pickle that names any global other than those ``torch.save`` writes for plain tensors is refused with
:class:`InputCheckpointUnsafeError` naming the global; bytes that are not a torch zip archive are never
unpickled at all. No message ever suggests loading a file with pickled code enabled.

Bounds: a file of N bytes is read with memory in proportion to N, whatever its bytes claim. Every
claimed size is checked against the bytes that back it *before* anything of that size is allocated
(see :mod:`agentlightning.verl.input_bounds`); a file claiming more is
:class:`InputCheckpointCorruptError`. The writer runs the same checks on what it writes, so a file it
wrote is never refused for its size or content.

Integrity: the file is a torch zip archive whose zip *comment* holds a SHA-256 of everything before it
(``agentlightning-sha256:<hex>``, declared by the ``integrity`` entry), so every flipped bit is found,
not only those in the records the zip CRCs cover (about half of a small file's bytes are zip headers
and padding that neither the CRCs nor ``torch.load`` check). It is still an ordinary zip that
``torch.load`` reads. Files written before the checksum existed are read with the CRC checks only.

Atomicity: the file is written with :func:`agentlightning.verl.durable.atomic_write_bytes` (temporary
name, fsync, ``os.replace``, fsync of the folder), so after a kill or a power loss a reader sees either
no file or a complete one. A file *cut short* under its final name (:class:`InputCheckpointTruncatedError`)
therefore comes from another writer or a copy that was interrupted; a full-length file that fails its
checks (:class:`InputCheckpointCorruptError` and the other subclasses of :class:`InputCheckpointError`)
comes from no crash at all. :mod:`agentlightning.verl.resume_selection` decides what each means for a
resume.
"""


from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from agentlightning.verl import inflight
from agentlightning.verl.durable import NotReadable, atomic_write_bytes, read_regular, torch_bytes
from agentlightning.verl.errors import (
    FIX_OTHER_CHECKPOINT,
    InputCheckpointCorruptError,
    InputCheckpointEncodeError,
    InputCheckpointTruncatedError,
    InputCheckpointUnsafeError,
)
from agentlightning.verl.input_bounds import (
    ZIP_END,
    ZIP_END_SIZE,
    ZIP_START,
    Refused,
    check_archive,
    check_state,
    zip_end,
)
from agentlightning.verl.input_format import (
    INPUT_STATE_FORMAT_VERSION,
    INTEGRITY_SHA256,
    KEY_CARRIED_OVER,
    KEY_FORMAT_VERSION,
    KEY_GLOBAL_STEP,
    KEY_INPUT_STREAM,
    KEY_INTEGRITY,
    InputCheckpoint,
    validate_payload,
)
from agentlightning.verl.value_encoding import encode_value
from agentlightning.verl.verl_layout import input_state_path

CHECKSUM_PREFIX = b"agentlightning-sha256:"
CHECKSUM_SIZE = len(CHECKSUM_PREFIX) + 64
_CHECKSUM_RE = re.compile(re.escape(CHECKSUM_PREFIX) + rb"[0-9a-f]{64}\Z")
#: The largest input file the reader takes (and the writer writes): it holds a loader position, a buffered
#: tail and in-flight rollouts, never model weights. Checked before a byte is read (a 3 GiB
#: sparse file cost 32 s and 3 GB before it was refused).
MAX_INPUT_FILE_BYTES = 1 << 30
_REFUSED_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)")
_UNPICKLER_ERROR_RE = re.compile(r"WeightsUnpickler error: ([^\n]{0,200})")

FIX_UNSAFE = (
    "Never load it with a loader that runs pickled code: agentlightning does not write code into this "
    "file, so it comes from elsewhere. " + FIX_OTHER_CHECKPOINT
)
FIX_UNSTORABLE = (
    "Store plain dense tensors (tensor.detach().contiguous()), not parameters, subclasses, sparse or "
    "expanded tensors, and store numpy string arrays of very different lengths with dtype=object"
)


# ---------------------------------------------------------------- writing


def checksummed(archive: bytes) -> bytes | None:
    """The torch zip ``archive`` with its checksum as zip comment, or None when its end record is not
    the one torch writes (no comment).

    The checksum covers every byte before it, the end record with the comment's length included.
    """
    if archive[-ZIP_END_SIZE:-ZIP_END_SIZE + 4] != ZIP_END or archive[-2:] != b"\x00\x00":
        return None
    head = archive[:-2] + CHECKSUM_SIZE.to_bytes(2, "little")
    return head + CHECKSUM_PREFIX + hashlib.sha256(head).hexdigest().encode("ascii")


def encode_input_file(payload: dict[str, Any]) -> bytes:
    """The bytes of an input file holding ``payload``: a torch zip archive whose comment is its checksum.

    A torch that writes another end record gets the file without a checksum rather than a guess.
    """
    return checksummed(torch_bytes({**payload, KEY_INTEGRITY: INTEGRITY_SHA256})) or torch_bytes(payload)


def write_input_state(
    step_folder: str,
    global_step: int,
    stream_state: Mapping[str, Any],
    carried_over: Mapping[str, Any] | None = None,
) -> str:
    """Atomically and durably write the input file for ``global_step`` into ``step_folder``; returns
    its path.

    ``carried_over`` is the in-flight record's ``state_dict()``; None stores an empty record (nothing in
    flight). The state is encoded and the file's bytes pass the reader's checks before any file is
    touched, so a state that cannot be stored (or read back) leaves the folder as it was.
    """
    path = input_state_path(step_folder)
    if carried_over is None:
        carried_over = inflight.InFlightInputs().state_dict()
    try:
        stream = encode_value(dict(stream_state), KEY_INPUT_STREAM)
        groups = encode_value(dict(carried_over), KEY_CARRIED_OVER)
    except InputCheckpointEncodeError as err:
        raise InputCheckpointEncodeError(path, err.problem, err.fix) from None
    payload = {
        KEY_FORMAT_VERSION: INPUT_STATE_FORMAT_VERSION,
        KEY_GLOBAL_STEP: int(global_step),
        KEY_INPUT_STREAM: stream,
        KEY_CARRIED_OVER: groups,
    }
    data = encode_input_file(payload)
    try:
        if len(data) > MAX_INPUT_FILE_BYTES:
            raise Refused(f"is larger than {MAX_INPUT_FILE_BYTES} bytes")
        check_archive(data)
        check_state(payload, len(data))
    except Refused as refused:
        problem = f"would not be read back: the reader refuses a file that {refused.problem}"
        if refused.code:
            problem = f"holds a value that torch.save stores by calling {refused.code}, which the reader refuses"
        raise InputCheckpointEncodeError(path, problem, FIX_UNSTORABLE) from None
    atomic_write_bytes(data, path)
    return path


# ---------------------------------------------------------------- reading


def read_input_checkpoint(step_folder: str, expected_step: int | None = None) -> InputCheckpoint | None:
    """The decoded, validated input file in ``step_folder`` (format version 1 or 2), or None if it has
    none.

    Every problem raises a subclass of :class:`InputCheckpointError` naming the file and the problem:
    :class:`InputCheckpointTruncatedError` (cut short), :class:`InputCheckpointUnsafeError` (pickled
    code), :class:`InputCheckpointCorruptError` (any other damage: checksum, structure, sizes it cannot
    back, missing entries, wrong types), :class:`InputCheckpointVersionError` and
    :class:`InputCheckpointStepMismatchError` (the file's step differs from ``expected_step``). No
    exception from inside torch escapes.
    """
    path = input_state_path(step_folder)
    if not os.path.lexists(path):
        return None
    try:
        raw = read_regular(path, MAX_INPUT_FILE_BYTES)
    except NotReadable as refused:
        raise InputCheckpointCorruptError(path, str(refused), FIX_OTHER_CHECKPOINT) from None
    except OSError as err:
        raise InputCheckpointCorruptError(path, f"cannot be read ({err.strerror or err})", FIX_OTHER_CHECKPOINT) \
            from None
    has_checksum = _check_bytes(path, raw)
    try:
        check_archive(raw)
        payload = _unpickle(path, raw)
        check_state(payload, len(raw))
    except Refused as refused:
        if refused.code:
            raise _unsafe(path, refused.code) from None
        raise InputCheckpointCorruptError(path, refused.problem, FIX_OTHER_CHECKPOINT) from None
    return validate_payload(path, payload, expected_step, has_checksum)


def read_input_state(step_folder: str, expected_step: int | None = None) -> dict[str, Any] | None:
    """The decoded input stream state stored in ``step_folder``, or None if it has no input file
    (:func:`read_input_checkpoint` without the version and the carried-over groups)."""
    checkpoint = read_input_checkpoint(step_folder, expected_step)
    return None if checkpoint is None else checkpoint.stream


def _check_bytes(path: str, raw: bytes) -> bool:
    """Refuse bytes that are cut short, not a zip archive, or fail their checksum; True if checksummed."""
    if len(raw) < len(ZIP_START) and ZIP_START.startswith(raw):
        raise InputCheckpointTruncatedError(
            path, f"is cut short: {len(raw)} bytes, an interrupted write", FIX_OTHER_CHECKPOINT
        )
    if not raw.startswith(ZIP_START):
        raise InputCheckpointCorruptError(
            path, "is not a torch zip archive (its first bytes are no zip signature)", FIX_OTHER_CHECKPOINT
        )
    has_checksum = _CHECKSUM_RE.search(raw[-CHECKSUM_SIZE:]) is not None
    end = zip_end(raw)
    if end is None and not has_checksum:
        raise InputCheckpointTruncatedError(
            path,
            f"is cut short: {len(raw)} bytes and no end-of-archive record (an interrupted write or copy)",
            FIX_OTHER_CHECKPOINT,
        )
    if end == len(raw) - ZIP_END_SIZE and not has_checksum:
        return False  # no comment: written before the checksum existed; the zip CRCs are checked on load
    if not has_checksum:
        raise InputCheckpointCorruptError(path, "has a damaged checksum record", FIX_OTHER_CHECKPOINT)
    head = raw[:-CHECKSUM_SIZE]
    if hashlib.sha256(head).hexdigest().encode("ascii") != raw[-64:]:
        raise InputCheckpointCorruptError(
            path,
            "fails its SHA-256 checksum: its bytes changed after it was written (disk or copy damage)",
            FIX_OTHER_CHECKPOINT,
        )
    return True


def _unsafe(path: str, code: str) -> InputCheckpointUnsafeError:
    return InputCheckpointUnsafeError(
        path, f"holds pickled code that loading would run (it calls {code}); it was refused and nothing ran", FIX_UNSAFE
    )


def _unpickle(path: str, raw: bytes) -> Any:
    """``torch.load(weights_only=True)`` of ``raw`` with every failure turned into a typed error.

    The checks before it refuse what torch would; this maps what remains. torch's messages advise
    loading the file with pickled code enabled: only the line saying what was wrong is kept.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols are noise here
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as err:  # any failure inside torch means the same thing to the user
        message = str(err)
        refused = _REFUSED_GLOBAL_RE.search(message)
        if refused:
            raise _unsafe(path, refused.group(1)) from None
        raise InputCheckpointCorruptError(
            path, f"cannot be loaded ({type(err).__name__}: {_torch_problem(message)})", FIX_OTHER_CHECKPOINT
        ) from None


def _torch_problem(message: str) -> str:
    """The part of a torch error ``message`` that says what was wrong: printable, without advice."""
    detail = _UNPICKLER_ERROR_RE.search(message)
    lines = ([detail.group(1)] if detail else []) + message.splitlines()
    kept = [line.strip() for line in lines if line.strip() and "weights_only" not in line]
    return "".join(c if c.isprintable() else "?" for c in (kept[0] if kept else ""))[:200]
