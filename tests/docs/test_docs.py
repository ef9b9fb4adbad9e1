"""The documentation cannot rot: the site builds with ``mkdocs build --strict``; code on the pages is
either included from a file under docs/examples that a test here runs, or a command that a test
collects or runs; and the verdicts, findings and outputs the pages quote are what the harness says
today.

(docs/writing-a-target.md quotes its example project verbatim and is checked by
test_downstream_example.py; docs/trainer-configuration.md belongs to the trainer's tests.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from optional import requires

from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.plugin import options as plugin_options
from pytest_resume_check.records import names

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
PLANTED = EXAMPLES / "planted"
DOWNSTREAM = EXAMPLES / "downstream"

#: The pages whose every block this module checks.
CHECKED_PAGES = ("index.md", "quickstart.md", "matrix.md", "reading-a-report.md", "ci.md",
                 "crash-consistency.md", "distributed.md", "design.md", "findings.md", "recipes/index.md", "github.md",
                 "recipes/command.md", "recipes/lightning.md", "recipes/accelerate.md", "recipes/hf-trainer.md")
#: The other pages of the site, each with what checks it instead (tests/docs/test_site_map.py keeps both lists
#: and mkdocs.yml's nav the same pages).
CHECKED_ELSEWHERE = {
    "writing-a-target.md": "test_downstream_example.py and test_docs_snippets.py run its example project and blocks",
    "trainer-configuration.md": "test_docs_snippets.py runs its blocks",
    "guarantees.md": "test_every_test_the_guarantees_name_exists: each promise names the test that holds it",
    "cluster.md": "its commands need a Ray cluster: tests/plugin/test_ray_cluster.py runs what it describes",
    "reference.md": "generated from the docstrings by the strict build (test_mkdocs_build_is_strict_clean)",
}
#: Languages that are code and must be included from a tested file, never written inline.
INCLUDED_LANGUAGES = {"python", "yaml", "ini", "toml", "shell"}
COMMAND_TESTS = "engine/test_command_targets.py"
LIGHTNING_TESTS = "engine/test_integration_lightning.py"
HF_TESTS = "engine/test_integration_hf_trainer.py"
ACCELERATE_TESTS = "engine/test_integration_accelerate.py"
ZERO_CHANGE_RECIPE_TEST = "engine/test_zero_change.py::test_recipe_project_passes_and_a_planted_name_sort_is_caught"
POINTER_RECIPE_TEST = ("engine/test_zero_change_commit.py::"
                       "test_recipe_project_passes_and_the_pointer_is_recognised_without_its_declaration")
#: Example files the pages include, each run by a test below.
TESTED_EXAMPLES = {
    "planted/conftest.py": "test_report_page_quotes_real_verdicts_of_the_planted_example",
    "planted/conftest.py:known-bug": "test_the_declared_known_bug_fails_exactly_where_declared",
    "ci/conftest.py": "test_cases_hook_example_adds_worker_cases_in_ci_only",
    "ci/resume-matrix.yml": "test_ci_workflow_runs_its_matrix_command_on_the_example_project",
    "ci/resume-matrix-action.yml":
        "plugin/test_action.py::test_the_workflow_example_runs_the_action_on_the_example_project",
    "ini/pytest.ini": "test_ini_example_configures_the_matrix",
    "reports/html_from_json.py": "test_html_from_json_example_writes_the_report",
    "findings/torchdata_shared_generator.py": "test_torchdata_finding_script_shows_two_orders",
    "findings/torchdata_sampler_state_after_load.py": "test_torchdata_sampler_finding_script_shows_the_replay",
    "findings/torchdata_worker_rng_after_resume.py": "test_torchdata_worker_rng_finding_script_shows_other_noise",
    # Recipes: their projects run in the integration's own test file (file::test).
    "recipes/command/conftest.py:glue": f"{COMMAND_TESTS}::test_recipe_project_passes_and_a_planted_bash_bug_is_caught",
    "recipes/command/conftest.py:bash": f"{COMMAND_TESTS}::test_recipe_project_passes_and_a_planted_bash_bug_is_caught",
    "recipes/command/train.sh": f"{COMMAND_TESTS}::test_recipe_project_passes_and_a_planted_bash_bug_is_caught",
    "recipes/zero_change/conftest.py:glue": ZERO_CHANGE_RECIPE_TEST,
    "recipes/zero_change/train.py": ZERO_CHANGE_RECIPE_TEST,
    "recipes/pointer/conftest.py:glue": POINTER_RECIPE_TEST,
    "recipes/pointer/train.py": POINTER_RECIPE_TEST,
    "recipes/lightning/conftest.py:glue": f"{LIGHTNING_TESTS}::test_recipe_project_passes_its_resume_matrix",
    "recipes/lightning/trainer.py": f"{LIGHTNING_TESTS}::test_recipe_project_passes_its_resume_matrix",
    "recipes/accelerate/conftest.py": f"{ACCELERATE_TESTS}::test_recipe_matrix_passes",
    "recipes/accelerate/trainer.py": f"{ACCELERATE_TESTS}::test_recipe_matrix_passes",
    "recipes/hf_trainer/conftest.py": f"{HF_TESTS}::test_recipe_project_passes_its_matrix",
    "recipes/hf_trainer/trainer.py": f"{HF_TESTS}::test_recipe_project_passes_its_matrix",
    "findings/lightning_epoch_end_resume.py": "test_lightning_finding_scripts_show_what_the_page_says",
    "findings/lightning_estimated_stepping_batches.py": "test_lightning_finding_scripts_show_what_the_page_says",
    "findings/hf_trainer_rng_after_collate.py":
        f"{HF_TESTS}::test_finding_script_shows_other_masks_after_a_mid_epoch_resume",
    "findings/accelerate_checkpoint_naming.py":
        f"{ACCELERATE_TESTS}::test_finding_script_naming_shows_the_failed_save_and_the_stale_resume",
    "findings/accelerate_loader_rng.py":
        f"{ACCELERATE_TESTS}::test_finding_script_rng_shows_other_draws_only_without_a_loader_generator",
    "findings/accelerate_stateful_workers.py":
        f"{ACCELERATE_TESTS}::test_finding_script_workers_shows_other_orders_only_with_workers",
    # A page may include a file of the package itself (mkdocs.yml's snippet base paths: docs/examples, .).
    "pytest_resume_check/builtin/train_script.py": f"{COMMAND_TESTS}::test_script_example_resumes_exactly",
    "pytest_resume_check/builtin/targets.py:ddp":
        "engine/test_distributed.py::test_the_bundled_matrix_has_every_distributed_kind",
    "pytest_resume_check/builtin/targets.py:ddp_torchrun":
        "engine/test_torchrun.py::test_the_two_worker_loop_under_torchrun_passes_each_kind_of_kill",
    "tests/support/distributed_targets.py:two_nodes":
        "engine/test_torchrun.py::test_two_nodes_that_lose_one_go_on_with_the_other_and_pass",
}
#: Shell lines that install things: shown, not run here (.ci/run installs the same way).
INSTALL = re.compile(r"^(python3 -m venv \S+|(\.venv/bin/)?pip install .+)$")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')

needs_torch = requires("torch", "torchdata")
needs_verl = requires("torch", "torchdata", "verl")


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of a page."""
    return FENCE.findall((DOCS / page).read_text())


