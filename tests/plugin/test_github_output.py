"""GitHub's output: the step summary a session appends to ``$GITHUB_STEP_SUMMARY``
(once, by the xdist controller), and ``--resume-matrix-repro``'s folders, each of which reproduces its
failing cell alone: its README's command, run in the folder after the project is gone, fails with the
same headline. Output that cannot be written is a warning naming the path, and the session's exit status
stays what the cells earned. The trainer is the torch-free one of ``project_trainer.py``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from project_trainer import write_project

from pytest_resume_check.plugin.options import GITHUB_STEP_SUMMARY
from pytest_resume_check.plugin.repro import ERR_REPRO_WRITE
from pytest_resume_check.plugin.summary import ERR_STEP_SUMMARY, ERR_STEP_SUMMARY_NOT_REGULAR
from pytest_resume_check.records.names import OPT_REPRO, OPT_STEP_SUMMARY
from pytest_resume_check.records.regular_files import KIND_FIFO
from pytest_resume_check.report import markdown
from pytest_resume_check.report import repro as repro_folder

CASES = "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]"
SEED = "--resume-matrix-seed=5"
#: Where the venv's pytest is: a README's command starts with ``pytest``.
BIN = str(Path(sys.executable).parent)


def pytest_run(path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """A matrix session in the project ``path`` (its modules on PYTHONPATH, as a project's own are);
    GITHUB_STEP_SUMMARY only where a test sets it."""
    base = {k: v for k, v in os.environ.items() if k != GITHUB_STEP_SUMMARY}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--resume-matrix", "-m", "resume_matrix", SEED, *args], cwd=path,
                          env={**base, "PYTHONPATH": str(path), **(env or {})}, capture_output=True, text=True,
                          timeout=600)
    return done.returncode, done.stdout + done.stderr


def one_line(text: str) -> str:
    """Output with pytest's wrapping of long warning lines undone."""
    return " ".join(text.split())


def test_the_step_summary_is_appended_once_by_the_xdist_controller(tmp_path):
    project = write_project(tmp_path / "p", "files", CASES)
    step = tmp_path / "step-summary.md"
    step.write_text("an earlier step's line\n")
    report = tmp_path / "m.json"
    code, out = pytest_run(project, "-n", "2", f"--resume-matrix-json={report}", env={GITHUB_STEP_SUMMARY: str(step)})
    assert code == 1, out[-3000:]
    text = step.read_text()
    assert text.startswith("an earlier step's line\n\n### resume matrix: ")
    assert text.count("### resume matrix: ") == 1  # the controller's, none of a worker's
    header = re.search(r"=+ (resume matrix: \d+ cells, .*seed 5) =+", out).group(1)
    assert f"### {header}\n" in text
    assert "```text\nfiles: " in text  # the target's grid
    cells = json.loads(report.read_text())["cells"]
    failing = [c for c in cells if not c["passed"]]
    assert failing and len(failing) <= markdown.LISTED
    for c in failing:
        name = f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]"
        assert f"- `{name}`: {markdown.escape(c['headline'])}\n" in text
        assert f"  ```sh\n  {c['rerun']}\n  ```\n" in text


def test_the_option_and_the_ini_key_win_over_the_environment(tmp_path):
    project = write_project(tmp_path / "p", "files", "[{'id': 'ok'}]")
    from_env, from_option, from_ini = tmp_path / "env.md", tmp_path / "option.md", tmp_path / "ini.md"
    code, out = pytest_run(project, "-k", "ckpt2]", f"{OPT_STEP_SUMMARY}={from_option}",
                           env={GITHUB_STEP_SUMMARY: str(from_env)})
    assert code == 0, out[-3000:]
    assert from_option.read_text().startswith("### resume matrix: ") and not from_env.exists()
    with (project / "pytest.ini").open("a") as ini:
        ini.write(f"resume_matrix_step_summary = {from_ini}\n")
    code, out = pytest_run(project, "-k", "ckpt2]", env={GITHUB_STEP_SUMMARY: str(from_env)})
    assert code == 0, out[-3000:]
    assert from_ini.read_text().startswith("### resume matrix: ") and not from_env.exists()


def test_a_step_summary_nearly_full_gets_only_the_counts_line_and_never_passes_githubs_limit(tmp_path):
    project = write_project(tmp_path / "p", "files", "[{'id': 'ok'}]")
    step = tmp_path / "step-summary.md"
    step.write_text("x" * (markdown.GITHUB_LIMIT - 2000) + "\n")
    code, out = pytest_run(project, "-k", "ckpt2]", env={GITHUB_STEP_SUMMARY: str(step)})
    assert code == 0, out[-3000:]
    added = step.read_text().rpartition("x\n")[2]
    assert added.startswith("\n### resume matrix: 1 cells, 0 failing") and "No room for the grids" in added
    assert step.stat().st_size <= markdown.GITHUB_LIMIT
    step.write_text("x" * (markdown.GITHUB_LIMIT - 50) + "\n")
    code, out = pytest_run(project, "-k", "ckpt2]", env={GITHUB_STEP_SUMMARY: str(step)})
    assert code == 0, out[-3000:]
    assert step.stat().st_size == markdown.GITHUB_LIMIT - 49  # no room even for that: nothing added


