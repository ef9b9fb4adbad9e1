"""Every Python block on the hand-written pages (writing a target, trainer configuration) does what the
page says it does. A block is either quoted from an example file under docs/examples or run here as it
stands; either way its test checks the block's promise, named in :data:`PROMISES`. Outlines are marked
``text``."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from optional import requires

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
FENCE = re.compile(r"^ *```python\n(.*?)^ *```", re.M | re.S)
DOWNSTREAM = EXAMPLES / "downstream"
PROJECT = ("trainer.py", "conftest.py", "pytest.ini", "test_by_hand.py")
CELL = re.compile(r"^resume-matrix::regression\[(.+)\]$", re.M)
MATRIX_SUMMARY = re.compile(r"resume matrix: (\d+) cells, (\d+) failing")
PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q")


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((DOCS / page).read_text())


def quoted_from(block: str) -> str | None:
    """The example file (relative to docs/examples) that holds ``block`` verbatim, if any."""
    for path in sorted(EXAMPLES.rglob("*.py")):
        if block.strip() in path.read_text():
            return path.relative_to(EXAMPLES).as_posix()
    return None


def run(args, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-W", "ignore", "-c", code, *args], cwd)


def succeeded(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def copy_project(folder: Path) -> Path:
    for name in PROJECT:
        shutil.copy(DOWNSTREAM / name, folder / name)
    return folder


# -- writing-a-target.md ----------------------------------------------------------------------------------

TARGET_CHECKS = """
from pytest_resume_check import EXACTLY_ONCE_ORDERED, Target

assert isinstance(regression, Target) and regression.name == "regression"
assert regression.ref[0::2] == ("trainer", "train")  # children import it by name
assert [c["id"] for c in regression.cases] == ["e2", "e2-shuffle"]
assert regression.steps is trainer.total_steps and regression.boundaries is trainer.epoch_boundaries
assert regression.contract == EXACTLY_ONCE_ORDERED
assert regression.resume_modes == ("auto", "path") and regression.isolation == "forkserver"
assert regression.preload == ("torch", "torchdata.stateful_dataloader", "trainer:warm_up")
assert regression.expected_failures == ()
"""


def declares_the_documented_target(block: str, tmp_path: Path) -> None:
    """The declaration holds what each of its comments says."""
    succeeded(run_python(block + TARGET_CHECKS, copy_project(tmp_path)))


def passes_as_a_test_of_the_example_project(block: str, tmp_path: Path) -> None:
    copy_project(tmp_path)
    (tmp_path / "test_snippet.py").write_text(block)
    done = run([*PYTEST, "test_snippet.py"], tmp_path)
    succeeded(done)
    assert "1 passed" in done.stdout, done.stdout[-3000:]


def matrix_cells(folder: Path, *args: str) -> list[str]:
    """The cell ids (inside ``regression[...]``) that ``pytest --resume-matrix`` collects."""
    done = run([*PYTEST, "--resume-matrix", "--co", *args], folder)
    succeeded(done)
    return CELL.findall(done.stdout)


def turns_every_case_mode_and_kill_point_into_a_test_item(block: str, tmp_path: Path) -> None:
    """conftest.py: "pytest --resume-matrix turns every (case, resume mode, kill point) of it into a
    test item"."""
    cases = re.findall(r'"id": "([^"]+)"', block)
    modes = ("auto", "path")  # the default: the conftest names none
    pattern = re.compile(rf"^({'|'.join(map(re.escape, cases))})-({'|'.join(modes)})-(ckpt\S+)$")
    cells = [pattern.match(cell) for cell in matrix_cells(copy_project(tmp_path))]
    assert cells and all(cells), cells
    kills = {}
    for cell in cells:
        kills.setdefault((cell[1], cell[2]), []).append(cell[3])
    assert set(kills) == {(case, mode) for case in cases for mode in modes}
    for mode in modes:
        assert len({tuple(kills[case, mode]) for case in cases}) == 1, f"cases differ in their {mode} kill points"
        assert len(set(kills[cases[0], mode])) == len(kills[cases[0], mode]) > 0


