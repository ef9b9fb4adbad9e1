"""A trainer's state found by walking its attributes: ``run.state(step, state_of(trainer))``.

:func:`state_of` walks an object's attributes (its ``__dict__`` and ``__slots__``, in sorted order) and
the values of dicts and items of lists, tuples and deques below them, depth first, and returns every
*component* it finds, named by its attribute path (``ema_model``, ``optim.inner``, ``models.0``,
``cfg.lr``). A component is a value :mod:`pytest_resume_check.records.state` can digest, and is not
walked further:

- objects with a callable ``state_dict()``: modules, optimizers, LR schedulers, ``GradScaler``,
  ``StatefulDataLoader`` (returned as they are; ``state_dict()`` is called when the state is digested);
- objects with a callable ``get_state()``: ``torch.Generator``;
- numpy generators (``Generator``, ``RandomState``, a bare bit generator) and Python ``random.Random``
  instances, as a snapshot of their state (a dict, or bytes for ``random.Random``);
- tensors, numpy arrays and scalars, numbers, bools, strings, bytes, None, enum members, paths;
- sets, as a list sorted by ``repr``.

Any other object with attributes (a config, an EMA wrapper, a callable augmentation of your own, a
plain ``DataLoader`` and its iterator) is walked. Skipped: functions, methods, lambdas, partials,
classes and Python modules; attributes whose names start with ``__`` (dunders, and private names
``self.__x``, stored as ``_Class__x``); objects of the packages that never hold training state (files
and ``io`` buffers, sockets, threads, locks, queues, processes of ``multiprocessing`` and
``subprocess``, ``concurrent`` and ``asyncio``, ``logging`` and the trackers ``loguru``, ``wandb``,
tensorboard, ``mlflow``, ``unittest.mock`` objects, and this harness's own objects such as
``RunContext``: :data:`SKIPPED_PACKAGES`); objects with a callable ``fileno`` (an OS handle), with
callable ``acquire`` and ``release`` (a lock), with ``pid`` and a callable ``poll`` or ``is_alive`` (a
process), or with callable ``is_alive`` and ``join`` (a thread). An object reached twice (a cycle, or
the same module under two names) is reported once, under the first path. A tensor or module that a
reported module holds (its parameters, buffers and submodules) is not reported again under its own
path, nor is a sampler that a reported loader holds (its position is part of the loader's state).

What it does NOT see:

- state outside the object graph: the process-global generators (Python ``random``, numpy's global
  generator, torch's default CPU and CUDA generators; the harness captures these itself), module-level
  globals, class attributes, and variables in closures or in the training loop's own frame;
- state reachable only through properties or methods (a value a ``@property`` computes from elsewhere,
  a counter kept in a bound method's closure), and attributes deeper than ``max_depth`` (the trainer's
  own attributes are depth 1);
- the inside of C extension objects that expose no state (a ``torch.device``, a Python generator or
  iterator object, a ``range``; their position is not seen), and the inside of anything skipped above;
- the loader's worker processes and their generators, and files on disk;
- what a component's own ``state_dict()`` leaves out (gradients), and a plain ``DataLoader``'s place in
  its epoch: the loader is walked, but the sampler iterator that holds the place is a generator object.

Everything it finds is compared, strings included: a value that differs between runs by design (a
run's own checkpoint folder, a start time) belongs in ``skip``. So does a multi-worker ``DataLoader``
iterator held on the trainer: its bookkeeping (batches in flight, ``_task_info``) depends on when the
workers answer. A dataset held on the trainer is hashed at every step; skip it too.

No torch or numpy import: values are recognised by duck typing.
"""

from __future__ import annotations

import enum
import functools
import numbers
import os
import random
import types
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["state_of"]

#: Packages whose objects never hold training state (matched against every class of an object's MRO):
#: OS handles and concurrency, logging and experiment trackers, mocks, and the harness itself.
SKIPPED_PACKAGES = (
    "io", "_io", "tempfile", "socket", "_socket", "ssl", "select", "selectors",
    "threading", "_thread", "queue", "_queue", "multiprocessing", "_multiprocessing", "subprocess",
    "concurrent", "asyncio", "logging", "loguru", "wandb", "tensorboard", "tensorboardX",
    "torch.utils.tensorboard", "mlflow", "unittest.mock", "pytest_resume_check",
)

#: What is never walked nor reported: code, not state.
_CODE = (
    type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    types.MethodWrapperType, types.WrapperDescriptorType, types.MethodDescriptorType,
    types.ClassMethodDescriptorType, functools.partial, staticmethod, classmethod, property,
)

#: Plain values: components, never deduplicated by identity (small ints and strings are shared).
_PLAIN = (str, bytes, bytearray, numbers.Number, enum.Enum, os.PathLike)

#: Marks a value that is neither a component nor walked.
_NOTHING = object()


def state_of(obj: Any, *, skip: Iterable[str] | str = (), max_depth: int = 6) -> dict[str, Any]:
    """The components of ``obj``'s state by attribute path, in walk order (sorted names, depth first).

    ``skip`` names attribute paths to leave out, each with everything below it (``"data"`` skips
    ``data`` and ``data.loader``, not ``database``); an object skipped under one path is still found under
    another, and a skipped module covers nothing (its parameters held elsewhere are reported there).
    ``max_depth`` is the longest path walked: the
    trainer's attributes are depth 1, ``cfg.lr`` depth 2. ``obj`` itself is walked, never reported: pass
    the trainer, not a module (a module's own submodules would show as ``_modules.<name>``).
    """
    skipped = (skip,) if isinstance(skip, str) else tuple(skip)
    walk = _Walk(skipped, max_depth)
    walk.seen[id(obj)] = obj
    if max_depth > 0:
        for name, value in _attributes(obj):
            walk.visit(value, name, 1)
    covered = walk.covered()
    return {path: value for path, value in walk.found if id(value) not in covered}


