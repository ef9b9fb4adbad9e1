"""A plain PyTorch training loop over ``StatefulDataLoader``, written to resume exactly.

Each step takes ``take`` inputs from a buffer that is refilled from a loader yielding batches of
``batch``; when ``take`` does not match ``batch`` the buffer holds the unused tail of a loader batch
between steps. A checkpoint (``torch.save`` of model, optimizer with momentum, LR scheduler, global RNG,
loader state, buffer, epoch and step, published atomically through a ``latest`` file) restores all of
it. After every step the loop reports its state by component (``run.state``).

The ``bug`` argument plants one known resume bug; the harness's own tests use these variants to
prove each bug is caught with the right verdict. Case keys: ``n`` inputs, ``batch``, ``take``,
``epochs``, ``shuffle``, ``workers``.

torch and torchdata are imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_resume_check.ids import WithIds, ids_of
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, RunContext

LATEST = "latest"
STATE_FILE = "state.pt"
FEATURES = 4

#: Planted bugs.
DROP_BUFFER = "drop_buffer"  # the checkpoint forgets the buffered tail -> LOST
BUFFER_AND_REREAD = "buffer_and_reread"  # the tail is saved and read again from the loader -> DUPLICATED
RESTART_AT_EPOCH_BOUNDARY = "restart_at_epoch_boundary"  # verl's data.pt heuristic -> DUPLICATED/LOST
FRESH_SHUFFLE = "fresh_shuffle"  # loader state not saved, new permutation -> LOST and DUPLICATED
EPOCH_RESET = "epoch_reset"  # epoch counter not restored -> EPOCH
RAISE_ON_RESUME = "raise_on_resume"  # -> RESUME_ERROR
SHARED_GENERATOR = "shared_generator"  # shuffle=True with one torch.Generator -> REORDERED next epoch
NON_ATOMIC_SAVE = "non_atomic_save"  # state.pt and latest written in place, no fsync -> RESUME_ERROR on crashes
SWALLOW_SAVE_ERRORS = "swallow_save_errors"  # an OSError while saving is ignored -> SILENT_IO_ERROR
OLDEST_CHECKPOINT = "oldest_checkpoint"  # auto resume takes the oldest step folder -> STALE_RESUME
NO_OPTIMIZER = "no_optimizer"  # the optimizer's momentum is not restored -> STATE_DIVERGED
#: loader.state_dict() taken when the checkpoint is written: right after a resume, before the next batch,
#: torchdata 0.11 reads it as the start of the epoch (docs/findings.md) -> DUPLICATED on a second resume
LOADER_STATE_AT_SAVE = "loader_state_at_save"
CRASH = "crash"  # exits by itself at step 2 -> CRASHED
HANG = "hang"  # stops sending events at step 2 -> HUNG

DEFAULT_CASE = {"n": 12, "batch": 4, "take": 4, "epochs": 2, "shuffle": False, "workers": 0}


#: What a target of these loops preloads in the fork server (copy it for a loop of your own): torch, the
#: loader, and the warm-up that pays torch's first-step costs once.
PRELOAD = ("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.loop:warm_up")


def params(case: Mapping[str, Any]) -> dict[str, Any]:
    """The case with defaults filled in."""
    return {**DEFAULT_CASE, **{k: v for k, v in case.items() if k != "id"}}


def total_steps(case: Mapping[str, Any]) -> int:
    """Steps of an uninterrupted run: every input of every epoch, ``take`` per step."""
    p = params(case)
    return math.ceil(p["n"] * p["epochs"] / p["take"])


def epoch_boundaries(case: Mapping[str, Any]) -> list[int]:
    """Steps during which an epoch's last input is taken."""
    p = params(case)
    return [math.ceil(e * p["n"] / p["take"]) for e in range(1, p["epochs"] + 1)]


def buffered_steps(case: Mapping[str, Any]) -> list[int]:
    """Steps after which inputs of a loader batch wait in the buffer (take does not align with batch)."""
    p = params(case)
    return [s for s in range(1, total_steps(case)) if (s * p["take"]) % p["batch"]]


class Features:
    """Map-style dataset of fixed random feature rows (module level so loader workers can use it)."""

    def __init__(self, n: int):
        import torch

        self.rows = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Any:
        return self.rows[index]


