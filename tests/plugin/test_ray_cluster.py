"""``--resume-matrix-ray`` on a real Ray cluster of two nodes on this machine (a head and a second raylet,
each with resources of its own; docs/cluster.md): the header names the cluster and the summary where the
cells ran; the same verdict for every cell as the local run of the same seed, a failing cell's report and
kept evidence as locally, a trainer configured by the environment given its declared variables on the
nodes and warned about where it reads one that differs there, GPU resources given by Ray or refused, a lost
node's cells failing one line each, Ctrl-C ending every task, and no process of ours left after."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from leftovers import interruptible
from optional import requires
from project_session import pytest_in

pytestmark = requires("ray")

TRAINER = Path(__file__).resolve().parents[1] / "support" / "project_trainer.py"
GROUP_ENV = "PYTEST_RESUME_CHECK_RAY_GROUP"
SEED = "--resume-matrix-seed=5"

#: A correct case and a planted bug (a resume loses its first input); a target that needs one GPU a run
#: (the second node declares one) and one that needs two (no node has them).
CONFTEST = """
import project_trainer
from pytest_resume_check import resume_target

def declare(name, cases, **options):
    return resume_target(project_trainer.train, name=name, steps=project_trainer.STEPS, cases=cases,
                         preload=("project_trainer",), crash_save=False, **options)

files = declare("files", [{"id": "ok"}, {"id": "bug", "skip": True, "links": True}])
gpu = declare("gpu", [{"id": "g"}], resume_modes=["auto"], resources={"CPU": 1, "GPU": 1})
gpu2 = declare("gpu2", [{"id": "g"}], resume_modes=["auto"], resources={"GPU": 2})

# Configured by the environment: a resume loses its first input when every variable named is set. The nodes
# have none of them: RC_ENV_A is not declared, RC_ENV_B is (pass_env=), RC_ENV_C is given by the option.
env_undeclared = declare("env_undeclared", [{"id": "e", "skip_if_set": ["RC_ENV_A"]}], resume_modes=["auto"])
env_declared = declare("env_declared", [{"id": "e", "skip_if_set": ["RC_ENV_B", "RC_ENV_C"]}], resume_modes=["auto"],
                       pass_env=["RC_ENV_B"])
"""
#: The values this machine has for the variables the `env_` targets read (never in a report).
ENV_VALUES = {"RC_ENV_A": "value-of-a", "RC_ENV_B": "value-of-b", "RC_ENV_C": "value-of-c"}

#: Targets held at a gate each: one only the second node can run, one that a third node can run too (the
#: gate of its first runs opens once the second node is lost), one on the head.
HELD = """
import project_trainer
from pytest_resume_check import resume_target

def declare(name, node, gate):
    return resume_target(project_trainer.train, name=name, steps=project_trainer.STEPS, resume_modes=["auto"],
                         cases=[{{"id": "held", "gate": gate}}], preload=("project_trainer",), crash_save=False,
                         hang_timeout=600, resources={{"CPU": 1, node: 1}})

