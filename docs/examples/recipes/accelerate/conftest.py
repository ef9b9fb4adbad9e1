"""Makes the Accelerate trainer of trainer.py a resume-check target: AccelerateResumeCheck watches the trainer's
Accelerator (batches, optimizer steps, save_state / load_state); the trainer's own --resume_from_checkpoint
chooses the checkpoint to resume from, and the matrix checks that choice too."""

from __future__ import annotations

import trainer

from pytest_resume_check import resume_target
from pytest_resume_check.integrations.accelerate import MARKER, AccelerateResumeCheck
from pytest_resume_check.integrations.durable import leaves_incomplete

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
    # The trainer's own choice of checkpoint, by the run's resume mode (disabled: none); AccelerateResumeCheck
    # reports it.
    args.resume_from_checkpoint = {"auto": "latest", "path": run.resume_path}.get(run.resume_mode)
    with AccelerateResumeCheck(run, accelerator, ids="idx"):
        trainer.training_function(accelerator, args)


def epoch_ends(case):  # the last optimizer step of each epoch
    args = trainer.parse_args(case["argv"])
    return [trainer.num_update_steps_per_epoch(args) * e for e in range(1, args.num_train_epochs + 1)]


# A finding of the default crash smoke cells: load_state() without a folder takes the highest-numbered
# checkpoint_<n>, finished or not. A power loss before the save's last file (AccelerateResumeCheck's marker, written
# last) is durable leaves a folder it still takes.
UNFINISHED = ("Accelerate: load_state() takes the highest-numbered checkpoint folder, finished or not "
              "(docs/recipes/accelerate.md#crash-smoke-cells)")

# The warm-up runs a tiny Accelerate loop once in the fork server, so each run starts warm (~1 s less).
target = resume_target(accelerate_regression, steps=lambda case: epoch_ends(case)[-1], boundaries=epoch_ends,
                       cases=CASES, preload=("trainer", "pytest_resume_check.integrations.accelerate:warm_up"),
                       expected_failures=[(lambda cell: leaves_incomplete(cell, MARKER + ".tmp"), UNFINISHED)])
# --8<-- [end:glue]
