"""A training script run as it is (train.py, no resume-check calls in it): the harness finds its checkpoints
by the glob, kills it at each, sees which one each resume opens and compares the model it writes at the end."""

from pytest_resume_check import resume_target

# --8<-- [start:glue]
script = resume_target.command(
    ["{python}", "train.py", "--out", "{checkpoint_dir}", "--seed", "{seed}"],
    name="unchanged_script", steps=6, checkpoints="step_*.pt", outputs=["model.pt"],
)
# --8<-- [end:glue]
