"""A reproduction folder holds only files of the project's root and names no path of the machine: the
README's paths (a traceback's files, the kept folders) with the machine's places named, relative to the
project's root below it; a copy read only as a regular file inside that root; the places a session names."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pytest_resume_check.plugin import project_files
from pytest_resume_check.records.regular_files import KIND_FIFO
from pytest_resume_check.report import repro

PLACES = {"/home/ann/proj": "", "/home/ann": "~", "/home/ann/proj/.venv/bin/python": "python",
          "/opt/py/lib/python3.11/site-packages": "<site-packages>", "/tmp/pytest-of-ann/pytest-3": "<basetemp>"}


def test_paths_below_the_projects_root_are_written_relative_to_it_and_other_places_by_name():
    text = ('  File "/home/ann/proj/train.py", line 3\n'
            '  File "/opt/py/lib/python3.11/site-packages/torch/nn.py", line 9\n'
            "kept: /tmp/pytest-of-ann/pytest-3/resume-matrix0/t/c (checkpoints)\n"
            "/home/ann/proj/.venv/bin/python -m x; rootdir: /home/ann/proj, notes in /home/ann/notes.txt")
    assert repro.without_machine_paths(text, PLACES) == (
        '  File "train.py", line 3\n'
        '  File "<site-packages>/torch/nn.py", line 9\n'
        "kept: <basetemp>/resume-matrix0/t/c (checkpoints)\n"
        "python -m x; rootdir: ., notes in ~/notes.txt")


def test_a_place_matches_only_whole_path_components():
    text = "/srv/home/ann/b.py /home/anna/c.py /home/ann.d /opt/py/lib/python3.11/site-packages-old/d.py"
    assert repro.without_machine_paths(text, PLACES) == text
    assert repro.without_machine_paths("/home/ann/proj2/a.py", PLACES) == "~/proj2/a.py"  # not the root's
    assert repro.without_machine_paths("x", {}) == "x"


def test_a_readme_names_modules_from_outside_the_project_by_name_and_the_reports_paths_by_place(tmp_path):
    text = repro.readme_text(repro.Repro(
        name="t[c-auto-ckpt1]", target="t", headline="RESUME_ERROR: /home/ann/proj/x.py", excerpt=[],
        command="pytest x", report='  File "/home/ann/secrets/site_settings.py", line 1', root=tmp_path,
        outside=["site_settings"], not_copied=["`m` (/home/ann/proj/m.so): not a Python source file"],
        places=PLACES))
    assert "- needed, not copied: site_settings (from outside the project)\n" in text
    assert "RESUME_ERROR: x.py\n" in text and "(m.so)" in text
    assert '  File "~/secrets/site_settings.py", line 1' in text and "/home/ann" not in text


def test_a_copy_that_is_no_regular_file_inside_the_root_is_left_out_and_named(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "own.py").write_text("A = 1\n")
    (tmp_path / "settings.py").write_text("TOKEN = 'x'\n")
    (root / "linked.py").symlink_to(tmp_path / "settings.py")  # replaced by a link out after it was chosen
    os.mkfifo(root / "fifo.py")
    folder = repro.write(tmp_path / "out", repro.Repro(
        name="t[c-auto-ckpt1]", target="t", headline="LOST 1 input", excerpt=[], command="pytest x", report="",
        root=root, copies={"own.py": Path("own.py"), "linked.py": Path("linked.py"), "fifo.py": Path("fifo.py")},
        places={str(tmp_path): "<tmp>"}))
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "own.py", "pytest.ini"]
    readme = (folder / repro.README).read_text()
    assert "- `own.py`: a copy of the project's `own.py`\n" in readme and "`linked.py`: a copy" not in readme
    assert f"- not copied: `fifo.py` is {KIND_FIFO}\n" in readme
    assert "- not copied: `linked.py` is a symbolic link to <tmp>/settings.py, outside <tmp>/proj\n" in readme


def test_a_file_is_inside_the_root_only_if_its_links_resolve_inside(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("")
    (tmp_path / "elsewhere.py").write_text("")
    (root / "link.py").symlink_to(tmp_path / "elsewhere.py")
    assert project_files.inside_root(root / "pkg" / "mod.py", root) == Path("pkg/mod.py")
    assert project_files.inside_root(root / "pkg" / ".." / "pkg" / "mod.py", root) == Path("pkg/mod.py")
    assert project_files.inside_root(root / "link.py", root) is None
    assert project_files.inside_root(root / ".." / "elsewhere.py", root) is None


class Config:
    """What :func:`project_files.machine_places` asks of pytest's config: no base temporary directory."""


#: Installed distributions by top-level name, as :func:`importlib.metadata.packages_distributions` gives them.
INSTALLED = {"pytest_resume_check": ["pytest-resume-check"], "pytest": ["pytest"]}


def test_the_places_of_a_session_name_the_interpreter_and_leave_paths_in_the_project_relative(tmp_path):
    places = project_files.machine_places(Config(), tmp_path, INSTALLED)  # type: ignore[arg-type]
    assert places[str(tmp_path)] == "" and places[sys.executable] == project_files.PLACE_PYTHON
    assert places[sys.prefix] == project_files.PLACE_PREFIX
    harness = str(Path(project_files.__file__).parents[1])  # the package folder
    assert places[harness] == f"{project_files.PLACE_SITE_PACKAGES}/pytest_resume_check"  # editable or not
    inner = project_files.machine_places(Config(), Path(sys.prefix), INSTALLED)  # type: ignore[arg-type]
    assert inner[sys.prefix] == "" and inner[sys.executable] == project_files.PLACE_PYTHON
    assert not [p for p, name in inner.items() if name not in ("", project_files.PLACE_PYTHON)
                and Path(p).resolve().is_relative_to(Path(sys.prefix).resolve())]


def test_a_conftest_from_outside_the_project_that_declares_the_target_is_named_not_copied():
    text = repro.readme_text(repro.Repro(name="t[c-auto-ckpt1]", target="t", headline="LOST 1 input", excerpt=[],
                                         command="pytest x", report="", declared_outside="conftest"))
    assert repro.DECLARED_OUTSIDE.format(target="t", module="conftest") + "\n" in text
    assert "is not declared by a conftest.py of the project" not in text  # not an installed package's either
