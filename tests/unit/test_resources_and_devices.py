"""A target's ``resources=`` (what one run needs, checked where it is declared) and the GPUs a run gets on
this machine: one share of the devices per pytest-xdist worker, or one line where there are too few."""

from __future__ import annotations

import pytest

from pytest_resume_check.process.devices import device_env
from pytest_resume_check.targets import TargetError, resume_target, run_resources


def train(run):  # never run: the declarations below are only checked
    pass


def test_resources_are_checked_and_default_to_one_cpu():
    assert run_resources(resume_target(train, steps=2)) == {"CPU": 1.0}
    declared = resume_target(train, steps=2, resources={"GPU": 1, "CPU": 2.5, "fast_disk": 1})
    assert declared.resources == (("CPU", 2.5), ("GPU", 1.0), ("fast_disk", 1.0))
    assert run_resources(declared) == {"CPU": 2.5, "GPU": 1.0, "fast_disk": 1.0}
    for bad in ({"GPU": 0.5}, {"CPU": 0}, {"CPU": -1}, {"CPU": "two"}, {"GPU": True}, {1: 1}, ["CPU"],
                {"CPU": float("inf")}):
        with pytest.raises(TargetError, match=r"resources=.* must map resource names to amounts"):
            resume_target(train, steps=2, resources=bad)


def test_each_xdist_worker_gets_its_own_gpus():
    two_workers = {"CUDA_VISIBLE_DEVICES": "3,5,6,7", "PYTEST_XDIST_WORKER_COUNT": "2"}
    assert device_env("t", 0, two_workers) == {}
    assert device_env("t", 1, {**two_workers, "PYTEST_XDIST_WORKER": "gw0"}) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert device_env("t", 1, {**two_workers, "PYTEST_XDIST_WORKER": "gw1"}) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert device_env("t", 2, {**two_workers, "PYTEST_XDIST_WORKER": "gw1"}) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert device_env("t", 2, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {"CUDA_VISIBLE_DEVICES": "0,1"}  # no xdist
    with pytest.raises(ValueError, match=r"worker gw2 \(of 3 pytest-xdist workers\) has none of this machine's 2 "
                                         r"devices \(0,1\) left to itself; run with -n 2 or fewer"):
        device_env("t", 1, {"CUDA_VISIBLE_DEVICES": "0,1", "PYTEST_XDIST_WORKER": "gw2",
                            "PYTEST_XDIST_WORKER_COUNT": "3"})
    with pytest.raises(ValueError, match=r"target 't' needs 1 GPU a run .* shows too few \(CUDA_VISIBLE_DEVICES=''\)"):
        device_env("t", 1, {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(ValueError, match=r"needs 3 GPUs a run .* too few \(only 2: CUDA_VISIBLE_DEVICES='0,1'\)"):
        device_env("t", 3, {"CUDA_VISIBLE_DEVICES": "0,1"})
