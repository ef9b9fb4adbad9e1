"""A torch-free trainer that checkpoints the way async checkpointing does: the training thread hands
the state to a background saver thread and goes on; the saver writes the checkpoint atomically and
reports ``checkpoint_published`` from its own thread, while the training thread already reports the
next steps. Every step also logs from a third thread, so three threads share the run's event channel.
"""

from __future__ import annotations

import json
import os
import queue
import threading

from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

STEPS = 8
PER_STEP = 10


def train(run: RunContext) -> None:
    start, total, folder = 0, 0, None
    if run.resume_mode == RESUME_PATH:
        folder = run.resume_path
    elif run.resume_mode != RESUME_DISABLED and (run.checkpoint_dir / "latest").exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
    if folder is not None:
        saved = json.loads((folder / "state.json").read_text())
        start, total = saved["step"], saved["total"]
    run.resumed(start, folder)
    jobs: queue.Queue = queue.Queue()
    saver = threading.Thread(target=_saver, args=(run, jobs), daemon=True)
    saver.start()
    chatter = threading.Thread(target=_chatter, args=(run,), daemon=True)
    chatter.start()
    for step in range(start + 1, STEPS + 1):
        for i in range((step - 1) * PER_STEP, step * PER_STEP):
            run.consumed([i], step=step, epoch=0)  # one call per input: many small reports
            total += i
        run.step_end(step)
        # Its own schedule checkpoints every step (and so every step the harness asks for); the saver
        # publishes while this thread trains on.
        run.should_checkpoint(step)
        jobs.put((step, total))
    jobs.put(None)
    saver.join()


def _saver(run: RunContext, jobs: queue.Queue) -> None:
    while (job := jobs.get()) is not None:
        step, total = job
        folder = run.checkpoint_dir / f"step_{step}"
        folder.mkdir(exist_ok=True)
        _write(folder / "state.json", json.dumps({"step": step, "total": total}))
        _write(run.checkpoint_dir / "latest", folder.name)
        run.checkpoint_published(step, folder)


def _chatter(run: RunContext) -> None:
    for i in range(1000):  # batches of these exceed a pipe message's single write
        run.log(f"background line {i} " + "x" * 300)


def _write(path, text):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
