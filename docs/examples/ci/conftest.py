"""In CI only, run every case of the built-in loop target a second time with two loader workers.

The ``pytest_resume_check_cases`` hook returns the cases a target runs with (the first plugin or
conftest that returns something wins); returning None leaves the target's own cases.
"""

from __future__ import annotations

import os


def pytest_resume_check_cases(config, target):
    if target.name != "builtin_loop" or not os.environ.get("CI"):
        return None
    with_workers = [{**case, "id": f"{case['id']}-w2", "workers": 2}
                    for case in target.cases if not case.get("workers")]
    return [*target.cases, *with_workers]
