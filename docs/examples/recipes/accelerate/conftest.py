"""Makes the Accelerate trainer of trainer.py a resume-check target: ResumeCheck watches the trainer's
Accelerator (batches, optimizer steps, save_state / load_state) and picks the checkpoint to resume from."""

from __future__ import annotations

import trainer

from pytest_resume_check import resume_target
from pytest_resume_check.integrations.accelerate import ResumeCheck

# Two ways to skip the batches already trained on: the loader's saved state, or skip_first_batches.
CASES = [
    {"id": "stateful-ga2-keep2", "argv": ["--stateful_dataloader", "--gradient_accumulation_steps=2",
                                          "--checkpoint_limit=2"]},
    {"id": "skip-shuffle-epoch", "argv": ["--shuffle", "--batch_size=3", "--checkpointing_steps=epoch"]},
]


# --8<-- [start:glue]
def accelerate_regression(run):  # the target's name
    args = trainer.parse_args([*run.case["argv"], f"--output_dir={run.checkpoint_dir}", f"--seed={run.seed}"])
    accelerator = trainer.build_accelerator(args)
    with ResumeCheck(run, accelerator, ids="idx") as check:
        args.resume_from_checkpoint = check.resume_from
        trainer.training_function(accelerator, args)


def epoch_ends(case):  # the last optimizer step of each epoch
    args = trainer.parse_args(case["argv"])
    return [trainer.num_update_steps_per_epoch(args) * e for e in range(1, args.num_train_epochs + 1)]


# The warm-up runs a tiny Accelerate loop once in the fork server, so each run starts warm (~1 s less).
target = resume_target(accelerate_regression, steps=lambda case: epoch_ends(case)[-1], boundaries=epoch_ends,
                       cases=CASES, preload=("trainer", "pytest_resume_check.integrations.accelerate:warm_up"))
# --8<-- [end:glue]
