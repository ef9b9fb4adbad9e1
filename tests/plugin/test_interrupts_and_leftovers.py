"""Nothing outlives a session: Ctrl-C in the middle of a matrix ends pytest promptly with every child,
the fork server and its resource tracker gone, and processes a target detaches from its run (setsid,
double fork) are found and killed after each run.

Each session runs in its own process group with a canary in its environment; every process it starts
inherits the canary, so a scan of ``/proc`` counts what is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from leftovers import interruptible, settle
from project_trainer import write_project

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

def session(tmp_path: Path, cases: str, *args: str, canary: str, flags: Path | None = None) -> subprocess.Popen:
    write_project(tmp_path, "leftover", cases)
    env = {**os.environ, "LEFTOVER_CANARY": canary, "PYTHONPATH": str(tmp_path)}
    if flags is not None:
        env["TRAINER_FLAG_DIR"] = str(flags)
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                             "--resume-matrix", "-m", "resume_matrix", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_daemons_a_run_detaches_are_killed_with_the_run(tmp_path, isolation):
    canary, report = uuid.uuid4().hex, tmp_path / "verdicts.json"
    proc = session(tmp_path, "[{'id': 'daemon', 'daemon': True}]", f"--resume-matrix-isolation={isolation}",
                   "-k", "ckpt2] or ckpt3]", f"--resume-matrix-json={report}", canary=canary)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "3 passed" in out, out[-3000:]
    assert settle(canary) == []
    stories = [cell["story"] for cell in json.loads(report.read_text())["cells"]]
    # The resumed runs' daemons (the first runs are shared, their daemons are swept with the shared run).
    detached = re.compile(r"run 2 \(resume from s\d\): ran to the end \(\d+ process(es)? it detached killed after "
                          r"it\)$")
    assert all(detached.search(story) for story in stories), stories
    assert "resource_tracker" not in out  # spawn runs: no "process died unexpectedly ... might leak" warning


def test_ctrl_c_mid_matrix_ends_pytest_and_leaves_no_process(tmp_path):
    canary, flags = uuid.uuid4().hex, tmp_path / "flags"
    flags.mkdir()
    # Slow steps and 30 MB checkpoints: the interrupt lands while a run trains or while the harness
    # copies a paused run's checkpoint directory.
    proc = session(tmp_path, "[{'id': 'slow', 'sleep': 0.3, 'bytes': 30_000_000}]", canary=canary, flags=flags)
    deadline = time.monotonic() + 300
    while len(list(flags.iterdir())) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # wait until the matrix is under way: the references ran, cells run
    assert proc.poll() is None, "the session ended before it could be interrupted"
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, _ = proc.communicate(timeout=120)  # a guard against a hang, not a speed claim
    took = time.monotonic() - sent
    print(f"pytest exited {took:.1f} s after Ctrl-C")
    assert proc.returncode == 2, out[-3000:]  # pytest's "interrupted"
    assert "KeyboardInterrupt" in out
    assert settle(canary) == []
