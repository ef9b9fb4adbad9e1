"""A target that declares GPUs (``resources={"GPU": 1}``) on one machine: with ``-n 2`` each pytest-xdist
worker's runs see only that worker's device, so GPU runs never share one; where there are too few, its
cells fail with one line. Checked by the environment each run sees (no GPU is needed: the devices are the
names ``CUDA_VISIBLE_DEVICES`` gives)."""

from __future__ import annotations

import json

from optional import requires
from project_session import pytest_in, write_project

pytestmark = requires("xdist")


def test_each_worker_runs_see_their_own_device(tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    path = write_project(tmp_path / "project", cases="[{'id': 'a'}, {'id': 'b'}]", name="gpu",
                         resources="{'GPU': 1}")
    code, output = pytest_in(path, "--resume-matrix", "-n", "2", "--resume-matrix-seed=2",
                             env={"CUDA_VISIBLE_DEVICES": "3,5", "TRAINER_FLAG_DIR": str(flags)})
    assert code == 0, output
    seen = {tuple(f.read_text().split()[1:]) for f in flags.iterdir()}
    assert seen == {("gw0", "3"), ("gw1", "5")}, seen  # both workers ran cells, each on its own device


def test_too_few_devices_is_one_line_per_cell(tmp_path):
    path = write_project(tmp_path / "project", cases="[{'id': 'a'}]", name="gpu", resources="{'GPU': 1}")
    code, output = pytest_in(path, "--resume-matrix", "--resume-matrix-json=out.json",
                             env={"CUDA_VISIBLE_DEVICES": ""})
    assert code == 1, output
    cells = json.loads((path / "out.json").read_text())["cells"]
    assert cells and all(c["status"] == "TARGET_ERROR" for c in cells)
    assert {c["headline"] for c in cells} == {
        "TARGET_ERROR: target 'gpu' needs 1 GPU a run (resources=), and this machine shows too few "
        "(CUDA_VISIBLE_DEVICES=''); run it where there are (a Ray cluster with GPUs: --resume-matrix-ray), or "
        "declare no GPU"}