def resumes_exactly_after_sigkills(block: str, tmp_path: Path) -> None:
    """trainer.py: "A small PyTorch regression trainer that resumes exactly after a SIGKILL": its cell
    with two kills (the second after an unsaved step, across the epoch boundary) passes."""
    copy_project(tmp_path)
    seed = "--resume-matrix-seed=1234"
    shuffled = [cell for cell in matrix_cells(tmp_path, seed) if cell.startswith("e2-shuffle-auto-")]
    cell = max(shuffled, key=lambda c: (c.count("_ckpt"), c))
    assert "_ckpt" in cell and "+" in cell, shuffled
    done = run([*PYTEST, "--resume-matrix", seed, f"--resume-matrix-cell=regression[{cell}]"], tmp_path)
    succeeded(done)
    assert [m.groups() for m in MATRIX_SUMMARY.finditer(done.stdout)] == [("1", "0")], done.stdout[-3000:]


def its_hand_written_tests_pass(block: str, tmp_path: Path) -> None:
    """test_by_hand.py: each kill scenario it spells out resumes as its asserts say."""
    tests = re.findall(r"^def (test_\w+)", block, re.M)
    done = run([*PYTEST, "test_by_hand.py"], copy_project(tmp_path))
    succeeded(done)
    assert f"{len(tests)} passed" in done.stdout, done.stdout[-3000:]


# -- trainer-configuration.md -----------------------------------------------------------------------------

CONFIG_CHECKS = """
from agentlightning.verl.trainer import read_async_settings

settings = read_async_settings(config)  # what the trainer reads at construction
assert settings.enabled and settings.async_train_batch_size == 6
assert config.data.train_batch_size == 4  # the rest of the config as it was
"""


def adds_settings_the_trainer_reads(block: str, tmp_path: Path) -> None:
    succeeded(run_python(block + CONFIG_CHECKS, tmp_path))


#: Put in front of the block: records every observer call, unbuffered, to the file ``sys.argv[1]`` and
#: SIGKILLs the run at the end of step ``sys.argv[2]`` (0: never).
RECORDER = """
import json, os, signal, sys


class Recorder:
    def __init__(self, path, kill_at):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.kill_at = kill_at

    def write(self, *event):
        os.write(self.fd, (json.dumps(event) + "\\n").encode())

    def resumed(self, step, path):
        self.write("resumed", step, path)

    def consumed(self, ids, step, epoch):
        self.write("consumed", step, epoch, list(ids))

    def trained(self, ids, step, epoch):
        self.write("trained", step, epoch, list(ids))

    def step_end(self, step):
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def should_checkpoint(self, step):
        return False  # the snippet's save_freq decides

    def checkpoint_published(self, step, path):
        self.write("published", step, path)

"""
OBSERVE = "trainer.input_observer = Recorder(sys.argv[1], int(sys.argv[2]))"
#: The steps at whose end the interrupted job is killed: with save_freq=2, each kill loses one unsaved
#: step; the second resumes from the checkpoint at the end of epoch 0.
KILLS = (3, 5)


