"""One group of cells on a cluster node: the body of the Ray task the pytest side submits per group
(target, case, resume mode), and the entry point of the pytest session it starts there.

:func:`run_group` is a generator task: it first yields which node it runs on, then starts the group's
own pytest (``python -m pytest_resume_check.cluster.node LINE OUTPUT EXIT ARGS...``: the cells named,
the seed and the options of the session that submitted it, a folder of its own under the node's
temporary directory), and yields each cell's record (:mod:`.wire`) as that pytest writes it, a failing cell's kept
folders packed with it (up to the copy limit; beyond it their paths are named and the folders stay on
the node). Last it yields how that pytest ended.

Nothing is left behind: the group's pytest runs detached from the task's worker (Ray SIGKILLs a
worker's children with it) and interrupts itself once, as at a Ctrl-C, ending its runs and fork server,
when a pipe whose only write end the task holds closes: when the task stops it (its pytest ended, the
session's :class:`Control` actor says stop, the task's worker is told to exit) or when the worker dies.
The task then waits for it to end, kills whatever still carries the group's token, and removes the
group's folder unless evidence too big to copy stayed in it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_resume_check.cluster import wire
from pytest_resume_check.cluster.evidence import folder_bytes, pack
from pytest_resume_check.process import sweep
from pytest_resume_check.process.layout import remove_inside

#: Every group's folder on a node lies in this folder of the node's temporary directory.
BASE_FOLDER = "pytest-resume-check-ray-{uid}"
#: How often the task reads the group's records; how long an interrupted group's pytest may take to end
#: its runs and fork server before what is left of it is killed.
POLL_SECONDS = 0.1
STOP_GRACE = 60.0
#: How often the task reads the session's stop flag, and how long that read may take.
CONTROL_EVERY = 0.5
CONTROL_TIMEOUT = 30.0
#: Lines of the group's pytest output a record of how it ended carries.
TAIL_LINES = 15

ERR_NO_FOLDER = ("node {host} has no folder {cwd}: every node runs the project from the path pytest was started in "
                 "on the submitting machine; check the project out there (and install it as there)")
ERR_BASE = ("{path} is not a folder of this user's own (a symlink, or another user's): remove it, or point TMPDIR "
            "elsewhere on this node")


def node_info() -> dict[str, str]:
    """Which node this task runs on (Ray's node id and address, the host name)."""
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname()}


class Control:
    """The submitting session's stop flag: one Ray actor per session, which every task of it reads while
    it runs (Ray's own cancel does not reach a running generator task)."""

    def __init__(self) -> None:
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped


def run_group(spec: dict[str, Any], control: Any) -> Iterator[dict[str, Any]]:
    """The Ray task of one group: ``spec`` holds ``session`` (the submitting session's token), ``cwd``,
    ``args`` (the group pytest's arguments), ``copy_limit`` (bytes of kept folders a failing cell may
    send back), ``env`` (variables the group's pytest gets, and so its runs: None unsets one) and
    ``env_key`` (what keys the digests of the variables its runs read); ``control`` is the session's
    :class:`Control` actor. It ends when its pytest has ended, or when the session stops it."""
    info = node_info()
    yield {"node": info}
    if not os.path.isdir(spec["cwd"]):
        yield {"ended": None, "tail": [ERR_NO_FOLDER.format(host=info["host"], cwd=spec["cwd"])]}
        return
    group = Group(spec, lambda: _stopped(control))
    try:
        yield from group.run()
    finally:  # also when the task's worker is told to exit
        group.stop()


def _stopped(control: Any) -> bool:
    """Whether the session said stop, or its actor is gone (and so is the session); a slow answer on a
    loaded cluster is asked again later, never taken for a stop."""
    import ray

    try:
        return bool(ray.get(control.stopped.remote(), timeout=CONTROL_TIMEOUT))
    except ray.exceptions.GetTimeoutError:
        return False
    except Exception:
        return True