def shell_lines() -> list[tuple[str, str, str]]:
    """(page, directory relative to the repository, line) of every shell command on the checked pages."""
    out = []
    for page in CHECKED_PAGES:
        for lang, body in blocks(page):
            if lang != "bash":
                continue
            cwd = "."
            for line in body.splitlines():
                if line.startswith("cd "):
                    cwd = line[3:].strip()
                elif line.strip():
                    out.append((page, cwd, line.strip()))
    return out


PYTEST_COMMANDS = [(p, cwd, line) for p, cwd, line in shell_lines() if line.startswith("pytest ")]
#: The commands as test cases: those of the verl target need verl.
PYTEST_COMMAND_CASES = [
    pytest.param(p, cwd, line, id=f"{p}:{i}", marks=[needs_verl] if "verl_stock_sync" in line else [])
    for i, (p, cwd, line) in enumerate(PYTEST_COMMANDS)
]


#: In this repository's root a command also collects the suite's own test modules (testpaths), which these
#: commands are not about: importing them took 11 of the 12 s a collection took. The matrix's cells come from
#: the targets tests/conftest.py declares, which is still read.
OWN_TEST_MODULES = f"--ignore-glob={ROOT / 'tests'}/*/test_*.py"


def run_pytest(args, cwd, timeout=600, env=None):
    skip_own = [OWN_TEST_MODULES] if Path(cwd).resolve() == ROOT.resolve() else []
    return subprocess.run([sys.executable, "-m", "pytest", *args, *skip_own], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def text_block_after(page: str, marker: str) -> list[str]:
    """The lines of the first ``text`` block after ``marker`` on ``page``."""
    text = (DOCS / page).read_text()
    rest = text[text.index(marker):]
    return re.search(r"^```text\n(.*?)^```", rest, re.M | re.S).group(1).splitlines()


# -- the site and the shape of the pages -------------------------------------------------------------------

@requires("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")
def test_mkdocs_build_is_strict_clean(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "startup")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "startup" / "img" / "html-report.png").is_file()
    # The API reference is read from the sources (no import): the declared names and the trainer are on it.
    reference = (tmp_path / "startup" / "reference" / "index.html").read_text()
    for name in ("pytest_resume_check.targets.resume_target", "pytest_resume_check.run.RunContext",
                 "pytest_resume_check.engine.Engine", "pytest_resume_check.integrations.lightning",
                 "agentlightning.verl.trainer.AgentLightningRayPPOTrainer"):
        assert f'id="{name}"' in reference, name


