"""The Agent Lightning trainer with its actor on verl's RayWorkerGroup of real Ray actors, under the harness.

Every run is a Ray driver (a child process the harness SIGKILLs) connected to one Ray head per session,
started by the target's service. Checked here: the Ray target's default matrix passes; with the fix
switched off the buffered tail is LOST on Ray too; each rank saves and restores its own file across the
process boundary; a killed driver's actors are ended by Ray; a session leaves no Ray process and no Ray
folder behind. These tests take seconds per run (each run starts two actor processes that import verl).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("verl")
pytest.importorskip("ray")

from agentlightning.verl import ray_cluster  # noqa: E402
from agentlightning.verl import resume_target as rt  # noqa: E402
from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records.results import Outcome  # noqa: E402
from pytest_resume_check.run import KillSpec, RunContext  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

ASYNC_CASE = rt.RAY_CASES[0]  # 6 inputs per step from batches of 4: a buffered tail of 2 after step 1
PIDS_FILE = "actor_pids.txt"
#: The RayHead of this test module's service, so tests can look at its processes.
HEADS: list[ray_cluster.RayHead] = []
GROUPS: list[int | None] = []  # their process groups


@contextmanager
def observed_head():
    """The Ray target's service, keeping its head where the tests can see it."""
    head = ray_cluster.RayHead()
    head.start()
    HEADS.append(head)
    GROUPS.append(head.pgid)
    try:
        yield head.driver_env()
    finally:
        head.stop()


def fit_ray_unfixed(run: RunContext) -> None:
    """The async trainer on Ray workers without the input file (the behaviour before the fix)."""
    from agentlightning.verl.testing import TrainerWithoutInputFile

    rt.fit_trainer(run, async_enabled=True, trainer_cls=TrainerWithoutInputFile, ray_workers=rt.RAY_WORKERS)


def fit_ray_noting_actors(run: RunContext) -> None:
    """The Ray target, which first writes its actors' process ids into the checkpoint folder."""
    from agentlightning.verl.cpu_builder import build_cpu_trainer

    p = rt.params(run.case)
    trainer = build_cpu_trainer(str(run.checkpoint_dir), dataset_size=p["n"], async_train_batch_size=p["refill"],
                                total_epochs=p["epochs"], seed=run.seed, ray_workers=rt.RAY_WORKERS,
                                latency_profile=rt.LATENCY_PROFILES[p["latency"]])
    pids = trainer.actor_rollout_wg.execute_all_sync("pid")
    (run.checkpoint_dir / PIDS_FILE).write_text(" ".join(map(str, pids)))
    trainer.input_observer = rt.RunObserver(run, trainer)
    trainer.fit()


unfixed_on_ray = resume_target(fit_ray_unfixed, name="unfixed_on_ray", steps=rt.async_steps, cases=[ASYNC_CASE],
                               preload=rt.PRELOAD, services=[observed_head], hang_timeout=300)
noting_actors = resume_target(fit_ray_noting_actors, name="noting_actors", steps=rt.async_steps, cases=[ASYNC_CASE],
                              preload=rt.PRELOAD, services=[observed_head], hang_timeout=300)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("ray"), seed=0, hang_timeout=300)
    yield engine
    assert engine.close() == []
    assert GROUPS and all(pgid and ray_cluster.group_members(pgid) == [] for pgid in GROUPS)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return ray_cluster.process_title(pid) != ""


def test_unfixed_trainer_on_ray_workers_loses_the_buffered_tail(engine):
    cell = Cell(unfixed_on_ray, ASYNC_CASE, "auto", (KillSpec(1),), rt.async_steps(ASYNC_CASE))
    result = engine.run_cell(cell)
    # The cause first: the buffered tail the restored state lacks; then the inputs it lost.
    assert result.verdict.categories[0] == vd.LOST, result.verdict.headline
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 1 (the restored step of resume from "
                                              "global_step_1): inputs differs (buffered_tail)"), result.verdict.headline
    lost = next(f for f in result.verdict.findings if f.category == vd.LOST)
    assert lost.headline.startswith("LOST 2 inputs after resume from global_step_1"), lost.headline


