"""A torch-free trainer for process tests of state verdicts: one float weight, six steps, a JSON
checkpoint written atomically. Case keys plant what the tests need:

- ``jitter``: the reported state carries noise below 1e-9 that differs in every process (as
  nondeterministic kernels would), while the training itself stays deterministic;
- ``nudge``: a resumed run restores the weight 1e-3 off (a state bug a tolerance must still catch);
- ``object``: a plain object of the trainer's (:class:`Schedule`, no ``state_dict()``) is reported, with
  ``"state"`` as ``state['opt']['sched']``, with ``"final"`` in the final outputs as ``final['best']``;
- ``sparse``: the weight is reported as a sparse torch tensor too (``sparse`` names its layout:
  ``coo``, ``csr``, ``csc``, ``bsr``, ``bsc``), built afresh in every run;
- ``sparse_nudge``: with ``sparse``, a resumed run restores the weight 1e-3 off.
"""

from __future__ import annotations

import json
import os
import random

from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

STEPS = 6


class Schedule:
    """A trainer's own object with state but no ``state_dict()``: its repr is ``object``'s, address included."""

    def __init__(self, step: int):
        self.step = step


def components(run: RunContext, step: int, w: float) -> dict:
    """What the run reports after ``step``: the case's planted components beside the plain ones."""
    out: dict = {"model": {"w": w}, "progress": {"step": step}}
    if run.case.get("object") == "state":
        out["opt"] = {"lr": 0.1, "sched": Schedule(step)}
    if run.case.get("sparse"):
        import torch

        dense = torch.tensor([[w, 0.0], [0.0, float(step)]], dtype=torch.float64)
        layout = run.case["sparse"]
        out["model"]["sparse"] = (dense.to_sparse() if layout == "coo" else
                                  getattr(dense, f"to_sparse_{layout}")((1, 1)) if layout in ("bsr", "bsc") else
                                  getattr(dense, f"to_sparse_{layout}")())
    return out


def train(run: RunContext) -> None:
    start, w, folder = 0, 0.0, None
    if run.resume_mode == RESUME_PATH:
        folder = run.resume_path
    elif run.resume_mode != RESUME_DISABLED and (run.checkpoint_dir / "latest").exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
    if folder is not None:
        saved = json.loads((folder / "state.json").read_text())
        start, w = saved["step"], saved["w"]
        if run.case.get("nudge") or run.case.get("sparse_nudge"):
            w += 1e-3
    run.resumed(start, folder)
    noise = random.Random(os.getpid()).uniform(-1e-9, 1e-9) if run.case.get("jitter") else 0.0
    if folder is not None:  # what the checkpoint restored, compared with the reference's state at that step
        run.state(start, components(run, start, w + noise))
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.9 * w + step
        run.step_end(step)
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))
        run.state(step, components(run, step, w + noise))
    if run.case.get("object") == "final":
        run.final({"best": Schedule(STEPS)})


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
