"""Planted-bug versions of the bundled DDP loop (:mod:`pytest_resume_check.builtin.ddp`), one per bug,
as module-level functions a child process can import by name."""

from __future__ import annotations

from typing import Any

from pytest_resume_check.builtin import ddp


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


def rank1_dies_at_step_3(run: Any) -> None:
    """Rank 1 ends itself at step 3 in every attempt: a job torchrun restarts until no restart is left."""
    import os

    run.resumed(0)
    for step in range(1, 7):
        run.consumed([step * 10 + run.rank], step=step, epoch=0)
        if run.rank == 1 and step == 3:
            os._exit(3)
        run.step_end(step)
