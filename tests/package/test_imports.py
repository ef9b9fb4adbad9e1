"""Importing is free of effects, and cheap where a module promises it.

Every module of ``pytest_resume_check`` and ``agentlightning`` is imported in a child forked from an
interpreter that imported every module from outside our packages first (what ours import: torch, verl,
...), and the child compares its own state before and after the import: no thread, no process, no
signal handler, not a child subreaper, no frozen GC (house style, "Importing is free of effects": the first version made
every importer a subreaper and froze its GC). Engine modules also never import pytest. The lists come
from walking the packages, so a new module is checked without being added anywhere.

Everything here runs without torch, except the one test that runs a target.
"""

from __future__ import annotations

import json
import os
import pkgutil
import select
import subprocess
import sys
from collections.abc import Iterable

import pytest
from optional import MISSING_REASON, requires

import agentlightning
import pytest_resume_check
from pytest_resume_check.process._server_setup import WARMUP_ENV

#: Every test here starts interpreters (a probe per module, or a zygote that forks one): not the fast loop.
pytestmark = pytest.mark.slow

PACKAGES = (pytest_resume_check, agentlightning)
OURS = {package.__name__ for package in PACKAGES}

#: The pytest side of the plugin (the ``plugin`` subpackage and the hook specs); every other module of
#: pytest_resume_check is engine and can be used from a script, so it must not import pytest.
PYTEST_SIDE_PREFIXES = ("pytest_resume_check.plugin", "pytest_resume_check.hookspecs")

#: Optional dependencies: a module whose import stops at one of these, not installed, is skipped, not
#: failed. omegaconf comes with verl (agentlightning.verl.trainer imports it before verl); the last three are
#: the integrations' frameworks.
OPTIONAL = ("torch", "torchdata", "numpy", "verl", "omegaconf", "lightning", "transformers", "accelerate")

# What the probe compares, by name.
PYTHON_THREADS = "Python threads"
OS_THREADS = "OS threads"
CHILDREN = "child processes"
SIGNALS = "signal handlers"
SUBREAPER = "child subreaper"
FROZEN_GC = "frozen GC objects"

#: The exceptions, with the effects they may have and why. Both are entries of the fork server's
#: preload list, which can only name modules: importing them *is* the call, and only the fork server
#: imports them.
PRELOAD_ENTRIES = {
    # Points fds 1 and 2 at /dev/null while the server imports and warms up the targets' modules;
    # file descriptors are not among the compared state, so it has nothing to be excused for.
    "pytest_resume_check.process._preload_begin": (),
    # Makes the server the subreaper of its children (it reaps orphaned loader workers at once) and
    # freezes its heap, so no forked child's first collection copies it.
    "pytest_resume_check.process._preload_end": (SUBREAPER, FROZEN_GC),
}

#: Runs in a fresh interpreter: ``-c PROBE module report.json``, or as the zygote: ``-c PROBE --zygote
#: folder first.json``, which imports the modules first.json lists and then probes each module named on
#: its stdin in a forked child.
PROBE = r"""
import ctypes, gc, importlib, json, os, signal, sys, threading

PR_GET_CHILD_SUBREAPER = 37


def children():
    # Processes whose parent is this one, zombies included.
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # The name in parentheses may hold spaces; after it come the state and the parent's pid.
        if int(stat.rpartition(")")[2].split()[1]) == me:
            found.append(int(pid))
    return sorted(found)


def subreaper():
    flag = ctypes.c_int(-1)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value


def state():
    return {
        "Python threads": threading.active_count(),
        "OS threads": len(os.listdir("/proc/self/task")),
        "child processes": children(),
        "signal handlers": {getattr(s, "name", str(s)): repr(signal.getsignal(s)) for s in signal.valid_signals()},
        "child subreaper": subreaper(),
        "frozen GC objects": gc.get_freeze_count(),
    }


def probe(module):
    # The state before and after importing module (or the dependency it found missing), and what it imported.
    modules, before = set(sys.modules), state()
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        return {"missing": error.name}
    # in the order they were imported
    return {"before": before, "after": state(), "imported": [m for m in sys.modules if m not in modules]}


if sys.argv[1] == "--zygote":
    # Import every module first.json lists, then for each module name read from stdin fork a child that
    # imports it and writes its report to the folder, and answer its exit status on stdout.
    folder = sys.argv[2]
    with open(sys.argv[3]) as f:
        for first in json.load(f):
            try:
                importlib.import_module(first)
            except Exception:  # an optional dependency not installed: the module needing it says so
                pass
    for line in sys.stdin:
        module = line.strip()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                result = probe(module)
                with open(os.path.join(folder, module + ".json"), "w") as f:
                    json.dump(result, f)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    sys.exit(0)

module, report = sys.argv[1], sys.argv[2]
result = probe(module)
with open(report, "w") as f:  # not stdout: a preload entry points fd 1 at /dev/null
    json.dump(result, f)
"""