def find_checkpoint(run: RunContext, bug: str | None = None) -> Path | None:
    """The checkpoint folder to resume from under the run's resume mode, or None to start fresh."""
    if run.resume_mode == RESUME_DISABLED:
        return None
    if run.resume_mode == RESUME_PATH:
        if run.resume_path is None or not (run.resume_path / STATE_FILE).exists():
            raise FileNotFoundError(f"resume path {run.resume_path} holds no {STATE_FILE}")
        return run.resume_path
    assert run.resume_mode == RESUME_AUTO
    latest = run.checkpoint_dir / LATEST
    if not latest.exists():
        return None
    if bug == OLDEST_CHECKPOINT:
        folders = sorted(run.checkpoint_dir.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        return folders[0]
    return run.checkpoint_dir / latest.read_text().strip()


def train(run: RunContext, bug: str | None = None) -> None:
    """The loop. Correct when ``bug`` is None.

    One function on purpose (longer than the house limit): it reads as the plain training loop a user
    would write, and each planted bug is one ``if bug == ...`` beside the correct line it replaces.
    """
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    p = params(run.case)
    torch.manual_seed(run.seed)
    dataset = WithIds(Features(p["n"]))

    hidden: list[Any] = []  # generators whose state decides the future

    def make_loader(seed: int) -> tuple[Any, Any]:
        if bug == SHARED_GENERATOR and p["shuffle"]:
            generator = torch.Generator()
            generator.manual_seed(seed)
            hidden.append(generator)  # the next epoch's permutation depends on it: part of the state
            return None, StatefulDataLoader(dataset, batch_size=p["batch"], shuffle=True, generator=generator,
                                            num_workers=int(p["workers"]))
        # One permutation per epoch, a pure function of (seed, epoch): nothing hidden in a shared
        # generator that the loader state would have to carry (see SHARED_GENERATOR).
        sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=bool(p["shuffle"]),
                                             seed=seed)
        return sampler, StatefulDataLoader(dataset, batch_size=p["batch"], sampler=sampler,
                                           num_workers=int(p["workers"]))

    def start_epoch(sampler: Any, loader: Any, epoch: int) -> Any:
        if sampler is not None:
            sampler.set_epoch(epoch)
        return iter(loader)

    sampler, loader = make_loader(run.seed)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.8)
    step, epoch, batches_in_epoch = 0, 0, 0
    buffer: list[tuple[Any, Any, int]] = []  # (id, features, epoch) not yet trained on
    # The loader's position as of the last batch taken. Not loader.state_dict() at save time: with
    # StatefulDistributedSampler (torchdata 0.11) a state_dict() taken after load_state_dict() and
    # before the next batch reports the start of the epoch, so a second resume replays it.
    position: dict[str, Any] = loader.state_dict()
    state_before_last_batch = position
    loader_iter = None

    folder = find_checkpoint(run, bug)
    if folder is not None:
        if bug == RAISE_ON_RESUME:
            raise RuntimeError("planted bug: resume fails")
        saved = torch.load(folder / STATE_FILE, weights_only=True)
        model.load_state_dict(saved["model"])
        if bug != NO_OPTIMIZER:
            optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        step, batches_in_epoch = saved["step"], saved["batches_in_epoch"]
        epoch = 0 if bug == EPOCH_RESET else saved["epoch"]
        buffer = [(i, x, e) for i, x, e in zip(saved["buffer_ids"], saved["buffer_x"], saved["buffer_epochs"])]
        if bug == FRESH_SHUFFLE:
            sampler, loader = make_loader(run.seed + 7919)
            loader_iter = start_epoch(sampler, loader, epoch)
            for _ in range(batches_in_epoch):
                next(loader_iter)
        elif bug == RESTART_AT_EPOCH_BOUNDARY and step % len(loader) == 0:
            pass  # like verl 0.8/0.9: "at an epoch boundary the loader starts over"
        else:
            loader.load_state_dict(saved["loader"])
            position = saved["loader"]
    run.resumed(step, folder)
    if loader_iter is None:
        loader_iter = start_epoch(sampler, loader, epoch)
    if folder is not None:
        # Last: starting the loader's iterator above drew its base seed from the global generator.
        torch.set_rng_state(saved["rng"])

    def report_state(at: int) -> None:
        """Everything that decides the rest of the run, by component."""
        run.state(at, {
            "model": model, "optimizer": optimizer, "scheduler": scheduler, "rng": torch.get_rng_state(),
            "loader": {"position": position, "generators": [g.get_state() for g in hidden],
                       "epoch": epoch, "batches": batches_in_epoch},
            "buffer": buffer, "step": at,
        })

    if folder is not None:
        report_state(step)  # what the checkpoint restored, compared with the reference's state at that step

    last = total_steps(run.case)
    while step < last:
        while len(buffer) < p["take"] and epoch < p["epochs"]:
            state_before_last_batch = position
            try:
                batch = next(loader_iter)
            except StopIteration:
                epoch += 1
                batches_in_epoch = 0
                loader_iter = start_epoch(sampler, loader, epoch)
                position = loader.state_dict()
                continue
            position = loader.state_dict()
            batches_in_epoch += 1
            buffer.extend((i, x, epoch) for i, x in zip(ids_of(batch), batch["input"]))
        taken, buffer = buffer[: p["take"]], buffer[p["take"]:]
        if not taken:
            break  # every epoch is used up (only a buggy resume gets here before the last step)
        step += 1
        if bug in (CRASH, HANG) and step == 2:
            if bug == CRASH:
                os._exit(3)
            time.sleep(3600)
        for e in sorted({e for _, _, e in taken}):
            run.consumed([i for i, _, ep in taken if ep == e], step=step, epoch=e)
        x = torch.stack([x for _, x, _ in taken])
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        run.step_end(step)
        if run.should_checkpoint(step):
            loader_state = state_before_last_batch if bug == BUFFER_AND_REREAD else position
            if bug == LOADER_STATE_AT_SAVE:
                loader_state = loader.state_dict()
            kept = [] if bug == DROP_BUFFER else buffer
            path = _save(run.checkpoint_dir, step, bug, {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                "loader": {} if bug == FRESH_SHUFFLE else loader_state,
                "step": step,
                "epoch": epoch,
                "batches_in_epoch": batches_in_epoch,
                "buffer_ids": [i for i, _, _ in kept],
                "buffer_x": torch.stack([x for _, x, _ in kept]) if kept else torch.zeros(0, FEATURES),
                "buffer_epochs": [e for _, _, e in kept],
            })
            if path is not None:
                run.checkpoint_published(step, path)
        report_state(step)


