"""A Python program run as ``__main__`` in the run's own process, as a fresh interpreter would run it.

:mod:`.command` runs ``{python} script.py`` and ``{python} -m module`` programs in the run's process (forked
from the preloaded fork server) to spare them an interpreter's start. Its verdicts must be those of the same
program in a fresh interpreter, where the harness is another process. So while the program runs, this module
gives it what that interpreter would: ``__file__`` absolute, the end an interpreter makes (threading's exit
hooks, the threads that are no daemons, the exit functions, those its imports registered included: logging's
and multiprocessing's, which waits for the children that are no daemons; streams flushed unless the program
closed them),
and a process of its own as far as ending or replacing it goes (:class:`OwnProcess`): ``os._exit`` ends the
run as the program's exit, an ``exec`` starts the new program on the run's socket, and a process the program
forks never returns into the harness's code.
"""

from __future__ import annotations

import atexit
import operator
import os
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from pytest_resume_check.child import cpython
from pytest_resume_check.child.ending import report_end
from pytest_resume_check.records.plan import RunPlan
from pytest_resume_check.run import Converged

#: How a program's ``exec`` is run instead: (executable, arguments, environment) -> (exit code, calls made).
Starter = Callable[[str, list[str], Mapping[str, str]], tuple[int, int]]


def run_main(name: str, module: bool, home: int) -> int:
    """Run the script ``name`` (or, ``module``, the module) as ``__main__``; the exit code an interpreter
    gives it (a message or a traceback is printed as the interpreter prints it, if ``sys.stderr`` is open).
    ``home``: the run's process, where an early stop (:class:`Converged`) goes on to end the run."""
    import runpy

    try:
        if module:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            run_script(name)
    except SystemExit as exc:
        return exit_code(exc.code)
    except Converged:
        if os.getpid() == home:
            raise  # an early stop: the run ends here, as for a Python target
        return 0  # in a process the program forked: that process ends, the run goes on
    except BaseException:  # what the interpreter prints for an uncaught exception, and its exit code
        try:
            traceback.print_exc()
        except (OSError, ValueError):  # the program closed its stderr
            pass
        return 1
    return 0


def run_script(name: str) -> None:
    """Run the script ``name`` as ``python name`` runs it: a ``__main__`` module whose ``__file__`` is the
    script's absolute path (as the interpreter gives it since Python 3.9, so a script that changes folder
    still finds the files beside it), ``sys.argv[0]`` left as given, its folder first on ``sys.path``. The
    module stays ``__main__`` afterwards, as in an interpreter (its exit functions and the processes it
    starts use it)."""
    import builtins
    import importlib.machinery
    import types

    path = os.path.abspath(name)
    sys.path.insert(0, os.path.dirname(path))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def exit_code(value: Any) -> int:
    """The exit code ``sys.exit(value)`` gives a process (a message is printed and gives 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except (OSError, ValueError):  # the program closed its stderr
        pass
    return 1


#: Exit functions standard modules register when imported, by module: a program importing the module in a
#: fresh interpreter has them run at its exit; in the run's process the fork server imported it already. In
#: the order they are registered (so run in the reverse order): logging flushes and closes its handlers,
#: multiprocessing joins the children that are no daemons (terminates those that are) and runs its
#: finalizers (a private function, :func:`.cpython.multiprocessing_exit_function`). (``weakref.finalize``'s
#: exit function is left out: it would also run the finalizers the server's objects registered, such as
#: removing the server's temporary folders.)
IMPORT_EXITS: tuple[tuple[str, Callable[[], Callable[[], None] | None]], ...] = (
    ("logging", lambda: sys.modules["logging"].shutdown),
    ("multiprocessing.util", cpython.multiprocessing_exit_function),
)


def register_import_exits() -> None:
    """Register the exit functions of :data:`IMPORT_EXITS` whose modules are imported, as their imports did in
    a fresh interpreter, before any the program registers (so they run after the program's)."""
    for module, exit_function in IMPORT_EXITS:
        function = exit_function() if module in sys.modules else None
        if function is not None:
            atexit.register(function)


def end_as_interpreter(threads: set[threading.Thread], hooks: list[Any]) -> None:
    """What an interpreter does once its main module ends: the threading module's exit hooks registered
    since (not in ``hooks``; concurrent.futures finishes an executor's queue so), a wait for the threads
    started since (not in ``threads``) that are no daemons, then the exit functions and a flush of the
    standard streams (one the program closed is left alone, as the interpreter leaves it)."""
    for hook in reversed([h for h in cpython.threading_exit_hooks() if h not in hooks]):
        hook()
    for thread in threading.enumerate():
        if thread not in threads and not thread.daemon and thread is not threading.current_thread():
            thread.join()
    try:
        cpython.run_exit_functions()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass


class OwnProcess:
    """While it is entered, what ends or replaces a process acts as in the program's own process. In the run's
    process: ``os._exit`` concludes the run with that exit code, as the program's process exiting would (no
    exit functions, no unwinding), then ends the process; ``os.execv`` and ``os.execve`` (through which every
    ``os.exec*`` goes) start the new program with ``start`` instead, as a process of its own holding the run's
    socket as a fresh interpreter's exec'd program would, and conclude the run when it exits. In a process the
    program forked both are the real ones; such a process ends when the program's code ends in it
    (:meth:`end_if_forked`), never running the harness's code.

    ``conclude(code, calls)`` judges the program's end (its exit code, the calls it made besides those of
    the run's process) by raising for a failure; the run's end is then reported as a target's would be."""

    def __init__(self, plan: RunPlan, sink: Any, conclude: Callable[[int, int], None], start: Starter):
        self.home = os.getpid()
        self._plan, self._sink, self._conclude, self._start = plan, sink, conclude, start
        self._real = (os._exit, os.execv, os.execve)

    def __enter__(self) -> OwnProcess:
        os._exit, os.execv, os.execve = self._exit, self._execv, self._execve  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        if os.getpid() == self.home:
            os._exit, os.execv, os.execve = self._real

    def end_if_forked(self, code: int) -> None:
        """In a process the program forked, at the end of the program's code: end it with ``code``."""
        if os.getpid() != self.home:
            self._real[0](code)

    def _exit(self, status: int) -> None:
        if os.getpid() != self.home:
            self._real[0](status)
        self._end_run(operator.index(status) & 0xFF, 0)  # the status a parent sees

    def _execv(self, path: Any, args: Any) -> None:
        if os.getpid() != self.home:
            self._real[1](path, args)
        self._exec(path, args, os.environ)

    def _execve(self, path: Any, args: Any, env: Mapping[str, str]) -> None:
        if os.getpid() != self.home:
            self._real[2](path, args, env)
        self._exec(path, args, env)

    def _exec(self, path: Any, args: Any, env: Mapping[str, str]) -> None:
        args = [os.fsdecode(a) for a in args]
        if not args:
            self._real[1](path, args)  # raises what exec raises for no arguments
        self._end_run(*self._start(os.fsdecode(path), args, dict(env)))

    def _end_run(self, code: int, calls: int) -> None:
        """End the run as the end of the program's process with ``code`` would, then this process."""
        self._real[0](report_end(self._plan, self._sink, lambda: self._conclude(code, calls)))
