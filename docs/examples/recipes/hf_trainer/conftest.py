"""Makes the Trainer job of trainer.py a resume-check target: ``pytest --resume-matrix`` kills it at every
checkpoint (and between them), resumes it, and checks its inputs and training state against a run that
was never interrupted."""

from __future__ import annotations

import trainer

from pytest_resume_check import resume_target
from pytest_resume_check.integrations.hf_trainer import ResumeCheck


# --8<-- [start:glue]
def train(run):
    check = ResumeCheck(run, ids="idx")  # the dataset's own id column
    job = trainer.build_trainer(str(run.checkpoint_dir), seed=run.seed, callbacks=[check],
                                remove_unused_columns=False, **run.case["args"])  # keep "idx" for the callback
    job.train(resume_from_checkpoint=check.resume_from_checkpoint)  # what ResumeCheck chose, or None


hf_trainer_recipe = resume_target(train, name="hf_trainer_recipe", steps=6, boundaries=lambda case: [3, 6],
                                  cases=[{"id": "workers2", "args": {"dataloader_num_workers": 2}}],
                                  preload=("transformers.trainer", "pytest_resume_check.integrations.hf_trainer",
                                           "trainer"))
# --8<-- [end:glue]
