"""``agentlightning_input.pt``: the file that holds the async input position in each step folder.

This module owns the file's bytes: writing them atomically and durably, and reading them back safely.
What the file holds (entries, format versions, checks) is :mod:`agentlightning.verl.input_format`;
how numpy values are stored is :mod:`agentlightning.verl.value_encoding`; its name and place are
:mod:`agentlightning.verl.verl_layout`; its errors are :mod:`agentlightning.verl.errors`.

Safety: the file holds only tensors and plain Python values, so ``torch.load(weights_only=True)`` reads
it with no allow-list and no pickled code from a checkpoint is ever executed. A file that would need
code to load is refused with :class:`InputCheckpointUnsafeError`; bytes that are not a torch zip archive
are never unpickled at all.

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
import pickle
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from agentlightning.verl import inflight
from agentlightning.verl.durable import atomic_write_bytes, torch_bytes
from agentlightning.verl.errors import (
    FIX_OTHER_CHECKPOINT,
    InputCheckpointCorruptError,
    InputCheckpointEncodeError,
    InputCheckpointTruncatedError,
    InputCheckpointUnsafeError,
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

# Zip layout: every archive starts with a local file header and ends with the end-of-central-directory
# record (22 bytes, then a comment of the length its last two bytes give).
ZIP_START = b"PK\x03\x04"
ZIP_END = b"PK\x05\x06"
ZIP_END_SIZE = 22
CHECKSUM_PREFIX = b"agentlightning-sha256:"
CHECKSUM_SIZE = len(CHECKSUM_PREFIX) + 64
_CHECKSUM_RE = re.compile(re.escape(CHECKSUM_PREFIX) + rb"[0-9a-f]{64}\Z")
_REFUSED_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+) was not an allowed global")
_UNPICKLER_ERROR_RE = re.compile(r"WeightsUnpickler error: ([^\n]{0,200})")


# ---------------------------------------------------------------- writing


def encode_input_file(payload: dict[str, Any]) -> bytes:
    """The bytes of an input file holding ``payload``: a torch zip archive whose comment is its checksum.

    The checksum covers every byte before it, the end record with the comment's length included.
    """
    data = torch_bytes({**payload, KEY_INTEGRITY: INTEGRITY_SHA256})
    if data[-ZIP_END_SIZE:-ZIP_END_SIZE + 4] != ZIP_END or data[-2:] != b"\x00\x00":
        # Not the layout torch writes today: store the file without a checksum rather than guess.
        return torch_bytes(payload)
    head = data[:-2] + CHECKSUM_SIZE.to_bytes(2, "little")
    return head + CHECKSUM_PREFIX + hashlib.sha256(head).hexdigest().encode("ascii")


def write_input_state(
    step_folder: str,
    global_step: int,
    stream_state: Mapping[str, Any],
    carried_over: Mapping[str, Any] | None = None,
) -> str:
    """Atomically and durably write the input file for ``global_step`` into ``step_folder``; returns
    its path.

    ``carried_over`` is the in-flight record's ``state_dict()``; None stores an empty record (nothing in
    flight). The state is encoded before any file is touched, so a state that cannot be stored leaves
    the folder as it was.
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
    atomic_write_bytes(encode_input_file(payload), path)
    return path


# ---------------------------------------------------------------- reading


def read_input_checkpoint(step_folder: str, expected_step: int | None = None) -> InputCheckpoint | None:
    """The decoded, validated input file in ``step_folder`` (format version 1 or 2), or None if it has
    none.

    Every problem raises a subclass of :class:`InputCheckpointError` naming the file and the problem:
    :class:`InputCheckpointTruncatedError` (cut short), :class:`InputCheckpointUnsafeError` (pickled
    code), :class:`InputCheckpointCorruptError` (any other damage: checksum, structure, missing entries,
    wrong types), :class:`InputCheckpointVersionError` and :class:`InputCheckpointStepMismatchError`
    (the file's step differs from ``expected_step``). No exception from inside torch escapes.
    """
    path = input_state_path(step_folder)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise InputCheckpointCorruptError(path, f"cannot be read ({err})", FIX_OTHER_CHECKPOINT) from None
    checksummed = _check_bytes(path, raw)
    payload = _unpickle(path, raw)
    return validate_payload(path, payload, expected_step, checksummed)


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
            path, f"is not a torch zip archive (it starts with {raw[:8]!r})", FIX_OTHER_CHECKPOINT
        )
    has_checksum = _CHECKSUM_RE.search(raw[-CHECKSUM_SIZE:]) is not None
    comment = _zip_comment(raw)
    if comment is None and not has_checksum:
        raise InputCheckpointTruncatedError(
            path,
            f"is cut short: {len(raw)} bytes and no end-of-archive record (an interrupted write or copy)",
            FIX_OTHER_CHECKPOINT,
        )
    if not comment and not has_checksum:
        return False  # written before the checksum existed: the zip CRCs are checked on load
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


def _zip_comment(raw: bytes) -> bytes | None:
    """The comment of the zip archive ``raw``, or None when it has no end record at its end."""
    lowest = max(0, len(raw) - ZIP_END_SIZE - 0xFFFF)
    position = raw.rfind(ZIP_END, lowest)
    while position >= 0:
        comment_size = int.from_bytes(raw[position + 20:position + 22], "little")
        if position + ZIP_END_SIZE + comment_size == len(raw):
            return raw[position + ZIP_END_SIZE:]
        position = raw.rfind(ZIP_END, lowest, position)
    return None


def _unpickle(path: str, raw: bytes) -> Any:
    """``torch.load(weights_only=True)`` of ``raw`` with every failure turned into a typed error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols are noise here
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = _REFUSED_GLOBAL_RE.search(str(err))
        if refused or "Unsupported global" in str(err):
            name = refused.group(1) if refused else "a global"
            raise InputCheckpointUnsafeError(
                path,
                f"holds pickled code that loading would run (it calls {name}); "
                "torch.load(weights_only=True) refused it and nothing was run",
                "Do not load this file with weights_only=False: it was not written by agentlightning. "
                + FIX_OTHER_CHECKPOINT,
            ) from None
        detail = _UNPICKLER_ERROR_RE.search(str(err))
        problem = detail.group(1) if detail else (str(err).splitlines() or [type(err).__name__])[0]
        raise InputCheckpointCorruptError(
            path, f"cannot be unpickled ({problem[:200]})", FIX_OTHER_CHECKPOINT
        ) from None
    except Exception as err:  # any other failure inside torch means the same thing to the user
        raise InputCheckpointCorruptError(
            path, f"cannot be read ({type(err).__name__}: {str(err)[:200]})", FIX_OTHER_CHECKPOINT
        ) from None
