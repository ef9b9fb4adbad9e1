"""A command target's state keeps its leaf names.

One small torch trainer (a linear model, SGD with momentum, ``torch.save`` checkpoints) runs twice: as a Python
target, reporting through its ``RunContext``, and as a program speaking the line protocol, digesting its state
leaf by leaf where the tensors live (the ``leaves`` field of a ``state`` line) because a tensor cannot travel as
JSON. With the momentum not restored, both fail with the same headline, which names the first differing leaf
(``optimizer differs (state.0.momentum_buffer)``), where one digest per component named none; without the
planted bug both pass.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.child.command import FIELD_LEAVES
from pytest_resume_check.client import CONTEXT_ENV, FD_ENV
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.state import leaf_digests
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import resume_target

torch = pytest.importorskip("torch")

STEPS = 4  # 8 inputs, 2 per step
PLANT_MOMENTUM = "momentum"  # the resumed optimizer starts without its momentum buffers
EXPECTED = ("STATE_DIVERGED at step 2 (the restored step of resume from step_2.pt): optimizer differs "
            "(state.0.momentum_buffer), model agrees")


def train(run, plant: str) -> None:
    """The trainer, for a ``RunContext`` or a :class:`Wire` (the same calls)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.arange(2 * 2 * STEPS, dtype=torch.float32).reshape(2 * STEPS, 2) / 8
    folder = Path(run.checkpoint_dir)
    if run.resume_mode == "path":
        source = Path(run.resume_path) if run.resume_path else None
    else:
        saved = sorted(folder.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
        source = saved[-1] if saved and run.resume_mode == "auto" else None
    step = 0
    if source is not None:
        checkpoint = torch.load(source, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        if plant != PLANT_MOMENTUM:
            optimizer.load_state_dict(checkpoint["optimizer"])
        step = checkpoint["step"]
    run.resumed(step, source if step else None)
    if step:
        run.state(step, {"model": model, "optimizer": optimizer})
    while step < STEPS:
        step += 1
        ids = [2 * step - 2, 2 * step - 1]
        run.consumed(ids, step=step, epoch=0)
        optimizer.zero_grad()
        model(data[ids]).pow(2).mean().backward()
        optimizer.step()
        run.step_end(step)
        if run.should_checkpoint(step):
            path = folder / f"step_{step}.pt"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
            run.checkpoint_published(step, path)
        run.state(step, {"model": model, "optimizer": optimizer})


class Wire:
    """The line protocol spoken by hand, the state digested in the program (``leaves``)."""

    def __init__(self) -> None:
        context = json.loads(os.environ[CONTEXT_ENV])
        self.checkpoint_dir, self.resume_mode = context["checkpoint_dir"], context["resume_mode"]
        self.resume_path = context["resume_path"]
        self.sock = socket.socket(fileno=int(os.environ[FD_ENV]))
        self.reader = self.sock.makefile("rb")

    def _call(self, call: str, **fields):
        self.sock.sendall(json.dumps({"call": call, **fields}).encode() + b"\n")
        answer = json.loads(self.reader.readline())
        assert answer["ok"], answer
        return answer.get("value")

    def resumed(self, step, path):
        self._call("resumed", step=step, path=str(path) if path else None)

    def consumed(self, ids, *, step, epoch):
        self._call("consumed", ids=ids, step=step, epoch=epoch)

    def step_end(self, step):
        self._call("step_end", step=step)

    def should_checkpoint(self, step):
        return self._call("should_checkpoint", step=step)

    def checkpoint_published(self, step, path):
        self._call("checkpoint_published", step=step, path=str(path))

    def state(self, step, components):
        self._call("state", step=step, **{FIELD_LEAVES: {k: leaf_digests(v) for k, v in components.items()}})


def program(argv: list[str]) -> None:
    """The command's entry point: ``python -c ... PLANT [client]``: the line protocol by hand, or the harness's
    client (whose ``state`` digests what JSON cannot carry, the module and the optimizer here, itself)."""
    if argv[1:] == ["client"]:
        from pytest_resume_check.client import connect

        train(connect(), argv[0])
    else:
        train(Wire(), argv[0])


def python_target(run) -> None:
    train(run, run.case["plant"])


CASES = ({"id": "plant", "plant": PLANT_MOMENTUM}, {"id": "correct", "plant": ""})
AS_FUNCTION = resume_target(python_target, name="momentum_function", steps=STEPS, cases=CASES, preload=("torch",))
AS_COMMAND = resume_target.command(
    ["{python}", "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
     f"import {Path(__file__).stem} as t; t.program(sys.argv[1:])", "{case[plant]}"],
    name="momentum_command", steps=STEPS, cases=CASES)
AS_CLIENT = resume_target.command([*AS_COMMAND.command.argv, "client"], name="momentum_client", steps=STEPS,
                                  cases=CASES)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("leaf-names"), seed=3, hang_timeout=60)


def test_a_command_names_the_first_differing_leaf_as_a_python_target_does(engine):
    headlines = []
    for target in (AS_FUNCTION, AS_COMMAND, AS_CLIENT):  # path mode: a command reads the resume path from its context
        result = engine.run_cell(Cell(target, CASES[0], "path", (KillSpec(2),), STEPS))
        assert result.verdict.categories == [vd.STATE_DIVERGED], result.verdict.headline
        headlines.append(result.verdict.headline)
    assert headlines[1] == headlines[0] and headlines[2] == headlines[0]
    assert headlines[0].startswith(EXPECTED)


def test_the_command_without_the_planted_bug_passes(engine):
    result = engine.run_cell(Cell(AS_COMMAND, CASES[1], "auto", (KillSpec(2),), STEPS))
    assert result.passed, result.verdict.headline


if __name__ == "__main__":  # a command's program, not a test run
    program(sys.argv[1:])
