"""The step summary in Markdown and the reproduction folder's texts, from cells' JSON:
the counts line, each target's grid, the failing cells with their rerun commands in code blocks (the
smallest failing kill point of each case first), marks and labels from the one table, markup in a
headline escaped, and never more bytes than it is given (what is left out is counted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_resume_check import categories
from pytest_resume_check.records import kill_ids
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.report import markdown, repro, summary

HEADER = "resume matrix: 3 cells, 2 failing, 0 expected failures, seed 7"


def cell(target="t", case="c", kill=None, passed=False, category=categories.LOST, headline=None,
         xfail_reason=None):
    """A cell's JSON as the plugin carries it (with its rerun command)."""
    kill = kill or (KillSpec(1),)
    data = {"target": target, "case": {"id": case}, "case_id": case, "resume_mode": "auto",
            "kill": kill_ids.kill_id(kill), "kills": [k.to_json() for k in kill], "passed": passed,
            "xfail_reason": xfail_reason, "categories": [] if passed else [category],
            "headline": "PASSED" if passed else headline or f"{category} at {kill_ids.kill_id(kill)}"}
    data["status"] = categories.status(data)
    data["rerun"] = f"pytest --resume-matrix --resume-matrix-seed=7 '--resume-matrix-cell={summary.cell_name(data)}'"
    return data


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^ *(`{3,})(\w*)\n.*?^ *\1$", text, re.M | re.S)


def test_the_summary_has_the_counts_line_each_grid_and_the_failing_cells_with_their_commands():
    cells = [cell(kill=(KillSpec(1),)), cell(kill=(KillSpec(2),)), cell(kill=(KillSpec(3),), passed=True),
             cell(target="u", kill=(KillSpec(1),), passed=True)]
    text = markdown.step_summary(cells, HEADER)
    assert text.splitlines()[0] == f"### {HEADER}"
    for target in ("t", "u"):
        assert f"#### {target}\n\n```text\n{target}: " in text
    assert "t: 3 cells, columns are kill points" in text
    grid_rows = [line for line in text.splitlines() if line.startswith("c auto")]
    assert grid_rows == ["c auto  L L .", "c auto  ."]
    assert "`.` pass · `L` lost" in text  # the legend: the marks shown, labelled as the table says
    for c in cells[:2]:
        name = summary.cell_name(c)
        assert f"- `{name}`: {c['headline']}" in text
        assert f"  ```sh\n  {c['rerun']}\n  ```" in text
    assert summary.cell_name(cells[2]) not in text
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_the_smallest_failing_kill_point_of_each_case_comes_first():
    cells = [cell(kill=(KillSpec(1), KillSpec(3, 1))), cell(kill=(KillSpec(4),)), cell(kill=(KillSpec(2),))]
    text = markdown.step_summary(cells, HEADER)
    listed = re.findall(r"^- `(t\[[^]]+\])`", text, re.M)
    assert listed[0] == "t[c-auto-ckpt2]"
    assert sorted(listed) == sorted(summary.cell_name(c) for c in cells)


def test_an_expected_failure_is_counted_but_not_listed_and_a_fixed_one_is_listed_as_xpass():
    xfail = cell(kill=(KillSpec(1),), xfail_reason="known")
    xpass = cell(kill=(KillSpec(2),), passed=True, xfail_reason="known")
    text = markdown.step_summary([xfail, xpass], HEADER)
    assert summary.cell_name(xfail) not in text.split("#### Failing cells")[1]
    assert "XPASS: declared as an expected failure (known) but passed" in text
    assert "`x` expected failure" in text and "`!` fixed (xfail passed)" in text


def test_markup_in_a_headline_is_escaped_and_backticks_cannot_end_a_block():
    hostile = cell(headline="LOST <img src=x> *all* of `ids` | [link](http://x)")
    hostile["rerun"] = "pytest ```weird``` --resume-matrix"
    text = markdown.step_summary([hostile], HEADER)
    assert r"LOST \<img src=x\> \*all\* of \`ids\` \| \[link\](http://x)" in text
    assert "  ````sh\n  pytest ```weird``` --resume-matrix\n  ````" in text


@pytest.mark.parametrize("text, span", [("a", "`a`"), ("a`b", "``a`b``"), ("`a", "`` `a ``")])
def test_a_code_span_is_delimited_by_more_backticks_than_it_holds(text, span):
    assert markdown.code_span(text) == span


@pytest.mark.parametrize("limit", [4096, 20_000, 200_000])
def test_the_summary_never_exceeds_its_bytes_and_says_how_many_cells_it_left_out(limit):
    cells = [cell(case=f"case{i}", kill=(KillSpec(k),), headline="LOST " + "é" * 300) for i in range(100)
             for k in range(1, 6)]
    text = markdown.step_summary(cells, HEADER, listed=1000, max_bytes=limit)
    assert len(text.encode()) <= limit
    shown = len(re.findall(r"^- `", text, re.M))
    assert shown < len(cells)
    assert f"... and {len(cells) - shown} more failing cells" in text
    assert all(fence for fence, _ in fenced_blocks(text))  # every block it opened it closed


def test_grids_that_do_not_fit_are_counted_too():
    cells = [cell(target=f"target{t}", case=f"case{i}", kill=(KillSpec(k),), passed=True)
             for t in range(30) for i in range(10) for k in range(1, 30)]
    text = markdown.step_summary(cells, HEADER, max_bytes=8192)
    assert len(text.encode()) <= 8192
    shown = len(re.findall(r"^#### target", text, re.M))
    assert 0 < shown < 30
    assert f"... and the grids of {30 - shown} more targets" in text


def test_the_list_stops_at_listed_cells():
    cells = [cell(kill=(KillSpec(k),)) for k in range(1, 8)]
    text = markdown.step_summary(cells, HEADER, listed=3)
    assert len(re.findall(r"^- `", text, re.M)) == 3
    assert "... and 4 more failing cells: every cell is in the terminal log and the JSON report" in text


# -- the reproduction folder's texts ---------------------------------------------------------------------

@pytest.mark.parametrize("name, folder", [
    ("files[bug-auto-ckpt2]", "files-bug-auto-ckpt2"),
    ("t[c-auto-ckpt5+1:term2]", "t-c-auto-ckpt5+1_term2"),
    ("t[a/b-path-ckpt1_ckpt7+1]", "t-a_b-path-ckpt1_ckpt7+1"),
    ("..[x]", "_.-x"),
])
def test_a_cell_name_becomes_a_safe_folder_name(name, folder):
    assert repro.folder_name(name) == folder
    assert "/" not in repro.folder_name(name) and len(repro.folder_name("t[" + "x" * 400 + "]")) <= repro.NAME_CHARS


def test_a_folder_that_reproduces_another_cell_is_not_written_over(tmp_path):
    first = repro.write(repro.folder_for(tmp_path, "t[a:b]"), example("t[a:b]"))
    assert repro.folder_for(tmp_path, "t[a:b]") == first  # the same cell again: the same folder
    second = repro.folder_for(tmp_path, "t[a_b]")
    assert second.name == first.name + "-2"


def example(name="t[c-auto-ckpt1]", **kw):
    return repro.Repro(name=name, target="t", headline="LOST 1 input", excerpt=["  reference: 1", "  resumed:   2"],
                       command=f"pytest --resume-matrix '--resume-matrix-cell={name}' --resume-matrix-target=t",
                       report="LOST 1 input\n  rerun: pytest x", **kw)


def test_the_readme_starts_with_the_cell_its_headline_and_excerpt_then_the_command(tmp_path):
    conftest = Path("tests/conftest.py")  # relative to the project's root
    text = repro.readme_text(example(root=tmp_path, copies={"conftest.py": conftest}, declared_in=conftest,
                                     ini={"resume_matrix_hang_timeout": "5"}))
    lines = text.splitlines()
    assert lines[0] == "# Reproduction of the resume-matrix cell `t[c-auto-ckpt1]`"
    assert lines[2:6] == ["```text", "LOST 1 input", "  reference: 1", "  resumed:   2"]
    command = text.split(repro.RUN_TITLE)[1].split("```bash\n")[1].split("\n")[0]
    assert command == "pytest --resume-matrix '--resume-matrix-cell=t[c-auto-ckpt1]' --resume-matrix-target=t"
    assert "`conftest.py`: a copy of the project's `tests/conftest.py`, which declares the target `t`" in text
    ini = repro.ini_text(example(ini={"resume_matrix_hang_timeout": "5"}))
    assert ini.startswith("[pytest]\n") and "pythonpath = .\n" in ini
    assert ini.endswith("resume_matrix_hang_timeout = 5\n")


def test_the_readme_of_an_installed_target_says_the_command_finds_it():
    text = repro.readme_text(example())
    assert "`--resume-matrix-target=t` in the command finds where it is installed" in text
