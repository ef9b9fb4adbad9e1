"""The composite action (action.yml at the repository's root), run as GitHub would run
its steps: each ``run:`` script with bash ``-eo pipefail``, its ``env:`` and ``working-directory``, the
expressions it uses replaced by what GitHub gives them (``inputs.*``, ``github.action_path``,
``runner.temp``, ``steps.matrix.outputs.*``), and GITHUB_OUTPUT / GITHUB_STEP_SUMMARY files.

The plugin is installed from a copy of this checkout (the action's own path) into a scratch venv, offline:
the venv sees pytest, pytest-xdist, setuptools and pip of the test environment through a folder of links,
never this checkout's editable install. The project is the torch-free one of ``project_trainer.py`` with
a planted bug, so the matrix fails and the evidence step's condition holds. The torch step (a download) is
checked, not run.

The workflow example of docs/github.md (docs/examples/ci/resume-matrix-action.yml) runs too: the action's
steps with the example's inputs, on the example project of "Writing a target" (torch), in this
environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import distribution
from pathlib import Path

import pytest
from optional import requires
from project_trainer import write_project

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
#: What an installed plugin needs of the test environment, with what building and installing it needs.
DISTRIBUTIONS = ("pip", "pytest", "pluggy", "iniconfig", "packaging", "pygments", "setuptools", "pytest-xdist",
                 "execnet")
#: What of this checkout a build reads.
SOURCE = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "pytest_resume_check", "agentlightning")
EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")

pytestmark = requires("yaml")


def action() -> dict:
    import yaml

    return yaml.safe_load(ACTION.read_text())


def steps_by_name() -> dict[str, dict]:
    return {step["name"]: step for step in action()["runs"]["steps"]}


def linked_environment(folder: Path) -> Path:
    """A folder of links to :data:`DISTRIBUTIONS` (their top-level packages and metadata) in the test
    environment."""
    folder.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for name in DISTRIBUTIONS:
        for file in distribution(name).files or ():
            top = Path(str(file)).parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth") or (folder / top).exists():
                continue
            if (site / top).exists():
                (folder / top).symlink_to(site / top)
    return folder


def scratch_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "test-environment.pth").write_text(f"{linked_environment(tmp_path / 'linked')}\n")
    return venv


def substitute(text: str, values: dict[str, str]) -> str:
    """``text`` with each ``${{ expression }}`` replaced; an expression the test does not know fails it."""
    def value(match: re.Match[str]) -> str:
        assert match.group(1) in values, f"action.yml uses {match.group(1)!r}, which this test does not give"
        return values[match.group(1)]

    return EXPRESSION.sub(value, text)


def run_step(step: dict, values: dict[str, str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    assert step.get("shell") == "bash", step["name"]
    step_env = {k: substitute(str(v), values) for k, v in (step.get("env") or {}).items()}
    folder = cwd / substitute(step.get("working-directory", "."), values)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", substitute(step["run"], values)],
                          cwd=folder, env={**env, **step_env}, capture_output=True, text=True, timeout=300)


def test_torch_is_installed_pinned_first_and_only_when_asked_then_the_plugin_then_the_project():
    steps = action()["runs"]["steps"]
    assert action()["runs"]["using"] == "composite"
    torch, plugin, project, matrix = steps[:4]
    assert torch["if"] == "inputs.torch == 'true'" and action()["inputs"]["torch"]["default"] == "false"
    assert "torch==2.13.0" in torch["run"] and "--index-url https://download.pytorch.org/whl/cpu" in torch["run"]
    assert "${{ github.action_path }}" in plugin["env"].values()
    assert project["if"] == "inputs.install != ''" and matrix["id"] == "matrix"
    assert action()["inputs"]["command"]["default"] == "pytest --resume-matrix -m resume_matrix"


def test_the_action_installs_the_plugin_runs_the_matrix_and_keeps_the_evidence_of_a_failure(tmp_path):
    checkout = tmp_path / "action"
    checkout.mkdir()
    for name in SOURCE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(source, checkout / name)
    venv = scratch_venv(tmp_path)
    workspace = write_project(tmp_path / "workspace", "files", "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]")
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    outputs, step_summary = tmp_path / "github-output", tmp_path / "step-summary.md"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", GITHUB_OUTPUT=str(outputs),
               GITHUB_STEP_SUMMARY=str(step_summary), PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONWARNINGS="ignore")
    inputs = {name: str(spec.get("default", "")) for name, spec in action()["inputs"].items()}
    # The default command by the venv's interpreter (the linked environment has no pytest script), with a
    # short matrix; the extras the test environment holds.
    inputs.update(command="python -m pytest --resume-matrix -m resume_matrix -p no:randomly --resume-matrix-seed=2 "
                          "-k 'ckpt2] or ckpt3]'", extras="test",
                  install="python -c 'import pytest_resume_check' && touch installed-here")
    values = {f"inputs.{k}": v for k, v in inputs.items()}
    values.update({"github.action_path": str(checkout), "runner.temp": str(runner_temp)})
    steps = steps_by_name()

    installed = run_step(steps["Install pytest-resume-check from the action's checkout"], values, env, workspace)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import pytest_resume_check as p; print(p.__file__)"],
                           capture_output=True, text=True, env=env, check=True, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where  # the action's copy, not this checkout

    project = run_step(steps["Install the project"], values, env, workspace)
    assert project.returncode == 0 and (workspace / "installed-here").exists(), project.stderr[-3000:]

    matrix = next(s for s in action()["runs"]["steps"] if s.get("id") == "matrix")
    ran = run_step(matrix, values, env, workspace)
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]  # the planted bug fails the step
    evidence = Path(dict(line.split("=", 1) for line in outputs.read_text().splitlines())["evidence"])
    assert evidence.parent == runner_temp
    cells = json.loads((evidence / "resume-matrix.json").read_text())["cells"]
    failing = [c for c in cells if not c["passed"]]
    assert failing and all(Path(c["repro"]).parent == evidence / "repro" for c in failing)
    assert all((Path(c["repro"]) / "README.md").is_file() for c in failing)
    kept = {p.parent.name for p in (evidence / "tmp").rglob("run1.log") if "resume-matrixcurrent" not in p.parts}
    assert kept == {f"{c['resume_mode']}-{c['kill']}" for c in failing} | {"reference"}  # with their runs' logs
    assert step_summary.read_text().startswith("### resume matrix: ")

    upload = steps["Keep the evidence of the failing cells"]
    assert upload["uses"].startswith("actions/upload-artifact@v4")
    assert upload["if"].startswith("failure()")
    values["steps.matrix.outputs.evidence"] = str(evidence)
    paths = substitute(upload["with"]["path"], values).split()
    assert paths[0] == str(evidence) and paths[1].startswith("!")


@pytest.mark.parametrize("expression", ["inputs.command", "inputs.extras", "inputs.install",
                                        "github.action_path"])
def test_inputs_reach_the_scripts_through_the_environment_only(expression):
    """A script with ``${{ inputs.command }}`` pasted in would run whatever the input holds as code."""
    for step in action()["runs"]["steps"]:
        assert expression not in step.get("run", ""), step["name"]


EXAMPLE = ROOT / "docs" / "examples" / "ci" / "resume-matrix-action.yml"
DOWNSTREAM = ROOT / "docs" / "examples" / "downstream"


@requires("torch", "torchdata")
def test_the_workflow_example_runs_the_action_on_the_example_project(tmp_path):
    """docs/github.md's workflow: its inputs are the action's, and the action's steps with them pass the
    example project's matrix (torch and the plugin are this environment's: the install steps are the test
    above's), with the evidence options added and the summary written."""
    import yaml

    workflow = yaml.safe_load(EXAMPLE.read_text())
    step = next(s for s in workflow["jobs"]["resume-matrix"]["steps"] if "pytest-resume-check@" in s.get("uses", ""))
    given = {k: str(v) for k, v in step["with"].items()}
    assert set(given) <= set(action()["inputs"]), set(given) - set(action()["inputs"])
    assert given["torch"] == "true"  # the torch step runs first on GitHub
    extras = set(distribution("pytest-resume-check").metadata.get_all("Provides-Extra") or ())
    assert set(given["extras"].split(",")) <= extras
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    for name in ("conftest.py", "trainer.py", "pytest.ini"):
        shutil.copy(DOWNSTREAM / name, workspace / name)
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    outputs, step_summary = tmp_path / "github-output", tmp_path / "step-summary.md"
    inputs = {name: str(spec.get("default", "")) for name, spec in action()["inputs"].items()} | given
    values = {f"inputs.{k}": v for k, v in inputs.items()} | {"runner.temp": str(runner_temp)}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", GITHUB_OUTPUT=str(outputs),
               GITHUB_STEP_SUMMARY=str(step_summary), PYTHONWARNINGS="ignore")
    ran = run_step(steps_by_name()["Resume matrix"], values, env, workspace)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "resume-check: matrix=quick seed=1234" in ran.stdout
    evidence = Path(dict(line.split("=", 1) for line in outputs.read_text().splitlines())["evidence"])
    cells = json.loads((evidence / "resume-matrix.json").read_text())["cells"]
    assert cells and all(c["passed"] for c in cells)
    assert not (evidence / "repro").exists()  # nothing failed, nothing to reproduce
    summary = step_summary.read_text()
    assert summary.startswith(f"### resume matrix: {len(cells)} cells, 0 failing, 0 expected failures, seed 1234")
    assert "#### Failing cells" not in summary
