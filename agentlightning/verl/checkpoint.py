"""``agentlightning_input.pt``: the async input position stored in each ``global_step_N`` folder.

What the file holds (keys are the constants below): the format version, the global step, the input
stream state of :mod:`agentlightning.verl.inputs` (loader state, buffered tail, input epoch, loader
batches taken in that epoch) and, since format version 2, the carried-over groups of
:mod:`agentlightning.verl.inflight` (the original row of every input whose rollouts were still running,
with its id, input epoch and first submission step). Version 1 files (no carried-over groups) are still
read; :class:`InputCheckpoint` says which version a file was.

Safety: the file holds only tensors and plain Python values (numpy arrays are stored as tagged dicts
and rebuilt on load), so ``torch.load(weights_only=True)`` reads it with no allow-list and no pickled
code from a checkpoint is ever executed.

Atomicity: the file is written to a temporary name through an open file object, flushed, fsynced,
moved into place with ``os.replace`` and the folder is fsynced. ``torch.save(obj, path)`` would write
through C++ and never fsync. A reader therefore sees either no file or a complete one.

This module also resolves which folder a resume reads (the same rules as verl's
``RayPPOTrainer._load_checkpoint``) and repairs a torn ``latest_checkpointed_iteration.txt``: verl
writes it with a plain ``open("w")``, so a kill during that write leaves it empty and verl's resume
then fails on ``int("")``.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentlightning.verl import inflight
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

# verl's names inside a checkpoint directory.
TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
DATALOADER_FILENAME = "data.pt"
STEP_FOLDER_PREFIX = "global_step_"

# Marks a numpy array stored as a plain dict (torch's weights_only unpickler rejects numpy types).
NDARRAY_TAG = "__agentlightning_ndarray__"
_TEMP_SUFFIX = ".tmp"
_STEP_FOLDER_RE = re.compile(r"^global_step_(\d+)$")


class InputCheckpointError(RuntimeError):
    """A problem with an input checkpoint file; the message names the file, the problem and the fix."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(f"{path}: {problem}. {fix}")


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
    """The file cannot be read or lacks required entries."""


class InputCheckpointStepMismatchError(InputCheckpointError):
    """The step recorded in the file differs from the step of the folder that holds it."""


class InputCheckpointEncodeError(InputCheckpointError):
    """A value in the input state cannot be stored as tensors and plain Python values."""


class TrackerError(RuntimeError):
    """``latest_checkpointed_iteration.txt`` is unreadable and no complete checkpoint replaces it."""


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


