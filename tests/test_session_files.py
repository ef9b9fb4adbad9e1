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
import textwrap
import time
from pathlib import Path

TRAINER = textwrap.dedent('''
    import os
    import time

    STEPS = 6

    def train(run):
        gate = run.case.get("gate")
        while gate and not os.path.exists(gate):  # held until the test lets it go on
            time.sleep(0.05)
        latest = run.checkpoint_dir / "latest"
        start = 0
        if run.resume_mode == "path":
            start = int((run.resume_path / "step").read_text())
        elif run.resume_mode == "auto" and latest.exists():
            start = int(latest.read_text())
        run.resumed(start, run.checkpoint_dir / f"s{start}" if start else None)
        skip = start + 1 if start and run.case.get("skip") else None  # planted: one input lost
        for step in range(start + 1, STEPS + 1):
            if step != skip:
                run.consumed([step], step=step, epoch=0)
            time.sleep(run.case.get("sleep", 0))
            run.step_end(step)
            if run.should_checkpoint(step):
                folder = run.checkpoint_dir / f"s{step}"
                folder.mkdir(exist_ok=True)
                (folder / "weights.bin").write_bytes(b"w" * 100_000)
                (folder / "step").write_text(str(step))
                latest.write_text(str(step))
                run.checkpoint_published(step, folder)
''')


def project(path: Path, cases: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "files_trainer.py").write_text(TRAINER)
    (path / "conftest.py").write_text(
        "import files_trainer\n"
        "from pytest_resume_check import resume_target\n"
        f"t = resume_target(files_trainer.train, name='files', steps=files_trainer.STEPS, cases={cases},"
        " preload=('files_trainer',))\n")
    (path / "pytest.ini").write_text("[pytest]\nresume_matrix_targets = files\n")
    return path


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