def test_a_killed_drivers_actors_are_ended_by_ray_and_each_rank_saved_its_own_file(engine, tmp_path):
    plan = engine.plan(noting_actors, ASYNC_CASE, tmp_path, 0, kill=KillSpec(1))
    record = engine.run(plan, noting_actors)
    assert record.outcome == Outcome.KILLED, record.error
    pids = [int(p) for p in (Path(plan.checkpoint_dir) / PIDS_FILE).read_text().split()]
    assert len(pids) == rt.RAY_WORKERS and os.getpid() not in pids and record.pid not in pids
    actor_folder = Path(plan.checkpoint_dir) / "global_step_1" / "actor"
    assert sorted(p.name for p in actor_folder.iterdir()) == [
        f"model_world_size_2_rank_{rank}.pt" for rank in range(rt.RAY_WORKERS)]
    deadline = time.monotonic() + ray_cluster.ACTOR_EXIT_TIMEOUT
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), "Ray left a SIGKILLed driver's actors running"
    assert HEADS[-1].actor_processes() == []


#: The cells CI runs of the target's 23 (each run costs seconds): async, one unsaved step after a checkpoint
#: with rollouts in flight; sync, a double kill across the epoch.
CI_CELLS = "async-n8-b4-r6-e1-mixed-auto-ckpt2+1] or sync-b4-e2-auto-ckpt1_ckpt3+1]"


def test_the_ray_target_passes_its_matrix_and_leaves_nothing(tmp_path):
    """Two cells of the Ray target (:data:`CI_CELLS`) as a user of the package runs them, from a folder of
    their own (the target comes from the entry point); then no Ray process or folder of that session is left
    (its head lives under a TMPDIR of its own, so other sessions' heads are not counted)."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="rc"))  # short: Ray's socket paths go under it
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--resume-matrix", "-m", "resume_matrix",
         "--resume-matrix-target=agentlightning_ray", "-k", CI_CELLS, "-p", "no:cacheprovider", "-q",
         f"--basetemp={tmp_path / 'bt'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1500,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stdout[-4000:]
    summary = next(line for line in done.stdout.splitlines() if "resume matrix:" in line)
    assert " 0 failing, 0 expected failures" in summary, summary
    assert summary.startswith("=") and "resume matrix: 2 cells," in summary, summary
    heads_left = [p.name for p in tmp.iterdir() if p.name.startswith(ray_cluster.TEMP_PREFIX)]
    assert heads_left == [], "the session left its Ray head's folder"  # (torch may leave a cache folder there)
    leftover = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                if str(tmp) in ray_cluster.process_title(pid)]
    assert leftover == [], "Ray processes outlived the session"
    shutil.rmtree(tmp)  # made by mkdtemp above


def _listening(pids: set[int]) -> list[str]:
    """The local addresses the processes ``pids`` listen on (TCP, from /proc: no `ss` needed)."""
    inodes = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address = fields[1].split(":")[0]
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    found.append(".".join(str(b) for b in raw[::-1]))
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.append(":".join(words[i:i + 2].hex() for i in range(0, 16, 2)))
    return found


LOOPBACK = {"127.0.0.1", "0000:0000:0000:0000:0000:ffff:7f00:0001", "0000:0000:0000:0000:0000:0000:0000:0001"}


def test_the_ray_head_listens_on_loopback_only():
    head = ray_cluster.RayHead()
    head.start()
    try:
        addresses = _listening(set(ray_cluster.group_members(head.pgid)))
    finally:
        head.stop()
    assert addresses, "the head listens on nothing?"
    assert set(addresses) <= LOOPBACK, addresses


OWNER = """
import time
from agentlightning.verl import ray_cluster
head = ray_cluster.RayHead()
head.start()
print(head.pgid, head.temp_dir, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_pytest_takes_its_ray_head_with_it():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        pgid, temp = owner.stdout.readline().split()  # the head accepts drivers now
        groups = {int(pgid)}
        assert ray_cluster.group_members(int(pgid)) and Path(temp).is_dir()
    finally:
        owner.kill()  # SIGKILL: no clean-up of its own runs
        owner.wait()
    deadline = time.monotonic() + 60  # generous: the watchdog's SIGTERM, 2 s of grace, then SIGKILL
    while any(ray_cluster.group_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(ray_cluster.group_members(g) for g in groups)
    deadline = time.monotonic() + 30
    while Path(temp).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(temp).exists()
