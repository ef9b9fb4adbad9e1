"""Cost per run of the Agent Lightning trainer on Ray workers: a session-wide Ray head against Ray started
per run, and against the in-process CPU worker group. Prints figures; asserts nothing.

    python benchmarks/ray_cost.py [--reps 3]

Every run is an uninterrupted supervised run through the engine's runner of the async case of
``agentlightning_ray`` (8 inputs, 4 steps), forked from the preloaded fork server (torch and verl already
imported), interleaved in every repetition (order rotated):

- ``in-process``: the trainer with the in-process ``CpuActorWorkerGroup`` (what ``agentlightning_async`` runs);
- ``session head, 2 actors`` / ``1 actor``: a driver connecting to the session's head (``agentlightning_ray``);
- ``Ray per run, 2 actors``: the run starts its own local Ray (``ray.init()``) and shuts it down.

It also prints how long the session head took to start. Where the time of a Ray run goes: each actor is a
new Ray worker process (verl puts each rank's RANK/WORLD_SIZE in the actor's runtime environment, so Ray
cannot reuse a worker), which imports the actor class's module and with it verl, tensordict, transformers
and torch (about 5 s on an idle core, measured with ``python -X importtime``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentlightning.verl import resume_target as rt
from agentlightning.verl.ray_cluster import RayHead, ray_head_service
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.targets import resume_target

CASE = rt.RAY_CASES[0]


def one_actor(run) -> None:
    """The Ray target with one actor."""
    rt.fit_trainer(run, async_enabled=True, ray_workers=1)


def ray_per_run(run) -> None:
    """Start a local Ray in the run, train with two actors on it, shut it down."""
    import logging
    import os

    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"  # else a local ray.init() writes a token into ~/.ray
    with tempfile.TemporaryDirectory(prefix="rc-") as tmp:
        ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                 _temp_dir=tmp)
        try:
            rt.fit_trainer(run, async_enabled=True, ray_workers=2)
        finally:
            ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    common = dict(steps=rt.async_steps, cases=[CASE], preload=rt.PRELOAD, hang_timeout=600)
    targets = {
        "in-process": resume_target(rt.fit_async, name="in_process", **common),
        "session head, 2 actors": rt.agentlightning_ray,
        "session head, 1 actor": resume_target(one_actor, name="one_actor", services=[ray_head_service], **common),
        "Ray per run, 2 actors": resume_target(ray_per_run, name="ray_per_run", **common),
    }
    head = RayHead()
    start = time.perf_counter()
    head.start()
    print(f"session head start: {time.perf_counter() - start:.1f} s")
    head.stop()
    root = Path(tempfile.mkdtemp(prefix="ray-cost-"))
    runner = Runner(seed=1, hang_timeout=600)
    seconds: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    try:
        for rep in range(args.reps + 1):  # repetition 0 starts the fork server and the head; not counted
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                target = targets[name]
                workdir = Layout(root).fresh(root / f"{target.name}-{rep}")
                plan = runner.plan(target, CASE, workdir, 0)
                start = time.perf_counter()
                record = runner.run(plan, target)
                took = time.perf_counter() - start
                if record.outcome != "done":
                    sys.exit(f"{name}: the run ended {record.outcome}: {record.describe()}")
                if rep:
                    seconds[name].append(took)
    finally:
        problems = runner.close()
        if problems:
            print("\n".join(problems))
    print(f"per uninterrupted run of {rt.async_steps(CASE)} steps, median of {args.reps}:")
    base = seconds["in-process"]
    for name, values in seconds.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"  {name:24s} {statistics.median(values):6.2f} s   {ratio:6.1f}x in-process")


if __name__ == "__main__":
    main()
