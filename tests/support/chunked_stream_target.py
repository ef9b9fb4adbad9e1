"""A stdlib trainer over a streaming dataset that prefetches: the early stop must not end a resumed run that
still has a replay pending.

12 inputs in batches of 2, two epochs of 6 steps. The loop keeps a queue of the next ``PREFETCH`` batches
ahead of the step that trains, and each checkpoint holds that queue and the stream's position. Its state
report is what an optimizer and a schedule that depend only on the step would give (``lr``, ``epoch``): it
says nothing of where the stream is.

Planted bug ``rounded``: the checkpoint rounds the stream's position down to a chunk of ``CHUNK`` batches
(as a dataset that resumes at its last shard boundary does), while it keeps the queue. A resume in the
middle of a chunk therefore reads again the batches between the chunk's start and the queue's end, after
the queued ones: each is trained twice, and the epoch takes more steps than the uninterrupted run's. With
the queue, the first replayed batch is trained ``PREFETCH`` steps after the resume, so a resume close to an
epoch's end reaches the end with the same inputs and the same state as the uninterrupted run, the replay
still pending.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import Any

N, BATCH, EPOCHS, CHUNK, PREFETCH = 12, 2, 2, 4, 3
PER_EPOCH = N // BATCH
STATE_FILE = "state.json"


def total_steps(case: Any = None) -> int:
    return PER_EPOCH * EPOCHS


def epoch_boundaries(case: Any = None) -> list[int]:
    return [PER_EPOCH * e for e in range(1, EPOCHS + 1)]


def _save(root: Path, step: int, state: dict[str, Any]) -> Path:
    folder = root / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)
    return folder


def _latest(run: Any) -> Path | None:
    if run.resume_mode == "disabled":
        return None
    if run.resume_mode == "path":
        return run.resume_path
    done = [p for p in run.checkpoint_dir.glob("step_*") if (p / STATE_FILE).is_file()]
    return max(done, key=lambda p: int(p.name.removeprefix("step_")), default=None)


def _train(run: Any, rounded: bool) -> None:
    step, epoch, position = 0, 0, 0  # position: batches of the epoch read from the stream
    queue: deque[list[int]] = deque()  # batches read ahead, not yet trained
    folder = _latest(run)
    if folder is not None:
        saved = json.loads((folder / STATE_FILE).read_text())
        step, epoch, position, queue = saved["step"], saved["epoch"], saved["position"], deque(saved["queue"])
    run.resumed(step, folder)

    def components() -> dict[str, Any]:
        return {"lr": 0.1 * 0.5 ** (step // 4), "epoch": epoch}

    if folder is not None:
        run.state(step, components())
    while epoch < EPOCHS:
        while len(queue) < PREFETCH and position < PER_EPOCH:
            queue.append(list(range(position * BATCH, (position + 1) * BATCH)))
            position += 1
        if not queue:
            epoch, position = epoch + 1, 0
            continue
        batch = queue.popleft()
        step += 1
        run.consumed(batch, step=step, epoch=epoch)
        run.step_end(step)
        if run.should_checkpoint(step):
            kept = position - position % CHUNK if rounded else position
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, {
                "step": step, "epoch": epoch, "position": kept, "queue": list(queue)}))
        run.state(step, components())


def correct(run: Any) -> None:
    _train(run, rounded=False)


def rounded(run: Any) -> None:
    _train(run, rounded=True)
