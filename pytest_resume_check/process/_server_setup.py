"""What the fork server does after its own modules are imported: become the subreaper of its children,
note the environment variables the project's code reads (:mod:`pytest_resume_check.child.environ`), import
its targets' modules (recording any that raise), set torch to one intra-op thread, import the
modules that declare its targets and run their warm-up functions (recording any that raise or leave
threads running), pay torch's first-use costs once when torch is in use, give back its output and
freeze its heap for the garbage collector.

Defining only: :mod:`._preload_end`, the last entry of the fork server's preload list, calls
:func:`finish`; :func:`send_failures` runs in a child forked from the server. Nothing here runs in any
other process.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import importlib
import json
import multiprocessing.spawn
import os
import sys
import warnings
from typing import Any

from pytest_resume_check.child.environ import READS
from pytest_resume_check.records.declaration import describe_error

#: The server's work, as JSON: ``{"import": [modules], "call": ["module:function" warm-ups], "path":
#: [the starter's sys.path], "auto": [[module, file] declaring a target], "warm_torch": bool, "started_for":
#: {...}}``; set by the starting :class:`~.fork_server.ForkServer` only in the environment it starts the
#: server with.
WARMUP_ENV = "PYTEST_RESUME_CHECK_WARMUP"
#: What the :class:`~.fork_server.ForkServer` that started this server knew and asked of it (``wanted``, the
#: modules it left out because they killed a server, ``fatal``, and why it turned ``auto_preload`` off), so
#: another one of the same process can tell whether the server does all it asks, and learn what it learned.
STARTED_FOR: dict[str, Any] = {}
#: Preloaded modules whose import raised in this server: module -> ``Type: message (at file:line)``.
#: Multiprocessing's own preload lets any exception but ImportError kill the server, and then every
#: child start fails with a bare EOFError; imported here, one broken module costs only the
#: targets that name it.
FAILED: dict[str, str] = {}
#: Warm-ups (``module:function``) that raised or could not be found: spec -> ``Type: message``. They
#: cost only speed (each run then pays what the warm-up would have paid), so they are warnings.
WARMUP_FAILED: dict[str, str] = {}
#: Warm-ups after which more threads ran in the server than before: spec -> how many more. A process
#: forked while other threads run inherits their locks but not the threads, and torch's thread pool
#: then hangs every forked run, so the targets naming such a warm-up are refused.
WARMUP_THREADS: dict[str, int] = {}
#: Modules declaring a target (``auto_preload``) that this server could not import: module -> why. They
#: cost nothing: each child imports its target's module itself, as it does with ``auto_preload=False``.
AUTO_FAILED: dict[str, str] = {}
#: Why what ``auto_preload`` did left this server unsafe to fork from (a declaring module started a
#: thread or initialised CUDA when imported, torch's warm-up left a thread): the starter then starts the
#: server again without it. Empty: it did not.
AUTO_UNSAFE: list[str] = []
#: Name of torch's warm-up in the messages.
TORCH_WARM_UP = "torch's warm-up"
PR_SET_CHILD_SUBREAPER = 36
#: A server shared by sessions (:mod:`.shared_server`): what it imported and the environment that read, for a
#: session to check the server is still what it would start (empty in a session's own server).
FINGERPRINT: dict[str, Any] = {}


def finish() -> None:
    """Called once, in the fork server, after its preload imports."""
    _become_subreaper()
    work = json.loads(os.environ.pop(WARMUP_ENV, "") or "{}")
    inherited = dict(os.environ) if work.get("shared") else {}  # imports may set some (torch does)
    STARTED_FOR.update(work.get("started_for") or {})
    READS.install()  # what the targets' modules read when imported here, each run forked from here read too
    try:
        _import(work.get("path", []), work.get("import", []))
        _single_threaded_torch()
        _import_declaring([(module, file) for module, file in work.get("auto", [])], work.get("main"))
        _single_threaded_torch()
        _call(work.get("call", []))
        if work.get("warm_torch") and not AUTO_UNSAFE:
            _warm_torch()
        _seed_torch(work.get("torch_seed"))
    finally:
        _restore_output()
    READS.seal()  # what the imports above read: a run whose env= differs there runs fresh (child.command)
    if work.get("shared"):
        from pytest_resume_check.process.shared_server import fingerprint

        FINGERPRINT.update(fingerprint({name: inherited.get(name) for name in READS.sealed()}))
    # Without this the first garbage collection in every forked child walks (and so copies) every
    # object torch and verl left in the server: about 0.4 s per run with verl 0.8.
    gc.collect()
    gc.freeze()


def _become_subreaper() -> None:
    """Loader workers of a killed child are orphaned. Without a subreaper they go to PID 1, which on
    some machines reaps only every ~1.5 s, and the harness waits for them to vanish. As subreaper
    the server adopts them and its SIGCHLD handler reaps them at once."""
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: PID 1 reaps, only slower
        pass


def _restore_output() -> None:
    """Give the server its stdout and stderr back (silenced by ``_preload_begin`` during imports and
    warm-up)."""
    begin = sys.modules.get("pytest_resume_check.process._preload_begin")
    if begin is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(begin.SAVED_STDOUT, 1)
        os.dup2(begin.SAVED_STDERR, 2)


def _single_threaded_torch() -> None:
    """torch starts its intra-op thread pool at the first parallel operation (a warm-up's training step)
    and a child forked after that hangs in its first one. With one intra-op thread no pool is started;
    the children inherit the setting (a trainer may call ``torch.set_num_threads`` itself)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        try:
            torch.set_num_threads(1)
        except Exception:  # a half-imported torch: its import error is recorded already
            pass


def _thread_count() -> int:
    """Threads of this process as the kernel sees them (also those of C libraries)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def send_failures(conn: Any) -> None:
    """In a child forked from the server: send what the server was started for, and its failed imports and
    warm-ups, to the starter."""
    conn.send({"import": dict(FAILED), "warmup": dict(WARMUP_FAILED), "threads": dict(WARMUP_THREADS),
               "auto": dict(AUTO_FAILED), "unsafe": list(AUTO_UNSAFE), "started_for": dict(STARTED_FOR),
               "fingerprint": FINGERPRINT})
    conn.close()


def _import(path: list[str], modules: list[str]) -> None:
    if path:  # the starter's sys.path, which its children get too: modules beside a conftest are found
        sys.path[:] = path
    for name in modules:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:
            FAILED[name] = describe_error(exc)


def _call(specs: list[str]) -> None:
    for spec in specs:
        module_name, _, func = spec.partition(":")
        before = _thread_count()
        try:
            function = getattr(importlib.import_module(module_name), func)
            _single_threaded_torch()  # also when this warm-up's module was the first to import torch
            function()
        except (Exception, SystemExit) as exc:  # only costs speed; each child still works
            WARMUP_FAILED[spec] = describe_error(exc)
        extra = _thread_count() - before
        if extra > 0:
            WARMUP_THREADS[spec] = extra


def _python_threads() -> int:
    """Threads running Python code in this process. Not the kernel's count: importing numpy (so torch)
    starts OpenBLAS's pool, which forks safely (it re-creates itself in the child), and a module that
    names ``torch`` in ``preload`` has always been imported with it."""
    return len(sys._current_frames())


def _cuda_initialised() -> bool:
    """Whether torch has set up CUDA in this process (a forked child then cannot use it)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # a half-imported torch: its import error is recorded already
        return False


def _import_declaring(modules: list[tuple[str, str]], main: str | None = None) -> None:
    """Import the starter's script as each child would (``main``: its path, a script that only imports,
    :func:`.fork_server._entry_script`), as this server's ``__main__``, so no child runs it again; then each
    module that declares a target as its children would (:func:`child.loading.target_module`: by name, or
    from its file under the same name), so they find it, and what it imports, loaded. One that raises is
    recorded in :data:`AUTO_FAILED` and left to the children; imports that start a thread or set up CUDA make
    the server unsafe to fork from (:data:`AUTO_UNSAFE`)."""
    from pytest_resume_check.child.loading import target_module

    threads, cuda = _python_threads(), _cuda_initialised()
    fresh = tuple(name for name in _SEEDED_AT_IMPORT if name not in sys.modules)
    if main is not None:
        try:
            # multiprocessing's own step for a preloaded ``__main__``; a child whose starter's script is this
            # file then finds it imported and does not run it again.
            multiprocessing.spawn.import_main_path(main)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the children run it themselves, as they did
            AUTO_FAILED[main] = describe_error(exc)
    for module, file in modules:
        try:
            target_module(module, file)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # also pytest.skip() at module level, which is no Exception
            AUTO_FAILED[module] = describe_error(exc)
    names = ", ".join([*([main] if main is not None else []), *(module for module, _ in modules)])
    extra = _python_threads() - threads
    if extra > 0:
        AUTO_UNSAFE.append(f"importing {names} started {extra} thread{'s' if extra > 1 else ''}")
    if _cuda_initialised() and not cuda:
        AUTO_UNSAFE.append(f"importing {names} initialised CUDA")
    if (modules or main is not None) and fresh:
        os.register_at_fork(after_in_child=functools.partial(_reseed, fresh, os.getpid()))


#: Modules whose global generator a fresh interpreter seeds at random when it imports them. A child that
#: imported them itself (``auto_preload=False``) started with its own seed, so an unseeded trainer's two
#: reference runs differed (NONDETERMINISTIC); forked from a server that imported them, every child would
#: start from one seed. (Python's ``random`` reseeds itself in a forked child.)
_SEEDED_AT_IMPORT = ("torch", "numpy.random")


def _seed_torch(seed: int | None) -> None:
    """Seed torch's global generator with the starter's seed once the imports and warm-ups are done, so every
    server one engine starts gives its runs the same start (each import of torch seeds it at random: a server
    started again for a later target gave the runs after it another start than the reference runs before it,
    and an unseeded trainer's restored step differed only for that). A child that reseeds at random
    (:func:`_reseed`) still does."""
    torch = sys.modules.get("torch")
    if seed is None or torch is None or not hasattr(torch, "default_generator"):
        return
    try:
        torch.default_generator.manual_seed(int(seed))
    except Exception:  # a half-imported torch: its import error is recorded already
        pass


def _reseed(names: tuple[str, ...], server: int, /) -> None:
    """In a process forked from the server (not in the processes a run forks): seed the generators of
    ``names`` at random, as importing them would have, when ``auto_preload`` imported them first. So the
    automatic preload changes how fast a run starts, never a verdict."""
    if os.getppid() != server:
        return
    torch = sys.modules.get("torch") if "torch" in names else None
    if torch is not None and hasattr(torch, "default_generator"):
        torch.default_generator.seed()
    legacy = sys.modules.get("numpy.random") if "numpy.random" in names else None
    if legacy is not None and hasattr(legacy, "seed"):
        legacy.seed()


def _warm_torch() -> None:
    """When the server's modules imported torch, pay the first-use costs every run would pay again: the
    first optimizer step (which imports ``torch._dynamo``, 1-3 s; ``DistributedDataParallel`` imports it
    too when first built), the first ``torch.save`` and ``torch.load``. On a throwaway model, with
    torch's generators as they were (a trainer that does not seed them starts where it did before), and
    one intra-op thread, so no thread is left running: one that is makes the server unsafe."""
    torch = sys.modules.get("torch")
    if torch is None:  # never import torch for a target that does not use it
        return
    before = _thread_count()
    try:
        _torch_first_use(torch)
    except Exception as exc:  # only costs speed: each run pays what this would have paid
        AUTO_FAILED[TORCH_WARM_UP] = describe_error(exc)
    extra = _thread_count() - before
    if extra > 0:
        AUTO_UNSAFE.append(f"{TORCH_WARM_UP} left {extra} more thread{'s' if extra > 1 else ''} running")


def _torch_first_use(torch: Any) -> None:
    import io

    importlib.import_module("torch._dynamo")  # what the first step imports lazily (most of the cost)
    if torch.distributed.is_available():
        importlib.import_module("torch.nn.parallel.distributed")
    with torch.random.fork_rng(devices=[]):
        model = torch.nn.Linear(4, 2)
        optimizers = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                      torch.optim.Adam(model.parameters()), torch.optim.AdamW(model.parameters())]
        for optimizer in optimizers:
            model(torch.randn(3, 4)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizers[-1].state_dict()}, buffer)
        buffer.seek(0)
        torch.load(buffer)