def warm_up() -> None:
    """Run a short loop once (in the fork server), so children start with torch initialised."""
    import tempfile

    from pytest_resume_check.run import RunPlan

    class _Discard:
        def send(self, event: Any) -> None:
            pass

    with tempfile.TemporaryDirectory() as tmp:
        plan = RunPlan("warm-up", ("", "", ""), {"n": 4, "take": 2, "epochs": 1}, 0, tmp, os.devnull,
                       resume_mode=RESUME_DISABLED, checkpoint_steps=frozenset({1}))
        train(RunContext(plan, _Discard()))


def _save(root: Path, step: int, bug: str | None, state: dict[str, Any]) -> Path | None:
    """Write ``step_N/state.pt`` and then point ``latest`` at it, each through a durable rename."""
    import torch

    folder = root / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    if bug == NON_ATOMIC_SAVE:
        torch.save(state, folder / STATE_FILE)
        (root / LATEST).write_text(folder.name)
        return folder
    if bug == SWALLOW_SAVE_ERRORS:
        try:
            return _save(root, step, None, state)
        except OSError:
            return None  # "saving is best effort": the run goes on as if nothing happened
    tmp = folder / (STATE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)
    tmp_latest = root / (LATEST + ".tmp")
    with open(tmp_latest, "w") as f:
        f.write(folder.name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_latest, root / LATEST)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return folder


# One module-level function per variant: a child process imports its target by name.
def correct_loop(run: RunContext) -> None:
    """The correct loop: every cell of the matrix passes."""
    train(run)


def loop_drop_buffer(run: RunContext) -> None:
    train(run, DROP_BUFFER)


def loop_buffer_and_reread(run: RunContext) -> None:
    train(run, BUFFER_AND_REREAD)


def loop_restart_at_epoch_boundary(run: RunContext) -> None:
    train(run, RESTART_AT_EPOCH_BOUNDARY)


def loop_fresh_shuffle(run: RunContext) -> None:
    train(run, FRESH_SHUFFLE)


def loop_epoch_reset(run: RunContext) -> None:
    train(run, EPOCH_RESET)


def loop_shared_generator(run: RunContext) -> None:
    """``StatefulDataLoader(shuffle=True, generator=g)``: resumed mid-epoch, the *next* epoch's
    permutation differs from the uninterrupted run's (torchdata 0.11, found by this harness)."""
    train(run, SHARED_GENERATOR)


def loop_non_atomic_save(run: RunContext) -> None:
    train(run, NON_ATOMIC_SAVE)


def loop_swallow_save_errors(run: RunContext) -> None:
    train(run, SWALLOW_SAVE_ERRORS)


def loop_oldest_checkpoint(run: RunContext) -> None:
    train(run, OLDEST_CHECKPOINT)


def loop_no_optimizer(run: RunContext) -> None:
    train(run, NO_OPTIMIZER)


def loop_loader_state_at_save(run: RunContext) -> None:
    train(run, LOADER_STATE_AT_SAVE)


def loop_raise_on_resume(run: RunContext) -> None:
    train(run, RAISE_ON_RESUME)


def loop_crash(run: RunContext) -> None:
    train(run, CRASH)


def loop_hang(run: RunContext) -> None:
    train(run, HANG)

