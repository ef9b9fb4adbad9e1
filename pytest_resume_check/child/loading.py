"""The target function found again in a run's process: the module that declares it, imported by name or
loaded from its file, and the function in it (the fork server preloads the same modules the same way)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_resume_check.targets import Target, TargetError, TargetFunction

__all__ = ["load_target_fn", "target_module"]


def load_target_fn(ref: tuple[str, str, str]) -> TargetFunction:
    """Import the target function in a child from its (module, file, qualname) reference
    (:attr:`Target.ref`)."""
    module_name, path, qualname = ref
    obj: Any = target_module(module_name, path)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, Target):
        obj = obj.fn
    fn: TargetFunction = obj
    return fn


def target_module(module_name: str, path: str) -> ModuleType:
    """The module ``module_name`` whose file is ``path``: by name when that finds this file, else loaded
    from the file (a conftest.py is imported by pytest under a name another conftest may hold). The same
    in a child and in the fork server that preloads it (``auto_preload``): a module either imported is
    found in ``sys.modules``, and only with the right file (the server may hold two conftest modules)."""
    by_path = _module_name_of_file(path) if path else None
    for name in (module_name, by_path):
        module = sys.modules.get(name) if name else None
        if module is not None and _is_file(module, path):
            return module
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    if module is not None and _is_file(module, path):
        return module
    if by_path is None:
        raise TargetError(f"cannot import module {module_name!r} of the target")
    spec = importlib.util.spec_from_file_location(by_path, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load the target's module from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(spec.name, None)  # as an import that raises: nothing half-made is found later
        raise
    return module


def _is_file(module: ModuleType, path: str) -> bool:
    """Whether ``module`` was loaded from ``path`` (any module, when no file is known)."""
    if not path:
        return True
    file = getattr(module, "__file__", "") or ""
    try:
        return Path(file) == Path(path) or (bool(file) and os.path.samefile(file, path))
    except OSError:
        return False


def _module_name_of_file(path: str) -> str:
    """The name a target's module loaded from its file gets (the same in every process: a digest)."""
    return "_resume_check_target_" + hashlib.sha1(path.encode(errors="surrogateescape")).hexdigest()[:16]
