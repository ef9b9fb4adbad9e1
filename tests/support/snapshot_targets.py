"""Trainers whose checkpoint files are written in place, where a shared first run's snapshot that held a
hard link to the file would silently change. Module-level functions, so a child process imports them by
name; torch-free.

- :func:`in_place_saver`: its one checkpoint file, ``model.bin``, is rewritten in place at every checkpoint
  (opened ``r+b``), and a resume starts from the step that file names: a snapshot still linked to it after
  the run rewrote it would resume later than its kill, and the cell would lose inputs.
- :func:`resume_marker`: a checkpoint a folder of its own each time, beside a ``config.bin`` written once at
  the first checkpoint and never again by a first run; a resume reads it and then rewrites it in place as
  ``resumed``; a run resumed from a folder whose config already says so skips its first input (a bug that
  only a second resume of one folder shows), so a later cell's snapshot still sharing that file with an
  earlier cell's would lose an input.
"""

from __future__ import annotations

import os
from typing import Any

from pytest_resume_check.cells.snapshots import LINK_MIN_BYTES

STEPS = 6
MODEL = "model.bin"
CONFIG = "config.bin"
LATEST = "latest"
#: The size of each file written in place: big enough that a snapshot links it to the live file rather than
#: copying it (a small file is copied, and its in-place rewrite never reaches a snapshot).
SIZE = LINK_MIN_BYTES
#: The two states of :func:`resume_marker`'s config, one size: an in-place rewrite keeps the file's size.
FRESH, RESUMED = b"fresh..." * (SIZE // 8), b"resumed." * (SIZE // 8)


def _write_in_place(path: Any, data: bytes) -> None:
    with open(path, "r+b" if path.exists() else "wb") as out:
        out.write(data)
        out.truncate()


def in_place_saver(run: Any) -> None:
    """Rewrites ``model.bin`` in place at each checkpoint; resumes from the step it names."""
    model = run.checkpoint_dir / MODEL
    start = int(model.read_text()) if run.resume_mode != "disabled" and model.exists() else 0
    run.resumed(start, model if start else None)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step):
            _write_in_place(model, str(step).encode().ljust(SIZE))  # int() reads it back, spaces and all
            run.checkpoint_published(step, model)


def resume_marker(run: Any) -> None:
    """Folders ``s<step>`` and a pointer, written aside and renamed; ``config.bin`` as described above."""
    latest, config = run.checkpoint_dir / LATEST, run.checkpoint_dir / CONFIG
    start = int(latest.read_text()) if run.resume_mode == "auto" and latest.exists() else 0
    skip = False
    if start:
        skip = config.read_bytes() == RESUMED
        _write_in_place(config, RESUMED)
    run.resumed(start, run.checkpoint_dir / f"s{start}" if start else None)
    for step in range(start + 1, STEPS + 1):
        if not (skip and step == start + 1):
            run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step):
            if not config.exists():
                config.write_bytes(FRESH)
            folder = run.checkpoint_dir / f"s{step}"
            folder.mkdir()
            (folder / MODEL).write_text(str(step))
            (run.checkpoint_dir / "latest.tmp").write_text(str(step))
            os.replace(run.checkpoint_dir / "latest.tmp", latest)
            run.checkpoint_published(step, folder)
