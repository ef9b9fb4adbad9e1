"""Makes the Trainer job of trainer.py a resume-check target: ``pytest --resume-matrix`` kills it at every
checkpoint (and between them), resumes it the way the job resumes after a crash (its own last_checkpoint),
and checks that it resumed from the newest checkpoint and that its inputs and training state are those of a
run that was never interrupted."""

from __future__ import annotations

import trainer

from pytest_resume_check import resume_target
from pytest_resume_check.integrations.durable import leaves_incomplete
from pytest_resume_check.integrations.hf_trainer import HFTrainerResumeCheck

# A finding of the default crash smoke cells (docs/recipes/hf-trainer.md#crash-smoke-cells): the Trainer writes
# checkpoint-N in place and never fsyncs it, and get_last_checkpoint takes a folder whatever its trainer_state.json
# holds, so a power loss while that file is not yet durable leaves an empty one that the resume fails to parse.
KNOWN = [(lambda cell: leaves_incomplete(cell, "trainer_state.json"),
          "transformers Trainer: a power loss before trainer_state.json is durable leaves it empty in the folder "
          "get_last_checkpoint takes (docs/recipes/hf-trainer.md#crash-smoke-cells)")]


# --8<-- [start:glue]
def train(run):
    check = HFTrainerResumeCheck(run, ids="idx")  # the dataset's own id column
    job = trainer.build_trainer(str(run.checkpoint_dir), seed=run.seed, callbacks=[check],
                                remove_unused_columns=False, **run.case["args"])  # keep "idx" for the callback
    # The job's own choice of checkpoint, by the run's resume mode (disabled: none); HFTrainerResumeCheck reports it.
    resume = {"auto": trainer.last_checkpoint(run.checkpoint_dir), "path": run.resume_path}.get(run.resume_mode)
    job.train(resume_from_checkpoint=resume)


hf_trainer_recipe = resume_target(train, name="hf_trainer_recipe", steps=6, boundaries=lambda case: [3, 6],
                                  cases=[{"id": "workers2", "args": {"dataloader_num_workers": 2}}],
                                  preload=("transformers.trainer", "pytest_resume_check.integrations.hf_trainer",
                                           "trainer"), expected_failures=KNOWN)
# --8<-- [end:glue]