def test_output_that_cannot_be_written_is_said_naming_it_and_the_exit_status_is_the_cells(tmp_path):
    project = write_project(tmp_path / "p", "files", CASES)
    folder_as_file = tmp_path / "not-a-folder"
    folder_as_file.write_text("")
    summary_as_folder = tmp_path / "a-folder"
    summary_as_folder.mkdir()
    cannot_summarise = one_line(ERR_STEP_SUMMARY.format(path=summary_as_folder, reason="Is a directory"))
    cannot_repro = one_line(ERR_REPRO_WRITE.format(name="files[bug-auto-ckpt2]", path=folder_as_file,
                                                   reason="Not a directory"))
    # -W error turns the warning into an error: it is then said as a line, and nothing else changes.
    for warnings in ((), ("-W", "error::pytest.PytestWarning")):
        code, out = pytest_run(project, "-k", "bug-auto-ckpt2]", *warnings, f"{OPT_REPRO}={folder_as_file}",
                               env={GITHUB_STEP_SUMMARY: str(summary_as_folder)})
        assert code == 1, out[-3000:]
        assert "1 failed" in out and "INTERNALERROR" not in out
        said = one_line(out)
        assert cannot_summarise in said and cannot_repro in said
        if not warnings:
            assert f"PytestWarning: {cannot_summarise}" in said


def test_a_fifo_as_the_step_summary_is_one_warning_naming_it_and_the_session_ends(tmp_path):
    """A FIFO would wait for a reader at the session's end (forever, with none): it is refused unopened for
    writing; this one has a reader, which gets nothing."""
    project = write_project(tmp_path / "p", "files", "[{'id': 'ok'}]")
    fifo = tmp_path / "step-summary"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        code, out = pytest_run(project, "-k", "ckpt2]", env={GITHUB_STEP_SUMMARY: str(fifo)})
        assert os.read(reader, 1 << 16) == b""
    finally:
        os.close(reader)
    assert code == 0, out[-3000:]
    refused = one_line(ERR_STEP_SUMMARY_NOT_REGULAR.format(path=fifo, kind=KIND_FIFO))
    assert one_line(out).count(refused) == 1


def readme_command(folder: Path) -> str:
    text = (folder / repro_folder.README).read_text()
    return text.split(repro_folder.RUN_TITLE)[1].split("```bash\n")[1].split("\n")[0]


def rerun_in(folder: Path, command: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The README's command as a user types it in the folder: a shell, the venv's pytest on PATH, none of
    the project's modules on PYTHONPATH."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", GITHUB_STEP_SUMMARY)}
    done = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True, timeout=600,
                          env={**base, "PATH": f"{BIN}{os.pathsep}{base['PATH']}", "PYTHONWARNINGS": "ignore",
                               **(env or {})})
    return done.returncode, done.stdout + done.stderr


def test_a_failing_cell_reproduces_alone_from_its_folder(tmp_path):
    project = write_project(tmp_path / "p", "files", CASES)
    with (project / "pytest.ini").open("a") as ini:  # the ini key, relative to where pytest runs
        ini.write("resume_matrix_repro = ../repro\n")
    report = tmp_path / "m.json"
    code, out = pytest_run(project, "-n", "2", "-k", "ckpt2] or ckpt3]", f"--resume-matrix-json={report}")
    assert code == 1, out[-3000:]
    cells = json.loads(report.read_text())["cells"]
    failing = {f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]": c for c in cells if not c["passed"]}
    root = tmp_path / "repro"
    assert sorted(p.name for p in root.iterdir()) == sorted(repro_folder.folder_name(n) for n in failing)
    assert all(c[repro_folder.CELL_KEY] == str(root / repro_folder.folder_name(n)) for n, c in failing.items())
    assert f"reproductions of {len(failing)} failing cells written to ../repro" in out
    name = "files[bug-auto-ckpt2]"
    folder = root / repro_folder.folder_name(name)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "conftest.py", "project_trainer.py", "pytest.ini"]
    readme = (folder / "README.md").read_text()
    assert readme.startswith(f"# Reproduction of the resume-matrix cell `{name}`\n\n```text\n"
                             f"{failing[name]['headline']}\n  reference: ")
    command = readme_command(folder)
    assert command == ("pytest --resume-matrix --resume-matrix-seed=5 '--resume-matrix-cell=files[bug-auto-ckpt2]' "
                       "--resume-matrix-target=files")
    shutil.rmtree(project)  # the folder alone
    code, again = rerun_in(folder, command)
    assert code == 1, again[-3000:]
    assert f"FAILED resume-matrix::{name}" in again
    assert f"\n{failing[name]['headline']}\n" in again  # the same headline, first line of the cell's report
    assert "1 failed, " in again


