"""The fork server runs start from: :class:`ForkServer`, one per engine.

The server imported the targets' ``preload`` modules once, so a run forked from it does not pay for
importing torch or verl again. A preload module that fails to import costs only the targets that name it:
:meth:`ForkServer.check_preload` raises a :class:`~.targets.TargetError` naming the module and its exception
for those, and the server goes on serving the others. So does a warm-up that leaves threads running in the
server (forked runs would hang); a warm-up that raises costs only speed and is a warning, once.

Without being asked (a target's ``auto_preload``), the server also imports the script the session was
started as when it only imports (``pytest``'s console script, which multiprocessing would otherwise run again
in every run), the modules that declare the targets and, when torch is then imported, pays its first-use
costs once. What it cannot do so costs no
error: a module that fails is left to the children, and a server made unsafe by it is started again without
it; :meth:`ForkServer.auto_preload_notes` says why.

CPython keeps one fork server per process (``multiprocessing``'s), reached only through
:mod:`pytest_resume_check.child.cpython`. Each :class:`ForkServer` keeps its own preload, warm-ups and what
failed; two of them in one process (two engines of a script) share the server process only while it was
started with everything the one about to start a run asks for, and otherwise start it again with their own.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import secrets
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_resume_check.child import cpython, imports
from pytest_resume_check.process import _server_setup, shared_server
from pytest_resume_check.process._server_setup import WARMUP_ENV
from pytest_resume_check.process.sweep import environment
from pytest_resume_check.records.names import ISOLATION_FORKSERVER, OPT_ISOLATION
from pytest_resume_check.targets import TargetError

#: What every run's process runs: imported by the server, not by each run (the starter's entry point gives a
#: run forked from a shared server the environment of the session that starts it).
_CHILD_MODULES = ("pytest_resume_check.child.main", "pytest_resume_check.process.starter")
#: The server's own preload entries: the first silences its output, the last does its work
#: (:mod:`._server_setup`); multiprocessing's preload would die of the first target module that raises.
_SERVER_PRELOAD = ["pytest_resume_check.process._preload_begin", "pytest_resume_check.process._preload_end"]
AUTO_DIED = "the fork server died while importing the modules that declare the targets"

ERR_PRELOAD = ("target {target!r}: preload module {module!r} failed to import in the fork server: {error}; fix the "
               "module, or remove it from the target's preload=")
ERR_SERVER_DIED = ("the fork server died while importing the preload modules {modules} or calling the warm-ups "
                   "{warmups}, and no module fails when imported alone; run with " + OPT_ISOLATION + "=spawn "
                   "to do without the fork server")
ERR_WARMUP_THREADS = ("target {target!r}: the warm-up {spec!r} left {n} more thread{s} running in the fork server; "
                      "a run forked from it inherits their locks but not the threads, and hangs (torch's thread pool "
                      "does). Make the warm-up start no thread (no loader workers or thread pools; torch runs it with "
                      "one intra-op thread already), or remove it from the target's preload=")
WARN_WARMUP = ("resume-check: target {target!r}: the warm-up {spec!r} failed in the fork server: {error}. Its runs "
               "still work, but each pays what the warm-up would have paid (often several times slower). {fix}")
FIX_WARMUP_IMPORT = ("The fork server imports with this session's sys.path: put the folder that holds {module!r} on it "
                     "(pytest's pythonpath ini option, or a conftest.py beside the module), or name the module by "
                     "its importable dotted path")
FIX_WARMUP_RAISED = "Fix the warm-up (it is called with no arguments), or remove it from the target's preload="


class ResumeCheckWarning(UserWarning):
    """Something that makes a matrix slower or less thorough without making it wrong."""


#: Imports one module in a fresh interpreter with the starter's sys.path: ``-c _IMPORT_ALONE path module``.
#: Ends with 0 also when the import raises (the server survives that): only a dying interpreter fails.
_IMPORT_ALONE = ("import importlib, json, sys\nsys.path[:] = json.loads(sys.argv[1])\n"
                 "try:\n    importlib.import_module(sys.argv[2])\nexcept (Exception, SystemExit):\n    pass\n")


@dataclass(frozen=True)
class ServerEnd:
    """How the fork server ended, as the kernel tells its parent: the signal that killed it, or its exit
    status (both None when that is no longer known)."""

    pid: int
    signal: int | None = None
    status: int | None = None

    @property
    def signal_name(self) -> str | None:
        """The killing signal's name (``SIGKILL``), None when no signal killed it."""
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"


