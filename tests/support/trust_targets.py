"""Trainers that are correct but do ordinary things a loaded machine turns into races: each must
pass. Module-level functions, so a child process imports them by name; torch-free except
:func:`two_rank_loop`, which imports torch inside.

- :func:`term_saver`: a SIGTERM handler that saves, publishes and exits (inside whatever report call the
  signal interrupts);
- :func:`churning_saver`: a background thread that keeps writing, renaming and deleting scratch files in
  the checkpoint folder while the trainer publishes (what a snapshot copy must not trip over);
- :func:`long_step_logger`: one step that takes longer than the hang limit and logs all along;
- :func:`two_rank_loop`: consumed, all-reduce, step_end, save on rank 0, barrier (``slow_rank1``: rank 1
  takes its time between the all-reduce and its step end whenever a checkpoint is due;
  ``rank0_ends_early``: rank 0 reports its step end before the all-reduce, so rank 1 cannot reach its own
  while rank 0 waits at a kill point there - not a correct loop for the matrix, and named as such).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from plain_state_target import _save  # step_N/state.json and the latest pointer, written atomically

STEPS = 6
LATEST = "latest"
#: Seconds rank 1 of :func:`two_rank_loop` waits before its step end when a checkpoint is due (case key
#: ``slow_rank1``): longer than the 2 s the harness used to wait for the other ranks before killing all.
SLOW_RANK1 = 3.0
#: :func:`long_step_logger`'s first step: this long, a ``run.log`` line every :data:`LOG_EVERY` seconds.
LONG_STEP = 7.0
LOG_EVERY = 0.2


def _restore(run: Any) -> tuple[int, float, Path | None]:
    folder = None
    if run.resume_mode == "path":
        folder = run.resume_path
    elif run.resume_mode != "disabled" and (run.checkpoint_dir / LATEST).exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / LATEST).read_text()
    if folder is None:
        return 0, 0.0, None
    saved = json.loads((Path(folder) / "state.json").read_text())
    return int(saved["step"]), float(saved["w"]), Path(folder)


def term_saver(run: Any) -> None:
    """Saves and publishes in its SIGTERM handler, then exits: the most common preemption handler."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    progress = {"step": start, "w": w}

    def on_term(signum: int, frame: Any) -> None:
        step = progress["step"]
        run.checkpoint_published(step, _save(run.checkpoint_dir, step, progress["w"]))
        run.log(f"saved step {step} on SIGTERM")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.5 * w + step
        progress.update(step=step, w=w)
        run.step_end(step)
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))
        run.state(step, {"model": {"w": w}})


def churning_saver(run: Any) -> None:
    """Publishes while a thread of its own churns scratch files in the checkpoint folder."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    stop = threading.Event()

    def churn() -> None:
        scratch = run.checkpoint_dir / "scratch"
        scratch.mkdir(exist_ok=True)
        n = 0
        while not stop.is_set():
            n += 1
            path = scratch / f"part-{n % 50}.tmp"
            path.write_bytes(b"x" * 4096)
            path.replace(scratch / f"part-{n % 50}")
            (scratch / f"part-{(n + 25) % 50}").unlink(missing_ok=True)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for step in range(start + 1, STEPS + 1):
            run.consumed([step], step=step, epoch=0)
            w = 0.5 * w + step
            run.step_end(step)
            if run.should_checkpoint(step):
                run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))
    finally:
        stop.set()
        thread.join()


def long_step_logger(run: Any) -> None:
    """Two steps; the first takes :data:`LONG_STEP` seconds and calls ``run.log`` all along (case key
    ``silent``: says nothing meanwhile)."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    for step in range(start + 1, 3):
        run.consumed([step], step=step, epoch=0)
        if step == 1 and run.case.get("silent"):
            time.sleep(LONG_STEP)
        elif step == 1:
            until = time.monotonic() + LONG_STEP
            while time.monotonic() < until:
                run.log(f"step {step}: still working")
                time.sleep(LOG_EVERY)
        w = 0.5 * w + step
        run.step_end(step)
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))


