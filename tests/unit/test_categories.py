"""The one table of verdict categories, and the views that must agree with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_resume_check import categories
from pytest_resume_check.judge import verdict
from pytest_resume_check.report import summary

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reading-a-report.md"


def test_the_docs_table_is_the_category_table():
    text = DOCS.read_text()
    block = re.search(r"<!-- categories-table:.*?-->\n(.*?)\n<!-- /categories-table -->", text, re.S)
    assert block is not None, "docs/reading-a-report.md lost its categories-table markers"
    assert block.group(1) == categories.markdown_table()


def test_every_verdict_category_has_a_section_in_the_docs():
    headings = " ".join(line for line in DOCS.read_text().splitlines() if line.startswith("### "))
    assert [name for name in categories.VERDICT_CATEGORIES if name not in headings] == []


def test_marks_are_unique_and_every_category_is_in_the_legend():
    marks = [c.mark for c in categories.TABLE]
    assert len(marks) == len(set(marks))
    legend = " ".join(categories.legend(60))
    assert [c.name for c in categories.TABLE if f"{c.mark} {c.label}" not in legend] == []


def test_the_verdict_reexports_the_table_names():
    assert all(getattr(verdict, name) == name for name in categories.VERDICT_CATEGORIES)


@pytest.mark.parametrize(("cell", "status"), [
    ({"passed": True, "categories": []}, "PASSED"),
    ({"passed": False, "categories": ["LOST", "EPOCH"]}, "LOST"),
    ({"passed": False, "categories": ["RESUME_ERROR"], "xfail_reason": "known"}, "XFAIL"),
    ({"passed": True, "categories": [], "xfail_reason": "known"}, "XPASS"),
    ({"passed": False, "categories": []}, "PROTOCOL"),
], ids=["pass", "first-category", "xfail", "xpass", "no-category"])
def test_status_of_a_cell(cell, status):
    cell = {**cell, "kills": [{"checkpoint_step": 1, "extra_steps": 0}]}
    assert categories.status(cell) == status
    assert summary.mark(cell) == categories.BY_NAME[status].mark