class MainNotAFile(RuntimeError):
    """The program driving the harness runs from a main file that is no file (a program read from standard
    input, ``python -``, or a file removed since): multiprocessing makes every process it starts, forked from a
    server or spawned, run its starter's main file again, so every run would fail before the harness got a word
    from it. Raised before the first run, not a bug of the harness (:mod:`~.judge.harness_errors`)."""

    def __init__(self, path: str):
        super().__init__(f"the driving program's main file {path} is no file")
        self.path = path


def check_main() -> None:
    """Raise :class:`MainNotAFile` when the processes multiprocessing starts would fail to run this process's
    main file again (a program run as ``python -c`` names none, and is fine)."""
    path = multiprocessing.spawn.get_preparation_data("check").get("init_main_from_path")
    if path and not os.path.isfile(path):
        raise MainNotAFile(str(path))


class ForkServerDied(Exception):
    """The fork server a run was started from died under it: the harness's own failure, never the run's
    (:mod:`pytest_resume_check.judge.harness_errors` makes it the cell's ``HARNESS`` line)."""

    def __init__(self, end: ServerEnd):
        super().__init__(f"the fork server (pid {end.pid}) died: "
                         + (f"killed by {end.signal_name}" if end.signal_name else f"exit status {end.status}"))
        self.end = end


def server_end(pid: int) -> ServerEnd | None:
    """How the fork server ``pid`` (a child of this process) ended, None while it runs. Asked with
    ``WNOWAIT``, so it stays a zombie for multiprocessing to reap when it starts the next one."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already (or not ours): dead, how is not known
        return None if shared_server.exists(pid) else ServerEnd(pid)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return ServerEnd(pid, signal=info.si_status)
    return ServerEnd(pid, status=info.si_status)


def _covers(served: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether a server started for ``served`` does all ``wanted`` asks (both as JSON values)."""
    def entries(work: dict[str, Any], key: str) -> set[Any]:
        return {tuple(e) if isinstance(e, list) else e for e in work.get(key, [])}

    return (all(entries(wanted, key) <= entries(served, key) for key in ("import", "call", "auto"))
            and (served.get("warm_torch", False) or not wanted.get("warm_torch", False)))


