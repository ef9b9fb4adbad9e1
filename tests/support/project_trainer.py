"""A torch-free trainer for tests that run a whole pytest session in a project of their own:
:func:`write_project` copies this file into the project with a conftest declaring it as a target.

Case keys: ``sleep`` seconds per step; ``bytes`` per checkpoint; ``daemon``: each run double-forks a
daemon into a new session; ``skip``: a resume loses its first input (a planted bug); ``gate``: a path the
run waits for before it starts; ``skip_if_set``: variable names, and a resume loses its first input when
all of them are set in the run's environment (a trainer configured by its environment); ``links``: each
save also points ``current`` at its folder by an absolute link, and the checkpoint folder holds a FIFO.
``TRAINER_FLAG_DIR`` in the environment: each run leaves a file there when it starts, named by its process and
its run's folder, which names its target, its pytest-xdist worker and the GPUs it sees (``-`` for none).
"""

import os
import time
from pathlib import Path

STEPS = 6


def train(run):
    flag = os.environ.get("TRAINER_FLAG_DIR")
    if flag:
        seen = f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}"
        folder = Path(run.plan.log_path).parent.name  # the cell's, the reference's or a recording's
        Path(flag, f"started-{os.getpid()}-{folder}").write_text(f"{run.plan.target_name} {seen}\n")
    gate = run.case.get("gate")
    while gate and not os.path.exists(gate):  # held until the test lets it go on
        time.sleep(0.05)
    if run.case.get("daemon"):
        _detach_daemon()
    start = 0
    latest = run.checkpoint_dir / "latest"
    if run.resume_mode == "path":
        start = int((run.resume_path / "step").read_text())
    elif run.resume_mode == "auto" and latest.exists():
        start = int(latest.read_text())
    run.resumed(start, run.checkpoint_dir / f"s{start}" if start else None)
    names = run.case.get("skip_if_set")
    configured = bool(names) and all(os.environ.get(name) for name in names)
    skip = start + 1 if start and (run.case.get("skip") or configured) else None
    for step in range(start + 1, STEPS + 1):
        if step != skip:
            run.consumed([step], step=step, epoch=0)
        time.sleep(run.case.get("sleep", 0))
        run.step_end(step)
        if run.should_checkpoint(step):
            folder = run.checkpoint_dir / f"s{step}"
            folder.mkdir(exist_ok=True)
            (folder / "weights.bin").write_bytes(b"\0" * run.case.get("bytes", 10))
            (folder / "step").write_text(str(step))
            latest.write_text(str(step))
            if run.case.get("links"):  # what trainers leave beside their checkpoints
                current = run.checkpoint_dir / "current"
                if current.is_symlink():
                    current.unlink()
                current.symlink_to(folder.resolve())
                if not os.path.lexists(run.checkpoint_dir / "events.fifo"):
                    os.mkfifo(run.checkpoint_dir / "events.fifo")
            run.checkpoint_published(step, folder)


def _detach_daemon():
    """Double fork into a new session, as a daemonising helper (a metrics agent) does. The run goes on once
    the daemon exists (the middle process has forked it and exited), so it is there when the run ends
    however loaded the machine is (a fast run ended before its daemon was forked)."""
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    os.waitpid(middle, 0)


def write_project(path, target, cases):
    """A project in ``path`` whose only resume-check target, ``target``, is this trainer with ``cases``
    (the source text of a list of case dicts)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "project_trainer.py").write_text(Path(__file__).read_text())
    (path / "conftest.py").write_text(
        "import project_trainer\n"
        "from pytest_resume_check import resume_target\n"
        f"t = resume_target(project_trainer.train, name={target!r}, steps=project_trainer.STEPS, cases={cases},"
        " preload=('project_trainer',), crash_save=False)\n")  # its save is written in place: no crash smoke cells
    (path / "pytest.ini").write_text(f"[pytest]\nresume_matrix_targets = {target}\n")
    return path