def two_rank_loop(run: Any) -> None:
    """Each rank takes input ``2 * (step - 1) + rank`` of a 12-input epoch; the checkpoint (rank 0's) holds
    the step and the weight."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=run.rank, world_size=run.world_size, timeout=timedelta(seconds=60))
    try:
        start, w, folder = _restore(run)
        run.resumed(start, folder)
        for step in range(start + 1, STEPS + 1):
            run.consumed([2 * (step - 1) + run.rank], step=step, epoch=0)
            early = run.rank == 0 and run.case.get("rank0_ends_early")
            if early:  # rank 0 reports the step's end before the collective rank 1 must finish first
                run.step_end(step)
            grad = torch.tensor([float(2 * (step - 1) + run.rank)])
            dist.all_reduce(grad)
            w = 0.5 * w + float(grad.item())
            checkpoint = run.should_checkpoint(step)
            if run.rank == 1 and checkpoint and run.case.get("slow_rank1") and not run.is_resume:
                time.sleep(SLOW_RANK1)
            if not early:
                run.step_end(step)
            if checkpoint and run.rank == 0:
                run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))
            dist.barrier()
            run.state(step, {"model": {"w": w}})
    finally:
        dist.destroy_process_group()


def scribbler(run: Any) -> None:
    """Writes bytes that are no event to every pipe and socket it holds (case key ``frame``: what), then
    trains as :func:`churning_saver` would without the thread."""
    import stat

    frame = {"junk": b"\x00\x00\x00\x05hello", "huge": b"\x7f\xff\xff\xf0junk",
             "short": b"\x00\x10\x00\x00junk"}[run.case.get("frame", "junk")]
    if not run.is_resume:
        for fd in range(3, 256):
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                    os.write(fd, frame)
            except OSError:
                continue
    _plain(run)


def _plain(run: Any) -> None:
    start, w, folder = _restore(run)
    run.resumed(start, run.case.get("resumed_from") if folder is not None and run.case.get("resumed_from") else folder)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.5 * w + step
        run.step_end(step)
        if run.should_checkpoint(step):
            if run.case.get("remove_root"):  # the session folder: <root>/<target>/<case>/<cell>/out
                shutil.rmtree(run.checkpoint_dir.parents[3], ignore_errors=True)
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))


def plain(run: Any) -> None:
    """Six steps, checkpoints when asked (case key ``remove_root``: removes the session folder when it
    checkpoints, as a second session with the same --basetemp would; ``resumed_from``: a resumed run
    reports that path as what it restored)."""
    _plain(run)


def server_killer(run: Any) -> None:
    """:func:`plain`, whose run SIGKILLs the fork server it was forked from (its parent) at the end of step
    ``kill_server_at`` (case key), as the kernel's OOM killer would, and then waits for the harness to end
    it."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    server = os.getppid()
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.5 * w + step
        run.step_end(step)
        if step == run.case.get("kill_server_at"):
            os.kill(server, signal.SIGKILL)
            threading.Event().wait()  # the harness ends the run: its server is gone
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))


def disk_full_saver(run: Any) -> None:
    """:func:`plain`, whose save of checkpoint ``disk_full_at`` (case key) writes through ``/dev/full``, where
    every write fails with ENOSPC: its own save meeting a full disk."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.5 * w + step
        run.step_end(step)
        if run.should_checkpoint(step):
            if step == run.case.get("disk_full_at"):
                (run.checkpoint_dir / f"step_{step}").mkdir(exist_ok=True)
                with open("/dev/full", "w") as f:
                    f.write(json.dumps({"step": step, "w": w}))
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))


def stderr_printer(run: Any) -> None:
    """:func:`plain`, printing a line to stderr (the run's log) at each step's end."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        w = 0.5 * w + step
        print(f"step {step}: w={w}", file=sys.stderr)
        run.step_end(step)
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))


def forking_logger(run: Any) -> None:
    """Forks a helper that logs long lines for a while, as the trainer logs long lines too: both write to
    the run's channel, messages far above what a pipe writes in one piece."""
    start, w, folder = _restore(run)
    run.resumed(start, folder)
    helper = os.fork()
    if helper == 0:
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            run.log("helper " + "h" * 8000)
            time.sleep(0.001)
        os._exit(0)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        for _ in range(50):
            run.log("trainer " + "t" * 8000)
        w = 0.5 * w + step
        run.step_end(step)
        if run.should_checkpoint(step):
            run.checkpoint_published(step, _save(run.checkpoint_dir, step, w))
        time.sleep(0.3)
    os.waitpid(helper, 0)