def test_code_on_the_pages_is_included_from_tested_files():
    included = set()
    for page in CHECKED_PAGES:
        for lang, body in blocks(page):
            if lang not in INCLUDED_LANGUAGES:
                continue
            match = INCLUDE.match(body.strip())
            assert match, f"{page}: a {lang} block written inline; include a tested file from docs/examples"
            included.add(match.group(1))
    assert included <= set(TESTED_EXAMPLES), f"included but not run by a test: {included - set(TESTED_EXAMPLES)}"
    for path, test in TESTED_EXAMPLES.items():
        file, _, section = path.partition(":")  # a section of a file: --8<-- [start:name] ... [end:name]
        where = EXAMPLES / file if (EXAMPLES / file).is_file() else ROOT / file
        assert where.is_file(), path
        assert not section or f"--8<-- [start:{section}]" in where.read_text(), path
        module, _, name = test.rpartition("::")
        defined = f"\ndef {name}(" in (ROOT / "tests" / module).read_text() if module else name in globals()
        assert defined, f"{path} names a test that does not exist: {test}"


def test_shell_blocks_hold_only_commands_the_tests_run_or_installs():
    for page, _, line in shell_lines():
        assert line.startswith(("pytest ", "python docs/examples/")) or INSTALL.match(line), f"{page}: {line}"


