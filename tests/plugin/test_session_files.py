"""Where a session keeps its files and for how long: in pytest's base temporary directory (so
``--basetemp`` and pytest's retention settings decide), nothing after an all-green session, a failing
cell's folder with what reproduces it, and never another live session's folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from project_trainer import write_project


def project(path: Path, cases: str) -> Path:
    return write_project(path, "files", cases)


def pytest_run(path: Path, *args: str, env: dict[str, str] | None = None, wait: bool = True):
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "--resume-matrix",
               "-m", "resume_matrix", *args]
    full_env = {**os.environ, "PYTHONPATH": str(path), **(env or {})}
    proc = subprocess.Popen(command, cwd=path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def test_an_all_green_session_keeps_no_file_in_the_basetemp_it_was_given(tmp_path):
    base = tmp_path / "bt"
    code, out = pytest_run(project(tmp_path / "p", "[{'id': 'ok'}]"), f"--basetemp={base}")
    assert code == 0, out[-3000:]
    assert (base / "resume-matrix0").is_dir()  # the session's folder lives where --basetemp says
    assert files_under(base / "resume-matrix0") == []


def test_a_failing_cell_keeps_its_folder_and_its_cases_reference_and_nothing_else(tmp_path):
    base = tmp_path / "bt"
    code, out = pytest_run(project(tmp_path / "p", "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]"),
                           f"--basetemp={base}", "-k", "ckpt2]")
    assert code == 1, out[-3000:]
    root = base / "resume-matrix0" / "files"
    assert sorted(p.name for p in root.iterdir()) == ["bug"]  # the passing case left nothing
    failed = sorted(re.findall(r"^FAILED resume-matrix::files\[bug-(\w+-ckpt2)\]", out, re.M))
    assert "auto-ckpt2" in failed
    assert sorted(p.name for p in (root / "bug").iterdir()) == [*failed, "reference"]
    assert f"kept: {root / 'bug' / 'auto-ckpt2'}" in out
    assert {p.name for p in files_under(root / "bug" / "auto-ckpt2")} >= {"run0.log", "run1.log", "weights.bin"}


def test_short_sessions_never_delete_the_folder_of_a_live_one(tmp_path):
    # One $TMPDIR, so every session's basetemp is pytest-of-<user>/pytest-<N> in it. Short: the fork
    # server's socket lives there too, and a Unix socket path has at most 107 bytes.
    shared = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    try:
        _short_sessions_beside_a_long_one(tmp_path, shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _short_sessions_beside_a_long_one(tmp_path: Path, shared: Path) -> None:
    env = {"TMPDIR": str(shared)}
    gate = tmp_path / "go"
    slow = pytest_run(project(tmp_path / "slow", f"[{{'id': 'held', 'gate': {str(gate)!r}}}]"), "-k", "ckpt2]",
                      "--resume-matrix-hang-timeout=600", env=env, wait=False)
    deadline = time.monotonic() + 300
    while not list(shared.glob("pytest-of-*/pytest-*/resume-matrix0/files")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the long session's reference run has started and waits at the gate
    assert slow.poll() is None, "the long session ended before the short ones ran"
    quick = project(tmp_path / "quick", "[{'id': 'ok'}]")
    for _ in range(4):  # more sessions than pytest keeps: each would remove the oldest if it could
        code, out = pytest_run(quick, "-k", "ckpt1]", "-o", "tmp_path_retention_count=1", env=env)
        assert code == 0, out[-3000:]
    gate.touch()
    out, _ = slow.communicate(timeout=600)
    assert slow.returncode == 0, out[-3000:]
