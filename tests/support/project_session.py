"""A user's project in a temporary folder, declaring the torch-free trainer of ``project_trainer.py``, and a
``pytest`` session run in it in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TRAINER = Path(__file__).resolve().parent / "project_trainer.py"
#: A correct case and one whose resume loses its first input (a planted bug).
CASES = "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]"


def write_project(path: Path, cases: str = CASES, name: str = "files", **options: str) -> Path:
    """A project whose conftest declares one target of the trainer (no pytest.ini); its save is written in
    place, so without crash smoke cells unless ``crash_save`` is given."""
    options.setdefault("crash_save", "False")
    path.mkdir(parents=True, exist_ok=True)
    (path / "project_trainer.py").write_text(TRAINER.read_text())
    extra = "".join(f", {k}={v}" for k, v in options.items())
    (path / "conftest.py").write_text(
        "import project_trainer\nfrom pytest_resume_check import resume_target\n"
        f"t = resume_target(project_trainer.train, name={name!r}, steps=project_trainer.STEPS, cases={cases}, "
        f"preload=('project_trainer',){extra})\n")
    return path


def pytest_in(path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit code, output) of ``pytest ARGS`` run in ``path`` with the project importable."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", *args], cwd=path,
                          env={**os.environ, "PYTHONPATH": str(path), "COLUMNS": "200", **(env or {})},
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr
