"""``agentlightning_input.pt``: the async input position stored in each ``global_step_N`` folder.

What the file holds (keys are the constants below): the format version, the global step, the input
stream state of :mod:`agentlightning.verl.inputs` (loader state, buffered tail, input epoch, loader
batches taken in that epoch) and, since format version 2, the carried-over groups of
:mod:`agentlightning.verl.inflight` (the original row of every input whose rollouts were still running,
with its id, input epoch and first submission step). Version 1 files (no carried-over groups) are still
read; :class:`InputCheckpoint` says which version a file was.

Safety: the file holds only tensors and plain Python values (numpy arrays are stored as tagged dicts
and rebuilt on load), so ``torch.load(weights_only=True)`` reads it with no allow-list and no pickled
code from a checkpoint is ever executed. A file that would need code to load is refused with
:class:`InputCheckpointUnsafeError`; bytes that are not a torch zip archive are never unpickled at all.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentlightning.verl import inflight
from agentlightning.verl.durable import atomic_write_bytes, torch_bytes
from agentlightning.verl.inputs import STATE_KEYS

INPUT_STATE_FILENAME = "agentlightning_input.pt"
#: Version 2 added the carried-over groups (KEY_CARRIED_OVER); version 1 files are still read.
INPUT_STATE_FORMAT_VERSION = 2
SUPPORTED_INPUT_STATE_FORMAT_VERSIONS = (1, 2)
#: The first version that records carried-over (in-flight) groups.
CARRIED_OVER_SINCE_VERSION = 2

KEY_FORMAT_VERSION = "format_version"
KEY_GLOBAL_STEP = "global_step"
KEY_INPUT_STREAM = "input_stream"
KEY_CARRIED_OVER = "carried_over"
#: Optional entry: ``"sha256"`` when the zip comment holds the file's checksum (see the module doc).
KEY_INTEGRITY = "integrity"
INTEGRITY_SHA256 = "sha256"

# verl's names inside a checkpoint directory.
TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
DATALOADER_FILENAME = "data.pt"
ACTOR_FOLDER = "actor"
STEP_FOLDER_PREFIX = "global_step_"

# Marks a numpy array stored as a plain dict (torch's weights_only unpickler rejects numpy types).
NDARRAY_TAG = "__agentlightning_ndarray__"

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

FIX_OTHER_CHECKPOINT = (
    "Resume from another checkpoint with trainer.resume_mode=resume_path "
    "trainer.resume_from_path=<an earlier global_step_N folder>, or delete this global_step folder"
)


class CheckpointError(RuntimeError):
    """A checkpoint a resume cannot use; the message names the path, the problem and the fix."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(f"{path}: {problem}. {fix}")


class InputCheckpointError(CheckpointError):
    """A problem with an input file (``agentlightning_input.pt``)."""


class InputCheckpointVersionError(InputCheckpointError):
    """The file was written in a format version this code does not read."""

    def __init__(self, path: str, found: Any) -> None:
        self.found = found
        self.supported = SUPPORTED_INPUT_STATE_FORMAT_VERSIONS
        supported = ", ".join(str(v) for v in SUPPORTED_INPUT_STATE_FORMAT_VERSIONS)
        super().__init__(
            path,
            f"input checkpoint format version {found!r} is not supported (supported: {supported})",
            "Upgrade agentlightning to a release that reads it, or resume from another checkpoint with "
            "trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N folder>",
        )


class InputCheckpointCorruptError(InputCheckpointError):
    """The file is damaged: unreadable, a checksum mismatch, missing entries or entries of wrong types."""


class InputCheckpointTruncatedError(InputCheckpointCorruptError):
    """The file is cut short: the beginning of a torch zip archive without its end (or empty)."""


class InputCheckpointUnsafeError(InputCheckpointCorruptError):
    """The file holds pickled code that loading would run; ``torch.load(weights_only=True)`` refused it."""


class InputCheckpointStepMismatchError(InputCheckpointError):
    """The step recorded in the file differs from the step of the folder that holds it."""


class InputCheckpointEncodeError(InputCheckpointError):
    """A value in the input state cannot be stored as tensors and plain Python values."""


# ---------------------------------------------------------------- encoding


