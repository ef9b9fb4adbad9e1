"""A local Ray head for the runs of a session, and the checks that a killed driver left nothing behind.

Starting Ray costs seconds, so the ``agentlightning_ray`` target does not start it per run: its service
(:func:`ray_head_service`, a harness service) starts one head per session (per xdist worker) with
``ray start --head --block`` in a session of its own, and every run connects to it as a driver through
``RAY_ADDRESS``. At the session's end (also after Ctrl-C) the service stops the head by signalling its
whole process group (GCS, raylet, agents, workers and actors all belong to it) and waits until none of
them is left, then removes the head's temporary folder, which it created.

Ray's processes are found by process group and read from ``/proc`` (Linux): no Ray API call is made
from the harness's own process. A driver's actors are recognised by their process title,
``ray::<ActorClass>`` (Ray's own ``ray::IDLE`` workers and agents are not actors).

Importing this module imports the standard library only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The variable through which a run finds the head (Ray's own: ``ray.init()`` reads it too).
ENV_ADDRESS = "RAY_ADDRESS"
#: Ray's token authentication, which the head and its drivers use with a token of the session's own (a
#: file in the head's folder), whatever ``~/.ray/auth_token`` holds: with that file present and the mode
#: unset, Ray 2.60 starts a head that wants its token while drivers send none.
ENV_AUTH_MODE, ENV_AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"
TOKEN_FILE = "auth_token"
#: Logical CPUs the head declares: two actors of one placement-group bundle each, and one for the task
#: verl runs in bundle 0 to choose the master port. With fewer, the placement group never becomes ready.
HEAD_CPUS = 4
#: How long the head may take to accept drivers, and how long a stop may take before SIGKILL.
START_TIMEOUT = 120.0
STOP_GRACE = 2.0
#: How long Ray may take to end a dead driver's actors.
ACTOR_EXIT_TIMEOUT = 30.0
TEMP_PREFIX = "rc-ray-"  # kept short: Ray's socket paths under it must fit in 107 bytes (a short TMPDIR too)

#: Ray as on one machine only: with it unset Ray resolves its node address to the machine's outward IP (even
#: with --node-ip-address=127.0.0.1) and its GCS, raylet and agents listen on every interface.
ENV_LOCAL_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: Ends the head when the process that started it is gone (SIGKILLed pytest): reads its stdin, a pipe only
#: that process writes to, until EOF; then SIGTERM and SIGKILL to the head's process group and removes its
#: folder. Runs in a session of its own, so a Ctrl-C at the terminal does not end it early.
WATCHDOG = """
import os, shutil, signal, sys, time
pgid, temp, prefix = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while True:
    try:
        if not os.read(0, 1):
            break
    except InterruptedError:
        continue
def members():
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if int(fields[2]) == pgid and fields[0] != b"Z":
                found.append(name)
        except (OSError, ValueError, IndexError):
            pass
    return found
for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 20.0)):
    deadline = time.monotonic() + grace
    while members() and time.monotonic() < deadline:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        time.sleep(0.1)
if os.path.basename(temp).startswith(prefix) and os.path.isdir(temp) and not os.path.islink(temp):
    shutil.rmtree(temp, ignore_errors=True)
