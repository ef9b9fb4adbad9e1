"""Two programs as resume-check targets: a Python training script that reports through
``pytest_resume_check.client`` (the bundled ``pytest_resume_check.builtin.train_script``) and a bash
trainer that speaks the line protocol itself (train.sh)."""

from pytest_resume_check import resume_target

CASES = [{"id": "in-order", "shuffle": 0}, {"id": "shuffled", "shuffle": 1}]

# --8<-- [start:glue]
script = resume_target.command(
    ["{python}", "-m", "pytest_resume_check.builtin.train_script", "--out", "{checkpoint_dir}",
     "--resume", "{resume_mode}", "--resume-from", "{resume_path}", "--seed", "{seed}", "--shuffle", "{case[shuffle]}"],
    name="script", steps=12, boundaries=lambda case: [6, 12], cases=CASES,
)
# --8<-- [end:glue]

# --8<-- [start:bash]
bash_trainer = resume_target.command(
    ["bash", "train.sh", "{checkpoint_dir}", "{resume_mode}", "{resume_path}", "{case[shuffle]}"],
    name="bash_trainer", steps=12, boundaries=lambda case: [6, 12], cases=CASES,
)
# --8<-- [end:bash]