class ForkServer:
    """The fork server an engine's runs are forked from, and all that is known of it: the preload modules and
    warm-ups asked for, the modules that declare the targets (``auto_preload``), which of them failed and how,
    its pid while it runs and how it ended. Started at the first run that needs it (:meth:`ensure`), started
    again when a later target asks for more, stopped at the session's end (:meth:`stop`)."""

    def __init__(self) -> None:
        self._preload: list[str] = list(_CHILD_MODULES)
        #: torch's global generator is seeded with this in every server this object starts (or adopts): a
        #: server started again (a later target's preload) would otherwise import torch with a new random seed,
        #: and a run forked from it would start from another state than the reference runs forked before.
        self._torch_seed = secrets.randbits(63)
        self._warmups: list[str] = []
        #: The modules that declare the targets (``auto_preload``): (module name, file), in the order asked for.
        self._auto: list[tuple[str, str]] = []
        #: The pid of the server this object started (or found started with all it asks), and what it serves.
        self._pid: int | None = None
        self._served: dict[str, Any] | None = None
        #: Preload modules that failed to import in the server: module -> what happened.
        self._failed: dict[str, str] = {}
        #: Of those, modules whose import killed the server outright; they stay out of its preload list.
        self._fatal: dict[str, str] = {}
        #: Warm-ups that raised in the server (spec -> error), and those that left threads running in it
        #: (spec -> how many); see :mod:`._server_setup`.
        self._warmup_failed: dict[str, str] = {}
        self._warmup_threads: dict[str, int] = {}
        #: Warm-up failures already warned about (one warning each).
        self._warned: set[str] = set()
        #: What ``auto_preload`` could not do in the server: module (or torch's warm-up) -> why.
        self._auto_failed: dict[str, str] = {}
        #: Why ``auto_preload`` is off for the rest of this object's life (None: it is on): what it did made
        #: the server unsafe to fork from, or the server died with it.
        self._auto_off: str | None = None
        #: Share servers with other sessions (:meth:`share`): the idle limit of those this object starts;
        #: None: this object starts its own (also after sharing failed once).
        self._share_idle: float | None = None
        #: The slot of the shared server this object forks from now, and whether a run was forked yet (its torch
        #: seed is then this object's for good: a shared server started with another is not used).
        self._slot: shared_server.Slot | None = None
        self._seeded = False
        #: Whether the shared server was found warm or started cold, and why, for the session's line.
        self.server_line: str | None = None

    # -- what is asked for ----------------------------------------------------------------------------

    def add_preload(self, entries: Iterable[str]) -> None:
        """Ask the server to import these modules (``pkg.mod``) or to call these warm-up functions
        (``pkg.mod:function``) once. Asked before the first run, they are in the server it starts; asked
        later, the server is started again with them at the next run."""
        for entry in entries:
            target = self._warmups if ":" in entry else self._preload
            if entry not in target:
                target.append(entry)

    def add_auto(self, module: str, file: str) -> None:
        """Ask the server to import ``module`` (from ``file``) as a child would find its target there, and to
        pay torch's first-use costs if torch is then imported (``auto_preload``)."""
        if (module, file) not in self._auto:
            self._auto.append((module, file))

    def auto_preload_notes(self) -> list[str]:
        """What ``auto_preload`` could not do in the server, one line each (the runs of those targets import
        their modules themselves)."""
        notes = [f"{module}: {why}" for module, why in self._auto_failed.items()]
        return notes + ([self._auto_off] if self._auto_off else [])

    def check_preload(self, target: str, entries: Iterable[str], isolation: str,
                      declared_in: tuple[str, str] | None = None) -> None:
        """Add ``entries`` (the preload of ``target``) to the server's, and raise :class:`~.targets.TargetError`
        if the server failed to import one of them (starting the server first if it is not running with them).
        ``declared_in``: (module, file) that declares the target, for ``auto_preload`` (what the server cannot
        do with it raises nothing)."""
        entries = list(entries)
        self.add_preload(entries)
        if declared_in is not None:
            self.add_auto(*declared_in)
        if isolation != ISOLATION_FORKSERVER:
            return
        self.ensure()
        for entry in entries:
            if entry in self._failed:
                raise TargetError(ERR_PRELOAD.format(target=target, module=entry, error=self._failed[entry]))
            if entry in self._warmup_threads:
                n = self._warmup_threads[entry]
                raise TargetError(ERR_WARMUP_THREADS.format(target=target, spec=entry, n=n, s="" if n == 1 else "s"))
            if entry in self._warmup_failed and entry not in self._warned:
                self._warned.add(entry)
                warnings.warn(warmup_warning(target, entry, self._warmup_failed[entry]), ResumeCheckWarning,
                              stacklevel=2)

    def share(self, idle: float | None = None) -> None:
        """Fork from a server shared with this user's other sessions of this project (xdist's workers, the
        next session), started if none runs, ended by its keeper ``idle`` seconds after the last session
        left (default: :func:`.shared_server.idle_limit`; :mod:`.shared_server`)."""
        self._share_idle = idle if idle is not None else shared_server.idle_limit()

    @property
    def shared(self) -> bool:
        """Whether the runs are forked from a server other sessions may fork from too."""
        return self._slot is not None and self.pid is not None

    # -- the server process ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running server's pid (it adopts orphans of the runs it forked), None before it starts, after
        it is stopped, or once another engine of this process started its own."""
        return self._pid if self._pid is not None and cpython.forkserver_pid() == self._pid else None

    def alive(self) -> bool:
        """Whether this object's server runs."""
        return shared_server.running(self.pid)

    def ended(self) -> ServerEnd | None:
        """How this object's server ended, if it did (None while it runs or before it started)."""
        return server_end(self._pid) if self._pid is not None else None

    def ensure(self) -> int | None:
        """Start the server with every preload asked for so far, unless the running one does all that; start
        it again when a later target asked for more (a session that ran one target and then another would
        otherwise pay the second target's imports in every child). Its pid."""
        ctx = multiprocessing.get_context("forkserver")
        wanted = self._wanted()
        if self._share_idle is not None:
            pid = self._ensure_shared(ctx, wanted)
            if pid is not None:
                self._seeded = True
                return pid
        self._seeded = True
        current = cpython.forkserver_pid()
        if shared_server.running(current):
            if current == self._pid and self._served is not None and _covers(self._served, wanted):
                return current
            if current != self._pid and self._adopt(ctx, current, wanted):
                return self._pid
            if not cpython.stop_forkserver():  # cannot restart on this Python: children import the rest themselves
                self._pid = current
                return current
        self._start(ctx)
        return self._pid

    def stop(self) -> None:
        """End of a session: stop the process's fork server (and the resource tracker) if this object started
        or found one; another engine's runs in this process then start a new one."""
        if self._slot is not None:
            self._leave()
            cpython.kill_resource_tracker()
        elif self._pid is not None:
            cpython.kill_forkserver()
            cpython.kill_resource_tracker()
        self._pid = self._served = None

    def _wanted(self) -> dict[str, Any]:
        """What a server for this object must have done, as JSON values (what a server found running is
        compared with): its preload modules, warm-ups, declaring modules and whether it warmed torch up."""
        auto, warm_torch = self._auto_work()
        work = {"import": self._preload, "call": self._warmups, "auto": auto, "warm_torch": warm_torch}
        wanted: dict[str, Any] = json.loads(json.dumps(work))
        return wanted

    def _auto_work(self) -> tuple[list[tuple[str, str]], bool]:
        """The declaring modules the server imports, and whether it warms torch up (nothing once it is off)."""
        if self._auto_off is not None or not self._auto:
            return [], False
        return list(self._auto), True

    def _adopt(self, ctx: Any, current: int | None, wanted: dict[str, Any]) -> bool:
        """Take the running server of another object of this process as this one's when it was started with
        all this object asks, learning what failed in it (and what its starter learned: the modules that kill
        a server, why ``auto_preload`` is off); whether it was."""
        found = self._probe(ctx)
        started_for = (found or {}).get("started_for") or {}
        if found is None or "wanted" not in started_for:  # gone, or a server none of ours started
            return False
        if started_for.get("auto_off") and self._auto_off is None:  # it would make this one's server unsafe too
            self._auto_off = started_for["auto_off"]
            wanted = self._wanted()
        if not _covers(started_for["wanted"], wanted):
            return False
        self._fatal.update(started_for.get("fatal") or {})
        self._torch_seed = started_for.get("torch_seed", self._torch_seed)  # its runs' start, kept on a restart
        self._pid, self._served = current, started_for["wanted"]
        self._take(ctx, found)
        return True

    def _work(self) -> dict[str, Any]:
        """What a server started now does (:mod:`._server_setup`'s work, as JSON values)."""
        modules = [m for m in self._preload if m not in self._fatal]
        auto, warm_torch = self._auto_work()
        started_for = {"wanted": self._wanted(), "fatal": self._fatal, "auto_off": self._auto_off,
                       "torch_seed": self._torch_seed}
        work: dict[str, Any] = json.loads(json.dumps({
            "import": modules, "call": self._warmups, "path": _sys_path(), "auto": auto, "warm_torch": warm_torch,
            "main": _entry_script() if auto else None, "started_for": started_for, "torch_seed": self._torch_seed}))
        return work

    def _ensure_shared(self, ctx: Any, wanted: dict[str, Any]) -> int | None:
        """Fork from the shared server of what is asked for now: the one running (checked to be still what
        this session would start, and to give its runs this object's torch seed once a run was forked), else
        a new one. Its pid; None when sharing is not possible here (this object then starts its own)."""
        if self._slot is not None:
            if (self.pid is not None and shared_server.running(self._pid) and self._served is not None
                    and _covers(self._served, wanted)):
                return self._pid
            self._leave()
        root = shared_server.private_root()
        if root is None:
            self._unshare()
            return None
        work = {**self._work(), "shared": True}
        slot = shared_server.Slot(root / shared_server.slot_name(work))
        with slot.starting() as got:
            if not got:
                self._unshare()
                return None
            record, line = slot.server(), None
            for _ in range(2):
                if record is None:
                    line = line or shared_server.COLD_NEW
                    record = slot.start(_SERVER_PRELOAD, {WARMUP_ENV: json.dumps(work)}, self._share_idle or 0.0)
                if record is None or not slot.lease():
                    self._unshare()
                    return None
                if slot.server() is None:  # its keeper ended it meanwhile (it took the lease to do so)
                    slot.release()
                    record = None
                    continue
                cpython.attach_forkserver(record["address"], int(record["pid"]), os.open(os.devnull, os.O_RDONLY))
                self._slot = slot
                found = self._probe(ctx)
                if found is None:  # it died while importing: this object's own server finds out why
                    self._leave()
                    self._unshare()
                    return None
                why = shared_server.stale(found.get("fingerprint") or {})
                seed = (found.get("started_for") or {}).get("torch_seed")
                if why is None and (seed == self._torch_seed or not self._seeded):
                    break
                self._leave()
                why = why or "its runs start from another torch seed than this session's"
                if not slot.end():
                    self.server_line = shared_server.COLD_BUSY.format(why=why)
                    self._unshare()
                    return None
                record, line = None, shared_server.COLD_CHANGED.replace("{why}", why)
            else:
                self._unshare()
                return None
        self.server_line = (line or shared_server.WARM).format(pid=record["pid"],
                                                               age=time.time() - float(record.get("started", 0)))
        started_for = found["started_for"]
        self._torch_seed = started_for.get("torch_seed", self._torch_seed)
        self._pid, self._served = int(record["pid"]), started_for["wanted"]
        self._take(ctx, found)
        if self._slot is slot:
            shared_server.end_others(root, slot.folder)
        return self.pid

    def _leave(self) -> None:
        """Stop forking from the shared server (it keeps running for other sessions) and give its lease back."""
        cpython.detach_forkserver()
        if self._slot is not None:
            self._slot.release()
        self._slot = None
        self._pid = self._served = None

    def _unshare(self) -> None:
        """Sharing failed here: this object starts its own servers from now on."""
        self._leave()
        self._share_idle = None
        if self.server_line is None:
            self.server_line = shared_server.COLD_OWN
        return None

    def _start(self, ctx: Any) -> None:
        check_main()  # a server that runs was started past this check; each run need not ask again
        # The server imports the targets' modules itself (multiprocessing's preload would die of the first
        # one that raises); they, the warm-ups and this sys.path reach it through its environment, set only
        # while it starts: a later subprocess of this process (a test's interpreter, a user's script) must
        # not inherit it.
        ctx.set_forkserver_preload(_SERVER_PRELOAD)
        work = self._work()
        with environment(WARMUP_ENV, json.dumps(work)):
            multiprocessing.forkserver.ensure_running()
        self._pid, self._served = cpython.forkserver_pid(), work["started_for"]["wanted"]
        self._learn_failures(ctx, work["import"], bool(work["auto"]))

    def _probe(self, ctx: Any) -> dict[str, Any] | None:
        """What the running server reports through a child forked from it (which starts once its imports are
        done): what it was started for and what failed; None when it is gone."""
        reader, writer = ctx.Pipe(duplex=False)
        probe = ctx.Process(target=_server_setup.send_failures, args=(writer,), name="resume-check:preload-check")
        try:
            probe.start()
            writer.close()
            found: dict[str, Any] = reader.recv()
            probe.join()
        except (EOFError, OSError):  # the server is gone
            return None
        finally:
            reader.close()
        return found

    def _learn_failures(self, ctx: Any, modules: list[str], auto: bool = False) -> None:
        """Ask the new server which modules failed to import. If the server died instead (a module exited or
        crashed the interpreter), import each module alone to find which, and start the server again without
        it. ``auto``: the server imported the modules that declare the targets; when that made it unsafe, or
        it died, it is started again without them (before any explicit module is suspected)."""
        found = self._probe(ctx)
        if found is not None:
            self._take(ctx, found)
            return
        if auto and self._auto_off is None:
            self._auto_off = AUTO_DIED
            self._restart(ctx)
            return
        fatal = {m: error for m in modules if (error := _import_alone(m))}
        if not fatal:
            raise RuntimeError(ERR_SERVER_DIED.format(modules=", ".join(modules),
                                                      warmups=", ".join(self._warmups) or "(none)"))
        self._fatal.update(fatal)
        self._restart(ctx)

    def _take(self, ctx: Any, found: dict[str, Any]) -> None:
        """Keep what a server reported failed; start it again without ``auto_preload`` when that made it
        unsafe (it serves no child yet)."""
        self._failed = {**self._fatal, **found["import"]}
        self._warmup_failed.update(found["warmup"])
        self._warmup_threads.update(found["threads"])
        self._auto_failed.update(found["auto"])
        if found["unsafe"] and self._auto_off is None:
            self._auto_off = "; ".join(found["unsafe"])
            self._restart(ctx)

    def _restart(self, ctx: Any) -> None:
        """Start the server again after it died or became unsafe, with what is asked for now."""
        cpython.stop_forkserver()  # reap the dead server (else the next start finds it soon enough)
        self._pid = self._served = None
        self.ensure()


