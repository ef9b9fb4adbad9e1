"""The ``torch.distributed`` default process group of a run's process, kept alive until the process ends.

A job started by ``torchrun`` (or by hand) builds its first ``DistributedDataParallel`` model after
``init_process_group``, and that imports ``torch.distributed.nn.functional`` (through ``torch._dynamo``),
whose default arguments (``group=group.WORLD``) then hold the default group until the process exits: the
group's destructor never runs in a job that finishes. A run of the harness starts from its preloaded fork
server, which imported that module (with ``torch._dynamo`` and ``torch.distributed.checkpoint``) before any
group existed, so there the group died with the trainer's model, when the trainer's function returned. torch's
gloo backend then joins its worker threads with the GIL held, and a worker thread that is still dropping the
last all-reduce of the backward pass (its thread-local state holds autograd's context, a Python object)
waits for the GIL forever: a correct loop that ends with ``destroy_process_group()`` hung at exit in about
one run in ten on a loaded machine, and never under plain ``torchrun``.

Holding the group as a fresh interpreter does takes that difference away: the run's process ends
(``os._exit``) with the group alive. Importing this module imports nothing; torch is read only where the
trainer imported it.
"""

from __future__ import annotations

import sys
from typing import Any


class GroupKeeper:
    """The default process groups initialised in this process, each held until the process ends. Safe from
    any thread and from signal handlers (it reads attributes and appends to a list)."""

    def __init__(self) -> None:
        self._kept: list[Any] = []

    def keep(self) -> None:
        """Hold the current default group, if ``torch.distributed`` is imported and initialised (a trainer
        that initialises a group again after destroying one gets each held)."""
        dist = sys.modules.get("torch.distributed")
        if dist is None:
            return
        try:
            group = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
        except Exception:  # a half-imported torch.distributed: nothing to hold yet
            return
        if group is not None and not any(kept is group for kept in self._kept):
            self._kept.append(group)

    @property
    def kept(self) -> tuple[Any, ...]:
        """The groups held so far, oldest first."""
        return tuple(self._kept)