def modules_of(package) -> list[str]:
    """The package and every module and subpackage under it."""
    # Subpackages are imported to look inside them; one that fails is still listed, and fails its test.
    walk = pkgutil.walk_packages(package.__path__, package.__name__ + ".", onerror=lambda name: None)
    return [package.__name__, *(info.name for info in walk)]


MODULES = [name for package in PACKAGES for name in modules_of(package)]


def on_pytest_side(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in PYTEST_SIDE_PREFIXES)


ENGINE_MODULES = [name for name in MODULES if name.startswith("pytest_resume_check") and not on_pytest_side(name)]


def clean_env() -> dict[str, str]:
    """This process's environment without the fork server's warm-up list, which no other process may
    inherit."""
    return {key: value for key, value in os.environ.items() if key != WARMUP_ENV}


def probe(module: str, folder) -> dict:
    """Import ``module`` in a fresh interpreter and return its report."""
    report = folder / f"{module}.json"
    done = subprocess.run([sys.executable, "-c", PROBE, module, str(report)],
                          capture_output=True, text=True, env=clean_env(), timeout=600)
    assert done.returncode == 0, f"importing {module} failed:\n{done.stderr[-4000:]}"
    return json.loads(report.read_text())


#: Run in a fresh interpreter: ``-c ALL_THEIRS modules.json out.json``: imports each of our modules, the
#: preload entries last (what their calls import lazily counts too: ``sysconfig.get_paths()`` imports
#: ``_sysconfigdata_*``, which nothing else imports where torch is not installed), and lists the modules
#: from outside our packages that came with them, in order. The preload entries' effects (fds 1 and 2 on
#: /dev/null, a subreaper, a frozen heap) stay in this throwaway interpreter, which reports through a file.
ALL_THEIRS = r"""
import importlib, json, sys
with open(sys.argv[1]) as f:
    ours, last, modules = json.load(f)
for module in [m for m in modules if m not in last] + last:
    try:
        importlib.import_module(module)
    except Exception:  # its own test says why
        pass
with open(sys.argv[2], "w") as f:
    json.dump([m for m in sys.modules if m.partition(".")[0] not in ours], f)
"""


