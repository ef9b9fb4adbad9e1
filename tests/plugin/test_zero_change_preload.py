"""A zero-change script fast without tuning: the fork server preloads the installed packages the script imports
anywhere (inside a function too) and those its own modules import, and when its runs still import a package
themselves, the session's note names it.

Every session is a subprocess: the fork server's state lives in the process that starts it. No timing is
asserted: the packages are installed in the project's ``site`` folder (on pytest's ``pythonpath``) and leave a
file per process that imported them; each run leaves a file with its pid.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

from pytest_resume_check.plugin import summary

PROBE_ENV = "ZERO_CHANGE_PRELOAD_PROBE"

#: An installed package: notes each process that imports it; ``started()`` notes a run.
PACKAGE = """
import os
from pathlib import Path

PROBE = Path(os.environ["ZERO_CHANGE_PRELOAD_PROBE"])
(PROBE / f"import-{__name__}-{os.getpid()}").touch()


def started():
    (PROBE / f"run-{os.getpid()}").touch()
"""

#: A script with no client calls: two steps, a JSON checkpoint each, resumed from the newest. ``{imports}``: the
#: body of ``load()``, which imports what the run needs.
SCRIPT = """
import glob
import json
import os
import sys
{top}

def load():
{imports}


def train(out):
    load().started()
    found = sorted(glob.glob(os.path.join(out, "step_*.json")))
    step = json.load(open(found[-1]))["step"] if found else 0
    while step < 2:
        step += 1
        with open(os.path.join(out, "tmp"), "w") as f:
            json.dump({{"step": step}}, f)
        os.replace(os.path.join(out, "tmp"), os.path.join(out, f"step_{{step}}.json"))


if __name__ == "__main__":
    train(sys.argv[1])
"""

CONFTEST = """
{first}
from pytest_resume_check import resume_target

t = resume_target.command(["{{python}}", "train.py", "{{checkpoint_dir}}"], name="t", steps=2,
                          checkpoints="step_*.json", resume_modes=["auto"], crash_save=False)
"""

#: In the session's process (which prints the note): the note's thresholds at zero, so it always shows.
NOTE_ALWAYS = ("from pytest_resume_check.plugin import summary as _summary\n"
               "_summary.NOTE_SHARE = _summary.NOTE_MEDIAN = _summary.NOTE_TOTAL = 0.0\n")


@pytest.fixture
def project(pytester, monkeypatch):
    """A project with the packages ``probe_pkg`` and ``hidden_pkg`` installed in its ``site`` folder; its session
    files under a short temporary folder (the fork server's socket path has a length limit)."""
    tmp = tempfile.mkdtemp(prefix="rc-")
    monkeypatch.setenv("TMPDIR", tmp)
    probe = pytester.path / "probe"
    probe.mkdir()
    monkeypatch.setenv(PROBE_ENV, str(probe))
    for name in ("probe_pkg", "hidden_pkg"):
        (pytester.path / "site" / name).mkdir(parents=True)
        (pytester.path / "site" / name / "__init__.py").write_text(PACKAGE)
    pytester.makefile(".ini", pytest="[pytest]\npythonpath = site\n")
    yield pytester
    shutil.rmtree(tmp, ignore_errors=True)


def run_matrix(pytester, script: str, first: str = ""):
    pytester.makepyfile(train=script)
    pytester.makeconftest(CONFTEST.format(first=first))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--resume-matrix",
                                           "--resume-matrix-seed=1", "--resume-matrix-target=t")
    result.assert_outcomes(passed=2)
    return result


def runs(pytester) -> set[int]:
    found = {int(p.name.split("-")[1]) for p in (pytester.path / "probe").glob("run-*")}
    assert len(found) >= 3  # the reference, killed runs and their resumes
    return found


def importers(pytester, package: str) -> set[int]:
    return {int(p.name.rsplit("-", 1)[1]) for p in (pytester.path / "probe").glob(f"import-{package}-*")}


def test_a_package_a_script_imports_only_inside_a_function_is_preloaded(project):
    run_matrix(project, SCRIPT.format(top="", imports="    import probe_pkg\n    return probe_pkg"))
    assert importers(project, "probe_pkg")  # the fork server imported it
    assert not importers(project, "probe_pkg") & runs(project)  # and no run imported it again


def test_a_package_the_scripts_own_module_imports_in_a_function_is_preloaded(project):
    (project.path / "helpers.py").write_text("def package():\n    import probe_pkg\n    return probe_pkg\n")
    run_matrix(project, SCRIPT.format(top="import helpers", imports="    return helpers.package()"))
    assert importers(project, "probe_pkg")
    assert not importers(project, "probe_pkg") & runs(project)


def test_the_note_names_the_package_the_runs_imported_themselves(project):
    # Imported by a name the source does not hold: no reading of it finds the package, the run sees it imported.
    hidden = '    import importlib\n    return importlib.import_module("hidden" + "_pkg")'
    result = run_matrix(project, SCRIPT.format(top="", imports=hidden), first=NOTE_ALWAYS)
    assert importers(project, "hidden_pkg") <= runs(project)  # each run imported it itself
    notes = [line for line in result.outlines if "before their first step" in line]
    assert len(notes) == 1
    assert 'preload=("hidden_pkg",)' in notes[0], notes[0]
    assert notes[0].endswith(summary.TIME_NOTE_IMPORTED.split("{preload}")[1].split("{why}")[0])
