"""What the plugin adds to pytest's command line and ini file, and what it says about them: every option
and ini key with its help text, the defaults and accepted ranges those texts name, the error of each bad
value, and the marker of the matrix's cells.

Loaded with the plugin in every pytest session, matrix or not, so it imports nothing of the engine. The
options' spellings are :mod:`pytest_resume_check.records.names`'s; reading and checking the values is
:mod:`.settings`'s; the commands that rerun a cell with them are :mod:`.commands`'s.
"""

from __future__ import annotations

import pytest

from pytest_resume_check.records.names import (
    DEFAULT_HANG_TIMEOUT,
    DEFAULT_SERVER_IDLE,
    ISOLATIONS,
    MODES,
    OPT_BUDGET,
    OPT_CELL,
    OPT_ENV,
    OPT_EXHAUSTIVE,
    OPT_HANG,
    OPT_HTML,
    OPT_ISOLATION,
    OPT_JSON,
    OPT_MATRIX,
    OPT_MODE,
    OPT_RAY,
    OPT_RAY_COPY,
    OPT_RAY_RETRIES,
    OPT_REPRO,
    OPT_SEED,
    OPT_SERVER,
    OPT_STEP_SUMMARY,
    OPT_TARGET,
    QUICK,
    SERVER_IDLE_ENV,
    SERVER_MODES,
    SERVER_OFF,
    SERVER_ON,
)

#: The marker every cell of the matrix carries (``-m resume_matrix`` selects them).
MARKER = "resume_matrix"
HELP_MARKER = f"{MARKER}: a cell of the resume matrix (pytest-resume-check)"

#: Megabytes of a failing cell's kept folders copied back from a node by default.
DEFAULT_RAY_COPY_MB = 256.0
#: The file GitHub Actions gives each step for its summary (Markdown, appended to); the default of
#: ``--resume-matrix-step-summary``.
GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"

HELP_MATRIX = "run this project's resume-check targets across the kill/resume matrix"
HELP_MODE = ("which kill points: 'quick' (default, a boundary-aware sample) or 'full' (every step); implies "
             f"{OPT_MATRIX}")
HELP_SEED = "seed for shuffles and kill-point sampling: an integer, or 'last' to reuse the previous seed"
HELP_TARGET = "only run this target (repeatable)"
HELP_CELL = ("run only this matrix cell, e.g. 'builtin_loop[b4-take2-e2-shuffle-auto-ckpt3]' (repeatable: "
             "each cell named runs)")
HELP_HANG = (f"seconds without an event before a run counts as HUNG and is killed (default {DEFAULT_HANG_TIMEOUT:g}; "
             "0 or inf: no limit, longer limits are cut to about 23 days)")
HELP_JSON = "write every cell's verdict and ledgers to this JSON file"
HELP_EXHAUSTIVE = ("run every cell from scratch to the end: no shared first runs, no early stop of resumed "
                   "runs whose reported state equals the reference's (slower; a check on those shortcuts)")
HELP_HTML = "write a self-contained HTML report (heatmaps, timelines of failing cells) to this file"
HELP_ISOLATION = "how children start for every target: 'forkserver' (preloaded) or 'spawn'"
HELP_SERVER = (f"'{SERVER_ON}': fork the runs from one server per project shared by the xdist workers and kept warm "
               "for the next session (ended when idle for ${idle_env}, default {idle:g} s, seconds, or by the next "
               f"session that needs another); '{SERVER_OFF}' (default): each session starts and ends its own")
HELP_REPRO = ("write a standalone reproduction of each failing cell into DIR/<cell>: the declaring conftest "
              "(and the project modules it uses), a pytest.ini, and a README.md with the headline and the command")
HELP_BUDGET = ("spend at most RUNS trainer runs: the matrix's cells that reveal most (epoch boundaries, first and "
               "last steps, buffered steps, double kills, one crash cell...) run, the rest are skipped and listed")
HELP_RAY = ("run the matrix's cells on a Ray cluster: 'auto' (the cluster this machine is part of, or RAY_ADDRESS) or "
            "the head's address (host:port); each group of cells (target, case, resume mode) is a task asking the "
            "target's resources= (docs/cluster.md)")
