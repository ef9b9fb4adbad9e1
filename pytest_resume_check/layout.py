"""Where a session keeps its files: the one place that spells out the folder layout.

::

    <root>/<target>/<case>/reference/          the two uninterrupted runs (out/, out-repeat/, run0.log, run1.log)
    <root>/<target>/<case>/<mode>-prefix/      a shared first run (out/ or out0/, snapshot-<step>/ copies)
    <root>/<target>/<case>/record-save<step>/  the run that recorded a save's file operations
    <root>/<target>/<case>/<mode>-<kill>/      one cell: out/ (auto) or out<i>/ (path mode), run<i>.log

Every folder the harness deletes goes through :meth:`Layout.fresh`, which refuses any path that does
not lie strictly inside the root.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pytest_resume_check.plan import RESUME_PATH

REFERENCE = "reference"
REPEAT_OUT = "out-repeat"
#: In a reference's folder: its state values per step (targets compared under a tolerance).
STATE_VALUES = "state-values"


def safe_name(text: str) -> str:
    """A folder name for ``text``: letters, digits and ``-_.=+,`` kept, anything else ``_``."""
    return "".join(c if c.isalnum() or c in "-_.=+," else "_" for c in text)[:120]


class Layout:
    """The folders of one session under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _case(self, target: str, case_id: str) -> Path:
        return self.root / safe_name(target) / safe_name(case_id)

    def reference(self, target: str, case_id: str) -> Path:
        return self._case(target, case_id) / REFERENCE

    def prefix(self, target: str, case_id: str, resume_mode: str) -> Path:
        return self._case(target, case_id) / safe_name(f"{resume_mode}-prefix")

    def record_save(self, target: str, case_id: str, step: int) -> Path:
        return self._case(target, case_id) / f"record-save{step}"

    def cell(self, target: str, case_id: str, resume_mode: str, kill_id: str) -> Path:
        return self._case(target, case_id) / safe_name(f"{resume_mode}-{kill_id}")

    @staticmethod
    def out(workdir: Path, resume_mode: str, index: int = 0) -> Path:
        """The checkpoint directory of run ``index``: one shared ``out`` (auto resume finds the newest
        checkpoint in it), or one per run in path mode (each resume names a folder of another run)."""
        return workdir / (f"out{index}" if resume_mode == RESUME_PATH else "out")

    @staticmethod
    def log(workdir: Path, index: int) -> Path:
        return workdir / f"run{index}.log"

    @staticmethod
    def snapshot(prefix: Path, step: int) -> Path:
        return prefix / f"snapshot-{step}"

    def fresh(self, path: Path) -> Path:
        """Delete ``path`` if it exists and create it empty; it must lie inside the root."""
        path = Path(path)
        root = self.root.resolve()
        resolved = path.resolve()
        if resolved == root or root not in resolved.parents:
            raise ValueError(f"refusing to delete {path}: it is not inside the session root {root}")
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path
