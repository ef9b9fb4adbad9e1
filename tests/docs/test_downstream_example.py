"""The downstream example of docs/examples/downstream works as documented, run the way a user runs it.

Each test copies the example project into a pytester directory and runs pytest on it in a subprocess
(children are really SIGKILLed there): the matrix passes for the correct trainer, the hand-written
``resume_check`` tests pass, and a copy with a planted bug fails with a headline and a rerun command
that reproduces exactly that cell. The guide quotes the example's files; they must not drift apart.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLE = DOCS / "examples" / "downstream"
GUIDE = DOCS / "writing-a-target.md"
PROJECT_FILES = ("conftest.py", "trainer.py", "pytest.ini")
BY_HAND = "test_by_hand.py"
BY_HAND_TESTS = 3

MATRIX_SUMMARY = re.compile(r"resume matrix: (\d+) cells, (\d+) failing, \d+ expected failures, seed (\d+)")
RERUN = re.compile(r"^\s*rerun: pytest (.*)$")

# The planted bug: the resumed trainer never restores the loader position, so each resume replays
# the current epoch from its first batch (like verl skipping data.pt at a presumed epoch boundary).
CORRECT_LOAD = 'loader.load_state_dict(state["loader"])'
BUGGY_LOAD = "pass  # planted bug: the loader state is not restored"
#: The cause first (the loader position the resume restored), then what it did to the inputs.
STATE_HEADLINE = ("STATE_DIVERGED at step * (the restored step of resume from step_*): data differs "
                  "(loader._num_yielded), model and optimizer agree")
DUPLICATED_LINE = "  also: DUPLICATED * input* after resume from step_*: ids * (epoch*)"


def copy_example(pytester: pytest.Pytester, files: tuple[str, ...]) -> None:
    for name in files:
        shutil.copy(EXAMPLE / name, pytester.path / name)


def plant_bug(trainer: Path) -> None:
    """Replace the one line that restores the loader state (keeping its indentation)."""
    lines = trainer.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip().startswith(CORRECT_LOAD)]
    assert len(hits) == 1, f"the example changed: no single line starts with {CORRECT_LOAD!r}"
    line = lines[hits[0]]
    lines[hits[0]] = line[: len(line) - len(line.lstrip())] + BUGGY_LOAD + "\n"
    trainer.write_text("".join(lines))


def summary(result: pytest.RunResult) -> tuple[int, int, int]:
    """(cells, failing verdicts, seed) from the plugin's terminal summary."""
    for line in result.outlines:
        match = MATRIX_SUMMARY.search(line)
        if match:
            cells, failing, seed = map(int, match.groups())
            return cells, failing, seed
    raise AssertionError("no resume matrix summary line in the output:\n" + result.stdout.str())


def test_matrix_passes_every_cell_of_the_correct_trainer(pytester: pytest.Pytester) -> None:
    copy_example(pytester, (*PROJECT_FILES, BY_HAND))
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-q", timeout=300)
    cells, failing, _ = summary(result)
    # 2 cases x (6 kills after a checkpoint, 2 with unsaved steps, 1 double; path mode: steps 1 and 3, the
    # boundaries 3 and 6, ckpt3+1 and 1 double), and the first case's 3 crash smoke cells in the save of step 2
    # (its save is atomic: nothing to tear)
    assert (cells, failing) == (31, 0)
    result.assert_outcomes(passed=cells + BY_HAND_TESTS)
    assert "builtin_loop" not in result.stdout.str()  # pytest.ini narrows the matrix to this project


#: The example's components, found instead by walking an object that holds what the trainer keeps
#: (``state_of``, as writing-a-target.md offers): the model, the optimizer, the loader and its sampler.
COMPONENTS = """        return {"model": model, "optimizer": optimizer, "rng": torch.get_rng_state(),
                "data": {"loader": loader, "epoch": epoch}}
"""
WALKED = """        held = SimpleNamespace(model=model, optimizer=optimizer, loader=loader, sampler=sampler,
                               epoch=epoch)
        return {**state_of(held), "rng": torch.get_rng_state()}
"""


def test_the_trainer_reporting_through_state_of_passes_every_cell(pytester: pytest.Pytester) -> None:
    # Right after restoring, torchdata's loader and sampler report position 0 until the next iter(): the
    # harness digests the position they will continue from, found on the trainer's objects too.
    copy_example(pytester, PROJECT_FILES)
    trainer = pytester.path / "trainer.py"
    text = trainer.read_text()
    assert text.count(COMPONENTS) == 1, "the example's components() changed"
    trainer.write_text("from types import SimpleNamespace\nfrom pytest_resume_check import state_of\n"
                       + text.replace("from __future__ import annotations\n", "").replace(COMPONENTS, WALKED))
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-q", timeout=300)
    assert summary(result)[:2] == (31, 0), result.stdout.str()[-3000:]


def test_hand_written_resume_tests_pass(pytester: pytest.Pytester) -> None:
    copy_example(pytester, (*PROJECT_FILES, BY_HAND))
    result = pytester.runpytest_subprocess(BY_HAND, "-p", "no:cacheprovider", "-q", timeout=300)
    result.assert_outcomes(passed=BY_HAND_TESTS)


def test_planted_bug_fails_with_a_headline_and_a_rerun_that_reproduces_it(pytester: pytest.Pytester) -> None:
    copy_example(pytester, PROJECT_FILES)
    plant_bug(pytester.path / "trainer.py")

    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-q", timeout=300)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cells, failing, seed = summary(result)
    assert failing > 0
    result.assert_outcomes(passed=cells - failing, failed=failing)
    result.stdout.fnmatch_lines([STATE_HEADLINE, DUPLICATED_LINE,
                                 "*rerun: pytest *--resume-matrix-cell=regression[[]*"])

    # The first failing cell: its headline (from the summary) and its rerun command.
    reruns = list(dict.fromkeys(m.group(1) for m in map(RERUN.match, result.outlines) if m))
    assert len(reruns) == failing  # one per failing cell (the summary repeats some of them)
    args = shlex.split(reruns[0])
    assert f"--resume-matrix-seed={seed}" in args
    cell = next(a for a in args if a.startswith("--resume-matrix-cell=")).partition("=")[2]
    headline = next(line.strip().partition(": ")[2] for line in result.outlines
                    if line.strip().startswith(cell + ": "))
    assert headline.startswith("STATE_DIVERGED at step ")

    again = pytester.runpytest_subprocess(*args, timeout=300)
    again.assert_outcomes(failed=1)
    assert headline in again.outlines  # the same verdict, word for word
    again.stdout.fnmatch_lines([f"*resume matrix: 1 cells, 1 failing, 0 expected failures, seed {seed}*"])


@pytest.mark.parametrize("name", [*PROJECT_FILES, BY_HAND])
def test_guide_quotes_the_example_file_verbatim(name: str) -> None:
    text = (EXAMPLE / name).read_text()
    assert f"\n{text}```\n" in GUIDE.read_text(), f"docs/writing-a-target.md no longer quotes {name} verbatim"
