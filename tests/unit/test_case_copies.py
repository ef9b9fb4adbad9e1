"""A case a run's process cannot get is refused where the target is declared, with one line naming the case and
the fix: each run gets its case as pickle copies it, and one that cannot be rebuilt there failed in the new
process before any of the harness's code ran (multiprocessing's traceback on the terminal, and the run's death
blamed on the trainer as "died by itself")."""

from __future__ import annotations

import threading

import pytest

from pytest_resume_check.records.declaration import ERR_CASE_NOT_SENT
from pytest_resume_check.targets import TargetError, resume_target


def train(run):  # never run: declaring the targets is the test
    raise AssertionError


def _refuse():
    raise RuntimeError("cannot be rebuilt in the child")


class RebuiltOnlyHere:
    """Pickles, but raises when it is rebuilt, as an object holding a handle of this process would."""

    def __reduce__(self):
        return (_refuse, ())


class Plain:
    """An object of the project's own that pickle copies."""

    def __init__(self, size):
        self.size = size


@pytest.mark.parametrize("value, error", [(RebuiltOnlyHere(), "RuntimeError: cannot be rebuilt in the child"),
                                          (lambda: 1, "PicklingError"),
                                          (threading.Lock(), "TypeError")])
def test_a_case_that_pickle_cannot_copy_is_refused_with_one_line(value, error):
    with pytest.raises(TargetError) as refused:
        resume_target(train, name="copies", steps=2, cases=({"id": "plain"}, {"id": "odd", "thing": value}))
    message = str(refused.value)
    assert message.startswith(ERR_CASE_NOT_SENT.split("{error}")[0].format(name="copies", case_id="odd"))
    assert error in message and "\n" not in message


def test_cases_of_plain_values_and_objects_that_pickle_copies_are_declared():
    target = resume_target(train, name="copies", steps=2, cases=({"n": 1, "sizes": [1, 2]}, {"thing": Plain(3)}))
    assert [case.get("n") for case in target.cases] == [1, None]