def encode_value(value: Any, where: str = "state") -> Any:
    """``value`` with numpy arrays and scalars turned into tagged dicts; rejects non-plain objects."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return _encode_ndarray(np.asarray(value), scalar=isinstance(value, np.generic), where=where)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise InputCheckpointEncodeError(
                    INPUT_STATE_FILENAME,
                    f"{where} has a dict key of type {type(key).__name__}",
                    "Use str or int keys in batches and dataset states",
                )
            out[key] = encode_value(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, list):
        return [encode_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(encode_value(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise InputCheckpointEncodeError(
        INPUT_STATE_FILENAME,
        f"{where} holds a {type(value).__module__}.{type(value).__name__}, which cannot be stored safely",
        "Let the collate function return only tensors, numpy arrays and lists of plain Python values",
    )


def _encode_ndarray(array: np.ndarray, *, scalar: bool, where: str) -> dict[str, Any]:
    if array.dtype.kind in "biufc":
        data: Any = torch.from_numpy(np.ascontiguousarray(array).reshape(-1).copy())
    elif array.dtype.kind == "O":
        # Elements of object arrays are Python objects; each must itself be storable.
        data = [encode_value(item, f"{where}[{i}]") for i, item in enumerate(array.reshape(-1).tolist())]
    elif array.dtype.kind in "US":
        data = array.reshape(-1).tolist()
    else:
        raise InputCheckpointEncodeError(
            INPUT_STATE_FILENAME,
            f"{where} is a numpy array of dtype {array.dtype}, which cannot be stored safely",
            "Use numeric, string or object numpy arrays in batches",
        )
    return {
        NDARRAY_TAG: 1,
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "scalar": scalar,
        "data": data,
    }


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value`: rebuilds numpy arrays and scalars with their dtype and shape."""
    if isinstance(value, dict):
        if value.get(NDARRAY_TAG) == 1:
            return _decode_ndarray(value)
        return {key: decode_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, tuple):
        return tuple(decode_value(item) for item in value)
    return value


def _decode_ndarray(record: dict[str, Any]) -> Any:
    dtype = np.dtype(record["dtype"])
    shape = tuple(record["shape"])
    data = record["data"]
    if dtype.kind == "O":
        flat = np.empty(len(data), dtype=object)
        # Element-wise fill: np.array(list_of_lists, dtype=object) would add dimensions.
        for i, item in enumerate(data):
            flat[i] = decode_value(item)
        array = flat.reshape(shape)
    elif isinstance(data, torch.Tensor):
        array = data.numpy().astype(dtype, copy=True).reshape(shape)
    else:
        array = np.array(data, dtype=dtype).reshape(shape)
    return array[()] if record.get("scalar") else array


# ---------------------------------------------------------------- the input file


def input_state_path(step_folder: str) -> str:
    """Path of the input file inside a ``global_step_N`` folder."""
    return os.path.join(step_folder, INPUT_STATE_FILENAME)


@dataclass(frozen=True)
class InputCheckpoint:
    """A decoded input file: its path, format version, step, stream state and carried-over groups.

    ``carried_over`` is the :class:`~agentlightning.verl.inflight.InFlightInputs` state, or None for a
    version 1 file, which did not record in-flight inputs.
    """

    path: str
    format_version: int
    global_step: int
    stream: dict[str, Any]
    carried_over: dict[str, Any] | None

    @property
    def records_carried_over(self) -> bool:
        """True when the file says which inputs were in flight (format version 2 and later)."""
        return self.carried_over is not None


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
    return _validate(path, payload, expected_step, checksummed)


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(path: str, payload: Any, expected_step: int | None, checksummed: bool) -> InputCheckpoint:
    def corrupt(problem: str) -> InputCheckpointCorruptError:
        return InputCheckpointCorruptError(path, problem, FIX_OTHER_CHECKPOINT)

    if not isinstance(payload, dict) or KEY_FORMAT_VERSION not in payload:
        raise InputCheckpointCorruptError(
            path, "is not an agentlightning input checkpoint (no format version)", "Remove the stray file"
        )
    version = payload[KEY_FORMAT_VERSION]
    if not _is_int(version):
        raise corrupt(f"has a format version of type {type(version).__name__}, not int")
    if version not in SUPPORTED_INPUT_STATE_FORMAT_VERSIONS:
        raise InputCheckpointVersionError(path, version)
    missing = _missing_entries(payload, version)
    if missing:
        raise corrupt(f"lacks required entries {missing}")
    if payload.get(KEY_INTEGRITY, INTEGRITY_SHA256) != INTEGRITY_SHA256:
        raise corrupt(f"has an unknown {KEY_INTEGRITY} entry {payload[KEY_INTEGRITY]!r}")
    if KEY_INTEGRITY in payload and not checksummed:
        raise corrupt("declares a checksum but has none (its zip comment was removed)")
    step = payload[KEY_GLOBAL_STEP]
    if not _is_int(step) or step < 0:
        raise corrupt(f"has a global step of type {type(step).__name__} ({step!r}), not a non-negative int")
    if expected_step is not None and step != int(expected_step):
        raise InputCheckpointStepMismatchError(
            path,
            f"records global step {step} but its folder is for step {expected_step}",
            "Do not rename or copy files between global_step folders; resume from the original folder",
        )
    try:
        stream = decode_value(payload[KEY_INPUT_STREAM])
        carried_over = None
        if version >= CARRIED_OVER_SINCE_VERSION:
            carried_over = decode_value(payload[KEY_CARRIED_OVER])
    except Exception as err:  # a tampered numpy record can fail in many ways inside numpy
        raise corrupt(f"holds a malformed numpy record ({type(err).__name__}: {err})") from None
    problem = _stream_problem(stream) or (_carried_over_problem(carried_over, step) if carried_over else None)
    if problem:
        raise corrupt(problem)
    return InputCheckpoint(
        path=path, format_version=version, global_step=step, stream=stream, carried_over=carried_over
    )


