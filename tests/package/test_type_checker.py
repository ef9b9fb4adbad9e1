"""What a type checker sees of the public API: a target declared either way has the type ``Target``, and a misspelt
or mistyped option is an error (mypy, run in this process; the declaration's options themselves:
tests/unit/test_public_modules.py)."""

from __future__ import annotations

import pytest

TYPED = '''
from typing_extensions import assert_type
from collections.abc import Callable
from pytest_resume_check.run import RunContext
from pytest_resume_check.targets import Target, resume_target

def fn(run: RunContext) -> None: ...

assert_type(resume_target(fn, steps=2, world_size=2), Target)
assert_type(resume_target(steps=2, cases=[{}]), Callable[[Callable[[RunContext], None]], Target])
resume_target(fn, steps=2, world_sise=2)
resume_target(fn, steps=2, capture_rng="no")
assert_type(resume_target.command(["{python}", "train.py"], name="script", steps=2, checkpoints="*.pt"), Target)
resume_target.command(["{python}", "train.py"], name="script", steps=2, world_sise=2)
import pytest_resume_check as package
assert_type(package.resume_target.command(["{python}", "train.py"], name="script", steps=2), package.Target)
package.resume_target(fn, steps=2, world_sise=2)
'''


@pytest.mark.slow  # mypy checks the package: about 30 s
def test_a_type_checker_sees_a_target_and_refuses_a_misspelt_or_mistyped_option(tmp_path):
    api = pytest.importorskip("mypy.api")
    probe = tmp_path / "probe.py"
    probe.write_text(TYPED, encoding="utf-8")
    out, _, _ = api.run([str(probe), "--python-version", "3.10", "--no-incremental", "--follow-imports=silent",
                         "--ignore-missing-imports", "--no-error-summary", "--hide-error-context"])
    errors = sorted(line.split(":", 1)[1].split(":", 1)[0] for line in out.splitlines() if ": error:" in line)
    assert sorted(set(errors)) == ["11", "12", "14", "17"], out
