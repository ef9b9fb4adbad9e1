"""A fork server shared by the sessions of one user and one project: the xdist workers of a session fork their
runs from one server, and the next session (the rerun line of a failing cell) finds it warm.

Each server lives in a *slot*, a folder named by the hash of what it was started for (the interpreter, the
preload modules, warm-ups and declaring modules, ``sys.path``, the working folder), inside the user's private
folder (:func:`private_root`: mode 0700, owned by the user, no symlink; its socket is 0600 in a 0700 folder of
the slot). A small *keeper* process (this module run as a program, no torch) starts the server as its child
and ends it, with every process left under it, once no session has held the slot's lease for the idle limit,
or when a later session asks (SIGTERM). A session holds the lease (a shared ``flock``, which the kernel
releases when the session dies, SIGKILL too) while it forks from the server.

The slot's name is only half of the key: what the server imported is checked against the files as they are
now (:func:`fingerprint` in the server, :func:`stale` in the session: a project file by its contents, an
installed one by size and time) and against the environment the server's imports read, so a server never
serves code or settings that changed since it started; a stale server is ended and a new one started cold.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_resume_check.records.environ import SHELL
from pytest_resume_check.records.names import DEFAULT_SERVER_IDLE, SERVER_IDLE_ENV

#: Seconds a session waits for another one starting the slot's server, or for a keeper to come up, before it
#: starts a server of its own instead (never forever).
WAIT = 120.0
#: The folder in the user's private folder that holds the slots.
ROOT_NAME = "pytest-resume-check-{uid}"
SERVER_FILE = "server.json"
LEASE_FILE = "lease"
START_FILE = "start.lock"
#: Seconds between the keeper's checks of the lease.
KEEPER_POLL = 0.5
#: The longest slot path that leaves room for multiprocessing's folder and socket name in a socket address.
SHORT_PATH = 60
#: The keeper's own output (why it could not start a server), in the slot.
KEEPER_LOG = "keeper.log"

COLD_NEW = "cold: no warm fork server for this project; started pid {pid}"
COLD_CHANGED = "cold: the warm fork server was stale ({why}); started pid {pid}"
COLD_BUSY = "cold: the warm fork server was stale ({why}) and in use by another session; one of this session's own"
COLD_OWN = "cold: the warm fork server could not be shared here; one of this session's own"
WARM = "warm: fork server pid {pid}, started {age:.0f} s ago"
WHY_FILE = "{file} changed"
WHY_ENV = "${name} changed"


def idle_limit() -> float:
    """Seconds a server this session starts stays without a session: ``$PYTEST_RESUME_CHECK_SERVER_IDLE``
    (tests set it small), else :data:`~.records.names.DEFAULT_SERVER_IDLE`."""
    try:
        return max(0.0, float(os.environ.get(SERVER_IDLE_ENV, "")))
    except ValueError:
        return DEFAULT_SERVER_IDLE


def private_root() -> Path | None:
    """The user's private folder for shared servers (made 0700 if missing), None where it cannot be trusted:
    not a folder, a symlink, another user's, or open to others."""
    root = Path(tempfile.gettempdir()) / ROOT_NAME.format(uid=os.getuid())
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return root


