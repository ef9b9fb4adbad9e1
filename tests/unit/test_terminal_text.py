"""What a trainer wrote reaches the terminal as text: its control characters are shown, not acted on
(``report.text.visible``); and a run whose target raised reports that error even when formatting its
traceback raises (``child.ending.error_text``), instead of dying with multiprocessing's traceback."""

from __future__ import annotations

import sys
import types

import pytest

from pytest_resume_check.child.ending import MSG_NO_STR, MSG_UNFORMATTED, error_text
from pytest_resume_check.report.text import visible


@pytest.mark.parametrize(("raw", "shown"), [
    ("bad \x1b]0;title\x07 and \x1b[2J clear", "bad \\x1b]0;title\\x07 and \\x1b[2J clear"),
    ("100%\rdone", "100%\\rdone"),
    ("csi \x9b2J del \x7f nul \x00", "csi \\x9b2J del \\x7f nul \\x00"),
    ("abc\u202edcba", "abc\\u202edcba"),
    ("lines\n\tand tabs stay, as does ünïcödé", "lines\n\tand tabs stay, as does ünïcödé"),
])
def test_control_characters_from_a_trainer_are_made_visible_and_the_rest_is_kept(raw, shown):
    assert visible(raw) == shown
    assert visible(shown) == shown  # once is enough: shown text acts on nothing


def _raised_in_a_module_whose_source_cannot_be_read() -> BaseException:
    """An error raised in a frame of a module whose loader raises when the traceback asks for its source."""
    class NoSource:
        def get_source(self, name: str) -> str:
            raise ValueError("source is not readable today")

    module = types.ModuleType("hostile_virtual")
    module.__loader__ = NoSource()  # type: ignore[assignment]
    exec(compile("def go():\n    raise RuntimeError('from a frame with no source')\n",
                 "/nonexistent/hostile_virtual.py", "exec"), module.__dict__)
    try:
        module.go()
    except RuntimeError as exc:
        return exc
    raise AssertionError("go() returned")


def test_an_error_whose_frames_cannot_be_formatted_is_still_reported_with_its_frames_and_message():
    error = _raised_in_a_module_whose_source_cannot_be_read()
    try:
        raise error
    except RuntimeError:
        text = error_text(sys.exc_info()[1])
    lines = text.splitlines()
    assert lines[0] == MSG_UNFORMATTED.format(error="ValueError")
    assert lines[-2:] == ['  File "/nonexistent/hostile_virtual.py", line 2, in go',
                          "RuntimeError: from a frame with no source"]


class NoStr(Exception):
    def __str__(self) -> str:
        raise ValueError("no str for you")


class BadNotes(Exception):
    @property
    def __notes__(self) -> list[str]:
        raise KeyError("notes")


class Neither(BadNotes, NoStr):
    pass


@pytest.mark.parametrize(("error", "last"), [
    (NoStr(), "<exception str() failed>"),  # traceback's own words: formatting it did not raise
    (BadNotes("noted"), "noted"),
    (Neither(), MSG_NO_STR.format(error="ValueError")),
])
def test_an_error_whose_own_methods_raise_ends_its_text_with_one_line_naming_it(error, last):
    try:
        raise error
    except Exception:
        text = error_text(sys.exc_info()[1])
    assert text.splitlines()[-1].endswith(last)
    assert type(error).__qualname__ in text.splitlines()[-1]
