"""The unit wing is the fast loop, so its tests start no process: every phase of each test here (the setup with
its fixtures, module-scoped ones included, the call and the teardown) runs with process starts refused
(``tests/support/no_processes.py``). These hooks run only for the tests under this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from no_processes import refused_process_starts


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with refused_process_starts():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with refused_process_starts():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with refused_process_starts():
        yield
