"""The bundled targets, registered through the ``pytest_resume_check.targets`` entry point: the built-in
loop, the training script run as a command, and one example per integration (offered where its
framework is installed; importing their modules imports no framework)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_resume_check.builtin import accelerate_example, ddp, hf_trainer_example, lightning_example, loop
from pytest_resume_check.targets import command_target, resume_target

#: Cases of the built-in loop: loader batch vs take size equal, dividing, not dividing and larger;
#: shuffle off and on; one and two epochs; 0 and 2 loader workers.
CASES = (
    {"id": "b4-take4-e2", "batch": 4, "take": 4, "epochs": 2},
    {"id": "b4-take2-e2-shuffle", "batch": 4, "take": 2, "epochs": 2, "shuffle": True},
    {"id": "b4-take3-e2-shuffle-w2", "batch": 4, "take": 3, "epochs": 2, "shuffle": True, "workers": 2},
    {"id": "b4-take6-e1", "batch": 4, "take": 6, "epochs": 1},
)

#: A plain PyTorch loop over StatefulDataLoader with a buffered tail, crash cells in the save of step 2.
builtin_loop = resume_target(
    loop.correct_loop,
    name="builtin_loop",
    steps=loop.total_steps,
    boundaries=loop.epoch_boundaries,
    buffered=loop.buffered_steps,
    cases=CASES,
    contract="exactly_once_ordered",
    preload=loop.PRELOAD,
    crash_save=(2, 1),
)


#: The training script of :mod:`pytest_resume_check.builtin.train_script`, run as a program (a fresh
#: interpreter per run) that reports through :mod:`pytest_resume_check.client`.
SCRIPT_ARGV = ("{python}", "-m", "pytest_resume_check.builtin.train_script", "--out", "{checkpoint_dir}",
               "--resume", "{resume_mode}", "--resume-from", "{resume_path}", "--seed", "{seed}",
               "--epochs", "{case[epochs]}", "--shuffle", "{case[shuffle]}")
SCRIPT_CASES = ({"id": "e2", "epochs": 2, "shuffle": 0}, {"id": "e2-shuffle", "epochs": 2, "shuffle": 1})


def script_steps(case: Mapping[str, Any]) -> int:
    return 6 * int(case["epochs"])  # 24 inputs in batches of 4


def script_boundaries(case: Mapping[str, Any]) -> list[int]:
    return [6 * (e + 1) for e in range(int(case["epochs"]))]


#: The training script as a command target (crash cells in the save of step 2).
script_example = command_target(  # = resume_target.command (type checkers do not see a function attribute)
    SCRIPT_ARGV,
    name="script_example",
    steps=script_steps,
    boundaries=script_boundaries,
    cases=SCRIPT_CASES,
    crash_save=(2, 1),
)


#: The two-rank DDP loop (gloo, StatefulDistributedSampler, torch.distributed.checkpoint): one rank alone
#: killed, preemption with a 2 s grace period, resumes on 1 and 3 ranks.
# --8<-- [start:ddp]
DDP_WORLD_SIZE = 2
ddp_loop = resume_target(
    ddp.correct_ddp,
    name="ddp_loop",
    steps=ddp.total_steps(DDP_WORLD_SIZE),
    boundaries=lambda case: ddp.epoch_boundaries(DDP_WORLD_SIZE),
    cases=({"id": "shuffle", "shuffle": True},),
    world_size=DDP_WORLD_SIZE,
    elastic=(1, 3),
    preemption=(2.0,),
    preload=("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.ddp:warm_up"),
)
# --8<-- [end:ddp]

# --8<-- [start:ddp_torchrun]
#: The same loop launched by torchrun (its elastic agent, c10d rendezvous, its worker restarts): a worker
#: killed alone is followed by torchrun restarting both, which must resume from the newest checkpoint.
ddp_torchrun = resume_target(
    ddp.correct_ddp,
    name="ddp_torchrun",
    steps=ddp.total_steps(DDP_WORLD_SIZE),
    boundaries=lambda case: ddp.epoch_boundaries(DDP_WORLD_SIZE),
    cases=({"id": "shuffle", "shuffle": True},),
    world_size=DDP_WORLD_SIZE,
    launcher="torchrun",
    max_restarts=1,
    resume_modes=("auto",),  # the loop's path mode is ddp_loop's: nothing launcher-specific to find there
    elastic=(1,),
    preemption=(2.0,),
    preload=("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.ddp:warm_up"),
)
# --8<-- [end:ddp_torchrun]


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("torchdata") is not None


#: The loop only where torch and torchdata are installed; the script needs nothing.
TARGETS = ([builtin_loop, ddp_loop, ddp_torchrun] if _has_torch() else []) + [script_example] \
    + lightning_example.TARGETS + accelerate_example.TARGETS + hf_trainer_example.TARGETS