# ---------------------------------------------------------------- atomic files


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename inside it survives a power loss (no-op where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` ``obj`` to ``path`` so that readers only ever see a complete file.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temp = f"{path}{_TEMP_SUFFIX}.{os.getpid()}"
    try:
        with open(temp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    fsync_dir(folder)


def atomic_write_text(text: str, path: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file, flush, fsync, ``os.replace``, fsync folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    temp = f"{path}{_TEMP_SUFFIX}.{os.getpid()}"
    try:
        with open(temp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    fsync_dir(folder)


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


def write_input_state(
    step_folder: str,
    global_step: int,
    stream_state: Mapping[str, Any],
    carried_over: Mapping[str, Any] | None = None,
) -> str:
    """Atomically write the input file for ``global_step`` into ``step_folder``; returns its path.

    ``carried_over`` is the in-flight record's ``state_dict()``; None stores an empty record (nothing in
    flight). Temporary files left by an earlier writer that was killed mid-write are removed first.
    """
    path = input_state_path(step_folder)
    if os.path.isdir(step_folder):
        for name in os.listdir(step_folder):
            if name.startswith(INPUT_STATE_FILENAME + _TEMP_SUFFIX):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(step_folder, name))
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
    atomic_torch_save(payload, path)
    return path


def read_input_checkpoint(step_folder: str, expected_step: int | None = None) -> InputCheckpoint | None:
    """The decoded input file in ``step_folder`` (format version 1 or 2), or None if it has none.

    Raises :class:`InputCheckpointVersionError` for an unknown format version,
    :class:`InputCheckpointCorruptError` for an unreadable or incomplete file and
    :class:`InputCheckpointStepMismatchError` when the file's step differs from ``expected_step``.
    """
    path = input_state_path(step_folder)
    if not os.path.exists(path):
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unpickling failure means the same thing to the user
        raise InputCheckpointCorruptError(
            path,
            f"cannot be read ({type(err).__name__}: {err})",
            "Delete the global_step folder, or resume from an earlier one with "
            "trainer.resume_mode=resume_path",
        ) from err
    if not isinstance(payload, dict) or KEY_FORMAT_VERSION not in payload:
        raise InputCheckpointCorruptError(
            path, "is not an agentlightning input checkpoint (no format version)", "Remove the stray file"
        )
    version = payload[KEY_FORMAT_VERSION]
    if version not in SUPPORTED_INPUT_STATE_FORMAT_VERSIONS:
        raise InputCheckpointVersionError(path, version)
    missing = _missing_entries(payload, version)
    if missing:
        raise InputCheckpointCorruptError(
            path,
            f"lacks required entries {missing}",
            "Resume from another checkpoint with trainer.resume_mode=resume_path",
        )
    if expected_step is not None and int(payload[KEY_GLOBAL_STEP]) != int(expected_step):
        raise InputCheckpointStepMismatchError(
            path,
            f"records global step {payload[KEY_GLOBAL_STEP]} but its folder is for step {expected_step}",
            "Do not rename or copy files between global_step folders; resume from the original folder",
        )
    carried_over = None
    if version >= CARRIED_OVER_SINCE_VERSION:
        carried_over = decode_value(payload[KEY_CARRIED_OVER])
        lengths = {key: len(carried_over[key]) for key in inflight.STATE_KEYS}
        if len(set(lengths.values())) != 1:
            raise InputCheckpointCorruptError(
                path,
                f"has carried-over lists of different lengths {lengths}",
                "Resume from another checkpoint with trainer.resume_mode=resume_path",
            )
    return InputCheckpoint(
        path=path,
        format_version=int(version),
        global_step=int(payload[KEY_GLOBAL_STEP]),
        stream=decode_value(payload[KEY_INPUT_STREAM]),
        carried_over=carried_over,
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


def read_input_state(step_folder: str, expected_step: int | None = None) -> dict[str, Any] | None:
    """The decoded input stream state stored in ``step_folder``, or None if it has no input file
    (:func:`read_input_checkpoint` without the version and the carried-over groups)."""
    checkpoint = read_input_checkpoint(step_folder, expected_step)
    return None if checkpoint is None else checkpoint.stream


# ---------------------------------------------------------------- resume folder and tracker


def step_of_folder(folder: str) -> int:
    """The global step encoded in a ``global_step_N`` folder name (verl's rule)."""
    return int(os.path.normpath(folder).split(STEP_FOLDER_PREFIX)[-1])


def read_tracker(checkpoint_dir: str) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``; None if absent. Raises ValueError if torn."""
    path = os.path.join(checkpoint_dir, TRACKER_FILENAME)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return int(f.read().decode())


def repair_torn_tracker(
    checkpoint_dir: str, required_files: tuple[str, ...] = (DATALOADER_FILENAME,)
) -> bool:
    """Rewrite a torn tracker to the newest complete ``global_step_N`` folder; True if it repaired one.

    A tracker is only written after its folder is complete, so a torn tracker means the newest folder
    holding all ``required_files`` is the one that was being published.
    """
    try:
        read_tracker(checkpoint_dir)
        return False
    except (ValueError, UnicodeDecodeError):
        pass
    tracker = os.path.join(checkpoint_dir, TRACKER_FILENAME)
    steps = []
    for name in os.listdir(checkpoint_dir):
        match = _STEP_FOLDER_RE.match(name)
        folder = os.path.join(checkpoint_dir, name)
        if match and all(os.path.exists(os.path.join(folder, f)) for f in required_files):
            steps.append(int(match.group(1)))
    if not steps:
        raise TrackerError(
            f"{tracker}: unreadable (torn write) and no complete global_step folder was found. "
            "Delete the tracker to start fresh, or resume with trainer.resume_mode=resume_path"
        )
    atomic_write_text(str(max(steps)), tracker)
    warnings.warn(
        f"{tracker} was torn (killed during its write); repaired it to point at global_step_{max(steps)}",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


def resolve_resume_folder(config: Any) -> str | None:
    """The ``global_step_N`` folder a resume under ``config`` reads, or None for a fresh start.

    Same rules as verl's ``RayPPOTrainer._load_checkpoint``: ``disable`` never resumes, ``auto``
    follows the tracker in ``trainer.default_local_dir``, ``resume_path`` uses
    ``trainer.resume_from_path`` (relative paths from the working directory).
    """
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = config.trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = config.trainer.resume_from_path
        if not isinstance(folder, str) or STEP_FOLDER_PREFIX not in folder:
            raise ValueError(
                f"trainer.resume_from_path={folder!r} must name a global_step_N folder when "
                "trainer.resume_mode=resume_path"
            )
        return os.path.abspath(folder)
    if mode != "auto":
        raise ValueError(f"trainer.resume_mode={mode!r} is not one of 'auto', 'resume_path', 'disable'")
    checkpoint_dir = os.path.abspath(config.trainer.default_local_dir)
    return find_latest_ckpt_path(checkpoint_dir)
