"""A stable digest of a trainer's state, for early convergence of resumed runs.

A target that reports ``run.state_digest(step, digest_of(state))`` after each step lets the harness
stop a resumed run as soon as its whole state equals the uninterrupted run's state at the same step:
from there on a deterministic trainer can only repeat the reference, so the reference's remaining
events stand in for the rest of the run. The digest must cover *everything* that decides the future
(model, optimizer, loader position, buffers, epoch, step, RNG state); a partial digest makes the
shortcut unsound. No torch or numpy import: values are inspected by duck typing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any


def digest_of(value: Any) -> str:
    """Hex digest of nested dicts/lists/tuples of tensors, numpy arrays, bytes and plain values."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()[:32]


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, Mapping):
        h.update(b"{")
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor
        array = value.detach().cpu().contiguous()
        h.update(f"T{tuple(array.shape)}{array.dtype}".encode())
        h.update(array.numpy().tobytes())
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # numpy array
        if value.dtype == object:
            _feed(h, value.tolist())
        else:
            h.update(f"A{value.shape}{value.dtype}".encode())
            h.update(value.tobytes())
    elif isinstance(value, (bytes, bytearray)):
        h.update(b"B" + bytes(value))
    else:
        h.update(repr(value).encode())
