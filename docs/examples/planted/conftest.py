"""Planted resume bugs of the built-in PyTorch loop, declared as targets.

Each target is the same small loop over a ``StatefulDataLoader`` with one known resume bug planted
(see ``pytest_resume_check.builtin.loop``), so a matrix over them shows every kind of verdict: the
HTML report screenshot in the docs and the torchdata finding come from here.
"""

from __future__ import annotations

from pytest_resume_check import resume_target
from pytest_resume_check.builtin import loop

PRELOAD = ("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.loop:warm_up")
# 8 inputs in loader batches of 4, 2 inputs per step, 2 epochs: 8 steps.
CASES = [
    {"id": "b4-take2", "n": 8, "batch": 4, "take": 2},
    {"id": "b4-take2-shuffle", "n": 8, "batch": 4, "take": 2, "shuffle": True},
]


def planted(fn, name, **options):
    return resume_target(fn, name=name, steps=loop.total_steps, boundaries=loop.epoch_boundaries,
                         cases=CASES, contract="exactly_once_ordered", preload=PRELOAD, **options)


def has_checkpoint(cell):
    """A kill with a checkpoint on disk: the resumed run reads it (and the planted bug raises)."""
    return any(kill.checkpoint_step for kill in cell.kills)


correct = planted(loop.correct_loop, "correct")
drop_buffer = planted(loop.loop_drop_buffer, "drop_buffer")  # the buffered tail is not saved: LOST
reread = planted(loop.loop_buffer_and_reread, "reread")  # the tail is saved and read again: DUPLICATED, LOST
shared_generator = planted(loop.loop_shared_generator, "shared_generator")  # torchdata: REORDERED
epoch_reset = planted(loop.loop_epoch_reset, "epoch_reset")  # the epoch is not restored: EPOCH
oldest_checkpoint = planted(loop.loop_oldest_checkpoint, "oldest_checkpoint")  # auto resume: STALE_RESUME
no_optimizer = planted(loop.loop_no_optimizer, "no_optimizer")  # momentum not restored: STATE_DIVERGED
raise_on_resume = planted(loop.loop_raise_on_resume, "raise_on_resume",  # RESUME_ERROR, declared known
                          expected_failures=[(has_checkpoint, "planted: loading a checkpoint raises")])


# A known upstream bug, declared (see writing-a-target.md, "Declaring a known bug").
# --8<-- [start:known-bug]
# The checkpoint stores loader.state_dict() when it is written. Right after a resume, before the next
# batch, torchdata 0.11's StatefulDistributedSampler reads as the start of the epoch (docs/findings.md).
# With 2 inputs per step from batches of 4, the step after a resume from an odd step trains on the
# buffered half batch only; killed right after checkpointing it, the next resume replays the epoch (or,
# from the last step, has nothing left to replay but restores that wrong position: STATE_DIVERGED).
torchdata_sampler = planted(loop.loop_loader_state_at_save, "torchdata_sampler", expected_failures=[
    (lambda cell: cell.kill_id in ("ckpt1_ckpt2+1", "ckpt3_ckpt4+1", "ckpt5_ckpt6+1", "ckpt7_ckpt8"),
     "torchdata 0.11: StatefulDistributedSampler.state_dict() right after a load reads as the epoch start"),
])
# --8<-- [end:known-bug]
