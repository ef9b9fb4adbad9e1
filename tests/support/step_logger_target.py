"""A torch-free trainer that logs a line per step (``run.log("step N")``): input id ``N`` at step ``N``,
checkpoints as folders ``step_N`` published through a ``latest`` file (auto resume only).

Case key ``replay``: the resumes (1: the first, 2: the second of a double kill) that take the restored
step's input again in their first step (a planted DUPLICATED, one per resume named).
"""

from __future__ import annotations

from pytest_resume_check.run import RESUME_AUTO, RunContext

STEPS = 8


def train(run: RunContext) -> None:
    latest = run.checkpoint_dir / "latest"
    start = int(latest.read_text()) if run.resume_mode == RESUME_AUTO and latest.exists() else 0
    nth = 0
    if start:
        counter = run.checkpoint_dir / "resumes"
        nth = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(nth))
    run.resumed(start, run.checkpoint_dir / f"step_{start}" if start else None)
    for step in range(start + 1, STEPS + 1):
        again = [start] if step == start + 1 and nth in run.case.get("replay", ()) else []
        run.consumed([*again, step], step=step, epoch=0)
        run.log(f"step {step}")
        run.step_end(step)
        if run.should_checkpoint(step):
            folder = run.checkpoint_dir / f"step_{step}"
            folder.mkdir(exist_ok=True)
            latest.write_text(str(step))
            run.checkpoint_published(step, folder)
