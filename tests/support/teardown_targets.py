"""Two-rank gloo targets about how a run ends (tests/engine/test_teardown_hang.py).

:func:`gil_needed_at_return` is a correct loop whose end meets torch's teardown race in the order that hangs, every
time. When a process group is destroyed, gloo joins its worker threads with the GIL held; a worker thread that is
still dropping a finished all-reduce needs the GIL when the work's thread-local state holds a Python object (on
a loaded machine, the autograd context of the backward pass's last all-reduce, now and then). Here rank 0 puts
such an object there itself (:class:`NeedsTheGil`, whose ``__del__`` runs on the worker thread) and lets the
worker thread take the GIL back only once nothing but the GIL stands between it and the end of its work: where
the group dies with the trainer's DDP model, at the target function's return, that is a deadlock; where the
group lives on until the process ends (as in a job ``torchrun`` starts), the run ends.

:func:`waits_in_a_collective_nobody_joins` is a trainer's own hang: rank 0 calls an all-reduce in step 2 that
rank 1 never calls (rank 1 waits for something else forever).

Importing this module imports nothing heavy; torch comes in inside the functions.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from pytest_resume_check.targets import resume_target

STEPS = 3
#: What the fork server imports for these targets: torch, and ``torch.distributed.nn`` before any group exists
#: (it comes with ``torch._dynamo`` and ``torch.distributed.checkpoint`` in any preloaded server), and torchrun (so both
#: launchers share one server).
PRELOAD = ("torch", "torch.distributed.nn", "torch.distributed.run")
#: The key of rank 0's object in torch's thread-local Python objects.
TLS_KEY = "resume_check_needs_the_gil"


class NeedsTheGil:
    """Held only by a gloo work's thread-local state: gloo's worker thread drops it, and its ``__del__`` runs
    there. It says it started, then waits (GIL released) until rank 0 lets it go on, and taking the GIL back
    is what it needs then."""

    def __init__(self, started: threading.Event, go: threading.Event):
        self.started, self.go = started, go

    def __del__(self) -> None:
        self.started.set()
        self.go.wait()


def gil_needed_at_return(run: Any) -> None:
    """A DDP loop of :data:`STEPS` steps; then one more all-reduce, whose work rank 0's gloo worker thread drops
    only once rank 0 took its own reference away (rank 1 joins it after that), and which then needs the GIL.
    Rank 0 destroys the group while that thread waits, makes sure nothing hands it the GIL before this function
    returns (no switch interval, no handle of the group freed), lets it go on and returns: only the GIL is left
    between the worker thread and its end."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=run.rank, world_size=run.world_size, timeout=timedelta(seconds=60))
    model = DistributedDataParallel(torch.nn.Linear(2, 1))  # the group's last holder once it is destroyed
    run.resumed(0)
    for step in range(1, STEPS + 1):
        run.consumed([10 * step + run.rank], step=step, epoch=0)
        model(torch.ones(1, 2)).sum().backward()
        run.step_end(step)
    started, go = threading.Event(), threading.Event()
    dropped = run.checkpoint_dir / f"rank0-dropped-its-reference-{os.getppid()}"  # the launcher's pid: one per run
    if run.rank == 1:
        while not dropped.exists():
            time.sleep(0.01)
    if run.rank == 0:
        torch._C._stash_obj_in_tls(TLS_KEY, NeedsTheGil(started, go))  # the work captures it
    finished = dist.all_reduce(torch.ones(1), async_op=True).get_future()  # no Work object: it holds the group
    if run.rank == 0:
        torch._C._remove_obj_from_tls(TLS_KEY)  # now only the work holds it
        dropped.touch()
    finished.wait()
    if run.rank == 0:
        started.wait()  # the worker thread drops the work and waits in NeedsTheGil.__del__
    dist.destroy_process_group()
    if run.rank == 0:
        # The group's Python handle lets go of the GIL while it is freed (torch frees such handles without the
        # GIL): freed now, while the worker thread waits for ``go``, the model's C++ reducer is the group's last
        # holder, and nothing between here and the end of this function lets go of the GIL.
        model.process_group = None
        sys.setswitchinterval(1e6)  # the worker thread gets the GIL only when this thread lets go of it
        go.set()


def wait_for_something_else_forever() -> None:
    """Rank 1's bug: it waits for something that never comes instead of joining rank 0's all-reduce."""
    threading.Event().wait()


def waits_in_a_collective_nobody_joins(run: Any) -> None:
    """Rank 0 all-reduces in step 2; rank 1 never does."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=run.rank, world_size=run.world_size, timeout=timedelta(seconds=60))
    run.resumed(0)
    for step in range(1, STEPS + 1):
        run.consumed([10 * step + run.rank], step=step, epoch=0)
        if step == 2 and run.rank == 1:
            wait_for_something_else_forever()
        dist.all_reduce(torch.ones(1))
        run.step_end(step)
    dist.destroy_process_group()


OPTIONS: dict[str, Any] = dict(steps=STEPS, cases=({"id": "end"},), world_size=2, resume_modes=("auto",),
                               preload=PRELOAD)
gil_at_return = resume_target(gil_needed_at_return, name="gil_at_return", **OPTIONS)
gil_at_return_torchrun = resume_target(gil_needed_at_return, name="gil_at_return_torchrun", launcher="torchrun",
                                       **OPTIONS)
collective_nobody_joins = resume_target(waits_in_a_collective_nobody_joins, name="collective_nobody_joins",
                                        hang_timeout=5, **OPTIONS)
