"""What we publish (issue 14, "installs like a plugin"): the wheel holds the two packages with their
``py.typed`` markers and the licence, and its metadata says MIT (an SPDX expression), POSIX/Linux and
pytest; the sdist holds what its own tests need (tests/, docs/ with the examples); building warns
about nothing in our license metadata. And ``import agentlightning`` refuses to share its import name
with another distribution (item 18).

The builds run without network and without build isolation, from a copy of the working tree in a
temporary folder, so the checkout gets no build/ or egg-info. They need setuptools>=77 (the first
that reads ``license = "MIT"``) in this environment and skip without it. Nothing here imports torch.
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