def warmup_warning(target: str, spec: str, error: str) -> str:
    """The warning for a warm-up that raised: what it raised and what to do about it."""
    module = spec.partition(":")[0]
    missing = error.startswith("ModuleNotFoundError") and repr(module.split(".")[0]) in error
    fix = FIX_WARMUP_IMPORT.format(module=module) if missing else FIX_WARMUP_RAISED
    return WARN_WARMUP.format(target=target, spec=spec, error=error, fix=fix)


def _sys_path() -> list[str]:
    """This process's sys.path as its children get it (the empty entry made absolute)."""
    return list(multiprocessing.spawn.get_preparation_data("ignore")["sys_path"])


def _entry_script() -> str | None:
    """The script this process was started as, for the server to import once as ``__main__`` (as
    ``__mp_main__``), when its top level only imports (a console script such as ``pytest``, or a script whose
    work is under ``if __name__ == "__main__":``). Every process multiprocessing starts runs its starter's
    script again unless its ``__main__`` already is that file: for ``pytest``, importing ``_pytest.config``
    in every run (about 0.1 s of CPU each). None for ``python -m`` (multiprocessing does not run a module's
    ``__main__`` again) and for a script that does anything else at its top, which each run keeps running
    itself. Nothing is imported here."""
    path = multiprocessing.spawn.get_preparation_data("ignore").get("init_main_from_path")
    return str(path) if path and imports.script_only_imports(Path(path)) else None


def _import_alone(module: str) -> str | None:
    """How importing ``module`` in a fresh interpreter kills it, if it does."""
    env = {k: v for k, v in os.environ.items() if k != WARMUP_ENV}
    code = subprocess.run([sys.executable, "-c", _IMPORT_ALONE, json.dumps(_sys_path()), module],
                          capture_output=True, env=env).returncode
    if code == 0:
        return None
    if code < 0:
        return f"importing it killed the interpreter ({signal.strsignal(-code) or f'signal {-code}'})"
    return f"importing it ended the interpreter with exit code {code}"
