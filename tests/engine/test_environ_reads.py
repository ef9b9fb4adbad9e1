"""Which environment variables a run read, seen in real runs (forked from the fork server that imported the
trainer's module, and spawned): the project's own reads, at import and in the run, from a thread too; not
the machine's, the harness's (a service's included) or the standard library's. No torch."""

from __future__ import annotations

import environ_target as trainer
import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.report.text import cell_json
from pytest_resume_check.targets import resume_target


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("environ"), seed=3, hang_timeout=60)
    yield engine
    engine.close()


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_a_run_names_the_variables_its_own_code_read_and_no_other(engine, isolation):
    target = resume_target(trainer.train, name=f"environ_{isolation}", steps=trainer.STEPS, preload=("environ_target",),
                           resume_modes=["auto"], crash_save=False, isolation=isolation, services=[trainer.service])
    result = engine.run_cell(Cell(target, {}, "auto", (KillSpec(2),), trainer.STEPS))
    assert result.passed, result.verdict.headline
    assert sorted(result.reference.environ_read) == trainer.COUNTED
    for run in result.runs:  # the resumed run starts past step 2, where the trainer reads RC_TEST_ITEM
        assert set(run.environ_read) <= set(trainer.COUNTED) and "RC_TEST_AT_IMPORT" in run.environ_read
    environment = cell_json(result)["environment"]
    assert environment["read"] == trainer.COUNTED
    assert environment["harness"] == ["PYTEST_RESUME_CHECK_RUN", trainer.SERVICE_ENV]
