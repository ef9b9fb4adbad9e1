"""Planted-bug versions of the bundled DDP loop (:mod:`pytest_resume_check.builtin.ddp`), one per bug,
as module-level functions a child process can import by name."""

from __future__ import annotations

from typing import Any

from pytest_resume_check.builtin import ddp
from pytest_resume_check.targets import resume_target


def ddp_sampler_rank0(run: Any) -> None:
    ddp.train(run, "sampler_rank0")


def ddp_stale_rank(run: Any) -> None:
    ddp.train(run, "stale_rank")


def ddp_elastic_epoch(run: Any) -> None:
    ddp.train(run, "elastic_epoch")


def ddp_term_ignored(run: Any) -> None:
    ddp.train(run, "term_ignored")


def ddp_one_rank(run: Any) -> None:
    """The correct loop, declared with one rank (resumed on two by the elastic cells)."""
    ddp.train(run)


def ddp_async_unawaited(run: Any) -> None:
    ddp.train(run, "async_unawaited")


def ddp_restart_fresh(run: Any) -> None:
    ddp.train(run, "restart_fresh")


def ddp_local_rank(run: Any) -> None:
    ddp.train(run, "local_rank")


def ddp_saved_world(run: Any) -> None:
    ddp.train(run, "saved_world")


def rank1_dies_at_step_3(run: Any) -> None:
    """Rank 1 ends itself at step 3 in every attempt: a job torchrun restarts until no restart is left."""
    import os

    run.resumed(0)
    for step in range(1, 7):
        run.consumed([step * 10 + run.rank], step=step, epoch=0)
        if run.rank == 1 and step == 3:
            os._exit(3)
        run.step_end(step)


# --8<-- [start:two_nodes]
ddp_two_nodes = resume_target(
    ddp.correct_ddp,
    name="ddp_two_nodes",
    steps=ddp.total_steps(2),
    boundaries=lambda case: ddp.epoch_boundaries(2),
    cases=({"id": "shuffle", "shuffle": True},),
    world_size=2,
    launcher="torchrun",
    nnodes=(1, 2),  # two nodes of one worker each; the job may go on with one
    max_restarts=1,  # the agents left restart their workers once a node is lost
    resume_modes=("auto",),
)
# --8<-- [end:two_nodes]


def ddp_tracker_early(run: Any) -> None:
    ddp.train(run, "tracker_early")


def ddp_newest_folder(run: Any) -> None:
    ddp.train(run, "newest_folder")


def ddp_keep_last(run: Any) -> None:
    ddp.train(run, keep=1)


def ddp_unsynced_rank1(run: Any) -> None:
    ddp.train(run, "unsynced_rank1")


def ddp_prune_early(run: Any) -> None:
    ddp.train(run, "prune_early", keep=1)


def ddp_async(run: Any) -> None:
    ddp.train(run, keep=1, asynchronous=True)


def ddp_async_prune(run: Any) -> None:
    ddp.train(run, "async_prune", keep=1)
