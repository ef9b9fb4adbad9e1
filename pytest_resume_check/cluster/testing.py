"""A Ray cluster of several nodes on this machine, for tests and benchmarks of ``--resume-matrix-ray``: a
head and more raylets, each ``ray start --block`` in a process group of its own with the resources it is
given, all with node address 127.0.0.1 and a token of the cluster's own. :meth:`LocalCluster.kill_node`
SIGKILLs one node's raylet (a lost node); :meth:`LocalCluster.stop` ends every node's process group and
removes the cluster's folder. No shipped module imports this one.

Ray runs several nodes on one machine only with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`` (with 0 it refuses
a second node); some of its agents then listen on every interface, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_resume_check.process.sweep import group_members

#: How long a node may take to join, and its processes to end once stopped.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
#: The variables every process of the cluster and its drivers get.
BASE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ray_command() -> list[str]:
    """Ray's command line tool: the ``ray`` script beside this interpreter, or its module run by this
    interpreter (an environment that sees Ray installed in another one, through a ``.pth`` file, has no
    script of its own)."""
    script = Path(sys.executable).with_name("ray")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ray.scripts.scripts"]


class LocalCluster:
    """Nodes on this machine: ``nodes[0]`` is the head; each entry maps resource names to amounts (``CPU``
    and ``GPU`` become ``--num-cpus`` and ``--num-gpus``, others ``--resources``); ``env``: more environment
for every node."""

    def __init__(self, nodes: Sequence[Mapping[str, float]], env: Mapping[str, str] | None = None):
        self.nodes = [dict(n) for n in nodes]
        #: More environment for every node (and so for the tasks' workers and what they start).
        self.extra_env = dict(env or {})
        self.folder = Path(tempfile.mkdtemp(prefix="rc-cl-"))  # short: Ray's socket paths live under it
        self.token = self.folder / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        self.address = ""
        self.processes: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        """What a driver (a pytest with ``--resume-matrix-ray``) needs in its environment."""
        return {**BASE_ENV, "RAY_AUTH_TOKEN_PATH": str(self.token)}

    def start(self) -> str:
        """Start every node, wait until all have joined; returns the head's address."""
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        try:
            for index, resources in enumerate(self.nodes):
                self._start_node(index, resources, port)
            self._wait_joined()
        except BaseException:
            self.stop()
            raise
        return self.address

    def add_node(self, resources: Mapping[str, float]) -> int:
        """Start one more node with ``resources`` and wait until it has joined; returns its index."""
        self.nodes.append(dict(resources))
        index = len(self.nodes) - 1
        self._start_node(index, resources, 0)
        self._wait_joined()
        return index

    def _start_node(self, index: int, resources: Mapping[str, float], port: int) -> None:
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        argv = [*ray_command(), "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                f"--num-cpus={resources.get('CPU', 1):g}", f"--num-gpus={resources.get('GPU', 0):g}",
                f"--resources={json.dumps(custom)}"]
        if index == 0:
            argv += ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={self.folder}",
                     *(f"{flag}={free_port()}" for flag in ("--ray-client-server-port", "--dashboard-agent-listen-port",
                                                            "--dashboard-agent-grpc-port", "--metrics-export-port",
                                                            "--runtime-env-agent-port"))]
        else:
            argv += [f"--address={self.address}"]
        env = {**os.environ, **self.extra_env, **self.env()}
        env.pop("RAY_ADDRESS", None)
        with open(self.folder / f"node{index}.log", "wb") as log:
            self.processes.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                   stderr=subprocess.STDOUT, env=env, start_new_session=True))
        if index == 0:
            self._wait_port(port)

    def _wait_port(self, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.processes[0].poll() is not None:
                raise RuntimeError(f"the Ray head exited: {self._log(0)}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the Ray head did not listen within {START_TIMEOUT:g} s: {self._log(0)}")

    def _wait_joined(self) -> None:
        """Until every node's raylet runs and its ``ray start`` says it started."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for index, process in enumerate(self.processes):
                if process.poll() is not None:
                    raise RuntimeError(f"Ray node {index} exited: {self._log(index)}")
            if all(self.raylet(i) is not None and b"--block" in (self.folder / f"node{i}.log").read_bytes()
                   for i in range(len(self.nodes))):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Ray nodes did not all start within {START_TIMEOUT:g} s")

    def _log(self, index: int) -> str:
        return (self.folder / f"node{index}.log").read_text(errors="replace")[-2000:]

    def raylet(self, index: int) -> int | None:
        """The raylet's pid of node ``index`` (None when it is gone)."""
        for pid in group_members(self.processes[index].pid):
            if "raylet/raylet" in command_line(pid):
                return pid
        return None

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index``'s raylet: Ray counts the node lost and its workers end."""
        pid = self.raylet(index)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """End every node's process group (SIGTERM, then SIGKILL), wait until none is left, remove the folder."""
        for process in reversed(self.processes):
            for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, STOP_TIMEOUT)):
                deadline = time.monotonic() + grace
                while group_members(process.pid) and time.monotonic() < deadline:
                    try:
                        os.killpg(process.pid, sig)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
            process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