HELP_RAY_RETRIES = ("with " + OPT_RAY + ": run a lost node's unfinished cells again elsewhere up to N times (default "
                    "0: they fail, one line each)")
HELP_RAY_COPY = ("with " + OPT_RAY + ": copy at most MB megabytes of a failing cell's kept folders back from its node "
                 f"(default {DEFAULT_RAY_COPY_MB:g}; beyond it the report names where they stayed)")
HELP_ENV = ("environment variables the runs take from the environment pytest is started in, e.g. "
            "TRAINER_MODE,DATA_ROOT (repeatable; names separated by commas): set to their values here on every Ray "
            "node that runs cells, and recorded with their values in reproductions (docs/cluster.md)")
HELP_STEP_SUMMARY = (f"append the matrix's summary in Markdown to this file (default: ${GITHUB_STEP_SUMMARY}, the "
                     "step summary GitHub Actions gives each step; /dev/null: none)")

#: The accepted ranges of the numeric options. A seed is one every seeding function takes (numpy's stop at
#: 2**32 - 1); the others are far beyond any real use, so a mistyped exponent is a usage error, not an overflow.
MAX_SEED = 2**32 - 1
MAX_BUDGET = 10**9
MAX_RAY_RETRIES = 100
MAX_RAY_COPY_MB = 2**20

ERR_MODE = ("{opt}={value!r} is not a matrix mode; use one of: " + ", ".join(MODES)
            + " (e.g. {opt}=" + QUICK + ")")
ERR_SEED = ("{opt}={value!r} is not a seed; give a whole number from 0 to " + f"{MAX_SEED:,}" + " (e.g. {opt}=1234), "
            "or 'last'")
ERR_SEED_LAST = "{opt}=last: no previous seed is cached in this project; run once without it first"
ERR_SEED_NO_CACHE = ("{opt}=last: pytest's cache is disabled (-p no:cacheprovider), so no previous seed can be read; "
                     "give the seed itself (the header of the earlier run printed it: {opt}=N)")
ERR_HANG = ("{opt}={value!r} is not a hang limit; give a number of seconds from 0 to inf (e.g. {opt}=60; 0 or inf: "
            "no limit; limits longer than about 23 days are cut to that)")
ERR_BUDGET = ("{opt}={value!r} is not a budget; give the most trainer runs the matrix may make, a whole number from "
              "1 to " + f"{MAX_BUDGET:,}" + " (e.g. {opt}=50)")
ERR_RAY_RETRIES = ("{opt}={value!r} is not a number of retries; give a whole number from 0 to " + str(MAX_RAY_RETRIES)
                   + " (e.g. {opt}=1)")
ERR_RAY_COPY = ("{opt}={value!r} is not a number of megabytes; give a number from 0 to " + f"{MAX_RAY_COPY_MB:,}"
                + " (1 TiB) (e.g. {opt}=512; 0: copy nothing back)")
ERR_RAY_XDIST = ("{opt} runs the cells on the Ray cluster, and -n {n} would run them in pytest-xdist workers too; "
                 "drop -n (the cluster's nodes run the groups in parallel)")
ERR_ENV = ("{opt}={value!r}: {bad!r} is not the name of an environment variable; give names of letters, digits and "
           "'_' separated by commas (e.g. {opt}=TRAINER_MODE,DATA_ROOT)")
ERR_SERVER = "{opt}={value!r} is not a server mode; use " + " or ".join(map(repr, SERVER_MODES))
ERR_ISOLATION = "{opt}={value!r} is not an isolation; use " + " or ".join(map(repr, ISOLATIONS))
#: The session's folder could not be made in pytest's base temporary directory (a ``--basetemp`` whose parent
#: folder is missing, a read-only disk): one usage error, not pytest's INTERNALERROR traceback.
ERR_SESSION_FOLDER = ("the resume matrix cannot make its session folder in {where} ({error}); create {parent} "
                      "or give a --basetemp in a folder that exists and is writable")


