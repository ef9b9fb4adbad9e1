"""The habits pytest users already have work on matrix cells, checked as a user would: a
project of its own in a temporary folder, ``pytest`` run in a subprocess. The trainer is the torch-free
one of ``project_trainer.py``, so these run in every environment.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from _pytest.mark.expression import Expression
from project_session import pytest_in
from project_session import write_project as project

from pytest_resume_check.process.runner import Runner
from pytest_resume_check.report import summary
from pytest_resume_check.targets import TargetError, resume_target


def failed_ids(out: str) -> list[str]:
    return re.findall(r"^FAILED (resume-matrix::\S+)", out, re.M)


# -- 1, 2: --lf / --ff, pasted node ids, -k ---------------------------------------------------------------

def test_lf_reruns_only_the_failed_cells_and_ff_runs_them_first(tmp_path):
    path = project(tmp_path / "p")
    code, out = pytest_in(path, "--resume-matrix", "-m", "resume_matrix")
    failed = failed_ids(out)
    assert code == 1 and failed and all(f.split("[")[1].startswith("bug-") for f in failed), out[-3000:]
    total = int(re.search(r"resume matrix: (\d+) cells", out).group(1))

    code, out = pytest_in(path, "--resume-matrix", "-m", "resume_matrix", "--lf")  # no seed: the last one
    assert code == 1, out[-3000:]
    assert sorted(failed_ids(out)) == sorted(failed)
    assert f"{len(failed)} failed, " in out and "passed" not in out.splitlines()[-1]
    assert re.search(rf"resume matrix: {len(failed)} cells", out)

    code, out = pytest_in(path, "--resume-matrix", "-m", "resume_matrix", "--ff", "-v")
    ran = re.findall(r"^(resume-matrix::\S+) (PASSED|FAILED)", out, re.M)
    assert len(ran) == total and {n for n, _ in ran[:len(failed)]} == set(failed), out[-3000:]


def test_a_node_id_copied_from_a_failed_line_runs_that_cell(tmp_path):
    path = project(tmp_path / "p")
    (path / "test_other.py").write_text("def test_other():\n    pass\n")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-seed=3")
    node = failed_ids(out)[0]
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix-seed=3", node)  # no --resume-matrix
    assert code == 1, out[-3000:]
    assert failed_ids(out) == [node] and "1 failed" in out and "test_other" not in out

    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix-seed=3", "resume-matrix::files[nope]")
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "node id 'files[nope]': no such cell in this matrix (mode quick, seed 3)" in out


def test_k_can_spell_every_cell_id_including_double_kills(tmp_path):
    path = project(tmp_path / "p", cases="[{'epochs': 2, 'shuffle': True}]")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "--co", "-q")
    names = re.findall(r"^resume-matrix::(\S+)$", out, re.M)
    assert code == 0 and names, out[-3000:]
    for name in names:
        Expression.compile(name)  # raises for what -k cannot spell (',' '@' '=' did)
    double = next(n for n in names if "_ckpt" in n)
    assert double.startswith("files[epochs2-shuffle1-")  # a case without an id: keyvalue pairs
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "--co", "-q", "-k", double)
    assert re.findall(r"^resume-matrix::(\S+)$", out, re.M) == [double], out[-3000:]


# -- 3, 5, 6, 7: the plugin's name, the option shape, paths, the seed -------------------------------------

def test_p_no_resume_check_the_name_in_the_header_disables_the_plugin(tmp_path):
    path = project(tmp_path / "p")
    code, header = pytest_in(path, "--co", "-p", "no:cacheprovider")
    assert re.search(r"^plugins: .*\bresume-check-\d", header, re.M), header[:2000]
    code, out = pytest_in(path, "-p", "no:resume-check", "--resume-matrix")
    assert code == pytest.ExitCode.USAGE_ERROR and "unrecognized arguments: --resume-matrix" in out


def test_resume_matrix_is_a_flag_that_leaves_the_path_after_it_alone(tmp_path):
    path = project(tmp_path / "p", cases="[{'id': 'ok'}]")
    (path / "test_other.py").write_text("def test_other():\n    pass\n")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "test_other.py", "-v")
    assert code == 0, out[-3000:]
    assert "test_other.py::test_other PASSED" in out and "resume-check: matrix=quick" in out
    assert re.search(r"resume-matrix::files\[ok-auto-ckpt1\] PASSED", out)

    # The mode has its own option; ``--resume-matrix=full`` (a spelling no release had) is a usage error.
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix=full", "--co", "-q")
    assert code == pytest.ExitCode.USAGE_ERROR and "--resume-matrix: ignored explicit argument 'full'" in out


def test_a_path_narrows_the_matrix_to_the_targets_its_conftests_declare(tmp_path):
    project(tmp_path / "p" / "a", name="alpha", cases="[{'id': 'ok'}]")
    project(tmp_path / "p" / "b", name="beta", cases="[{'id': 'ok'}]")
    (tmp_path / "p" / "b" / "project_trainer.py").unlink()  # one module of that name on sys.path
    code, out = pytest_in(tmp_path / "p", "-p", "no:cacheprovider", "--resume-matrix", "--co", "-q", "a",
                          env={"PYTHONPATH": str(tmp_path / "p" / "a")})
    ids = re.findall(r"^resume-matrix::(\w+)\[", out, re.M)
    assert code == 0 and set(ids) == {"alpha"}, out[-3000:]


def test_seed_last_with_the_cache_disabled_says_the_cache_is_disabled(tmp_path):
    code, out = pytest_in(project(tmp_path / "p"), "-p", "no:cacheprovider", "--resume-matrix",
                          "--resume-matrix-seed=last")
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--resume-matrix-seed=last: pytest's cache is disabled (-p no:cacheprovider)" in out


# -- 8, 9: --collect-only runs nothing; the hang limit of a target ----------------------------------------

def test_collect_only_runs_no_trainer_even_for_crash_cells(tmp_path):
    path = project(tmp_path / "p", cases="[{'id': 'ok'}]", crash_save="(3, 1)")
    flags = tmp_path / "flags"
    flags.mkdir()
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "--co",
                          env={"TRAINER_FLAG_DIR": str(flags)})
    assert code == 0, out[-3000:]
    assert list(flags.iterdir()) == []  # no run started
    assert "resume-check: files: crash-consistency cells not listed" in out


def test_a_target_declares_its_own_hang_limit(tmp_path):
    path = project(tmp_path / "p", cases="[{'id': 'slow', 'sleep': 3}]", hang_timeout="0.5")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "-k", "ckpt1]")
    assert code == 1, out[-3000:]
    assert "HUNG: the reference run sent no event for 0.5 s" in out


def test_the_command_line_hang_limit_wins_over_the_targets():
    target = resume_target(_fn, steps=1, hang_timeout=5)
    assert Runner(0, 60).hang_limit_of(target) == 5
    assert Runner(0, 60, hang_forced=True).hang_limit_of(target) == 60
    assert Runner(0, 60).hang_limit_of(target.with_options(hang_timeout=None)) == 60
    for bad in (-1, float("nan"), "soon", True):
        with pytest.raises(TargetError, match="hang_timeout=.* is not a number of seconds >= 0"):
            resume_target(_fn, steps=1, hang_timeout=bad)


def _fn(run):
    pass


def test_v_shows_which_passing_cell_paid_for_its_cases_reference_runs(tmp_path):
    code, out = pytest_in(project(tmp_path / "p", cases="[{'id': 'ok'}]"), "-p", "no:cacheprovider",
                          "--resume-matrix", "-v", "-p", "no:xdist")
    assert code == 0, out[-3000:]
    assert len(re.findall(r"PASSED \(reference runs \d+\.\d s\)", out)) == 1  # one case, one process


# -- 10, 12, 13: whose targets, kept evidence, xdist ------------------------------------------------------

def test_an_empty_project_gets_an_error_not_the_installed_packages_matrix(tmp_path):
    (tmp_path / "empty").mkdir()
    code, out = pytest_in(tmp_path / "empty", "-p", "no:cacheprovider", "--resume-matrix")
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--resume-matrix: this project declares no resume-check target" in out
    assert "name one with --resume-matrix-target=NAME" in out


def test_a_project_runs_its_own_targets_and_installed_ones_only_when_named(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    path = project(tmp_path / "p", cases="[{'id': 'ok'}]")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "--co", "-q")
    assert code == 0 and set(re.findall(r"^resume-matrix::(\w+)\[", out, re.M)) == {"files"}, out[-3000:]
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "--co", "-q",
                          "--resume-matrix-target=builtin_loop", "--resume-matrix-target=files")
    assert set(re.findall(r"^resume-matrix::(\w+)\[", out, re.M)) == {"files", "builtin_loop"}, out[-3000:]


def test_a_failing_cell_keeps_what_its_resume_restored_and_names_its_reference(tmp_path):
    path = project(tmp_path / "p", cases="[{'id': 'bug', 'skip': True}]", crash_save=None)
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "-k", "auto-ckpt2]",
                          f"--basetemp={tmp_path / 'bt'}")
    assert code == 1, out[-3000:]
    cell = tmp_path / "bt" / "resume-matrix0" / "files" / "bug" / "auto-ckpt2"
    assert f"kept: {cell} (checkpoints, run*.log, restored-run*: what each resume restored) and " \
           f"{cell.parent / 'reference'} (the uninterrupted runs)" in out
    assert (cell / "restored-run1" / "weights.bin").is_file()  # s2, linked when run 2 restored it
    assert (cell.parent / "reference" / "run0.log").is_file()


def test_two_xdist_workers_each_take_whole_groups_of_a_case_and_resume_mode(tmp_path):
    pytest.importorskip("xdist")
    path = project(tmp_path / "p", cases="[{'id': 'one'}, {'id': 'two'}, {'id': 'three'}]")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "-n", "2", "-v")
    assert code == 0, out[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, group in re.findall(r"^\[(gw\d)\] .*PASSED.* resume-matrix::files\[(\w+-(?:auto|path))-", out, re.M):
        workers.setdefault(group, set()).add(worker)
    assert len(workers) == 6 and all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 2  # and both workers had work


# -- 16: report formats ------------------------------------------------------------------------------------

def test_json_has_a_format_version_and_junit_groups_cells_by_target(tmp_path):
    path = project(tmp_path / "p", cases="[{'id': 'ok'}]")
    code, out = pytest_in(path, "-p", "no:cacheprovider", "--resume-matrix", "-k", "ckpt1]",
                          f"--resume-matrix-json={tmp_path / 'r.json'}", f"--junitxml={tmp_path / 'j.xml'}")
    assert code == 0, out[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["format"] == 2
    classnames = set(re.findall(r'classname="([^"]*)"', (tmp_path / "j.xml").read_text()))
    assert classnames == {"resume-matrix.files"}


def test_the_crash_grid_rows_come_in_one_order_whatever_the_cell_order():
    cells = [{"target": "t", "case_id": "c", "resume_mode": "auto", "passed": True, "xfail_reason": None,
              "categories": [], "kill": f"save3op{op}{suffix}",
              "kills": [{"checkpoint_step": 3, "extra_steps": 0,
                         "fault": {"step": 3, "mode": mode, "op": op, "errno": errno, "persistent": False}}]}
             for op in (0, 1) for suffix, mode, errno in (("", "crash", None), (":power", "power", None),
                                                          (":eio", "error", 5))]
    expected = summary.grid(cells)
    for seed in range(5):
        random.Random(seed).shuffle(cells)
        assert summary.grid(cells) == expected
    rows = [line.split()[0] for line in expected[2:5]]
    assert rows == ["kill", "power", "eio"]


def test_names_and_case_ids_that_would_make_cell_ids_ambiguous_are_refused():
    with pytest.raises(TargetError, match=r"contains '\[' or '\]'"):
        resume_target(_fn, name="loop[v2]", steps=1)
    with pytest.raises(TargetError, match="both get the id 'n12'; they would share one reference"):
        resume_target(_fn, steps=1, cases=[{"n": 12}, {"n1": 2}])
