"""A torch-free trainer that breaks one rule per case key, for the protocol and failure-report tests:

- ``twice``: a resumed run reports ``resumed`` twice;
- ``late``: a step's inputs are reported after its ``step_end``;
- ``runaway``: a resumed run never stops at the case's last step;
- ``enospc``: resuming fails with "No space left on device" while its log cannot be written either.
"""

from __future__ import annotations

import errno
import os

from pytest_resume_check.run import RESUME_DISABLED, RunContext

STEPS = 5


def train(run: RunContext) -> None:
    latest = run.checkpoint_dir / "latest"
    start = 0
    if run.resume_mode != RESUME_DISABLED and latest.exists():
        start = int(latest.read_text())
    if start and run.case.get("enospc"):
        os.close(1)  # the log is gone too: the error must still reach the harness
        os.close(2)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run.checkpoint_dir / "state.tmp"))
    run.resumed(start, run.checkpoint_dir if start else None)
    if start and run.case.get("twice"):
        run.resumed(start - 1)
    step = start
    while True:
        step += 1
        if step > STEPS and not (start and run.case.get("runaway")):
            break
        if not (run.case.get("late") and start):
            run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.case.get("late") and start:
            run.consumed([step], step=step, epoch=0)
        if run.should_checkpoint(step):
            latest.write_text(str(step))
            run.checkpoint_published(step, run.checkpoint_dir)
