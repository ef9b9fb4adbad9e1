"""What we publish ("installs like a plugin"): the wheel holds the two packages with their
``py.typed`` markers and the licence, and its metadata says MIT (an SPDX expression), POSIX/Linux and
pytest; the sdist holds what its own tests need (tests/, docs/ with the examples); building warns
about nothing in our license metadata. And ``import agentlightning`` refuses to share its import name
with another distribution (item 18).

The builds run without network and without build isolation, from a copy of the working tree in a
temporary folder, so the checkout gets no build/ or egg-info. They need setuptools>=77 (the first
that reads ``license = "MIT"``) in this environment and skip without it. Nothing here imports torch.

The wheel alone is enough (nobody outside a clone could install the plugin): installed into a
new virtual environment beside pytest, it runs a matrix in a project folder outside the checkout. That
test takes pytest (the version running it) from the package index pip is set up with, and skips when
there is none; the wheel itself installs from disk. The pages that say how to install name the wheel
file the build makes and extras it has, and show the index install only as one for once it is published.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from project_trainer import write_project

import agentlightning

ROOT = Path(__file__).resolve().parents[2]
#: Not part of the working tree a release is built from: VCS data, environments, build output, caches.
NOT_SOURCE = (".git", ".ci-envs", ".venv", "site", "build", "dist", "__pycache__", "*.egg-info",
              ".pytest_cache", ".ruff_cache")
#: The first setuptools that reads an SPDX ``license`` expression and ``license-files`` (PEP 639).
SETUPTOOLS_SPDX = (77,)
LINUX = "Classifier: Operating System :: POSIX :: Linux"
#: The files an upstream Agent Lightning install owns, as its RECORD lists them.
UPSTREAM_RECORD = "agentlightning/__init__.py,,\nagentlightning-0.2.0.dist-info/METADATA,,\n"


def setuptools_version() -> tuple[int, ...] | None:
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


SETUPTOOLS = setuptools_version()
needs_spdx_setuptools = pytest.mark.skipif(
    SETUPTOOLS is None or SETUPTOOLS < SETUPTOOLS_SPDX,
    reason=f"building without isolation needs setuptools>={SETUPTOOLS_SPDX[0]} (SPDX license expressions, "
           f"PEP 639) in this environment; found {'none' if SETUPTOOLS is None else '.'.join(map(str, SETUPTOOLS))}",
)


def run(args: list[str], cwd: Path) -> str:
    """Run a build command; its whole output (the backend's warnings included) on success."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def license_deprecations(output: str) -> list[str]:
    """The lines of a build's output where setuptools deprecates something about the license."""
    return [line for line in output.splitlines()
            if "SetuptoolsDeprecationWarning" in line and "license" in line.lower()]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The working tree as it is now (not HEAD: uncommitted changes are what is being checked)."""
    copy = tmp_path_factory.mktemp("tree") / "pytest-resume-check"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    return copy


@pytest.fixture(scope="module")
def wheel(tree, tmp_path_factory) -> Iterator[tuple[zipfile.ZipFile, str]]:
    """The open wheel and the build's output."""
    out = tmp_path_factory.mktemp("wheel")
    output = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out),
                  "."], tree)
    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive, output


@pytest.fixture(scope="module")
def sdist(tree, tmp_path_factory) -> tuple[set[str], str]:
    """The sdist's file names, relative to its top folder, and the build's output."""
    out = tmp_path_factory.mktemp("sdist")
    output = run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(out)!r})"],
                 tree)
    (built,) = out.glob("*.tar.gz")
    with tarfile.open(built) as archive:
        names = {member.name.partition("/")[2] for member in archive.getmembers() if member.isfile()}
    return names, output


# -- the wheel -----------------------------------------------------------------------------------------------

@needs_spdx_setuptools
def test_wheel_ships_both_packages_typed_and_the_license(wheel):
    archive, _ = wheel
    names = set(archive.namelist())
    assert {"pytest_resume_check/py.typed", "agentlightning/py.typed"} <= names
    assert {"pytest_resume_check/plugin/__init__.py", "agentlightning/verl/trainer.py"} <= names
    assert any(n.startswith("pytest_resume_check/report/assets/") and n.endswith(".css") for n in names)
    assert "pytest_resume_check/child/startup/sitecustomize.py" in names  # zero-change targets' watcher starts there
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert "MIT License" in archive.read(license_file).decode()
    assert not [n for n in names if n.startswith(("tests/", "docs/"))], "the wheel holds only the two packages"