def add_options(parser: pytest.Parser) -> None:
    """Every command-line option and ini key of the plugin."""
    group = parser.getgroup("resume-check", "pytest-resume-check: kill, resume and compare training runs")
    group.addoption(OPT_MATRIX, action="store_true", default=False, dest="resume_matrix", help=HELP_MATRIX)
    group.addoption(OPT_MODE, default=None, dest="resume_matrix_mode", help=HELP_MODE)
    group.addoption(OPT_SEED, default=None, dest="resume_matrix_seed", help=HELP_SEED)
    group.addoption(OPT_TARGET, action="append", default=[], dest="resume_matrix_target", help=HELP_TARGET)
    group.addoption(OPT_CELL, action="append", default=[], dest="resume_matrix_cell", help=HELP_CELL)
    group.addoption(OPT_HANG, default=None, dest="resume_matrix_hang_timeout", help=HELP_HANG)
    group.addoption(OPT_JSON, default=None, dest="resume_matrix_json", help=HELP_JSON)
    group.addoption(OPT_HTML, default=None, dest="resume_matrix_html", help=HELP_HTML)
    group.addoption(OPT_ISOLATION, default=None, dest="resume_matrix_isolation", help=HELP_ISOLATION)
    group.addoption(OPT_SERVER, default=None, dest="resume_matrix_server", metavar="on|off",
                    help=HELP_SERVER.format(idle_env=SERVER_IDLE_ENV, idle=DEFAULT_SERVER_IDLE))
    group.addoption(OPT_EXHAUSTIVE, action="store_true", default=False, dest="resume_matrix_exhaustive",
                    help=HELP_EXHAUSTIVE)
    group.addoption(OPT_REPRO, default=None, dest="resume_matrix_repro", metavar="DIR", help=HELP_REPRO)
    group.addoption(OPT_BUDGET, default=None, dest="resume_matrix_budget", metavar="RUNS", help=HELP_BUDGET)
    group.addoption(OPT_STEP_SUMMARY, default=None, dest="resume_matrix_step_summary", metavar="PATH",
                    help=HELP_STEP_SUMMARY)
    group.addoption(OPT_RAY, default=None, dest="resume_matrix_ray", metavar="auto|ADDRESS", help=HELP_RAY)
    group.addoption(OPT_RAY_RETRIES, default=None, dest="resume_matrix_ray_retries", metavar="N",
                    help=HELP_RAY_RETRIES)
    group.addoption(OPT_RAY_COPY, default=None, dest="resume_matrix_ray_copy", metavar="MB", help=HELP_RAY_COPY)
    group.addoption(OPT_ENV, action="append", default=[], dest="resume_matrix_env", metavar="NAME[,NAME...]",
                    help=HELP_ENV)
    parser.addini("resume_matrix", "matrix mode to run without the command-line flag: quick or full")
    parser.addini("resume_matrix_seed", HELP_SEED)
    parser.addini("resume_matrix_targets", HELP_TARGET, type="args")
    parser.addini("resume_matrix_hang_timeout", HELP_HANG)
    parser.addini("resume_matrix_json", HELP_JSON)
    parser.addini("resume_matrix_html", HELP_HTML)
    parser.addini("resume_matrix_isolation", HELP_ISOLATION)
    parser.addini("resume_matrix_server", HELP_SERVER.format(idle_env=SERVER_IDLE_ENV, idle=DEFAULT_SERVER_IDLE))
    parser.addini("resume_matrix_exhaustive", HELP_EXHAUSTIVE, type="bool", default=False)
    parser.addini("resume_matrix_repro", HELP_REPRO)
    parser.addini("resume_matrix_step_summary", HELP_STEP_SUMMARY)
    parser.addini("resume_matrix_budget", HELP_BUDGET)
    parser.addini("resume_matrix_ray", HELP_RAY)
    parser.addini("resume_matrix_ray_retries", HELP_RAY_RETRIES)
    parser.addini("resume_matrix_ray_copy", HELP_RAY_COPY)
    parser.addini("resume_matrix_env", HELP_ENV)
