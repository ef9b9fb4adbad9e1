"""Training state by component: flattening to keyed leaves, exact digests, comparison under a tolerance.

A target reports its state after a step as named components (``{"model": model, "optimizer": opt,
"rng": torch.get_rng_state()}``). Each component is flattened into *leaves* keyed by their path
(``state.0.exp_avg``, ``param_groups.0.lr``): objects with ``state_dict()`` or ``get_state()`` are
replaced by what those return, mappings and sequences are walked, and tensors, numpy arrays, bytes and
plain values are leaves. A leaf's digest covers its type, shape, dtype and exact bytes; a component's
digest covers its leaves' keys and digests. Two states are equal only if every byte agrees.

Digests are XXH3-128 (the ``xxhash`` package, which verl brings and the torch extra installs: issue 30, a
12 MB Adam state made a step 1.79x slower under SHA-256), or SHA-256 where ``xxhash`` is missing. The kind
is part of the digest (``x3:`` before an XXH3 digest), so digests of two kinds never pass for a difference
of state: :func:`digest_kind` names it and the judge refuses to compare across kinds.

No torch or numpy import at module level: values are inspected by duck typing, and numpy is imported
only to compare values under a tolerance.
"""

from __future__ import annotations

import functools
import hashlib
import math
import pickle
import random
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

#: Length of a digest in hex characters (its kind's prefix aside).
DIGEST_CHARS = 32
#: The digest kinds, and the prefix that marks a digest of the fast kind.
KIND_XXH3, KIND_SHA256 = "xxh3-128", "sha256"
XXH3_PREFIX = "x3:"
#: The component a target's own ``run.state_digest(step, digest)`` is reported as.
DIGEST_COMPONENT = "state_digest"


#: The process-global generators the harness records itself at every step end, each a component of its
#: own (:func:`captured_generators`); a headline says they were captured by the harness.
CAPTURED_PYTHON = "python random"
CAPTURED_NUMPY = "numpy global RNG"
CAPTURED_TORCH = "torch CPU RNG"
CAPTURED_CUDA = "torch CUDA RNG"
CAPTURED = frozenset({CAPTURED_PYTHON, CAPTURED_NUMPY, CAPTURED_TORCH, CAPTURED_CUDA})
#: The leaves of each captured generator that hold its state proper, a large block of random content (None:
#: every leaf); numpy's other leaves (its position, its cached Gaussian) are small values any state may hold.
GENERATOR_BODY: dict[str, tuple[str, ...] | None] = {
    CAPTURED_PYTHON: None, CAPTURED_NUMPY: ("state.key",), CAPTURED_TORCH: None, CAPTURED_CUDA: None}


def captured_generators() -> dict[str, Any]:
    """The state of every process-global generator this process has: Python's ``random``, numpy's global
    generator and torch's CPU generator when those libraries are imported (never imported here), and the
    CUDA generators when CUDA is initialised. Each is a few leaves (one bytes leaf for Python's)."""
    out: dict[str, Any] = {CAPTURED_PYTHON: repr(random.getstate()).encode()}
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        out[CAPTURED_NUMPY] = numpy.random.get_state(legacy=False)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        out[CAPTURED_TORCH] = torch.get_rng_state()
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            out[CAPTURED_CUDA] = cuda.get_rng_state_all()
    return out