@needs_spdx_setuptools
def test_wheel_metadata_says_mit_linux_and_pytest(wheel):
    archive, _ = wheel
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    lines = archive.read(metadata).decode().splitlines()
    assert "License-Expression: MIT" in lines
    assert "License-File: LICENSE" in lines
    assert LINUX in lines
    assert "Classifier: Framework :: Pytest" in lines
    assert {"Classifier: Programming Language :: Python :: 3.10",
            "Classifier: Programming Language :: Python :: 3.11"} <= set(lines)
    assert not [line for line in lines if line.startswith("Classifier: License ::")], "SPDX replaces them"


@needs_spdx_setuptools
def test_building_warns_about_nothing_in_the_license_metadata(wheel, sdist):
    for _, output in (wheel, sdist):
        assert not license_deprecations(output)


# -- the sdist -----------------------------------------------------------------------------------------------

@needs_spdx_setuptools
def test_sdist_carries_its_tests_and_the_docs_they_check(sdist, tree):
    names, _ = sdist
    assert {"LICENSE", "pyproject.toml", "README.md", "mkdocs.yml", "tests/conftest.py", "tests/support/optional.py",
            "docs/examples/planted/conftest.py", "docs/examples/ci/resume-matrix.yml"} <= names
    for folder in ("tests", "docs"):
        files = {p.relative_to(tree).as_posix() for p in (tree / folder).rglob("*") if p.is_file()}
        assert files <= names, f"{folder}/ files missing from the sdist: {sorted(files - names)}"
    assert any(n.startswith("tests/verl/test_") for n in names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


# -- the wheel alone, in a project of its own ----------------------------------------------------

#: The project's own target (tests/support/project_trainer.py, torch-free) and one cell of a target the wheel
#: registers through its entry point: the training script, run as a program of the new environment.
PROJECT_TARGET = "wheel_loop"
INSTALLED_CELLS = "script_example and e2-shuffle-auto-ckpt6"
SUMMARY = re.compile(r"resume matrix: (\d+) cells, 0 failing")


def new_venv(path: Path) -> Path:
    """A virtual environment of this Python without its site-packages (so nothing of the checkout's
    install is seen); its interpreter. Skips where ``venv`` cannot make one (no ensurepip)."""
    done = subprocess.run([sys.executable, "-m", "venv", str(path)], capture_output=True, text=True, timeout=300)
    if done.returncode:
        pytest.skip(f"python -m venv cannot make an environment here: {done.stderr.strip()[-500:]}")
    return path / "bin" / "python"


def outside_env(venv: Path) -> dict[str, str]:
    """This process's environment as a shell with ``venv`` activated sees it: nothing that would put the
    checkout on sys.path (PYTHONPATH) or hand pytest options or xdist state to the inner session."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PYTEST_")}
    return {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONWARNINGS": "ignore"}


@needs_spdx_setuptools
def test_the_wheel_alone_runs_a_matrix_in_a_project_outside_the_checkout(wheel, tmp_path):
    """The wheel carries the plugin's entry point (pytest loads it from the new environment), its bundled
    targets' entry point, and the HTML report's assets as package data; its only requirement is pytest
    (no torch arrives with it)."""
    archive, _ = wheel
    venv = tmp_path / "venv"
    python = new_venv(venv)
    env = outside_env(venv)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, f"pytest=={pytest.__version__}"], capture_output=True, text=True, timeout=600,
                          env=env)
    if done.returncode:
        pytest.skip(f"pytest=={pytest.__version__} could not be installed from a package index: "
                    f"{done.stderr.strip()[-500:]}")
    # From disk alone: a requirement beyond pytest would fail here.
    done = subprocess.run([*pip, "--no-index", archive.filename], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    project = write_project(tmp_path / "project", PROJECT_TARGET, "[{}]")
    done = subprocess.run(
        [str(venv / "bin" / "pytest"), "-p", "no:cacheprovider", "--resume-matrix", "-m", "resume_matrix",
         "--resume-matrix-seed=1234", f"--resume-matrix-target={PROJECT_TARGET}",
         "--resume-matrix-target=script_example", "-k", f"{PROJECT_TARGET} or ({INSTALLED_CELLS})",
         "--resume-matrix-html=report.html"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^plugins: .*\bresume-check-", out, re.M), out[:1000]
    cells = int(SUMMARY.search(out).group(1))
    per_target = {name: int(n) for name, n in re.findall(r"^(\w+): (\d+) cells, columns", out, re.M)}
    assert set(per_target) == {PROJECT_TARGET, "script_example"} and all(per_target.values()), out[-3000:]
    assert sum(per_target.values()) == cells
    assert re.search(rf"^=+ {cells} passed, \d+ deselected in ", out.splitlines()[-1]), out[-500:]
    report = project / "report.html"
    assert report.is_file(), out[-2000:] + done.stderr[-2000:]
    page = report.read_text()
    for asset in ("report.css", "report.js"):
        assert archive.read(f"pytest_resume_check/report/assets/{asset}").decode() in page, asset

    # Everything came from the new environment, and torch did not come with it.
    where = subprocess.run(
        [str(python), "-c", "import importlib.util as u, agentlightning, pytest_resume_check as p; "
                            "print(p.__file__); print(agentlightning.__file__); print(u.find_spec('torch'))"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-3000:]
    plugin_file, agentlightning_file, torch_spec = where.stdout.splitlines()
    for path in (plugin_file, agentlightning_file):
        assert Path(path).resolve().is_relative_to(venv.resolve()) and "site-packages" in path, path
    assert torch_spec == "None"


# -- the install commands the pages give ----------------------------------------------------------

#: The pages that tell a user how to install the plugin.
INSTALL_PAGES = ("README.md", "docs/quickstart.md", "docs/ci.md")
#: Marks the command that installs from an index as one for later: the package is not published yet.
NOT_YET = "once published on pypi"


def bash_blocks_with_context(page: str) -> list[tuple[str, str]]:
    """(the paragraph just before, body) of every bash block of a page."""
    text = (ROOT / page).read_text()
    return [(text[:m.start()].rstrip().rpartition("\n\n")[2], m.group(1))
            for m in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S)]


@needs_spdx_setuptools
def test_the_pages_name_the_wheel_the_build_makes_and_its_extras(wheel):
    archive, _ = wheel
    built = Path(archive.filename).name
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    extras = {line.partition(": ")[2] for line in archive.read(metadata).decode().splitlines()
              if line.startswith("Provides-Extra: ")}
    for page in INSTALL_PAGES:
        text = (ROOT / page).read_text()
        named = set(re.findall(r"pytest_resume_check-[^\s'\[/]+\.whl", text))
        assert named == {built}, f"{page} names {sorted(named)}; the build makes {built}"
        installs = "\n".join(line for line in text.splitlines() if "pip install" in line)
        asked = {e for group in re.findall(r"\[([a-z][\w,-]*)\]'", installs) for e in group.split(",")}
        assert asked and asked <= extras, f"{page} asks for extras the wheel does not have: {asked - extras}"


def test_installing_from_an_index_is_shown_only_as_once_published():
    for page in INSTALL_PAGES:
        for before, body in bash_blocks_with_context(page):
            if re.search(r"pip install '?pytest-resume-check\[", body):
                assert NOT_YET in before.lower(), f"{page}: an index install not marked '{NOT_YET}':\n{body}"


# -- the agentlightning import name (item 18) ----------------------------------------------------------------

def import_agentlightning(*path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``import agentlightning`` in a fresh interpreter with ``path`` first on ``sys.path``; ours comes from
    the checkout. Exit status 3 and the message when it raises ImportError."""
    code = "try:\n    import agentlightning\nexcept ImportError as e:\n    print(e)\n    raise SystemExit(3)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def fake_distribution(folder: Path, name: str, version: str, record: str) -> Path:
    info = folder / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"  # as an installer names it
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(record)
    return folder


def test_importing_agentlightning_next_to_upstream_agent_lightning_names_both_and_the_fix(tmp_path):
    site = fake_distribution(tmp_path / "site", "agentlightning", "0.2.0", UPSTREAM_RECORD)
    done = import_agentlightning(site, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    expected = agentlightning.ERR_SHARED_IMPORT_NAME.format(ours="pytest-resume-check", other="agentlightning",
                                                            version="0.2.0")
    assert done.stdout.strip() == expected
    assert "pip uninstall agentlightning" in expected and "separate virtual environments" in expected


def test_importing_agentlightning_alone_works(tmp_path):
    done = import_agentlightning(tmp_path, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_our_own_distribution_under_another_spelling_is_no_conflict(tmp_path):
    site = fake_distribution(tmp_path / "site", "Pytest_Resume.Check", "0.0.1", UPSTREAM_RECORD)
    done = import_agentlightning(site, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_distribution_that_does_not_provide_agentlightning_is_no_conflict(tmp_path):
    site = fake_distribution(tmp_path / "site", "agentlightning-tools", "1.0", "agentlightning_tools/__init__.py,,\n")
    done = import_agentlightning(site, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
