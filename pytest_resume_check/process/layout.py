"""Where a session keeps its files: the one place that spells out the folder layout.

::

    <root>/<target>/<case>/reference/          the two uninterrupted runs (out/, out-repeat/, run0.log, run1.log)
    <root>/<target>/<case>/<mode>-prefix/      a shared first run (out/ or out0/, snapshot-<step>/ copies)
    <root>/<target>/<case>/record-save<step>/  the run that recorded a save's file operations
    <root>/<target>/<case>/<mode>-<kill>/      one cell: out/ (auto) or out<i>/ (path mode), run<i>.log

Every file and folder the harness deletes goes through :func:`remove_inside` (:meth:`Layout.fresh`,
:meth:`Layout.remove`, the clean-up of old sessions), which refuses any path it cannot prove lies
strictly inside the root it is given (a target named ``..`` pointed the harness outside).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from pytest_resume_check.records.names import REFERENCE
from pytest_resume_check.records.plan import RESUME_PATH

REPEAT_OUT = "out-repeat"
#: In a reference's folder: its state values per step (targets compared under a tolerance).
STATE_VALUES = "state-values"


#: Why a deletion was refused; a bug in the harness or a hostile name, never something to retry.
ERR_OUTSIDE = "refusing to delete {path}: it is not inside {root}"


def check_inside(path: Path, root: Path) -> Path:
    """``path`` itself, once proven to lie strictly inside ``root``: spelled below it without any
    ``..``, and still below it with every symlink resolved. Raises ValueError otherwise."""
    path, root = Path(path), Path(root)
    below = path.parts[len(root.parts):]
    spelled = path.parts[:len(root.parts)] == root.parts and bool(below) and ".." not in below
    resolved, real_root = path.resolve(), root.resolve()
    if not spelled or real_root not in resolved.parents:
        raise ValueError(ERR_OUTSIDE.format(path=path, root=root))
    return path


def remove_inside(path: Path, root: Path, ignore_errors: bool = False) -> None:
    """Delete the file, symlink or folder ``path`` if it exists; it must lie inside ``root`` (see
    :func:`check_inside`; a refusal is raised even with ``ignore_errors``, which ignores OSError only)."""
    path = check_inside(path, root)
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    except OSError:
        if not ignore_errors:
            raise


#: The longest folder name the harness makes, in bytes (file systems allow 255 bytes, not characters).
MAX_NAME_BYTES = 120


def safe_name(text: str) -> str:
    """A folder name for ``text``: letters, digits and ``-_.=+,`` kept, anything else ``_``; cut to
    :data:`MAX_NAME_BYTES` bytes of UTF-8 at a character boundary (a case id of 100 non-ASCII
    letters was cut to 120 characters, 300 bytes, and every file operation of its cells failed)."""
    name = "".join(c if c.isalnum() or c in "-_.=+," else "_" for c in text)
    raw = name.encode("utf-8")
    if len(raw) <= MAX_NAME_BYTES:
        return name
    # Cut, with a digest of the whole text: two long ids that share their first bytes keep two folders.
    tag = "-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return raw[:MAX_NAME_BYTES - len(tag)].decode("utf-8", "ignore") + tag


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
        remove_inside(path, self.root)
        path.mkdir(parents=True)
        return path

    def remove(self, path: Path) -> None:
        """Delete a folder of this session (a passed cell's files); it must lie inside the root."""
        remove_inside(path, self.root, ignore_errors=True)

    def tidy(self) -> None:
        """End of a session: delete what only served its own runs (shared first runs with their
        snapshots, recorded saves) and the references of cases that kept no failing cell. A failing
        cell's folder holds its own checkpoints and logs and stays, with its case's reference beside it."""
        for case in (c for t in self._folders(self.root) for c in self._folders(t)):
            kept_cells = False
            for folder in self._folders(case):
                if folder.name.endswith("-prefix") or folder.name.startswith("record-save"):
                    self.remove(folder)
                elif folder.name != REFERENCE:
                    kept_cells = True
            if not kept_cells:
                self.remove(case)
        for target in self._folders(self.root):
            if not any(target.iterdir()):
                self.remove(target)

    @staticmethod
    def _folders(path: Path) -> list[Path]:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink()) if path.is_dir() else []