class Zygote:
    """One interpreter that has imported every module from outside our packages that any of ours imports,
    and forks a child per module to probe: a probe then costs a fork and our module's own import, not
    torch's and verl's again (they cost most of this file's time, twice per module that starts threads)."""

    def __init__(self, folder):
        self.folder = folder
        spec, theirs = folder / "modules.json", folder / "theirs.json"
        spec.write_text(json.dumps([sorted(OURS), sorted(PRELOAD_ENTRIES), MODULES]))
        subprocess.run([sys.executable, "-c", ALL_THEIRS, str(spec), str(theirs)], check=True, env=clean_env(),
                       timeout=600)
        self.process = subprocess.Popen([sys.executable, "-c", PROBE, "--zygote", str(folder), str(theirs)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean_env())

    def probe(self, module: str) -> dict:
        """The report of importing ``module`` in a child forked from the zygote."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(module + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 600)  # generous: a import that hangs fails
        assert ready, f"importing {module} did not finish in 600 s"
        code = self.process.stdout.readline().strip()
        assert code == "0", f"importing {module} in a forked probe failed (exit status {code!r})"
        return json.loads((self.folder / f"{module}.json").read_text())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    forked = Zygote(tmp_path_factory.mktemp("zygote"))
    yield forked
    forked.close()


def skip_if_a_dependency_is_missing(module: str, result: dict) -> None:
    """Skip when importing ``module`` stopped at an optional dependency that is not installed."""
    if "missing" in result:
        dependency = result["missing"].partition(".")[0]
        assert dependency in OPTIONAL, f"importing {module} needs {result['missing']}, not an optional dependency"
        pytest.skip(f"{module}: " + MISSING_REASON.format(dependency))


def top_level(modules: Iterable[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def effects(before: dict, after: dict) -> dict[str, str]:
    """What an import changed, by name of the compared state."""
    found = {}
    for name in (PYTHON_THREADS, OS_THREADS):
        if after[name] > before[name]:
            found[name] = f"started threads ({name}: {before[name]} before, {after[name]} after)"
    started = sorted(set(after[CHILDREN]) - set(before[CHILDREN]))
    if started:
        found[CHILDREN] = f"started processes {started}"
    changed = [s for s, handler in after[SIGNALS].items() if before[SIGNALS].get(s) != handler]
    if changed:
        found[SIGNALS] = "changed the handlers of " + ", ".join(changed)
    if after[SUBREAPER] != 0:
        found[SUBREAPER] = "made the process a child subreaper"
    if after[FROZEN_GC] != 0:
        found[FROZEN_GC] = f"froze {after[FROZEN_GC]} objects for the GC"
    return found


# -- every module -------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", MODULES)
def test_importing_a_module_starts_nothing_and_changes_no_process_setting(module, zygote):
    # Some libraries start threads when imported (numpy's OpenBLAS pool, pyarrow's, torch's): effects of
    # theirs, not of our code. The zygote imported every module from outside our packages before the
    # baseline; what the import of ours changes after it is ours.
    result = zygote.probe(module)
    skip_if_a_dependency_is_missing(module, result)
    found = effects(result["before"], result["after"])
    unexpected = [text for name, text in found.items() if name not in PRELOAD_ENTRIES.get(module, ())]
    assert not unexpected, f"importing {module} " + "; ".join(unexpected)
    theirs = [m for m in result["imported"] if m.partition(".")[0] not in OURS]
    assert not theirs, f"the zygote did not import {theirs} before the baseline: their effects would count as ours"


@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_engine_modules_never_import_pytest(module, tmp_path):
    result = probe(module, tmp_path)
    skip_if_a_dependency_is_missing(module, result)
    pulled = sorted({"pytest", "_pytest"} & top_level(result["imported"]))
    assert not pulled, f"{module} imports {pulled}: only {', '.join(PYTEST_SIDE_PREFIXES)} may"


# -- cheap imports -------------------------------------------------------------------------------------

def test_importing_agentlightning_imports_neither_torch_nor_verl():
    code = (
        "import sys, agentlightning, agentlightning.verl\n"
        "assert 'AgentLightningRayPPOTrainer' in dir(agentlightning.verl)\n"
        "heavy = [m for m in ('torch', 'verl', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=clean_env())


def test_computing_the_matrix_steps_imports_neither_torch_nor_verl():
    from agentlightning.verl import resume_target as rt

    code = (
        "import sys\n"
        "from agentlightning.verl import resume_target as rt\n"
        "steps = [rt.async_steps(c) for c in rt.ASYNC_CASES] + [rt.sync_steps(c) for c in rt.SYNC_CASES]\n"
        "bounds = [rt.async_boundaries(c) for c in rt.ASYNC_CASES]\n"
        "heavy = [m for m in ('torch', 'verl', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print(steps)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True,
                         env=clean_env())
    assert out.stdout.strip() == str([rt.async_steps(c) for c in rt.ASYNC_CASES]
                                     + [rt.sync_steps(c) for c in rt.SYNC_CASES])


# -- what a run leaves behind --------------------------------------------------------------------------

@requires("torch", "torchdata")
def test_a_run_through_the_engine_leaves_no_warmup_list_in_the_environment(tmp_path, monkeypatch):
    from pytest_resume_check.builtin.targets import builtin_loop
    from pytest_resume_check.cells.matrix import Cell
    from pytest_resume_check.engine import Engine
    from pytest_resume_check.records.plan import KillSpec

    monkeypatch.delenv(WARMUP_ENV, raising=False)
    assert any(":" in entry for entry in builtin_loop.preload)  # the run has a warm-up to pass on
    case = builtin_loop.cases[0]
    cell = Cell(builtin_loop, case, "auto", (KillSpec(1),), builtin_loop.steps(case))
    result = Engine(tmp_path, seed=3).run_cell(cell)
    assert result.passed
    assert WARMUP_ENV not in os.environ