def test_the_html_screenshot_is_shown():
    assert "](img/html-report.png)" in (DOCS / "reading-a-report.md").read_text()
    assert (DOCS / "img" / "html-report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_matrix_page_lists_every_option_and_no_other():
    page = (DOCS / "matrix.md").read_text()
    options = {v for k, v in vars(names).items() if k.startswith("OPT_")}
    for option in options:
        assert f"`{option}" in page, f"docs/matrix.md does not list {option}"
    shown = set(re.findall(r"`(--resume-matrix[a-z-]*)", page))
    assert shown <= options, f"docs/matrix.md lists options the plugin does not have: {shown - options}"
    inis = set(re.findall(r'addini\(\s*"(resume_matrix\w*)"', Path(plugin_options.__file__).read_text()))
    for ini in inis:
        assert f"`{ini}`" in page, f"docs/matrix.md does not list the ini setting {ini}"


# -- every pytest command on the pages collects --------------------------------------------------------

@needs_torch
@pytest.mark.parametrize(("page", "cwd", "line"), PYTEST_COMMAND_CASES)
def test_every_pytest_command_on_the_pages_collects(page, cwd, line, tmp_path):
    """Collecting checks the options, the target names and the cell ids; running is left to the tests
    below (and to the matrix's own tests). Commands for the project root run in this repository's root,
    whose tests/conftest.py declares the bundled targets (elsewhere they run only when named)."""
    args = shlex.split(line)[1:]
    args = [a for i, a in enumerate(args) if a != "-n" and (i == 0 or args[i - 1] != "-n")]  # xdist only spreads
    folder = ROOT / cwd
    # Reports a command writes go to tmp_path, never into the repository.
    args = [re.sub(r"^(--junitxml|--resume-matrix-json|--resume-matrix-html)=(?!/)", rf"\1={tmp_path}/", a)
            for a in args]
    extra = [a for a in ("--co", "-q") if a not in args]
    done = run_pytest([*args, *extra, "-p", "no:cacheprovider"], folder, timeout=300)
    assert done.returncode == 0, f"{page}: {line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    cells = [ln for ln in done.stdout.splitlines() if ln.startswith("resume-matrix::")]
    assert cells, f"{page}: {line} collects no matrix cell"
    if "--resume-matrix-cell=" in line:
        assert len(cells) == 1


# -- the examples the pages include --------------------------------------------------------------------

def test_html_from_json_example_writes_the_report(tmp_path):
    cell = {"target": "t", "case": {}, "case_id": "c", "resume_mode": "auto", "kill": "ckpt1", "passed": False,
            "xfail_reason": None, "categories": ["LOST"], "headline": "LOST 1 input", "resumed_from": [1],
            "reference": [[0, 1, 0, 0], [1, 2, 0, 0]], "composite": [[0, 1, 0, 0]], "runs": []}
    (tmp_path / "m.json").write_text(json.dumps({"seed": 3, "cells": [cell]}))
    done = subprocess.run([sys.executable, str(EXAMPLES / "reports" / "html_from_json.py"), "m.json", "out/r.html"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "out/r.html: 1 cells, 1 failing"
    assert "LOST 1 input" in (tmp_path / "out" / "r.html").read_text()


@needs_torch
def test_cases_hook_example_adds_worker_cases_in_ci_only(pytester):
    shutil.copy(EXAMPLES / "ci" / "conftest.py", pytester.path / "conftest.py")
    args = ("--resume-matrix", "--resume-matrix-target=builtin_loop", "--co", "-q", "-p", "no:cacheprovider")

    def case_ids(env):
        done = run_pytest(args, pytester.path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return {m.group(1) for m in re.finditer(r"builtin_loop\[(.+?)-(?:auto|path)-ckpt", done.stdout)}

    local = case_ids({"CI": ""})
    ci = case_ids({"CI": "true"})
    assert local and ci > local
    assert ci - local == {f"{c}-w2" for c in local if not c.endswith("-w2")}  # cases with workers stay as they are


@needs_torch
def test_ini_example_configures_the_matrix(pytester):
    shutil.copy(EXAMPLES / "ini" / "pytest.ini", pytester.path / "pytest.ini")
    done = run_pytest(("-m", "resume_matrix", "--co", "-q", "-p", "no:cacheprovider"), pytester.path)
    assert done.returncode == 0, done.stdout + done.stderr
    cells = [ln for ln in done.stdout.splitlines() if ln.startswith("resume-matrix::")]
    assert cells and all(ln.startswith("resume-matrix::builtin_loop[") for ln in cells)
    header = run_pytest(("-m", "resume_matrix", "--co", "-p", "no:cacheprovider"), pytester.path)
    assert "resume-check: matrix=quick seed=1234" in header.stdout


@needs_torch
@requires("yaml")
def test_ci_workflow_runs_its_matrix_command_on_the_example_project(pytester):
    import yaml

    workflow = yaml.safe_load((EXAMPLES / "ci" / "resume-matrix.yml").read_text())
    steps = workflow["jobs"]["resume-matrix"]["steps"]
    matrix = next(s for s in steps if s.get("name") == "Resume matrix")
    kept = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    for name in ("conftest.py", "trainer.py", "pytest.ini"):
        shutil.copy(DOWNSTREAM / name, pytester.path / name)
    # The step's env as a pull request sees it: quick mode, the fixed seed.
    env = {**os.environ, "MODE": "quick", "SEED": "1234", "PYTHONWARNINGS": "ignore",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", matrix["run"]], cwd=pytester.path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resume-check: matrix=quick seed=1234" in done.stdout
    reports = kept["with"]["path"].split()
    assert reports == ["resume-matrix.xml", "resume-matrix.json", "resume-matrix.html"]
    for report in reports:
        assert (pytester.path / report).stat().st_size > 0, report
    cells = json.loads((pytester.path / "resume-matrix.json").read_text())["cells"]
    assert cells and all(c["passed"] for c in cells)
    assert '<property name="verdict" value="PASSED"' in (pytester.path / "resume-matrix.xml").read_text()


# -- the verdicts and findings the pages quote --------------------------------------------------------------

TEMPLATE_CATEGORIES = ("CRASHED", "HUNG", "NONDETERMINISTIC", "PROTOCOL", "TARGET_ERROR", "HARNESS")


def template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{[^}]*\}", template)
    return re.compile("^" + ".+".join(re.escape(p) for p in parts) + "$")


def test_report_page_example_lines_of_process_verdicts_match_the_message_templates():
    from pytest_resume_check.cluster import executor
    from pytest_resume_check.judge import harness_errors
    from pytest_resume_check.process import fork_server, supervisor

    stalled = vd.MSG_HUNG_STALLED.format(who="{who}", what=supervisor.ERR_PEERS.replace("{s}", ""))
    templates = [vd.MSG_CRASHED, vd.MSG_HUNG + vd.MSG_HUNG_STACK, vd.MSG_NONDETERMINISTIC, vd.MSG_PROTOCOL,
                 vd.MSG_STEPS, stalled + vd.MSG_HUNG_STACKS,
                 "TARGET_ERROR: " + fork_server.ERR_PRELOAD, harness_errors.MSG_DISK_FULL,
                 harness_errors.MSG_FOLDER_GONE, harness_errors.MSG_WORKER_CRASHED,
                 "HARNESS: " + executor.MSG_NODE_LOST,
                 harness_errors.MSG_SERVER_DIED.replace("{how}", harness_errors.HOW_SIGKILL)]
    shown = [line for lang, body in blocks("reading-a-report.md") if lang == "text"
             for line in body.splitlines() if line.startswith(TEMPLATE_CATEGORIES)]
    assert len(shown) == 13
    for line in shown:
        assert any(template_pattern(t).match(line) for t in templates), line
    # The PROTOCOL example for a plain object in run.state is the run context's own line.
    from pytest_resume_check.records.state import MSG_UNDIGESTABLE
    undigestable = next(line for line in shown if "cannot digest" in line)
    assert template_pattern(vd.MSG_CALLS.format(who="{who}", what=MSG_UNDIGESTABLE)).match(undigestable)
    # The PROTOCOL example for a missing resumed() call is the ledger's own message.
    from pytest_resume_check.records.ledger import compose
    never = next(line for line in shown if "never reported which checkpoint" in line)
    with pytest.raises(Exception, match=re.escape(never.split(": ", 1)[1])):
        compose([[], []])


@needs_torch
def test_report_page_quotes_real_verdicts_of_the_planted_example(tmp_path):
    cells = ("drop_buffer[b4-take2-auto-ckpt1]", "reread", "shared_generator[b4-take2-shuffle-auto-ckpt1]",
             "epoch_reset[b4-take2-auto-ckpt5]", "raise_on_resume[b4-take2-auto-ckpt1]",
             "oldest_checkpoint[b4-take2-auto-ckpt4]", "no_optimizer[b4-take2-auto-ckpt4]")
    report = tmp_path / "planted.json"
    done = run_pytest(("--resume-matrix", "-m", "resume_matrix", "--resume-matrix-seed=1234", "-p", "no:cacheprovider",
                       "-k", " or ".join(cells), f"--resume-matrix-json={report}"), PLANTED,
                      env={"COLUMNS": "80"})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    real = {line.rstrip() for line in done.stdout.splitlines()}
    real |= {c["headline"] for c in json.loads(report.read_text())["cells"]}
    quoted = [line.rstrip() for lang, body in blocks("reading-a-report.md") if lang == "text"
              for line in body.splitlines()]
    for line in quoted:
        if line.startswith(TEMPLATE_CATEGORIES) or line.lstrip().startswith("kept:") or not line.strip():
            continue
        assert line in real, f"docs/reading-a-report.md shows a line this run did not print:\n{line}"
    # The torchdata finding quotes the same cell.
    finding = text_block_after("findings.md", "shared_generator[b4-take2-shuffle-auto-ckpt1]")
    assert finding[0] in real


@needs_torch
def test_torchdata_finding_script_shows_two_orders():
    done = subprocess.run([sys.executable, "-W", "ignore", "docs/examples/findings/torchdata_shared_generator.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    shown = text_block_after("findings.md", "python docs/examples/findings/torchdata_shared_generator.py")
    assert done.stdout.splitlines() == shown
    assert done.returncode == 1, "the orders agree: torchdata fixed it; update docs/findings.md"


@needs_torch
def test_the_declared_known_bug_fails_exactly_where_declared(tmp_path):
    """writing-a-target.md's expected_failures example (the old one, meta-pytorch/data#1437, passes on
    torchdata 0.11 and so failed as XPASS when copied). Its cells fail as declared, the rest pass."""
    report = tmp_path / "known.json"
    done = run_pytest(("--resume-matrix", "--resume-matrix-mode=full", "-m", "resume_matrix",
                       "--resume-matrix-seed=1234", "-p", "no:cacheprovider",
                       "--resume-matrix-target=torchdata_sampler", f"--resume-matrix-json={report}"), PLANTED)
    assert done.returncode == 0, done.stdout[-3000:]
    cells = json.loads(report.read_text())["cells"]
    expected = sorted((c["case_id"], c["kill"]) for c in cells if c["xfail_reason"])
    assert expected == [(case, kill) for case in ("b4-take2", "b4-take2-shuffle")
                        for kill in ("ckpt1_ckpt2+1", "ckpt3_ckpt4+1", "ckpt5_ckpt6+1", "ckpt7_ckpt8")]
    assert all(not c["passed"] for c in cells if c["xfail_reason"])  # XFAIL, none XPASS
    assert all(c["passed"] for c in cells if not c["xfail_reason"])
    assert f"{len(cells) - 8} passed, 8 xfailed" in done.stdout


@needs_torch
def test_torchdata_sampler_finding_script_shows_the_replay():
    script = "docs/examples/findings/torchdata_sampler_state_after_load.py"
    done = subprocess.run([sys.executable, "-W", "ignore", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines() == text_block_after("findings.md", f"python {script}")
    assert done.returncode == 1, "the twice-resumed loader continues right: torchdata fixed it; update docs/findings.md"


@needs_torch
def test_torchdata_worker_rng_finding_script_shows_other_noise():
    script = "docs/examples/findings/torchdata_worker_rng_after_resume.py"
    done = subprocess.run([sys.executable, "-W", "ignore", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines() == text_block_after("findings.md", f"python {script}")
    assert done.returncode == 1, "the resumed workers draw the same noise: torchdata fixed it; update docs/findings.md"


@requires("torch", "torchdata", "lightning")
@pytest.mark.parametrize("script, shows", [
    ("lightning_epoch_end_resume.py", "epoch 1, resumed from step=5:   []"),
    ("lightning_estimated_stepping_batches.py", "after step 3, resumed from step=3:  [0, 1, 2, 3,"),
])
def test_lightning_finding_scripts_show_what_the_page_says(script, shows):
    command = f"python docs/examples/findings/{script}"
    assert any(line == command for _, _, line in shell_lines())
    done = subprocess.run([sys.executable, "-W", "ignore", f"docs/examples/findings/{script}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert shows in done.stdout, done.stdout + done.stderr[-2000:]
    assert done.returncode == 1, f"{script} shows no difference: Lightning fixed it; update docs/findings.md"


@needs_verl
def test_verl_finding_reproduces_with_its_documented_command(pytester):
    line = next(ln for p, _, ln in PYTEST_COMMANDS
                if p == "findings.md" and "--resume-matrix-cell=verl_stock_sync" in ln)
    args = shlex.split(line)[1:]
    done = run_pytest([*args, "-p", "no:cacheprovider", "--junitxml=verl.xml"], pytester.path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 xfailed" in done.stdout
    cell = json.loads((pytester.path / "verl.json").read_text())["cells"][0]
    shown = text_block_after("findings.md", line)
    assert cell["categories"] == ["REORDERED", "STATE_DIVERGED"]
    assert shown == [cell["headline"], *(f"  also: {f['headline']}" for f in cell["findings"][1:])]
    # The junit excerpt on the CI page is this cell's.
    xml = (pytester.path / "verl.xml").read_text()
    page = (DOCS / "ci.md").read_text()
    for prop in re.findall(r"<property [^>]*/>", page):
        assert prop in xml, prop


@needs_verl
def test_quickstart_figures_come_from_the_command_it_shows(tmp_path):
    """docs/quickstart.md's one-target command prints the summary the page shows (the page said
    197 cells while the same command ran 426). Its timings are not checked: they depend on the machine.
    The whole main job is not run here (inside the suite it hit its time limit on a loaded
    machine); its counts are checked from its matrix below."""
    command = ("pytest --resume-matrix -m resume_matrix --resume-matrix-target=verl_stock_sync -n auto "
               "--resume-matrix-seed=1234")
    assert f"```bash\n{command}\n```" in (DOCS / "quickstart.md").read_text()
    shown = text_block_after("quickstart.md", command)
    args = shlex.split(command)[1:]
    args[args.index("auto")] = "2"
    done = run_pytest((*args, "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'bt'}"), ROOT, timeout=1200,
                      env={"COLUMNS": "80"})  # generous: it takes about a minute on 2 idle cores
    assert done.returncode == 0, done.stdout[-3000:]
    real = [line.rstrip() for line in done.stdout.splitlines()]
    summary_line = next(line for line in shown if "resume matrix:" in line)
    assert summary_line in real
    at = real.index(summary_line)
    grids = shown[shown.index(summary_line) + 1:shown.index("[...]", shown.index(summary_line))]
    assert real[at + 1:at + 1 + len(grids)] == grids
    outcome = re.search(r"(\d+ passed, \d+ xfailed)", shown[-1]).group(1)
    assert outcome in real[-1]


@needs_verl
def test_quickstart_counts_the_cells_of_the_main_job(tmp_path, request):
    """"719 cells, 48 of them expected failures with seed 1234": the matrix of this repository's targets, built
    as the plugin builds it with that seed (crash cells from each target's recorded save), without running a
    cell."""
    # The suite's top conftest.py, as pytest loaded it: the name ``conftest`` alone may be another wing's.
    top = Path(__file__).resolve().parents[1] / "conftest.py"
    suite = next(m for m in request.config.pluginmanager.get_plugins() if getattr(m, "__file__", None) == str(top))
    RESUME_TARGETS = suite.RESUME_TARGETS

    from pytest_resume_check.cells import matrix
    from pytest_resume_check.engine import Engine

    engine = Engine(tmp_path, seed=1234)
    cells = []
    try:
        for target in RESUME_TARGETS:
            cells += matrix.cells(target, "quick", 1234)
            if target.crash_save:
                cells += engine.crash_cells(target, "quick")
    finally:
        engine.close()
    text = (DOCS / "quickstart.md").read_text()
    expected = sum(1 for c in cells if c.xfail_reason)
    assert f"{len(cells)} cells,\n{expected} of them expected failures with seed 1234" in text, (len(cells), expected)


def test_every_test_the_guarantees_name_exists():
    """docs/guarantees.md names the test that holds each promise; each must exist (a renamed test would
    leave a promise unheld)."""
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", (DOCS / "guarantees.md").read_text())
    assert len(named) >= 30
    for path, name in named:
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} is named in guarantees.md but missing"
