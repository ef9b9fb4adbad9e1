"""The one way the tests ask for optional dependencies: :func:`has` and :func:`requires`.

``requires("torch", "torchdata")`` marks a test, or one parametrized case (``pytest.param(...,
marks=requires("verl"))``), to be skipped where a module is not installed; the reason names the
missing ones. ``has(...)`` answers the same question as a bool, for decisions made while collecting.

A test *file* that imports torch, torchdata, verl or numpy at module level keeps
``pytest.importorskip(...)`` before those imports instead: the import would fail before any marker is
read.

Neither function imports the modules it asks about (``importlib.util.find_spec`` only finds them), so
asking costs nothing and leaves ``sys.modules`` as it was: pytester snapshots ``sys.modules``, and
torch's C extension does not survive being imported a second time. Tests import this module as
``from optional import has, requires`` (the rootdir conftest puts tests/support, where it lives, on
``sys.path``).
"""

from __future__ import annotations

import importlib.util

import pytest

#: The skip reason of :func:`requires`; ``{}`` is the comma-separated list of missing modules.
MISSING_REASON = "not installed: {}"


def missing(*modules: str) -> list[str]:
    """The top-level ``modules`` that cannot be found, in the order given."""
    for name in modules:
        if "." in name:
            # find_spec("a.b") imports "a": exactly what asking must not do.
            raise ValueError(f"ask for the top-level module, not {name!r}")
    return [name for name in modules if importlib.util.find_spec(name) is None]


def has(*modules: str) -> bool:
    """Whether every one of the top-level ``modules`` is installed."""
    return not missing(*modules)


def requires(*modules: str) -> pytest.MarkDecorator:
    """A ``skipif`` marker that skips unless every one of ``modules`` is installed."""
    absent = missing(*modules)
    return pytest.mark.skipif(bool(absent), reason=MISSING_REASON.format(", ".join(absent)))