DIST_INFO = "buggy_targets-1.0.dist-info"
INSTALLED_MODULE = '''"""An installed package's resume-check target (a planted bug: a resume loses its first input)."""
from pytest_resume_check import resume_target
from project_trainer import STEPS, train

TARGETS = [resume_target(train, name="installed_files", steps=STEPS, cases=[{"id": "bug", "skip": True}],
                         preload=("project_trainer",))]
'''


def install_buggy_package(site: Path) -> None:
    """A distribution on ``site`` (a folder put on PYTHONPATH) whose entry point declares a target."""
    site.mkdir()
    shutil.copy(Path(__file__).parents[1] / "support" / "project_trainer.py", site / "project_trainer.py")
    (site / "buggy_targets.py").write_text(INSTALLED_MODULE)
    info = site / DIST_INFO
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: buggy-targets\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest_resume_check.targets]\nbuggy = buggy_targets:TARGETS\n")
    (info / "top_level.txt").write_text("buggy_targets\nproject_trainer\n")


def test_an_installed_packages_target_reproduces_with_the_target_option_alone(tmp_path):
    site = tmp_path / "site"
    install_buggy_package(site)
    project = tmp_path / "p"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    env = {"PYTHONPATH": str(site)}
    code, out = pytest_run(project, "--resume-matrix-target=installed_files", "-k", "ckpt2]",
                           f"{OPT_REPRO}={tmp_path / 'repro'}", env=env)
    assert code == 1, out[-3000:]
    name = "installed_files[bug-auto-ckpt2]"
    folder = tmp_path / "repro" / repro_folder.folder_name(name)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "pytest.ini"]
    assert "`installed_files` is not declared by a conftest.py" in (folder / "README.md").read_text()
    command = readme_command(folder)
    assert command.endswith(" --resume-matrix-target=installed_files")
    headline = re.search(rf"^_+ resume-matrix {re.escape(name)} _+\n(.+)$", out, re.M).group(1)
    code, again = rerun_in(folder, command, env=env)
    assert code == 1, again[-3000:]
    assert f"\n{headline}\n" in again and "1 failed, " in again


def test_a_cell_configured_by_the_environment_reproduces_by_its_readmes_environment(tmp_path):
    """The trainer loses an input on resume only when RC_MODE and RC_OTHER are set: the README says how to
    set the declared RC_MODE (with its value, quoted) and the declared but unset RC_UNSET, and names RC_OTHER,
    which is not declared, without its value; nothing else of the session carries a value."""
    from project_session import write_project as project_with

    project = project_with(tmp_path / "p", "[{'id': 'env', 'skip_if_set': ['RC_MODE', 'RC_OTHER']}]",
                           pass_env="['RC_MODE']")
    values = {"RC_MODE": "fast lane", "RC_OTHER": "secret-value-1"}
    report = tmp_path / "m.json"
    code, out = pytest_run(project, "-k", "ckpt2]", "--resume-matrix-env=RC_UNSET", f"--resume-matrix-json={report}",
                           f"{OPT_REPRO}={tmp_path / 'repro'}", env=values)
    assert code == 1, out[-3000:]
    name = "files[env-auto-ckpt2]"
    folder = tmp_path / "repro" / repro_folder.folder_name(name)
    readme = (folder / repro_folder.README).read_text()
    section = readme[readme.index(repro_folder.ENV_TITLE):readme.index(repro_folder.FILES_TITLE)]
    exports = section.split("```bash\n")[1].split("```")[0]
    assert exports == "export RC_MODE='fast lane'\nunset RC_UNSET\n"
    assert "`RC_OTHER`" in section and "`PYTEST_RESUME_CHECK_RUN`" in section
    cell = next(c for c in json.loads(report.read_text())["cells"] if c["kill"] == "ckpt2")
    assert cell["environment"] == {"read": ["RC_MODE", "RC_OTHER", "TRAINER_FLAG_DIR"],
                                   "harness": ["PYTEST_RESUME_CHECK_RUN"], "declared": ["RC_MODE", "RC_UNSET"],
                                   "ran_fresh": []}
    assert all(values["RC_OTHER"] not in text for text in (readme, out, report.read_text()))
    assert values["RC_MODE"] not in report.read_text() + out

    # As the README says: its exports, with RC_OTHER set as it was, fail as the session did; without them, not.
    shutil.rmtree(project)
    command = readme_command(folder)
    code, again = rerun_in(folder, exports + command, env={"RC_OTHER": values["RC_OTHER"], "RC_UNSET": "1"})
    assert code == 1 and f"\n{cell['headline']}\n" in again, again[-3000:]
    code, again = rerun_in(folder, command, env={"RC_OTHER": values["RC_OTHER"]})
    assert code == 0, again[-3000:]