"""

ERR_NO_RAY = ("the Ray head needs the `ray` command, which comes with verl (pip install 'pytest-resume-check[verl]'); "
              "it was not found next to {python}")
ERR_START = "the Ray head did not start within {timeout:.0f} s (exit code {code}); its output ends with:\n{tail}"


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid``, read from ``/proc`` (none where there is no ``/proc``)."""
    members: list[int] = []
    if not os.path.isdir("/proc"):
        return members
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def process_title(pid: int) -> str:
    """The command line of ``pid`` as ``ps`` shows it (Ray sets its workers' titles to ``ray::...``)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class RayHead:
    """One local Ray head, started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, num_cpus: int = HEAD_CPUS) -> None:
        self.num_cpus = num_cpus
        self.process: subprocess.Popen[bytes] | None = None
        self.temp_dir: Path | None = None
        self.address = ""
        #: The watchdog that ends the head if this process dies, and the pipe it watches.
        self.watchdog: subprocess.Popen[bytes] | None = None
        self._watched: int | None = None

    @property
    def pgid(self) -> int | None:
        """The head's process group (its ``ray start`` process leads it), None before start."""
        return self.process.pid if self.process is not None else None

    def start(self) -> str:
        """Start the head and wait until a driver can connect; returns its address (``host:port``)."""
        ray_cli = Path(sys.executable).with_name("ray")
        if not ray_cli.exists():
            raise RuntimeError(ERR_NO_RAY.format(python=sys.executable))
        self.temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))  # under TMPDIR; keep that path short
        port = free_port()
        ports = {flag: free_port() for flag in ("--ray-client-server-port", "--dashboard-port",
                                                "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                                "--metrics-export-port", "--runtime-env-agent-port")}
        argv = [str(ray_cli), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.num_cpus}", "--num-gpus=0", "--include-dashboard=false",
                "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
                *(f"{flag}={value}" for flag, value in ports.items())]
        token = self.temp_dir / TOKEN_FILE
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        log = open(self.temp_dir / "head.log", "wb")  # noqa: SIM115 - the head writes to it until stopped
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.driver_env()}
        env.pop(ENV_ADDRESS, None)
        try:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
        finally:
            log.close()
        self._start_watchdog()
        self.address = f"127.0.0.1:{port}"
        try:
            self._wait_ready(port)
        except BaseException:
            self.stop()
            raise
        return self.address

    def _start_watchdog(self) -> None:
        assert self.process is not None and self.temp_dir is not None
        read, self._watched = os.pipe()  # the write end is not inheritable: only this process holds it
        try:
            self.watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(self.process.pid), str(self.temp_dir),
                                              TEMP_PREFIX], stdin=read, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read)

    def driver_env(self) -> dict[str, str]:
        """What a driver needs in its environment to connect: the address (once started), the token, and
        Ray kept to loopback."""
        assert self.temp_dir is not None
        env = {ENV_AUTH_MODE: "token", ENV_AUTH_TOKEN_PATH: str(self.temp_dir / TOKEN_FILE), **ENV_LOCAL_ONLY}
        if self.address:
            env[ENV_ADDRESS] = self.address
        return env

    def _wait_ready(self, port: int) -> None:
        assert self.process is not None and self.temp_dir is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is None and b"--block" in (self.temp_dir / "head.log").read_bytes():
                # `ray start --block` says so once every process it started is up.
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        return
            if code is not None:
                break
            time.sleep(0.2)
        tail = (self.temp_dir / "head.log").read_bytes()[-2000:].decode(errors="replace")
        raise RuntimeError(ERR_START.format(timeout=START_TIMEOUT, code=self.process.poll(), tail=tail))

    def actor_processes(self) -> list[tuple[int, str]]:
        """(pid, title) of the actors alive in this head: workers titled ``ray::<Class>...`` that are not
        Ray's idle workers or agents."""
        if self.pgid is None:
            return []
        found = []
        for pid in group_members(self.pgid):
            title = process_title(pid)
            if title.startswith("ray::") and not title.startswith(("ray::IDLE", "ray::DashboardAgent",
                                                                    "ray::RuntimeEnvAgent")):
                found.append((pid, title))
        return found

    def wait_no_actors(self, timeout: float = ACTOR_EXIT_TIMEOUT) -> list[tuple[int, str]]:
        """Wait until no actor is alive (Ray ends a dead driver's actors); returns those still alive."""
        deadline = time.monotonic() + timeout
        alive = self.actor_processes()
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = self.actor_processes()
        return alive

    def stop(self) -> None:
        """SIGTERM the head's process group, SIGKILL what is left after :data:`STOP_GRACE`, wait until the
        group is empty, and remove the head's temporary folder."""
        process, self.process = self.process, None
        if process is not None:
            _signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            while group_members(process.pid) and time.monotonic() < deadline:
                if process.poll() is None:
                    try:
                        process.wait(timeout=0.2)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.1)
            deadline = time.monotonic() + STOP_GRACE * 10
            while (left := group_members(process.pid)) and time.monotonic() < deadline:
                _signal_group(process.pid, signal.SIGKILL)
                time.sleep(0.05)
            if process.poll() is None:
                process.wait()
            if left:
                raise RuntimeError(f"Ray head processes {left} survived SIGKILL (stuck in the kernel?)")
        temp, self.temp_dir = self.temp_dir, None
        if temp is not None and temp.name.startswith(TEMP_PREFIX) and temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp, ignore_errors=True)  # ours: made by mkdtemp in start(), nothing else
        watched, self._watched = self._watched, None
        if watched is not None:
            os.close(watched)  # the watchdog finds the head gone, and exits
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            try:
                watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def ray_head_service() -> Iterator[dict[str, str]]:
    """A harness service (``resume_target(..., services=[ray_head_service])``): one Ray head for the
    session's runs, whose address they get as ``RAY_ADDRESS`` (with the head's token). At the end it
    checks that no actor outlived its driver, then stops the head; an actor still alive is an error
    naming it."""
    head = RayHead()
    head.start()
    try:
        yield head.driver_env()
        left = head.wait_no_actors()
        if left:
            raise RuntimeError("Ray actors outlived every driver of the session: "
                               + ", ".join(f"{title} (pid {pid})" for pid, title in left))
    finally:
        head.stop()


ray_head_service.start_timeout = START_TIMEOUT + 30  # type: ignore[attr-defined]  # its own limit is the one said
