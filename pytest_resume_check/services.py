"""Services a target's runs share: something started once per session (a Ray head, a database) instead
of once per run.

A target declares ``services=(factory, ...)``: each factory is called with no arguments in the process
that runs the cells (the pytest process, or each xdist worker) and returns a context manager. Entering it
starts the service and gives a mapping of environment variables; every run of the target gets them in
its environment (a command target's program too), which is how a run finds the service. A service is
started on the first run of a target that names it and stopped, in reverse order, when the session ends,
after Ctrl-C too. A factory that raises is not retried: every cell of its targets fails with one line
that names it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from pytest_resume_check.targets import Target, TargetError, describe_error

ServiceFactory = Callable[[], AbstractContextManager[Mapping[str, str]]]

ERR_START = ("target {target!r}: its service {service} failed to start: {error}. The target's cells cannot run "
             "without it; fix the service (or its environment) and rerun")
ERR_ENV = ("target {target!r}: its service {service} gave {value!r} where it must give a mapping of environment "
           "variable names to str values")
ERR_STOP = "resume-check: service {service} raised while stopping: {error}"


def service_name(factory: Any) -> str:
    """How a service is named in messages: its module and qualified name."""
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    return f"{module}.{name}" if module else name


class Services:
    """The services started in this process, by factory; :meth:`close` stops them all."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._env: dict[Any, dict[str, str]] = {}
        self._failed: dict[Any, str] = {}
        self._lock = threading.Lock()

    def env_for(self, target: Target) -> dict[str, str]:
        """The environment the runs of ``target`` get from its services, starting those not yet running.
        Raises :class:`TargetError` if one failed to start (now or earlier in the session)."""
        env: dict[str, str] = {}
        with self._lock:
            for factory in target.services:
                if factory in self._failed:
                    raise TargetError(ERR_START.format(target=target.name, service=service_name(factory),
                                                       error=self._failed[factory]))
                if factory not in self._env:
                    self._env[factory] = self._start(target, factory)
                env.update(self._env[factory])
        return env

    def _start(self, target: Target, factory: Any) -> dict[str, str]:
        name = service_name(factory)
        try:
            manager = factory()
            value = self._stack.enter_context(manager)
        except Exception as exc:
            self._failed[factory] = describe_error(exc)
            raise TargetError(ERR_START.format(target=target.name, service=name, error=self._failed[factory])) from exc
        value = {} if value is None else value
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            self._failed[factory] = f"it gave {value!r}"
            raise TargetError(ERR_ENV.format(target=target.name, service=name, value=value))
        return dict(value)

    @property
    def running(self) -> int:
        """How many services are running."""
        return len(self._env)

    def close(self) -> list[str]:
        """Stop every service, the last started first; returns what went wrong (one line each)."""
        with self._lock:
            stack, self._stack = self._stack, ExitStack()
            self._env.clear()
            self._failed.clear()
        try:
            stack.close()
        except Exception as exc:  # the stack already tried every service; name the error
            return [ERR_STOP.format(service="(session services)", error=describe_error(exc))]
        return []