on_second = declare("on_second", "second", {never!r})
roams = declare("roams", "roam", {later!r})
on_head = declare("on_head", "head", {never!r})
"""


def project(path: Path, conftest: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "project_trainer.py").write_text(TRAINER.read_text())
    (path / "conftest.py").write_text(conftest)
    return path


def cluster_of(nodes: list[dict[str, float]], flags: Path) -> object:
    from pytest_resume_check.cluster.testing import LocalCluster

    cluster = LocalCluster(nodes, env={"TRAINER_FLAG_DIR": str(flags)})
    cluster.start()
    return cluster


def cells(path: Path) -> dict[str, dict[str, object]]:
    data = json.loads(path.read_text())
    return {f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]": c for c in data["cells"]}


def ours(cluster) -> list[int]:
    """Processes started by a group of cells on a node of ``cluster`` (they carry a group's token, and the
    cluster's token file from the node's environment; another test's cluster may run meanwhile)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if f"{GROUP_ENV}=".encode() in environ and f"={cluster.token}\0".encode() in environ:
            found.append(int(entry))
    return found


def normalised(text: str) -> str:
    """Output with every session folder spelled ROOT and durations left out."""
    text = re.sub(r"/\S*?/resume-matrix\d+", "ROOT", text)
    return re.sub(r"\d+(\.\d+)? ?s\b", "N s", text)


def block(output: str, name: str) -> str:
    """The failure report of the cell ``name`` in pytest's FAILURES section."""
    header = re.search(rf"^_+ .*{re.escape(name)} _+$", output, re.MULTILINE)
    assert header is not None, output
    end = output.find("\n____", header.end())
    return output[header.end():end if end > 0 else None]


def test_cluster_gives_each_cell_the_local_verdict_report_and_evidence(tmp_path):
    pytest.importorskip("torch")  # builtin_loop, a bundled target, trains a torch model
    flags = tmp_path / "flags"
    flags.mkdir()
    path = project(tmp_path / "project", CONFTEST)
    cluster = cluster_of([{"CPU": 1, "head": 1}, {"CPU": 1, "second": 1, "GPU": 1}], flags)
    try:
        common = ["--resume-matrix", SEED, "--resume-matrix-target=builtin_loop", "--resume-matrix-target=files",
                  "--resume-matrix-target=env_undeclared", "--resume-matrix-target=env_declared", "-v"]
        ray = [f"--resume-matrix-ray={cluster.address}", "--resume-matrix-target=gpu", "--resume-matrix-target=gpu2",
               "--resume-matrix-env=RC_ENV_C"]
        # The nodes have TRAINER_FLAG_DIR as this session has it: only the RC_ENV_ variables differ there.
        env = {**cluster.env(), "RAY_ADDRESS": "", **ENV_VALUES, "TRAINER_FLAG_DIR": str(flags)}
        # Each session keeps its folder in a --basetemp of its own: in pytest's numbered ones, other sessions
        # of the suite (with -n 2) remove a finished session's folder before this test reads it.
        code, remote = pytest_in(path, *common, *ray, "-k", "files or b4-take6 or gpu or env_", "--junitxml=junit.xml",
                                 "--resume-matrix-json=cluster.json", f"--basetemp={tmp_path / 'on-cluster'}",
                                 env=env)
        again_code, again = pytest_in(path, *common, *ray, "--lf", "--resume-matrix-json=again.json", env=env)
        left = ours(cluster)
    finally:
        cluster.stop()
    assert code == 1, remote
    local_code, local = pytest_in(path, *common, "-k", "files or b4-take6 or env_", "--resume-matrix-json=local.json",
                                  f"--basetemp={tmp_path / 'here'}", env=ENV_VALUES)
    assert local_code == 1, local
    on_cluster, here = cells(path / "cluster.json"), cells(path / "local.json")

    # The header names the cluster and its nodes; the summary says how many cells ran where.
    assert f"\nresume-check: cells run on the Ray cluster at {cluster.address}: 2 nodes alive: " in remote, remote
    places = re.search(rf"^resume-check: (\d+) cells ran on the Ray cluster at {re.escape(cluster.address)}: (.*)$",
                       remote, re.MULTILINE)
    assert places is not None and int(places.group(1)) == len(on_cluster), remote
    refused = [n for n in on_cluster if n.startswith("gpu2[")]
    counts = [int(n) for n in re.findall(r"(\d+) on node \S+ \(.*?, node id [0-9a-f]{12}\)", places.group(2))]
    assert counts and sum(counts) + len(refused) == len(on_cluster), places.group(0)
    assert f"{len(refused)} without one" in places.group(2)

    # Every cell the local run has, with the same verdict, headline and rerun line; but the trainer configured
    # by RC_ENV_A, which is not declared, trains otherwise on the nodes, which lack it.
    undeclared = sorted(n for n in here if n.startswith("env_undeclared["))
    assert set(here) <= set(on_cluster) and len(here) > 20 and undeclared
    same = ("status", "headline", "rerun", "categories", "findings", "reference", "composite", "marks", "story",
            "resumed_from", "known_finding")
    for name, cell in here.items():
        if name in undeclared:
            continue
        got = on_cluster[name]
        assert {k: got[k] for k in same} == {k: cell[k] for k in same}, name
        assert [r["outcome"] for r in got["runs"]] == [r["outcome"] for r in cell["runs"]], name
    failing = sorted(n for n, c in here.items() if c["status"] != "PASSED")
    assert failing and all(n.startswith(("files[bug-", "env_")) for n in failing)
    assert any(n.startswith("env_declared[") for n in failing) and set(undeclared) & set(failing)
    assert all(on_cluster[n]["status"] == "PASSED" for n in undeclared)
    assert any(c["status"] == "PASSED" for n, c in here.items() if n.startswith("builtin_loop["))

    # That is said once, naming the variable and how to forward it; each cell's JSON names what differed (names,
    # never values: not even the declared ones' are in a report).
    from pytest_resume_check.plugin import environment

    warned = environment.differs_message(["RC_ENV_A"])
    assert remote.count("EnvironmentDiffersWarning: ") == 1 and warned in remote, remote
    summary = remote[remote.index("warnings summary"):remote.index(warned)]
    assert sorted(re.findall(r"^resume-matrix::(\S+)$", summary, re.MULTILINE)) == undeclared
    assert places.group(0).endswith(f"; {len(undeclared)} read environment variables that differ there (see the "
                                    "warnings)")
    for name, cell in on_cluster.items():
        assert cell["environment"].get("differs", []) == (["RC_ENV_A"] if name in undeclared else []), name
    assert on_cluster[undeclared[0]]["environment"]["read"] == ["RC_ENV_A", "TRAINER_FLAG_DIR"]
    declared = next(c for n, c in on_cluster.items() if n.startswith("env_declared["))
    assert declared["environment"]["declared"] == ["RC_ENV_B", "RC_ENV_C"]
    for value in ENV_VALUES.values():
        assert value not in remote and value not in (path / "cluster.json").read_text(), value

    # A failing cell's report reads as locally; its kept folders were copied into this session's folder.
    name = failing[0]
    assert normalised(block(remote, name)) == normalised(block(local, name))
    kept = re.search(r"kept: (\S+) \(checkpoints.*and (\S+) \(the uninterrupted runs\)", block(remote, name))
    assert kept is not None, block(remote, name)
    for folder in map(Path, kept.groups()):
        assert folder.is_dir() and "resume-matrix" in str(folder) and "pytest-resume-check-ray" not in str(folder)
    assert (Path(kept.group(1)) / "run0.log").is_file()
    root = Path(kept.group(1)).parents[2]  # ROOT/files/bug/auto-ckpt1: this session's folder
    assert re.fullmatch(r"resume-matrix\d+", root.name)
    for run in on_cluster[name]["runs"]:
        assert run["log_file"].startswith(f"{root}/") and Path(run["log_file"]).is_file()

    # Kept folders with an absolute link to a checkpoint and a FIFO: a link that leads inside its folder comes back
    # relative (one in a cell's snapshot of a shared first run leads into that run's folder: left out), each FIFO
    # is left out; what was left out is named in the report and the JSON, and everything else is kept.
    came_back = []
    for bug in (n for n in failing if n.startswith("files[bug-")):
        text = block(remote, bug)
        kept = re.search(r"kept: (\S+) \(checkpoints", text)
        assert kept is not None, text
        cell = Path(kept.group(1))
        assert (cell / "run0.log").is_file() and not list(cell.rglob("events.fifo")), text
        for link in cell.rglob("current"):
            assert not os.path.isabs(os.readlink(link)) and (link / "weights.bin").is_file(), text
            came_back.append(link)
        from pytest_resume_check.cluster.outcomes import REFUSED_KEY

        refused = on_cluster[bug][REFUSED_KEY]
        assert refused and {r["where"] for r in refused} == {"node"}, refused
        for r in refused:
            assert (r["why"] == "a FIFO" if r["path"].endswith("/events.fifo") else
                    r["path"].endswith("/current") and r["why"].endswith(", outside its kept folder")), r
        assert f": {refused[0]['path']} ({refused[0]['why']}; left out on the node)" in text, text
    assert came_back

    # GPU resources: each run of `gpu` saw the device Ray gave its task; `gpu2` is refused in one line.
    seen = [f.read_text().split() for f in flags.iterdir()]
    gpu_runs = [s for s in seen if s[0] == "gpu"]
    assert gpu_runs and all(s[2] == "0" for s in gpu_runs), seen
    assert all(s[2] == "-" for s in seen if s[0] == "files")
    assert all(c["status"] == "PASSED" for n, c in on_cluster.items() if n.startswith("gpu["))
    refused = [c for n, c in on_cluster.items() if n.startswith("gpu2[")]
    assert refused and all(c["status"] == "TARGET_ERROR" and "no node of the Ray cluster" in c["headline"]
                           and "\n" not in c["headline"] for c in refused)
    assert left == []

    # junit has every cell with its target's class name and verdict; --lf reruns exactly the failing cells.
    junit = (path / "junit.xml").read_text()
    assert junit.count('classname="resume-matrix.files"') == sum(n.startswith("files[") for n in on_cluster)
    assert '<property name="verdict" value="LOST"' in junit or '<property name="verdict" value="DUPLICATED"' in junit
    failed_before = sorted(n for n, c in on_cluster.items() if c["status"] not in ("PASSED", "XFAIL"))
    assert again_code == 1 and sorted(cells(path / "again.json")) == failed_before, again


def test_lost_node_fails_its_cells_or_runs_them_elsewhere_and_ctrl_c_stops_every_task(tmp_path):
    """The second node runs two groups when its raylet is killed: `on_second`'s cells (no other node has its
    resource) fail one line each; `roams`'s run again on a third node (--resume-matrix-ray-retries=1) and
    pass. Then Ctrl-C while `on_head`'s group waits: the session ends, nothing of ours is left."""
    flags = tmp_path / "flags"
    flags.mkdir()
    later = tmp_path / "later"
    path = project(tmp_path / "project", HELD.format(never=str(tmp_path / "never"), later=str(later)))
    code, listed = pytest_in(path, "--resume-matrix", "--co", "-q")
    held = [ln for ln in listed.splitlines() if ln.startswith("resume-matrix::on_second[")]
    moved = [ln for ln in listed.splitlines() if ln.startswith("resume-matrix::roams[")]
    assert held and moved, listed
    cluster = cluster_of([{"CPU": 1, "head": 1}, {"CPU": 2, "second": 1, "roam": 1}], flags)
    out = tmp_path / "out.txt"
    try:
        with open(out, "w") as sink:
            session = subprocess.Popen(
                [sys.executable, "-m", "pytest", "--resume-matrix", SEED, "-v", "-p", "no:randomly",
                 "--resume-matrix-ray=auto", "--resume-matrix-ray-retries=1", "--resume-matrix-json=cluster.json"],
                cwd=path, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=interruptible,
                env={**os.environ, **cluster.env(), "RAY_ADDRESS": cluster.address, "PYTHONPATH": str(path),
                     "COLUMNS": "200"})
        try:
            runs = wait_for(lambda: {f.read_text().split()[0]: int(f.name.split("-")[1]) for f in flags.iterdir()},
                            lambda got: len(got) == 3, "a run of each target to start")
            cluster.add_node({"CPU": 1, "roam": 1})  # where the roaming group can go once the second is lost
            cluster.kill_node(1)  # the second node's raylet: its tasks fail, the session goes on
            later.touch()
            wait_for(lambda: out.read_text().count(" FAILED"), lambda n: n >= len(held), "the lost node's cells")
            wait_for(lambda: out.read_text().count(" PASSED"), lambda n: n >= len(moved), "the moved cells")
            wait_for(lambda: alive(runs["on_second"]), lambda up: not up, "the lost node's run to end")
            assert alive(runs["on_head"]) and ours(cluster)  # the held group is seen: the check below can fail
            session.send_signal(signal.SIGINT)  # Ctrl-C: the head's task is stopped, its run ended
            code = ended(session, out)
        finally:
            if session.poll() is None:
                session.kill()
        left = ours(cluster)
    finally:
        cluster.stop()
    output = out.read_text()
    assert code == 2, output
    judged = cells(path / "cluster.json")
    lost = {n: c for n, c in judged.items() if n.startswith("on_second[")}
    assert len(lost) == len(held)
    for cell in lost.values():
        assert cell["status"] == "HARNESS" and "\n" not in cell["headline"], cell["headline"]
        assert re.match(r"HARNESS: Ray node \S+ \(.*node id [0-9a-f]{12}\) was lost while it ran this cell's group "
                        r"\(NodeDiedError\)", cell["headline"]), cell["headline"]
    again = {n: c for n, c in judged.items() if n.startswith("roams[")}
    assert len(again) == len(moved) and all(c["status"] == "PASSED" for c in again.values()), again
    assert not alive(runs["on_head"]) and left == []


def ended(session: subprocess.Popen[bytes], out: Path, timeout: float = 300.0) -> int:
    """The exit code of ``session``; one that has not ended within ``timeout`` (generous: it only keeps a
    broken stop from hanging the suite) is made to print its threads' stacks (pytest's faulthandler) first."""
    try:
        return session.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:  # whether SIGINT is blocked or pending in it (a Ctrl-C that never became KeyboardInterrupt)
            masks = [ln for ln in Path(f"/proc/{session.pid}/status").read_text().splitlines()
                     if ln.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))]
        except OSError:
            masks = []
        session.send_signal(signal.SIGABRT)
        session.wait(timeout=30)
        tail = out.read_text()[-8000:]
        raise AssertionError(f"the session did not end within {timeout:g} s of Ctrl-C ({'; '.join(masks)}):\n"
                             f"{tail}") from None


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def wait_for(read, done, what: str, timeout: float = 180.0):
    """Read until ``done(value)``; the limit only guards against a broken run hanging the suite."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last seen: {value!r}")
        time.sleep(0.1)


def test_a_cluster_that_cannot_be_used_is_one_error(tmp_path):
    path = project(tmp_path / "project", CONFTEST)
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, output = pytest_in(path, "--resume-matrix", "-k", "files", f"--resume-matrix-ray=127.0.0.1:{port}")
    assert code == 4 and f"--resume-matrix-ray=127.0.0.1:{port}: no Ray head answers there" in output, output
    assert "Traceback" not in output
    code, output = pytest_in(path, "--resume-matrix", "-k", "files", "--resume-matrix-ray=auto",
                             env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert code == 4 and (f"--resume-matrix-ray=auto: no Ray cluster found for this machine (the cluster Ray finds, "
                          f"127.0.0.1:{port}, does not answer") in output, output
    code, output = pytest_in(path, "--resume-matrix", "--resume-matrix-ray=auto", "-n", "2")
    assert code == 4 and "drop -n" in output, output
    code, output = pytest_in(path, "--resume-matrix", "--resume-matrix-ray=auto", "--resume-matrix-ray-retries=x")
    assert code == 4 and "--resume-matrix-ray-retries='x' is not a number of retries" in output, output