def recorded(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def ledger(events: list[list], kind: str, upto: float = float("inf")) -> list[list]:
    return [event[1:] for event in events if event[0] == kind and event[1] <= upto]


def resumes_exactly_when_killed_and_run_again(block: str, tmp_path: Path) -> None:
    """"kill it at any point and run the same two lines again: it resumes exactly": the job killed
    twice and run again each time consumes and trains on the inputs of the uninterrupted run, in the
    same steps and epochs."""
    lines = block.splitlines()
    fit = [i for i, line in enumerate(lines) if line.startswith("trainer.fit()")]
    assert len(fit) == 1, "the block no longer ends in one trainer.fit() line"
    code = RECORDER + "\n".join([*lines[:fit[0]], OBSERVE, *lines[fit[0]:]])
    (tmp_path / "reference").mkdir()
    (tmp_path / "job").mkdir()

    def start(folder: Path, events: str, kill_at: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-W", "ignore", "-c", code, events, str(kill_at)], cwd=folder,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    reference = start(tmp_path / "reference", "events.jsonl", 0)  # alongside the first interrupted run
    runs = []
    for index, kill_at in enumerate((*KILLS, 0)):
        child = start(tmp_path / "job", f"run{index}.jsonl", kill_at)
        out, err = child.communicate(timeout=600)
        assert child.returncode == (-signal.SIGKILL if kill_at else 0), out[-2000:] + err[-3000:]
        runs.append(recorded(tmp_path / "job" / f"run{index}.jsonl"))
    out, err = reference.communicate(timeout=600)
    assert reference.returncode == 0, out[-2000:] + err[-3000:]
    expected = recorded(tmp_path / "reference" / "events.jsonl")

    resumed = [ledger(events, "resumed")[0][0] for events in runs]
    published = [{step: path for step, path in ledger(events, "published")} for events in runs]
    assert resumed == [0, 2, 4]  # each run restored the newest checkpoint the killed one published
    assert [ledger(events, "resumed")[0][1] for events in runs[1:]] == [published[0][2], published[1][4]]
    for kind in ("consumed", "trained"):
        composite = [e for events, upto in zip(runs, [*resumed[1:], float("inf")]) for e in ledger(events, kind, upto)]
        assert composite and composite == ledger(expected, kind), f"the {kind} inputs differ from the uninterrupted run"


# -- which block promises what ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Promise:
    """How to recognise a block, what it needs installed, and the check of what it promises."""

    applies: Callable[[str, str | None], bool]  # (block, example file it is quoted from)
    needs: tuple[str, ...]
    check: Callable[[str, Path], None]


def declares_the_known_bug(block: str, tmp_path: Path) -> None:
    """planted/conftest.py:known-bug: the declaration names "exactly these four cells of the full
    matrix" per case (tests/docs/test_docs.py runs them and sees them fail as declared)."""
    import runpy

    from pytest_resume_check.cells import matrix

    target = runpy.run_path(str(EXAMPLES / "planted" / "conftest.py"))["torchdata_sampler"]
    declared = [c for c in matrix.cells(target, matrix.FULL, seed=1234) if c.xfail_reason]
    assert sorted({c.kill_id for c in declared}) == ["ckpt1_ckpt2+1", "ckpt3_ckpt4+1", "ckpt5_ckpt6+1", "ckpt7_ckpt8"]
    assert len(declared) == 4 * len(target.cases)


TORCH = ("torch", "torchdata")
VERL = ("torch", "torchdata", "verl")
PROMISES = (
    Promise(lambda block, quoted: block.strip() == '--8<-- "planted/conftest.py:known-bug"', (),
            declares_the_known_bug),
    Promise(lambda block, quoted: quoted == "downstream/conftest.py", TORCH,
            turns_every_case_mode_and_kill_point_into_a_test_item),
    Promise(lambda block, quoted: quoted == "downstream/trainer.py", TORCH, resumes_exactly_after_sigkills),
    Promise(lambda block, quoted: quoted == "downstream/test_by_hand.py", TORCH, its_hand_written_tests_pass),
    Promise(lambda block, quoted: quoted is None and block.startswith("def test_"), TORCH,
            passes_as_a_test_of_the_example_project),
    Promise(lambda block, quoted: quoted is None and "import trainer" in block and "resume_target(" in block, TORCH,
            declares_the_documented_target),
    Promise(lambda block, quoted: quoted is None and "add_agentlightning_config(" in block, VERL,
            adds_settings_the_trainer_reads),
    Promise(lambda block, quoted: quoted is None and "build_cpu_trainer(" in block and ".fit()" in block, VERL,
            resumes_exactly_when_killed_and_run_again),
)


def promise_of(block: str) -> Promise | None:
    quoted = quoted_from(block)
    matching = [p for p in PROMISES if p.applies(block, quoted)]
    assert len(matching) <= 1, f"more than one promise applies to:\n{block}"
    return matching[0] if matching else None


def block_cases() -> list:
    cases = []
    for page in ("writing-a-target.md", "trainer-configuration.md"):
        for index, block in enumerate(python_blocks(page)):
            promise = promise_of(block)
            marks = [requires(*promise.needs)] if promise else []
            cases.append(pytest.param(page, index, block, id=f"{page}:{index}", marks=marks))
    return cases


BLOCKS = block_cases()


@pytest.mark.parametrize(("page", "index", "block"), BLOCKS)
def test_each_python_block_does_what_the_page_says(page, index, block, tmp_path):
    promise = promise_of(block)
    if promise is None:
        pytest.fail(f"docs/{page} python block {index} has no promise checked here; add one to PROMISES:\n{block}")
    promise.check(block, tmp_path)


def test_the_pages_have_python_blocks_at_all():
    assert len(BLOCKS) >= 5
