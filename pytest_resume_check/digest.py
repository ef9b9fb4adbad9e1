"""A stable digest of a trainer's state, for targets that digest their state themselves.

``run.state_digest(step, digest_of(state))`` reports one digest as one state component (named
``state_digest``). Prefer ``run.state(step, {"model": model, "optimizer": optimizer, ...})``: the harness
then digests each component itself and a divergence names the component and the first differing key.
The digest must cover *everything* that decides the future (model, optimizer, loader position,
buffers, epoch, step, RNG state); a partial digest makes the early stop unsound. No torch or numpy
import: values are inspected by duck typing (see :mod:`pytest_resume_check.records.state`).
"""

from __future__ import annotations

from typing import Any

from pytest_resume_check.records.state import combine, leaf_digests

__all__ = ["digest_of"]


def digest_of(value: Any) -> str:
    """Hex digest of nested dicts/lists/tuples of tensors, numpy arrays, bytes, plain values and
    objects with ``state_dict()`` or ``get_state()``. Raises
    :class:`~pytest_resume_check.records.state.Undigestable` for a value no digest reads the same way in every
    run (a plain object, whose repr holds its address); raised in a target, the run is ``PROTOCOL`` naming it."""
    return combine(leaf_digests(value))
