"""What a reader cannot open is not named: no internal issue numbers in the package, the tests, the
benchmarks or the docs (a reader has no tracker to look them up in; the history is in CHANGELOG.md and the
commit messages), no path of the machine the docs were written on, and no private module of the package on
a user's page (design.md and CONTRIBUTING.md map the internals for maintainers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: "issue 29", "issues 12 and 14", "(issue 19, item 7)"; and a bare "#44" that no repository precedes (an
#: upstream reference is written owner/repo#N or as a link to it). Hex colours have six digits.
ISSUE = re.compile(r"\b[Ii]ssues? \d+|(?<![\w/.#-])#\d{1,4}\b(?![\da-fA-F]|\]\(https://)")
#: Paths of the machine: its work tree, root's home, pytest's folders as root. Example output uses the
#: placeholder user ``ci``.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|opt)/|pytest-of-root|/Users/")
#: A private module of ours: a ``_``-prefixed part after one of our packages' names.
PRIVATE_MODULE = re.compile(r"\b(?:pytest_resume_check|agentlightning|process|child|records|plugin|cells|judge|report"
                            r"|cluster)(?:\.[a-z]\w*)*\._[a-z]\w*")
#: The pages for maintainers, which map the private modules.
MAINTAINER_PAGES = {"docs/design.md", "CONTRIBUTING.md"}
#: Text files of the repository that are read here (the generated site and environments are not).
SOURCES = ("pytest_resume_check", "agentlightning", "tests", "benchmarks", "docs")
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".ini", ".js", ".css", ".sh", ".txt"}
TOP_FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "mkdocs.yml", "pyproject.toml", "tox.ini", "action.yml")


def text_files() -> list[Path]:
    # An sdist holds fewer of them (no benchmarks, no action): what is there is read.
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).is_file()]
    for folder in SOURCES:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in SUFFIXES and p.is_file()
                  and "__pycache__" not in p.parts]
    return files


def pages() -> list[Path]:
    return [p for p in text_files() if p.suffix == ".md"]


def found(pattern: re.Pattern[str], files: list[Path]) -> list[str]:
    out = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if path == Path(__file__) and "re.compile" in line:
                continue
            for match in pattern.finditer(line):
                out.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    return out


def test_no_internal_issue_numbers():
    this = Path(__file__)
    assert found(ISSUE, [p for p in text_files() if p != this]) == []


def test_no_page_names_a_path_of_this_machine():
    assert found(MACHINE_PATH, pages()) == []


def test_only_the_maintainers_pages_name_private_modules():
    users = [p for p in pages() if p.relative_to(ROOT).as_posix() not in MAINTAINER_PAGES]
    assert found(PRIVATE_MODULE, users) == []


@pytest.mark.parametrize(("text", "hits"), [
    ("shared first runs (issue 30) and (issue 19, item 7); issues 12 and 14", ["issue 30", "issue 19", "issues 12"]),
    ("see #44 and (#7)", ["#44", "#7"]),
    ("huggingface/accelerate#2574, meta-pytorch/data#1437, [#2574](https://github.com/a/b/issues/2574)", []),
    ('colour="#333333", background:#123456', []),
])
def test_the_issue_pattern_finds_internal_numbers_and_leaves_upstream_links(text, hits):
    assert [m.group(0) for m in ISSUE.finditer(text)] == hits


def test_the_other_patterns_find_what_they_name():
    assert MACHINE_PATH.search("kept: /tmp/pytest-of-root/pytest-7/x") and MACHINE_PATH.search("see /work/main")
    assert not MACHINE_PATH.search("kept: /tmp/pytest-of-ci/pytest-3/x")
    assert PRIVATE_MODULE.search("the fork server's process._preload_end entry")
    assert not PRIVATE_MODULE.search("torch._dynamo, os._exit and loader._num_yielded")