def _missing_entries(payload: dict[str, Any], version: int) -> list[str]:
    stream = payload.get(KEY_INPUT_STREAM)
    missing = [KEY_GLOBAL_STEP] if KEY_GLOBAL_STEP not in payload else []
    missing += [key for key in STATE_KEYS if not isinstance(stream, dict) or key not in stream]
    if version >= CARRIED_OVER_SINCE_VERSION:
        groups = payload.get(KEY_CARRIED_OVER)
        missing += [
            f"{KEY_CARRIED_OVER}.{key}"
            for key in inflight.STATE_KEYS
            if not isinstance(groups, dict) or not isinstance(groups.get(key), list)
        ]
    return missing


def _batch_problem(batch: Any, where: str, rows: int | None = None) -> str | None:
    """Why ``batch`` is not a batch (a dict whose tensor, array and list fields share one length; with
    ``rows``, that length), or None."""
    if not isinstance(batch, dict):
        return f"{where} is a {type(batch).__name__}, not a dict of batch fields"
    lengths = set()
    for value in batch.values():
        if isinstance(value, list) or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 0):
            lengths.add(len(value))
    if len(lengths) > 1:
        return f"{where} has fields of different lengths {sorted(lengths)}"
    if rows is not None and lengths != {rows}:
        return f"{where} holds {sorted(lengths)} inputs, not {rows}"
    return None


def _stream_problem(stream: dict[str, Any]) -> str | None:
    where = KEY_INPUT_STREAM
    if not isinstance(stream.get("loader_state"), dict):
        return f"{where}.loader_state is a {type(stream.get('loader_state')).__name__}, not a dict"
    tail = stream.get("buffered_tail")
    if tail is not None:
        problem = _batch_problem(tail, f"{where}.buffered_tail")
        if problem:
            return problem
    for key in ("input_epoch", "loader_batches_taken_in_epoch"):
        value = stream.get(key)
        if not _is_int(value) or value < 0:
            return f"{where}.{key} is {value!r} ({type(value).__name__}), not a non-negative int"
    return None


def _carried_over_problem(groups: dict[str, Any], step: int) -> str | None:
    where = KEY_CARRIED_OVER
    lengths = {key: len(groups[key]) for key in inflight.STATE_KEYS}
    if len(set(lengths.values())) != 1:
        return f"has carried-over lists of different lengths {lengths}"
    for i, row in enumerate(groups[inflight.STATE_ROWS]):
        problem = _batch_problem(row, f"{where}.rows[{i}]", rows=1)
        if problem:
            return problem
    bounds = {
        inflight.STATE_INPUT_IDS: (None, None),
        inflight.STATE_INPUT_EPOCHS: (0, None),
        inflight.STATE_SUBMITTED_STEPS: (1, step),
    }
    for key, (low, high) in bounds.items():
        for i, value in enumerate(groups[key]):
            if not _is_int(value) or (low is not None and value < low) or (high is not None and value > high):
                limits = f" in [{low}, {high if high is not None else '...'}]" if low is not None else ""
                return f"{where}.{key}[{i}] is {value!r} ({type(value).__name__}), not an int{limits}"
    return None


def read_input_state(step_folder: str, expected_step: int | None = None) -> dict[str, Any] | None:
    """The decoded input stream state stored in ``step_folder``, or None if it has no input file
    (:func:`read_input_checkpoint` without the version and the carried-over groups)."""
    checkpoint = read_input_checkpoint(step_folder, expected_step)
    return None if checkpoint is None else checkpoint.stream
