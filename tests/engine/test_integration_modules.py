"""The integrations' modules, each imported with its framework (seconds each: Lightning, transformers): each imports
where its framework is installed, the preload strings users copy from the bundled targets name real modules
and functions, and the components and settings the known findings read (``report.known_findings``) are the
ones the integrations report. The known findings themselves, without the frameworks:
tests/unit/test_known_findings.py; the other public paths: tests/unit/test_public_api.py."""

from __future__ import annotations

import importlib

import pytest
from optional import requires

from pytest_resume_check.report import known_findings

#: The integrations, each with the framework it needs.
INTEGRATIONS = {"lightning": "lightning", "accelerate": "accelerate", "hf_trainer": "transformers"}


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_each_integration_imports_where_its_framework_is_installed(name):
    pytest.importorskip("torch")
    pytest.importorskip(INTEGRATIONS[name])
    importlib.import_module(f"pytest_resume_check.integrations.{name}")


@requires("torch", "torchdata")
def test_the_preload_strings_users_copy_name_real_modules_and_functions():
    from pytest_resume_check.builtin.targets import TARGETS

    entries = {entry for target in TARGETS for entry in target.preload if entry.startswith("pytest_resume_check")}
    assert "pytest_resume_check.builtin.loop:warm_up" in entries
    for entry in sorted(entries):
        module, _, function = entry.partition(":")
        imported = importlib.import_module(module)
        assert not function or callable(getattr(imported, function)), entry


@pytest.mark.parametrize("module, constant, evidence", [
    ("pytest_resume_check.integrations.lightning", "STATE_FIT_LOOP", "lightning-epoch-end-resume"),
    ("pytest_resume_check.integrations.hf_trainer", "STATE_TRAINER", "hf-trainer-rng-after-collate"),
    ("pytest_resume_check.integrations.hf_trainer", "STATE_TRAINER", "hf-trainer-state-not-durable"),
])
def test_the_evidence_is_the_integrations_own_component(module, constant, evidence):
    integration = pytest.importorskip(module)
    entry = next(k for k in known_findings.TABLE if k.id == evidence)
    assert entry.evidence == getattr(integration, constant)


@pytest.mark.parametrize("module, constant, copy", [
    ("pytest_resume_check.integrations.hf_trainer", "SETTING_WORKERS", "SETTING_WORKERS"),
    ("pytest_resume_check.integrations.hf_trainer", "STATE_BATCH", "BATCH"),
    ("pytest_resume_check.integrations.hf_trainer", "STATE_MODEL", "MODEL"),
    ("pytest_resume_check.integrations.hf_trainer", "STATE_RNG", "RNG"),
    ("pytest_resume_check.integrations.hf_trainer", "TRAINER_STATE_FILE", "TRAINER_STATE_FILE"),
    ("pytest_resume_check.integrations.lightning", "SETTING_STATEFUL_LOADER", "SETTING_STATEFUL_LOADER"),
    ("pytest_resume_check.integrations.lightning", "SETTING_EPOCH_END_FIX", "SETTING_EPOCH_END_FIX"),
    ("pytest_resume_check.integrations.accelerate", "SETTING_LOADER_GENERATOR", "SETTING_LOADER_GENERATOR"),
])
def test_what_the_conditions_read_is_what_the_integrations_report(module, constant, copy):
    integration = pytest.importorskip(module)
    assert getattr(known_findings, copy) == getattr(integration, constant)
