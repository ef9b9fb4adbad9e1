"""Where a session keeps its files: the one place that spells out the folder layout.

::

    <root>/<target>/<case>/reference/          the two uninterrupted runs (out/, out-repeat/, run0.log, run1.log)
    <root>/<target>/<case>/<mode>-prefix/      a shared first run (out/ or out0/, snapshot-<step>/ copies)
    <root>/<target>/<case>/record-save<step>/  the run that recorded a save's file operations
    <root>/<target>/<case>/<mode>-<kill>/      one cell: out/ (auto) or out<i>/ (path mode), run<i>.log

    <root>/#trash/                             folders being deleted (a name no target or case folder has)

Every file and folder the harness deletes goes through :func:`remove_inside` (:meth:`Layout.fresh`,
:meth:`Layout.remove`, the clean-up of old sessions), which refuses any path it cannot prove lies
strictly inside the root it is given (a target named ``..`` pointed the harness outside). A passed cell's
folder is deleted off the critical path (:class:`Trash`): renamed into the root's trash folder, which costs
the same whatever it holds, and deleted by a background thread, each path proven inside the root again
when it is deleted; :meth:`Layout.tidy` waits for that at the session's end and leaves no trash behind.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import shutil
import threading
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


#: The folder of a session's root that what is being deleted is moved into; ``#`` is a character
#: :func:`safe_name` never keeps, so no target's or case's folder can be named so.
TRASH = "#trash"


#: Seconds the trash's thread waits for more to delete before it ends.
IDLE = 1.0


class Trash:
    """Deletes folders of one root off the critical path. :meth:`discard` renames a folder into the root's
    :data:`TRASH` folder (the same file system: a rename costs the same whatever the folder holds) and a
    background thread deletes it; the thread lives while there is something to delete and :data:`IDLE`
    seconds more (starting one for every cell cost milliseconds on a loaded machine). Every path is
    proven to lie inside the root when it is moved and again when it is deleted (:func:`remove_inside`).
    :meth:`empty` waits for the deletions and removes the trash folder."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.folder = self.root / TRASH
        self._names = itertools.count()
        self._pending: collections.deque[Path] = collections.deque()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._ending = False  # the thread ends once nothing is pending, without waiting IDLE seconds
        #: Why the background thread refused a deletion (:data:`ERR_OUTSIDE`), raised by :meth:`empty`.
        self.refused: list[str] = []

    def discard(self, path: Path) -> None:
        """Delete ``path`` (a file, symlink or folder inside the root), soon: it is gone from where it was when
        this returns. Where it cannot be renamed (another file system mounted inside the root), it is deleted
        here and now."""
        path = check_inside(path, self.root)
        if not os.path.lexists(path):
            return
        aside = self.folder / f"{os.getpid()}-{id(self):x}-{next(self._names)}"
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            os.rename(path, check_inside(aside, self.root))  # the trash folder may not lead out of the root
        except OSError:
            remove_inside(path, self.root, ignore_errors=True)
            return
        self.delete_later(aside)

    def delete_later(self, path: Path) -> None:
        """Queue ``path`` for the background thread, which proves it lies inside the root before it deletes it."""
        with self._lock:
            self._pending.append(Path(path))
            self._lock.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="resume-check-trash", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._pending and not self._ending:
                    self._lock.wait(IDLE)
                if not self._pending:
                    self._thread = None
                    return
                path = self._pending.popleft()
            try:
                remove_inside(path, self.root, ignore_errors=True)
            except ValueError as refused:  # a path outside the root: never deleted, and said at the end
                self.refused.append(str(refused))

    def empty(self) -> None:
        """Wait until everything discarded so far is deleted and the thread has ended, then delete the trash
        folder; raises ValueError when the background thread refused a path (see :func:`check_inside`)."""
        with self._lock:
            thread, self._ending = self._thread, True
            self._lock.notify()
        if thread is not None:
            thread.join()
        self._ending = False
        remove_inside(self.folder, self.root, ignore_errors=True)
        refused, self.refused = self.refused, []
        if refused:
            raise ValueError(refused[0])


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
        #: Where removed folders go to be deleted in the background.
        self.trash = Trash(self.root)

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
        """Delete ``path`` if it exists (in the background: :class:`Trash`) and create it empty; it must lie
        inside the root."""
        path = Path(path)
        self.trash.discard(path)
        path.mkdir(parents=True)
        return path

    def remove(self, path: Path) -> None:
        """Delete a folder of this session (a passed cell's files) in the background (:class:`Trash`): it is
        gone from its place when this returns; it must lie inside the root."""
        self.trash.discard(path)

    def tidy(self) -> None:
        """End of a session: wait for the deletions under way (:meth:`Trash.empty`), then delete what only
        served its own runs (shared first runs with their snapshots, recorded saves) and the references of
        cases that kept no failing cell. A failing cell's folder holds its own checkpoints and logs and stays,
        with its case's reference beside it."""
        self.trash.empty()
        for case in (c for t in self._folders(self.root) for c in self._folders(t)):
            kept_cells = False
            for folder in self._folders(case):
                if folder.name.endswith("-prefix") or folder.name.startswith("record-save"):
                    remove_inside(folder, self.root, ignore_errors=True)
                elif folder.name != REFERENCE:
                    kept_cells = True
            if not kept_cells:
                remove_inside(case, self.root, ignore_errors=True)
        for target in self._folders(self.root):
            if not any(target.iterdir()):
                remove_inside(target, self.root, ignore_errors=True)

    @staticmethod
    def _folders(path: Path) -> list[Path]:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink()) if path.is_dir() else []