class _Walk:
    def __init__(self, skip: tuple[str, ...], max_depth: int):
        self.skip = skip
        self.max_depth = max_depth
        self.found: list[tuple[str, Any]] = []
        #: Objects walked or reported, by id (kept alive, so no id is reused during the walk).
        self.seen: dict[int, Any] = {}

    def visit(self, value: Any, path: str, depth: int) -> None:
        if any(path == s or path.startswith(s + ".") for s in self.skip) or isinstance(value, _CODE):
            return
        if _skipped(value):
            return
        component = _component(value)
        if component is not _NOTHING:
            if not _plain(value):
                if id(value) in self.seen:
                    return
                self.seen[id(value)] = value
            self.found.append((path, component))
            return
        if depth >= self.max_depth or id(value) in self.seen:
            return
        self.seen[id(value)] = value
        for name, child in _children(value):
            self.visit(child, f"{path}.{name}", depth + 1)

    def covered(self) -> set[int]:
        """Ids of what the reported modules hold (parameters, buffers, submodules) and the samplers a reported
        loader holds (their position is part of the loader's ``state_dict()``; a sampler reported on its
        own would show, right after the loader was restored, the position it had before: torchdata hands
        a loaded position to its sampler only when the next iterator starts)."""
        out: set[int] = set()
        keep: list[Any] = []
        for _, value in self.found:
            if callable(_get(value, "state_dict")):
                batches = _get(value, "batch_sampler")
                held = [s for s in (_get(value, "sampler"), batches, _get(batches, "sampler")) if s is not None]
                keep.extend(held)
                out.update(id(item) for item in held)
            if not callable(getattr(value, "parameters", None)):
                continue
            for method in ("parameters", "buffers", "modules"):
                fn = getattr(value, method, None)
                if not callable(fn):
                    continue
                try:
                    held = [item for item in fn() if item is not value]
                except Exception:  # duck typing: a ``parameters`` that is not torch's covers nothing
                    continue
                keep.extend(held)
                out.update(id(item) for item in held)
        return out


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, *_PLAIN))


def _skipped(value: Any) -> bool:
    """Whether ``value`` is an OS handle, a thread, lock or process, a logger, or the harness's own."""
    for cls in type(value).__mro__:
        module = getattr(cls, "__module__", None) or ""
        if any(module == p or module.startswith(p + ".") for p in SKIPPED_PACKAGES):
            return True

    def has(name: str) -> bool:
        return callable(_get(value, name))

    return (has("fileno") or (has("acquire") and has("release")) or (has("is_alive") and has("join"))
            or (_get(value, "pid") is not None and (has("poll") or has("is_alive"))))


def _get(value: Any, name: str) -> Any:
    """``value.name``, or None when it has none or reading it raises (duck typing reads attributes of
    arbitrary objects; a property that raises is no reason to fail)."""
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _component(value: Any) -> Any:
    """What ``value`` is reported as, or ``_NOTHING`` when it is not a component."""
    if _plain(value):
        return value
    if all(_get(value, name) is not None for name in ("detach", "cpu", "dtype")):  # tensor
        return value
    if all(_get(value, name) is not None for name in ("dtype", "shape", "tobytes")):  # numpy
        return value
    if isinstance(value, random.Random):
        try:
            return repr(value.getstate()).encode()
        except NotImplementedError:  # SystemRandom: the OS's entropy, no state to restore
            return _NOTHING
    numpy_state = _numpy_generator_state(value)
    if numpy_state is not None:
        return numpy_state
    if callable(_get(value, "state_dict")) or callable(_get(value, "get_state")):
        return value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return _NOTHING


def _numpy_generator_state(value: Any) -> dict[str, Any] | None:
    """A numpy ``Generator``'s, bit generator's or ``RandomState``'s state as a plain dict, else None."""
    module = type(value).__module__ or ""
    if not module.startswith("numpy.random"):
        return None
    state = _get(_get(value, "bit_generator"), "state")  # Generator
    if isinstance(state, Mapping):
        return dict(state)
    state = _get(value, "state")  # a bare bit generator (PCG64, MT19937, ...)
    if isinstance(state, Mapping) and callable(_get(value, "random_raw")):
        return dict(state)
    get_state = _get(value, "get_state")  # RandomState
    if callable(get_state):
        state = get_state(legacy=False)
        if isinstance(state, Mapping):
            return dict(state)
    return None


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    """A container's or object's children, named: dict values by key, items by index, attributes."""
    if isinstance(value, Mapping):
        used: set[str] = set()
        for key in sorted(value, key=lambda k: (str(k), repr(k))):
            name = str(key) if str(key) not in used else repr(key)
            used.add(name)
            yield name, value[key]
    elif isinstance(value, (list, tuple, deque)):
        for index, item in enumerate(value):
            yield str(index), item
    else:
        yield from _attributes(value)


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes from its ``__dict__`` and ``__slots__``, sorted by name; names that start
    with ``__`` left out, and so are private names (``self.__x``, stored mangled as ``_Class__x``)."""
    found: dict[str, Any] = {}
    instance_dict = getattr(obj, "__dict__", None)
    if isinstance(instance_dict, Mapping):
        found.update((name, v) for name, v in instance_dict.items() if isinstance(name, str))
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in found or name.startswith("__"):
                continue
            try:
                found[name] = getattr(obj, name)
            except AttributeError:  # a slot never assigned
                continue
    mangled = tuple(f"_{cls.__name__.lstrip('_')}__" for cls in type(obj).__mro__ if cls.__name__.strip("_"))
    return sorted((item for item in found.items() if not item[0].startswith(("__", *mangled))),
                  key=lambda item: item[0])
