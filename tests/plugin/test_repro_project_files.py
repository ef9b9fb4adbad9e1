"""A reproduction folder (``--resume-matrix-repro``) holds only the project's own files, and its README no
path of the machine: a CI job uploads the folders as an artifact. The project's conftest imports a settings
module (holding a token) from a folder beside the project, put on ``sys.path`` by the conftest itself, as a
machine's local settings are; the README names that module as needed, by its name alone, and the cell fails
again from the folder once the user provides it. The trainer is the torch-free one of ``project_trainer.py``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from project_trainer import write_project

from pytest_resume_check.plugin.options import GITHUB_STEP_SUMMARY
from pytest_resume_check.records.names import OPT_REPRO
from pytest_resume_check.report import repro as repro_folder

TOKEN = "token-8f41c2e9d7"
SETTINGS = f'''"""This machine's settings (beside the project, never part of it)."""
TOKEN = {TOKEN!r}


def refuse(step):
    raise RuntimeError(f"no resume from step {{step}} on this machine")
'''
CONFTEST = '''import os
import sys

# The machine's settings live beside the project, as a developer's local settings do.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "machine"))

import site_settings  # noqa: E402
import project_trainer  # noqa: E402
from pytest_resume_check import resume_target  # noqa: E402


def train(run):
    latest = run.checkpoint_dir / "latest"
    if run.case.get("raise") and latest.exists():
        site_settings.refuse(int(latest.read_text()))
    project_trainer.train(run)


t = resume_target(train, name="files", steps=project_trainer.STEPS, preload=("project_trainer",), crash_save=False,
                  cases=[{"id": "bug", "skip": True}, {"id": "raise", "raise": True}])
'''
LOST = "files[bug-auto-ckpt2]"
RAISED = "files[raise-auto-ckpt2]"
#: An absolute path in a text: a ``/`` that starts a path (not one after a name such as ``<basetemp>``).
ABSOLUTE = re.compile(r"(?<![\w.>~*-])/[^\s`'\"),]+")
#: Where the venv's pytest is: a README's command starts with ``pytest``.
BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One session of the project with both cells failing, their folders in ``repro``."""
    tmp = tmp_path_factory.mktemp("outside-modules")
    machine = tmp / "machine"
    machine.mkdir()
    (machine / "site_settings.py").write_text(SETTINGS)
    project = write_project(tmp / "p", "files", "[]")
    (project / "conftest.py").write_text(CONFTEST)
    base = {k: v for k, v in os.environ.items() if k != GITHUB_STEP_SUMMARY}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--resume-matrix", "-m", "resume_matrix", "--resume-matrix-seed=5", "-k", "ckpt2]",
                           f"{OPT_REPRO}=../repro"], cwd=project, env={**base, "PYTHONPATH": str(project)},
                          capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "2 failed" in out, out[-3000:]
    return tmp, out


def folder_of(tmp: Path, name: str) -> Path:
    return tmp / "repro" / repro_folder.folder_name(name)


def test_a_module_from_outside_the_project_is_named_in_the_readme_never_copied(session):
    tmp, _ = session
    for name in (LOST, RAISED):
        folder = folder_of(tmp, name)
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert files == ["README.md", "conftest.py", "project_trainer.py", "pytest.ini"]
        assert all(TOKEN not in (folder / f).read_text() for f in files)
        readme = (folder / repro_folder.README).read_text()
        assert repro_folder.NEEDED_OUTSIDE.format(name="site_settings") + "\n" in readme
        assert "- `project_trainer.py`: a copy of the project's `project_trainer.py`\n" in readme
        assert "- `conftest.py`: a copy of the project's `conftest.py`, which declares the target `files`\n" in readme


def test_a_readme_names_no_path_of_the_machine(session):
    """The traceback of the raising cell names the project's conftest, the settings module on its
    ``sys.path`` entry and the harness's own files; the report names the kept folders in the base temporary
    directory; the copies name where they come from. None of them by its absolute path."""
    tmp, _ = session
    machine_paths = {str(tmp), os.path.realpath(tmp), sys.prefix, sys.base_prefix, os.path.expanduser("~"),
                     sys.executable, str(Path(repro_folder.__file__).parents[2])}
    for name in (LOST, RAISED):
        readme = (folder_of(tmp, name) / repro_folder.README).read_text()
        assert ABSOLUTE.findall(readme) == [], readme
        assert not [path for path in machine_paths if path in readme], readme
        assert "kept: <basetemp>/" in readme
    readme = (folder_of(tmp, RAISED) / repro_folder.README).read_text()
    assert '  File "conftest.py", line ' in readme  # the project's file, relative to its root
    assert '  File "<sys.path>/site_settings.py", line ' in readme  # named by where Python found it
    lines = {line.strip() for line in readme.splitlines()}
    assert set(quoted_readme_lines()) <= lines  # docs/github.md quotes this README


def quoted_readme_lines() -> list[str]:
    """The lines docs/github.md quotes of a README with the machine's places named."""
    page = (Path(__file__).parents[2] / "docs" / "github.md").read_text()
    block = page.split("A folder is made to be shared", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines()]


def rerun_in(folder: Path, command: str, env: dict[str, str]) -> tuple[int, str]:
    """The README's command as a user types it in the folder: a shell, the venv's pytest on PATH."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", GITHUB_STEP_SUMMARY)}
    done = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True, timeout=600,
                          env={**base, "PATH": f"{BIN}{os.pathsep}{base['PATH']}", "PYTHONWARNINGS": "ignore", **env})
    return done.returncode, done.stdout + done.stderr


def test_the_cell_fails_again_from_its_folder_once_the_named_module_is_provided(session):
    """The folder alone lacks the machine's module (its conftest cannot import it); with the module on
    PYTHONPATH, as the README says it is needed, the cell fails with the same headline."""
    tmp, out = session
    folder = folder_of(tmp, LOST)
    shutil.rmtree(tmp / "p")
    readme = (folder / repro_folder.README).read_text()
    command = readme.split(repro_folder.RUN_TITLE)[1].split("```bash\n")[1].split("\n")[0]
    code, alone = rerun_in(folder, command, {})
    assert code == pytest.ExitCode.USAGE_ERROR and "No module named 'site_settings'" in alone, alone[-3000:]
    headline = re.search(rf"^_+ resume-matrix {re.escape(LOST)} _+\n(.+)$", out, re.M).group(1)
    code, again = rerun_in(folder, command, {"PYTHONPATH": str(tmp / "machine")})
    assert code == 1 and f"\n{headline}\n" in again and "1 failed, " in again, again[-3000:]
