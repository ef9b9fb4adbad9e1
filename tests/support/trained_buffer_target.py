"""A torch-free trainer with a training stage one step behind its loader, for tests of the evidence a
failing cell shows on the ``trained`` ledger: each step consumes a batch of two inputs and trains on the
batch the step before consumed (the last step on both); the batch waiting between the two is held in a
buffer. Six steps, one epoch, a JSON checkpoint written atomically.

Its planted bug: the checkpoint keeps the loader's position but not the buffer, so a resume continues the
consumed ledger exactly and never trains the restored step's batch: ``LOST`` on the trained ledger alone.
Case keys: ``keep_buffer`` saves the buffer too (the fix: every cell passes); ``skip`` makes a resumed run
also skip its first batch on the consumed ledger (both ledgers then lose inputs).
"""

from __future__ import annotations

import json
import os

from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

STEPS = 6
BATCH = 2


def batch_of(step: int) -> list[int]:
    """The ids the loader yields at ``step``."""
    return list(range((step - 1) * BATCH, step * BATCH))


def train(run: RunContext) -> None:
    start, buffer, folder = 0, [], None
    if run.resume_mode == RESUME_PATH:
        folder = run.resume_path
    elif run.resume_mode != RESUME_DISABLED and (run.checkpoint_dir / "latest").exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
    if folder is not None:
        saved = json.loads((folder / "state.json").read_text())
        start, buffer = saved["step"], saved.get("buffer", [])
    run.resumed(start, folder)
    for step in range(start + 1, STEPS + 1):
        batch = batch_of(step)
        if not (folder is not None and step == start + 1 and run.case.get("skip")):
            run.consumed(batch, step=step, epoch=0)
        due = buffer + (batch if step == STEPS else [])
        if due:
            run.trained(due, step=step, epoch=0)
        buffer = [] if step == STEPS else batch
        run.step_end(step)
        if run.should_checkpoint(step):
            kept = {"buffer": buffer} if run.case.get("keep_buffer") else {}
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, kept))


def _save(root, step, kept):
    folder = root / f"step_{step}"
    folder.mkdir(exist_ok=True)
    state = json.dumps({"step": step, **kept})
    for path, text in ((folder / "state.json", state), (root / "latest", folder.name)):
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return folder