def slot_name(work: dict[str, Any]) -> str:
    """The slot of a server started for ``work`` (the fork server's work, as JSON values) in this interpreter
    and working folder."""
    key = {"python": sys.executable, "version": sys.version, "cwd": os.getcwd(),
           **{k: work.get(k) for k in ("import", "call", "path", "auto", "warm_torch")}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


class Slot:
    """One slot folder: its server (started by a keeper), the start lock and the lease."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(mode=0o700, exist_ok=True)
        self._lease: int | None = None

    @contextlib.contextmanager
    def starting(self, timeout: float = WAIT) -> Iterator[bool]:
        """Held by the one session that finds, checks or starts the slot's server; False when another held it
        longer than ``timeout``."""
        fd = os.open(self.folder / START_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            got = _lock(fd, fcntl.LOCK_EX, timeout)
            yield got
        finally:
            os.close(fd)  # releases the lock

    def server(self) -> dict[str, Any] | None:
        """The running server's record (``address``, ``pid``, ``keeper``, ``cwd``, ``started``), None when none
        runs."""
        try:
            record: dict[str, Any] = json.loads((self.folder / SERVER_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not (running(record.get("pid")) and running(record.get("keeper"))):
            return None
        return record

    def lease(self, timeout: float = WAIT) -> bool:
        """Take the slot's lease (shared): the keeper ends no server while a session holds it."""
        if self._lease is None:
            fd = os.open(self.folder / LEASE_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            if not _lock(fd, fcntl.LOCK_SH, timeout):
                os.close(fd)
                return False
            self._lease = fd
        return True

    def release(self) -> None:
        """Give the lease back."""
        if self._lease is not None:
            os.close(self._lease)
            self._lease = None

    def start(self, preload: list[str], environ: dict[str, str], idle: float) -> dict[str, Any] | None:
        """Start a keeper that starts the server with the ``preload`` list and ``environ`` over this process's
        environment (its work) and keeps it until it is idle for ``idle`` seconds; its record once the server
        listens, None if the keeper failed (its log in the slot says why)."""
        with contextlib.suppress(OSError):
            (self.folder / SERVER_FILE).unlink()
        with open(self.folder / KEEPER_LOG, "wb") as log:
            command = [sys.executable, "-m", __name__, str(self.folder), str(idle), json.dumps(preload)]
            keeper = subprocess.Popen(command, env={**os.environ, **environ}, start_new_session=True,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and keeper.poll() is None:
            record = self.server()
            if record is not None:
                return record
            time.sleep(0.01)
        return None

    def end(self, timeout: float = 30.0) -> bool:
        """End the slot's server if no session holds its lease (this one must not); whether none runs now."""
        record = self.server()
        if record is None:
            return True
        fd = os.open(self.folder / LEASE_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _lock(fd, fcntl.LOCK_EX, 0):
                return False
            _signal_keeper(record["keeper"])
            deadline = time.monotonic() + timeout
            while self.server() is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            return self.server() is None
        finally:
            os.close(fd)


def end_others(root: Path, keep: Path) -> list[int]:
    """End the idle servers this working folder started in other slots (what changed since they started, a
    later session does not ask for again); the pids of their servers."""
    ended = []
    for folder in root.iterdir():
        if folder == keep or not folder.is_dir():
            continue
        slot = Slot(folder)
        record = slot.server()
        if record is not None and record.get("cwd") == os.getcwd() and slot.end():
            ended.append(int(record["pid"]))
    return ended


def _lock(fd: int, kind: int, timeout: float) -> bool:
    """Take ``flock`` ``kind`` on ``fd``, polling up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def running(pid: Any) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it ended and waits to be reaped); where ``/proc``
    cannot tell, whether a signal reaches it."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return exists(pid)


def exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts: only a signal's answer is asked)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _signal_keeper(pid: int) -> None:
    """Ask a keeper to end its server: only a process that runs this module (a reused pid is left alone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if __name__.encode() not in f.read():
                return
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass


# -- what the server imported, and whether it is still what a session would import ----------------------


def fingerprint(read_env: dict[str, str | None]) -> dict[str, Any]:
    """In the server, after its imports: every module file it holds (a project file by its contents, an
    installed or standard one by size and time) and ``read_env``, the variables its imports read with the values
    it was started with."""
    from pytest_resume_check.child.environ import library_folders

    library = library_folders()
    files = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file not in files:
            files[file] = _digest(file, library)
    return {"files": files, "env": read_env}


def stale(found: dict[str, Any]) -> str | None:
    """Why a server whose :func:`fingerprint` is ``found`` must not serve this session (a file it imported
    changed, or a variable its imports read has another value here; not the shell's own, :data:`SHELL`), None
    when it may."""
    from pytest_resume_check.child.environ import library_folders

    library = library_folders()
    for file, digest in (found.get("files") or {}).items():
        if _digest(file, library) != digest:
            return WHY_FILE.format(file=file)
    for name, value in (found.get("env") or {}).items():
        if name not in SHELL and os.environ.get(name) != value:  # the working folder is in the slot's name
            return WHY_ENV.format(name=name)
    return None


def _digest(file: str, library: tuple[str, ...]) -> str:
    try:
        if os.path.realpath(file).startswith(library):
            info = os.stat(file)
            return f"{info.st_size}:{info.st_mtime_ns}"
        return hashlib.sha256(Path(file).read_bytes()).hexdigest()
    except OSError:
        return "missing"


# -- the keeper ---------------------------------------------------------------------------------------


def _keep(folder: Path, idle: float, preload: list[str]) -> None:
    """The keeper: start the server (its work in the environment), publish its address, end it (and all left
    under it) when no session held the lease for ``idle`` seconds, when asked (SIGTERM), or when it died."""
    import multiprocessing
    import multiprocessing.forkserver

    from pytest_resume_check.process.sweep import kill_until_gone

    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    # The server's socket, in a 0700 folder (multiprocessing's, in this one): in the slot when its path is short
    # enough for a socket's address (108 bytes), else in one of the system's temporary folder.
    short = folder if len(str(folder)) <= SHORT_PATH else Path(tempfile.mkdtemp(prefix="rc-", dir=_system_tmp()))
    tempfile.tempdir = str(short)
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    multiprocessing.forkserver.ensure_running()
    from pytest_resume_check.child import cpython

    pid = cpython.forkserver_pid()
    address = cpython.forkserver_address()
    record = {"address": address, "pid": pid, "keeper": os.getpid(), "cwd": os.getcwd(), "started": time.time()}
    temporary = folder / f".{SERVER_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(record))
    os.replace(temporary, folder / SERVER_FILE)
    lease = os.open(folder / LEASE_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    idle_since: float | None = None
    while not stop and pid is not None and running(pid):
        time.sleep(KEEPER_POLL)
        if not _lock(lease, fcntl.LOCK_EX, 0):
            idle_since = None
            continue
        idle_since = idle_since if idle_since is not None else time.monotonic()
        if time.monotonic() - idle_since >= idle:
            break  # the lease stays taken: no session attaches while the server ends
        fcntl.flock(lease, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        (folder / SERVER_FILE).unlink()
    if pid is not None:
        from pytest_resume_check.process.sweep import PROC

        def under() -> list[int]:
            return _children(PROC, pid) + ([pid] if running(pid) else [])

        kill_until_gone(under, timeout=30.0)
    cpython.kill_forkserver()
    cpython.kill_resource_tracker()
    if short != folder:
        shutil.rmtree(short, ignore_errors=True)


def _system_tmp() -> str:
    """The system's temporary folder, not ``$TMPDIR`` (which may be too long to hold a socket)."""
    return "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()


def _children(proc: str, parent: int) -> list[int]:
    """Live processes whose parent is ``parent``."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if int(fields[1]) == parent and fields[0] not in (b"Z", b"X"):
                found.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return found


if __name__ == "__main__":
    _keep(Path(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]))
