"""Batches and loader states as tensors and plain Python values, so ``torch.load(weights_only=True)``
reads them back.

torch's ``weights_only`` unpickler rejects numpy types, and batches hold numpy arrays (verl's
non-tensor fields are object arrays). :func:`encode_value` turns every numpy array and scalar into a
tagged dict (dtype, shape, data) and refuses any other object that would need pickled code;
:func:`decode_value` rebuilds the arrays with their dtype and shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentlightning.verl.errors import InputCheckpointEncodeError
from agentlightning.verl.verl_layout import INPUT_STATE_FILENAME

#: Marks a numpy array stored as a plain dict.
NDARRAY_TAG = "__agentlightning_ndarray__"


def _refused(problem: str, fix: str) -> InputCheckpointEncodeError:
    # The writer replaces the bare file name with the path of the file it was writing.
    return InputCheckpointEncodeError(INPUT_STATE_FILENAME, problem, fix)


def encode_value(value: Any, where: str = "state") -> Any:
    """``value`` with numpy arrays and scalars turned into tagged dicts; rejects non-plain objects with
    :class:`~agentlightning.verl.errors.InputCheckpointEncodeError` naming ``where`` it sits."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return _encode_ndarray(np.asarray(value), scalar=isinstance(value, np.generic), where=where)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise _refused(
                    f"{where} has a dict key of type {type(key).__name__}",
                    "Use str or int keys in batches and dataset states",
                )
            out[key] = encode_value(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, list):
        return [encode_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(encode_value(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise _refused(
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
        raise _refused(
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
    """Inverse of :func:`encode_value`: rebuilds numpy arrays and scalars with their dtype and shape.

    A tampered record can fail in many ways inside numpy; the caller turns any exception into its own
    error.
    """
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
