"""A training script that commits each checkpoint through a pointer file (train.py, no resume-check calls in it):
the harness publishes a checkpoint when latest.txt names it, kills the script right before and after that, sees
which checkpoint each resume opens and compares the model it writes at the end."""

from pytest_resume_check import resume_target

# --8<-- [start:glue]
script = resume_target.command(
    ["{python}", "train.py", "--out", "{checkpoint_dir}", "--seed", "{seed}"],
    name="pointer_script", steps=6, checkpoints="ckpt_*.pt", commit="latest.txt", outputs=["model.pt"],
)
# --8<-- [end:glue]