class Group:
    """The group's pytest on this node, its folder and what it reports.

    The pytest runs detached (a session of its own, not a child of the task's worker, which Ray would
    SIGKILL with the worker) and holds the read end of a pipe whose only write end is the task's: when
    the task stops it, or its worker dies, the pipe closes and the pytest interrupts itself once, as a
    Ctrl-C would, ending its runs and fork server.
    """

    def __init__(self, spec: dict[str, Any], stopped: Any = lambda: False):
        self.spec = spec
        self.stopped = stopped
        self.base = own_folder(Path(tempfile.gettempdir(), BASE_FOLDER.format(uid=os.getuid())))
        self.folder = Path(tempfile.mkdtemp(prefix=f"{spec['session'][:12]}-", dir=self.base))
        self.stream = self.folder / "cells.jsonl"
        self.output = self.folder / "pytest.log"
        self.exit_file = self.folder / "exit"
        self.token = uuid.uuid4().hex
        self.pid: int | None = None
        self._line: int | None = None  # the write end of the pipe the pytest watches
        #: Evidence too big to copy stayed in the folder: it is not removed.
        self.keep = False

    def run(self) -> Iterator[dict[str, Any]]:
        self._start()
        offset, checked = 0, time.monotonic()
        while True:
            ended = not self.alive()
            records, offset = wire.read_new(str(self.stream), offset)
            for record in records:
                yield self._with_evidence(record)
            if ended and not records:
                break
            if time.monotonic() - checked > CONTROL_EVERY:
                checked = time.monotonic()
                if self.stopped():
                    return
            if not records:
                time.sleep(POLL_SECONDS)
        code = self.exit_file.read_text().strip() if self.exit_file.exists() else None
        yield {"ended": int(code) if code else None, "tail": self._tail()}

    def _start(self) -> None:
        env = group_environment(self.spec, os.environ, {wire.STREAM_ENV: str(self.stream), wire.GROUP_ENV: self.token})
        read, self._line = os.pipe()
        argv = [sys.executable, "-m", __name__, str(read), str(self.output), str(self.exit_file),
                *self.spec["args"], f"--basetemp={self.folder / 'tmp'}"]
        try:
            launcher = subprocess.run(argv, cwd=self.spec["cwd"], env=env, stdin=subprocess.DEVNULL,
                                      capture_output=True, pass_fds=(read,), timeout=STOP_GRACE)
        finally:
            os.close(read)
        self.pid = int(launcher.stdout.decode().strip() or 0) or None
        if self.pid is None:
            raise RuntimeError(f"the group's pytest did not start: {launcher.stderr.decode(errors='replace')[-500:]}")

    def alive(self) -> bool:
        """Whether the group's pytest still runs (it is no child of ours: read from ``/proc``)."""
        if self.pid is None:
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2:].split()[0] != "Z" and self.token in _environ(self.pid)

    def _tail(self) -> list[str]:
        try:
            text = self.output.read_text(errors="replace")
        except OSError:
            return []
        return [ln.rstrip() for ln in text.splitlines() if ln.strip()][-TAIL_LINES:]

    def _with_evidence(self, record: dict[str, Any]) -> dict[str, Any]:
        """A failing cell's record with its kept folders packed (``evidence``, and the entries left out named
        in ``evidence_refused``: :mod:`.evidence`), or, when they are more than the copy limit or could not be
        packed (``why``), their size and paths (``evidence_left``), which then stay on the node."""
        kept = [Path(p) for p in record.get("kept") or () if p and os.path.isdir(p)]
        if record.get("outcome") != wire.FAILED or not kept:
            return record
        root = Path(record["root"])
        size = folder_bytes(kept)
        if size > int(self.spec["copy_limit"]):
            self.keep = True
            record["evidence_left"] = {"bytes": size, "paths": [str(p) for p in kept], "group": str(self.folder)}
            return record
        try:
            packed = pack(kept, root, int(self.spec["copy_limit"]))
        except Exception as exc:  # a fault of the harness here: the folders stay, and the report says where
            self.keep = True
            record["evidence_left"] = {"bytes": size, "paths": [str(p) for p in kept], "group": str(self.folder),
                                       "why": f"{type(exc).__name__}: {exc}"}
            return record
        record["evidence"] = packed.data
        record["evidence_refused"] = [r.to_json() for r in packed.refused]
        return record

    def stop(self) -> None:
        """Close the pipe (the pytest interrupts itself), wait for it to end, kill anything still carrying
        the group's token; remove the group's folder unless evidence stayed in it."""
        if self._line is not None:
            os.close(self._line)
            self._line = None
        deadline = time.monotonic() + STOP_GRACE
        while self.alive() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        sweep.kill_until_gone(lambda: sweep.escaped(self.token, variable=wire.GROUP_ENV))
        if not self.keep:
            remove_inside(self.folder, self.base, ignore_errors=True)


#: Variables of the task's worker a group's pytest must not see: a step summary to append to, a pytest-xdist
#: worker's identity, options meant for another pytest.
DROPPED_ENV = ("GITHUB_STEP_SUMMARY", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")


def group_environment(spec: Mapping[str, Any], base: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """The environment of a group's pytest (and so of its runs): the node's (``base``) without
    :data:`DROPPED_ENV`, the group's ``own`` variables and the digests' key, then the variables the
    submitting session declared, as it has them (``spec["env"]``; None: unset, as it is there)."""
    env = {k: v for k, v in base.items() if k not in DROPPED_ENV}
    env.update(own)
    env[wire.ENV_KEY_ENV] = str(spec.get("env_key") or "")
    for name, value in (spec.get("env") or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def own_folder(path: Path) -> Path:
    """``path``, made if missing; it must be a real folder of this user's, private (the node's temporary
    directory is shared: another user could have put a symlink there)."""
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
        raise RuntimeError(ERR_BASE.format(path=path))
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


#: Set in the group's pytest once its pipe closed: nobody reads its records or folder any more.
_ORPHANED = threading.Event()


def _interrupt_when_closed(fd: int) -> None:
    """Block until the pipe's write end (the task's) is closed, then interrupt this process once."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    _ORPHANED.set()
    os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str]) -> int:
    """``LINE OUTPUT EXIT ARGS...``: start the group's pytest detached (a session of its own, its output to
    ``OUTPUT``, its exit code written to ``EXIT``) and print its pid; it interrupts itself when the pipe
    ``LINE`` closes."""
    line, output, exit_file, args = int(argv[0]), argv[1], argv[2], argv[3:]
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        return 0
    os.setsid()
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.set_inheritable(line, False)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a Ray worker may have ignored it
    threading.Thread(target=_interrupt_when_closed, args=(line,), daemon=True, name="resume-check-line").start()
    import pytest

    code = int(pytest.main(args))
    folder = Path(exit_file).parent
    if _ORPHANED.is_set():  # the task is gone (its worker died) or stopped it: its folder goes with it
        remove_inside(folder, folder.parent, ignore_errors=True)
    else:
        Path(exit_file).write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
