"""A torch-free trainer that breaks one rule per case key, for the protocol and failure-report tests:

- ``twice``: a resumed run reports ``resumed`` twice;
- ``late``: a step's inputs are reported after its ``step_end``;
- ``runaway``: a resumed run never stops at the case's last step;
- ``enospc``: resuming fails with "No space left on device" while its log cannot be written either;
- ``hang``: a resumed run blocks forever in :func:`wait_forever_in_my_loop` in its second step;
- ``hang_thread``: the same in a thread of its own, which the main thread joins;
- ``hang_always``: every run, the uninterrupted ones too, blocks forever in its step 2.

:func:`train_ranks` is a two-rank target: with ``hang``, rank 1 of a resumed run blocks forever in its
second step while rank 0 goes on.
"""

from __future__ import annotations

import errno
import os
import threading
import time

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
        if (start and step == start + 2 and run.case.get("hang")) or (step == 2 and run.case.get("hang_always")):
            wait_forever_in_my_loop()
        if start and step == start + 2 and run.case.get("hang_thread"):
            loader = threading.Thread(target=wait_forever_in_my_loop, name="my-loader-thread")
            loader.start()
            loader.join()
        if not (run.case.get("late") and start):
            run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.case.get("late") and start:
            run.consumed([step], step=step, epoch=0)
        if run.should_checkpoint(step):
            latest.write_text(str(step))
            run.checkpoint_published(step, run.checkpoint_dir)


def wait_forever_in_my_loop() -> None:
    """Where a planted hang blocks: nothing ever sets the event."""
    threading.Event().wait()


def train_ranks(run: RunContext) -> None:
    """Each rank takes input ``100 * rank + step`` in each step; rank 0 saves and publishes, once rank 1 has
    read where to resume (no collectives: a file tells rank 0)."""
    latest = run.checkpoint_dir / "latest"
    start = int(latest.read_text()) if run.resume_mode != RESUME_DISABLED and latest.exists() else 0
    read = run.checkpoint_dir / f"rank1-has-read-{os.getppid()}"  # the launcher's pid: one per run
    if run.rank == 1:
        read.touch()
    while run.rank == 0 and not read.exists():
        time.sleep(0.01)
    run.resumed(start, run.checkpoint_dir if start else None)
    for step in range(start + 1, STEPS + 1):
        if start and step == start + 2 and run.rank == 1 and run.case.get("hang"):
            wait_forever_in_my_loop()
        run.consumed([100 * run.rank + step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step) and run.rank == 0:
            latest.write_text(str(step))
            run.checkpoint_published(step, run.checkpoint_dir)
