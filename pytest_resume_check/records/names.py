"""How things are named: a case's id, the isolations, the variable that carries a run's token, the
reference runs' folder, and every command-line option of the plugin with the choices and the default its
help names.

Plain data shared by the declaration side (:mod:`pytest_resume_check.targets`), the child, the
processes, the cells, the reports and the plugin, so none of them imports another for a name. The
option spellings live here, not in the plugin, because messages below the plugin name options too; the
plugin reads them from here when it declares the options, so loading it imports no engine module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: How children start: from the preloaded fork server, or a fresh interpreter per run.
ISOLATION_FORKSERVER = "forkserver"
ISOLATION_SPAWN = "spawn"
ISOLATIONS = (ISOLATION_FORKSERVER, ISOLATION_SPAWN)

#: Every process a run starts carries the run's token in this variable of its environment, so what
#: escaped the run's process group is found after it (:mod:`pytest_resume_check.process.sweep`).
RUN_TOKEN_ENV = "PYTEST_RESUME_CHECK_RUN"
#: In a torchrun worker (and the program it runs): the job's attempt, the round of torchrun's rendezvous the
#: worker was started in (0 first, one more for each restart of the workers, a node joining included).
ATTEMPT_ENV = "PYTEST_RESUME_CHECK_ATTEMPT"

#: The command-line options, spelled once: the plugin declares them, and messages and reports that tell
#: the user which option to use name them from here.
OPT_MATRIX = "--resume-matrix"
OPT_MODE = "--resume-matrix-mode"
OPT_SEED = "--resume-matrix-seed"
OPT_TARGET = "--resume-matrix-target"
OPT_CELL = "--resume-matrix-cell"
OPT_HANG = "--resume-matrix-hang-timeout"
OPT_JSON = "--resume-matrix-json"
OPT_ISOLATION = "--resume-matrix-isolation"
#: A fork server shared by xdist's workers and kept warm for the next session (docs/ci.md).
OPT_SERVER = "--resume-matrix-server"
SERVER_ON = "on"
SERVER_OFF = "off"
SERVER_MODES = (SERVER_ON, SERVER_OFF)
#: Seconds a shared fork server stays without a session before it ends, and the variable that sets them.
DEFAULT_SERVER_IDLE = 900.0
SERVER_IDLE_ENV = "PYTEST_RESUME_CHECK_SERVER_IDLE"
OPT_EXHAUSTIVE = "--resume-matrix-exhaustive"
OPT_HTML = "--resume-matrix-html"
#: GitHub's output: a reproduction folder per failing cell, the step summary, a budget of runs.
OPT_REPRO = "--resume-matrix-repro"
OPT_STEP_SUMMARY = "--resume-matrix-step-summary"
OPT_BUDGET = "--resume-matrix-budget"
#: Running the matrix on a Ray cluster (docs/cluster.md).
OPT_RAY = "--resume-matrix-ray"
OPT_RAY_RETRIES = "--resume-matrix-ray-retries"
OPT_RAY_COPY = "--resume-matrix-ray-copy"
#: The variables the runs take from the environment pytest is started in (docs/cluster.md).
OPT_ENV = "--resume-matrix-env"

#: The matrix modes (``--resume-matrix-mode``): a boundary-aware sample of kill points, or every step.
QUICK = "quick"
FULL = "full"
MODES = (QUICK, FULL)

#: Seconds without an event before a run counts as HUNG (``--resume-matrix-hang-timeout``'s default).
DEFAULT_HANG_TIMEOUT = 60.0

#: The folder of a case's uninterrupted reference runs, beside its cells' folders (named in reports).
REFERENCE = "reference"

#: Characters of a cell id that pytest's ``-k`` can spell (its identifier grammar); ids are made of these.
K_SPELLABLE = re.compile(r"[^\w:+\-.\[\]\\/]")


def case_id(case: Mapping[str, Any]) -> str:
    """Readable id of a case: its ``id`` key, or ``keyvalue`` pairs joined by ``-`` (``epochs2-shuffle1``),
    with any character ``-k`` cannot spell made ``_``."""
    if "id" in case:
        return str(case["id"])
    if not case:
        return "default"
    return K_SPELLABLE.sub("_", "-".join(f"{k}{_short(v)}" for k, v in case.items()))


def _short(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)
