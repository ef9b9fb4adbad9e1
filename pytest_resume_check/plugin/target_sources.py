"""Where a session finds targets: the ones a module (a conftest.py) declares, and the ones installed
packages ship through the ``pytest_resume_check.targets`` entry-point group (which of them a session runs is
:mod:`pytest_resume_check.plugin.discovery`'s choice)."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import ModuleType

from pytest_resume_check.targets import Target, TargetError

#: The entry-point group an installed package names its targets in (a :class:`Target` or an iterable of them).
ENTRY_POINT_GROUP = "pytest_resume_check.targets"


def targets_in_module(module: ModuleType) -> list[Target]:
    """The targets a module (a conftest) declares: module-level :class:`Target` objects, in definition
    order, plus those listed in a module-level ``RESUME_TARGETS`` sequence."""
    found = [v for v in vars(module).values() if isinstance(v, Target)]
    for v in getattr(module, "RESUME_TARGETS", ()):
        if not isinstance(v, Target):
            raise TargetError(f"{module.__name__}.RESUME_TARGETS holds {type(v).__name__}, not a Target")
        if v not in found:
            found.append(v)
    return found


def entry_point_targets() -> list[Target]:
    """Targets shipped by installed packages through the entry-point group."""
    found: list[Target] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = ep.load()
        except Exception as exc:  # a broken plugin must not hide the others' targets silently
            raise TargetError(
                f"entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP} failed to load: "
                f"{type(exc).__name__}: {exc}; fix or uninstall the package that declares it"
            ) from exc
        values = [value] if isinstance(value, Target) else list(value)
        for v in values:
            if not isinstance(v, Target):
                raise TargetError(
                    f"entry point {ep.name!r} ({ep.value}) gave {type(v).__name__}, not a Target; "
                    "point it at a resume_target(...) object or a list of them"
                )
        found.extend(values)
    return found
