"""A torch-free trainer for process tests of state verdicts: one float weight, six steps, a JSON
checkpoint written atomically. Case keys plant what the tests need:

- ``jitter``: the reported state carries noise below 1e-9 that differs in every process (as
  nondeterministic kernels would), while the training itself stays deterministic;
- ``nudge``: a resumed run restores the weight 1e-3 off (a state bug a tolerance must still catch).
"""

from __future__ import annotations

import json
import os
import random

from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

STEPS = 6


def train(run: RunContext) -> None:
    start, w, folder = 0, 0.0, None
    if run.resume_mode == RESUME_PATH:
        folder = run.resume_path
    elif run.resume_mode != RESUME_DISABLED and (run.checkpoint_dir / "latest").exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
    if folder is not None:
        saved = json.loads((folder / "state.json").read_text())
        start, w = saved["step"], saved["w"]
        if run.case.get("nudge"):
            w += 1e-3
    run.resumed(start, folder)
    noise = random.Random(os.getpid()).uniform(-1e-9, 1e-9) if run.case.get("jitter") else 0.0
    if folder is not None:  # what the checkpoint restored, compared with the reference's state at that step
        run.state(start, {"model": {"w": w + noise}, "progress": {"step": start}})
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.9 * w + step
        run.step_end(step)
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))
        run.state(step, {"model": {"w": w + noise}, "progress": {"step": step}})


def _save(root, step, w):
    folder = root / f"step_{step}"
    folder.mkdir(exist_ok=True)
    for path, text in ((folder / "state.json", json.dumps({"step": step, "w": w})), (root / "latest", folder.name)):
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return folder