def drawn_after(states: Mapping[int, Mapping[str, str]], name: str, step: int) -> bool:
    """Whether a run still drew from captured generator ``name`` after ``step``: its digest (``states``:
    digests by component, by step) takes more than one value over the steps from ``step`` on. One that
    nobody draws from cannot change the training, whatever state it is in."""
    return len({d[name] for s, d in states.items() if s >= step and name in d}) > 1


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` pairs of a nested value, mapping keys in sorted order, sequences in order."""
    value = _expand(value)
    if isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            yield from flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}.{index}" if prefix else str(index))
    else:
        yield prefix, value


@functools.lru_cache(maxsize=1)
def _hasher() -> tuple[str, Any]:
    """(prefix, constructor) of this process's digests: XXH3-128 when ``xxhash`` imports, else SHA-256."""
    try:
        import xxhash
    except ImportError:
        return "", hashlib.sha256
    return XXH3_PREFIX, xxhash.xxh3_128


def new_hasher() -> Any:
    """A fresh hash object of this process's kind (``update``, ``digest``), for bytes outside a state."""
    return _hasher()[1]()


def digest_kind(digest: str) -> str:
    """:data:`KIND_XXH3` or :data:`KIND_SHA256`: how ``digest`` was made."""
    return KIND_XXH3 if digest.startswith(XXH3_PREFIX) else KIND_SHA256


def leaf_digest(value: Any) -> str:
    """Digest of one leaf: type, shape, dtype and exact bytes for tensors and arrays, repr otherwise."""
    prefix, new = _hasher()
    h = new()
    _feed_leaf(h, value)
    return prefix + h.hexdigest()[:DIGEST_CHARS]


def leaf_digests(value: Any) -> dict[str, str]:
    """Digest of every leaf of a component, by path (in flattening order)."""
    return {path: leaf_digest(leaf) for path, leaf in flatten(value)}


def combine(leaves: Mapping[str, str]) -> str:
    """The component's digest from its leaves' digests (keys included, so a renamed key differs)."""
    prefix, new = _hasher()
    h = new()
    for path, digest in leaves.items():
        h.update(path.encode() + b"\0" + digest.encode() + b"\0")
    return prefix + h.hexdigest()[:DIGEST_CHARS]


def first_differing_key(a: Mapping[str, str], b: Mapping[str, str]) -> str | None:
    """The first path (in ``a``'s order, then ``b``'s) whose digest differs or that one side lacks."""
    for path, digest in a.items():
        if b.get(path) != digest:
            return path
    return next((path for path in b if path not in a), None)


def plain_values(value: Any) -> dict[str, Any]:
    """The leaves as picklable plain values (tensors become numpy arrays), for tolerance comparison."""
    out = {}
    for path, leaf in flatten(value):
        if _is_tensor(leaf):
            leaf = _tensor_array(leaf)
        out[path] = leaf
    return out


def save_values(path: Path, components: Mapping[str, Mapping[str, Any]]) -> None:
    """Write one step's plain values (written by the first reference run in tolerance mode)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(dict(components), f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


def load_values(path: Path) -> dict[str, dict[str, Any]] | None:
    """One step's plain values as :func:`save_values` wrote them, None if that step has none."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)  # written by this session's own reference run
    except FileNotFoundError:
        return None


def first_not_close(ours: Mapping[str, Any], theirs: Mapping[str, Any], rtol: float, atol: float) -> str | None:
    """The first path whose values are not close (``|a - b| <= atol + rtol * |b|`` elementwise, NaN equal
    to NaN), whose shapes differ, or that one side lacks; None when every leaf is close."""
    for path, value in ours.items():
        if path not in theirs or not _close(value, theirs[path], rtol, atol):
            return path
    return next((path for path in theirs if path not in ours), None)


def pending_state(value: Any) -> dict[str, Any] | None:
    """The state an object that loads its state lazily will continue from, while its ``state_dict()`` does
    not say it yet; None for any other object (its ``state_dict()`` is what decides what comes next).

    torchdata's loaders apply a loaded state only when iteration starts: a ``StatefulDataLoader`` keeps it
    as ``next_iter_state`` until the next ``iter()``, and ``StatefulDistributedSampler`` (and the stateful
    random sampler's iterator) keep the position as ``next_yielded`` while ``state_dict()`` reports 0
    (torchdata 0.11; docs/findings.md). Digesting what they will continue from, not what ``state_dict()``
    says, compares the position that decides the next inputs at a restored step, and calls nothing on the
    loader: its ``state_dict()`` there would start an iterator (and draw its base seed from torch's
    generator) earlier than the trainer does."""
    pending = getattr(value, "next_iter_state", None)
    if isinstance(pending, Mapping) and pending and getattr(value, "_iterator", None) is None:
        return dict(pending)
    position = getattr(value, "next_yielded", None)
    if isinstance(position, int) and not isinstance(position, bool) and hasattr(value, "yielded"):
        state = getattr(value, "state_dict", None)
        current = state() if callable(state) else None
        if isinstance(current, Mapping) and "yielded" in current:
            return {**current, "yielded": position}
    return None


# -- helpers ---------------------------------------------------------------------------------------

def _expand(value: Any) -> Any:
    """Stateful objects (modules, optimizers, schedulers, loaders, generators) as their state; an object
    that loads its state lazily as the state it will continue from (:func:`pending_state`)."""
    if _is_tensor(value) or isinstance(value, (Mapping, list, tuple, str, bytes, bytearray)):
        return value
    pending = pending_state(value)
    if pending is not None:
        return pending
    for method in ("state_dict", "get_state"):
        fn = getattr(value, method, None)
        if callable(fn):
            return fn()
    return value


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "cpu") and hasattr(value, "dtype")


def _tensor_bytes(value: Any) -> memoryview:
    """The tensor's exact bytes without a copy when it is already contiguous on the CPU (any dtype,
    bfloat16 included: the bytes are read as uint8)."""
    flat = value.detach().cpu().contiguous().reshape(-1)
    try:
        return memoryview(flat.numpy()).cast("B")
    except TypeError:  # dtypes numpy lacks (bfloat16, float8): read the same bytes as uint8
        import torch

        return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _array_bytes(value: Any) -> Any:
    """A numpy array's exact bytes, without a copy when it is contiguous (``tobytes()`` always copies)."""
    if not value.flags.c_contiguous:
        value = value.copy(order="C")
    try:
        return memoryview(value).cast("B")
    except (TypeError, ValueError):  # dtypes the buffer protocol does not carry (datetime64, say)
        return value.tobytes()


def _tensor_array(value: Any) -> Any:
    array = value.detach().cpu()
    try:
        return array.numpy()
    except TypeError:
        import torch

        return array.to(torch.float32).numpy()


def _feed_leaf(h: Any, value: Any) -> None:
    if _is_tensor(value):
        h.update(f"T{tuple(value.shape)}{value.dtype}".encode())
        h.update(_tensor_bytes(value))
    elif hasattr(value, "tobytes") and hasattr(value, "dtype") and hasattr(value, "shape"):  # numpy
        if value.dtype == object:
            h.update(repr(value.tolist()).encode())
        else:
            h.update(f"A{value.shape}{value.dtype}".encode())
            h.update(_array_bytes(value))
    elif isinstance(value, (bytes, bytearray)):
        h.update(b"B" + bytes(value))
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode())


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, (bool, str, bytes, type(None))) or isinstance(b, (bool, str, bytes, type(None))):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= atol + rtol * abs(b)
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import numpy as np

        if a.shape != b.shape:
            return False
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
        return bool(np.array_equal(a, b))
    return a == b
