"""The plugin's options: their spellings, help texts and errors, reading and checking them into
:class:`Settings`, and the command line that reruns one cell with them.

Read whether or not the matrix is on: the ``resume_check`` fixture runs with the session's seed and
hang limit too.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from dataclasses import dataclass
from random import Random
from typing import Any

import pytest

from pytest_resume_check.cells.matrix import MODES, QUICK
from pytest_resume_check.records.names import (  # noqa: F401  (the option spellings, re-exported here)
    ISOLATIONS,
    OPT_CELL,
    OPT_EXHAUSTIVE,
    OPT_HANG,
    OPT_HTML,
    OPT_ISOLATION,
    OPT_JSON,
    OPT_MATRIX,
    OPT_MODE,
    OPT_SEED,
    OPT_TARGET,
)
from pytest_resume_check.records.results import DEFAULT_HANG_TIMEOUT

#: The options of GitHub's output, spelled here: the other spellings live in
#: ``records.names``, which messages below the plugin read; nothing below the plugin names these.
OPT_REPRO = "--resume-matrix-repro"
OPT_STEP_SUMMARY = "--resume-matrix-step-summary"
OPT_BUDGET = "--resume-matrix-budget"
#: Running the matrix on a Ray cluster (docs/cluster.md).
OPT_RAY = "--resume-matrix-ray"
OPT_RAY_RETRIES = "--resume-matrix-ray-retries"
OPT_RAY_COPY = "--resume-matrix-ray-copy"
#: The variables the runs take from the environment pytest is started in (docs/cluster.md).
OPT_ENV = "--resume-matrix-env"
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

#: Where ``--resume-matrix-seed=last`` finds the previous seed in pytest's cache.
CACHE_SEED = "resume_check/seed"
#: The node of the matrix, and how its cells' node ids start (``resume-matrix::t[case-auto-ckpt1]``).
MATRIX_NODE = "resume-matrix"
NODE_PREFIX = f"{MATRIX_NODE}::"
#: Keys of ``config.workerinput``: what an xdist controller hands every worker.
WORKER_SEED = "resume_matrix_seed"
WORKER_NODE_IDS = "resume_matrix_node_ids"

ERR_MODE = ("{opt}={value!r} is not a matrix mode; use one of: " + ", ".join(MODES)
            + " (e.g. {opt}=" + QUICK + ")")
ERR_SEED = ("{opt}={value!r} is not a seed; give a whole number from 0 to " + f"{MAX_SEED:,}" + " (e.g. {opt}=1234), "
            "or 'last'")
ERR_SEED_LAST = "{opt}=last: no previous seed is cached in this project; run once without it first"
ERR_SEED_NO_CACHE = ("{opt}=last: pytest's cache is disabled (-p no:cacheprovider), so no previous seed can be read; "
                     "give the seed itself (the header of the earlier run printed it: {opt}=N)")
#: The old spelling of the mode, ``--resume-matrix=full``: still accepted, with this note.
DEPRECATED_MODE = ("{old} is deprecated: use {new} (a bare {opt} can no longer swallow the path after it); "
                   "the old spelling still works for now")
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
ERR_ISOLATION = "{opt}={value!r} is not an isolation; use " + " or ".join(map(repr, ISOLATIONS))
#: The session's folder could not be made in pytest's base temporary directory (a ``--basetemp`` whose parent
#: folder is missing, a read-only disk): one usage error, not pytest's INTERNALERROR traceback.
ERR_SESSION_FOLDER = ("the resume matrix cannot make its session folder in {where} ({error}); create {parent} "
                      "or give a --basetemp in a folder that exists and is writable")


@dataclass(frozen=True)
class Settings:
    """Validated plugin settings (command line wins over the ini file)."""

    mode: str | None
    seed: int
    targets: tuple[str, ...]
    #: The cells named by ``--resume-matrix-cell`` (each time it was given), in the order given.
    cells: tuple[str, ...]
    hang_timeout: float
    json_path: str | None
    isolation: str | None
    html_path: str | None = None
    exhaustive: bool = False
    #: The hang limit was given on the command line: it wins over a target's own.
    hang_forced: bool = False
    #: Cell node ids given as arguments (pasted from a ``FAILED`` line).
    node_ids: tuple[str, ...] = ()
    #: Where each failing cell's standalone reproduction goes (``DIR/<cell>``); None: nowhere.
    repro_dir: str | None = None
    #: The Markdown file the summary is appended to (GitHub's step summary); None: none.
    step_summary: str | None = None
    #: At most this many trainer runs (``--resume-matrix-budget``); None: the whole matrix.
    budget: int | None = None
    #: The Ray cluster that runs the cells (``auto`` or the head's address); None: this machine.
    ray: str | None = None
    #: How many times a lost node's unfinished cells run again elsewhere.
    ray_retries: int = 0
    #: Bytes of a failing cell's kept folders copied back from its node.
    ray_copy_bytes: int = int(DEFAULT_RAY_COPY_MB * 2**20)
    #: Variables every target's runs take from this environment (``--resume-matrix-env``).
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class NumericOption:
    """A numeric option: where it is read, whether it takes whole numbers, the range it accepts (both ends
    included) and its error, which names the option, the value given and that range."""

    dest: str
    ini: str
    opt: str
    whole: bool
    low: float
    high: float
    error: str


#: Every numeric option of the plugin, checked by :func:`check_number` (nan, inf outside the range, a
#: negative count, a number too large to be meant: one usage error each, never an overflow further on).
SEED = NumericOption("resume_matrix_seed", "resume_matrix_seed", OPT_SEED, True, 0, MAX_SEED, ERR_SEED)
HANG = NumericOption("resume_matrix_hang_timeout", "resume_matrix_hang_timeout", OPT_HANG, False, 0, math.inf,
                     ERR_HANG)
BUDGET = NumericOption("resume_matrix_budget", "resume_matrix_budget", OPT_BUDGET, True, 1, MAX_BUDGET, ERR_BUDGET)
RAY_RETRIES = NumericOption("resume_matrix_ray_retries", "resume_matrix_ray_retries", OPT_RAY_RETRIES, True, 0,
                            MAX_RAY_RETRIES, ERR_RAY_RETRIES)
RAY_COPY = NumericOption("resume_matrix_ray_copy", "resume_matrix_ray_copy", OPT_RAY_COPY, False, 0, MAX_RAY_COPY_MB,
                         ERR_RAY_COPY)
NUMERIC_OPTIONS = (SEED, HANG, BUDGET, RAY_RETRIES, RAY_COPY)


def check_number(option: NumericOption, value: object, where: str) -> float:
    """``value`` (as given: text from the command line or the ini file) as a number in ``option``'s range,
    an ``int`` for a whole-number option; else ``pytest.UsageError`` with its error, naming ``where`` (the
    option, or the ini key) and the value."""
    text = str(value).strip()
    try:
        number: float = int(text) if option.whole else float(text)
    except ValueError:
        number = math.nan
    if not option.low <= number <= option.high:  # nan fails both comparisons
        raise pytest.UsageError(option.error.format(opt=where, value=value))
    return number


#: The session's settings, set in ``pytest_configure`` whether or not the matrix is on.
SETTINGS_KEY = pytest.StashKey[Settings]()


def add_options(parser: pytest.Parser) -> None:
    """Every command-line option and ini key of the plugin."""
    group = parser.getgroup("resume-check", "pytest-resume-check: kill, resume and compare training runs")
    group.addoption(OPT_MATRIX, action="store_true", default=False, dest="resume_matrix", help=HELP_MATRIX)
    group.addoption(OPT_MODE, default=None, dest="resume_matrix_mode", help=HELP_MODE)
    for mode in MODES:  # the old spelling: argparse matches these whole strings before splitting at "="
        group.addoption(f"{OPT_MATRIX}={mode}", action="store_const", const=mode, dest="resume_matrix_old_mode",
                        default=None, help=argparse.SUPPRESS)
    group.addoption(OPT_SEED, default=None, dest="resume_matrix_seed", help=HELP_SEED)
    group.addoption(OPT_TARGET, action="append", default=[], dest="resume_matrix_target", help=HELP_TARGET)
    group.addoption(OPT_CELL, action="append", default=[], dest="resume_matrix_cell", help=HELP_CELL)
    group.addoption(OPT_HANG, default=None, dest="resume_matrix_hang_timeout", help=HELP_HANG)
    group.addoption(OPT_JSON, default=None, dest="resume_matrix_json", help=HELP_JSON)
    group.addoption(OPT_HTML, default=None, dest="resume_matrix_html", help=HELP_HTML)
    group.addoption(OPT_ISOLATION, default=None, dest="resume_matrix_isolation", help=HELP_ISOLATION)
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
    parser.addini("resume_matrix_exhaustive", HELP_EXHAUSTIVE, type="bool", default=False)
    parser.addini("resume_matrix_repro", HELP_REPRO)
    parser.addini("resume_matrix_step_summary", HELP_STEP_SUMMARY)
    parser.addini("resume_matrix_budget", HELP_BUDGET)
    parser.addini("resume_matrix_ray", HELP_RAY)
    parser.addini("resume_matrix_ray_retries", HELP_RAY_RETRIES)
    parser.addini("resume_matrix_ray_copy", HELP_RAY_COPY)
    parser.addini("resume_matrix_env", HELP_ENV)


def read_settings(config: pytest.Config) -> Settings:
    """The checked settings of this session (``pytest.UsageError`` naming the fix for a bad value). Cell
    node ids are taken out of ``config.args`` first: they turn the matrix on."""
    node_ids = _take_node_ids(config)
    mode = _mode(config, bool(node_ids))  # checked in this order: the first bad value is the one named
    hang = _hang_timeout(config)
    isolation = _isolation(config)
    budget = _budget(config)
    return Settings(
        mode=mode,
        seed=_seed(config),
        targets=tuple(_setting(config, "resume_matrix_target") or ()),
        cells=tuple(config.getoption("resume_matrix_cell") or ()),
        hang_timeout=hang,
        json_path=_setting(config, "resume_matrix_json"),
        html_path=_setting(config, "resume_matrix_html"),
        isolation=isolation,
        exhaustive=bool(config.getoption("resume_matrix_exhaustive") or config.getini("resume_matrix_exhaustive")),
        hang_forced=config.getoption("resume_matrix_hang_timeout") is not None,
        node_ids=node_ids,
        repro_dir=_setting(config, "resume_matrix_repro"),
        step_summary=_setting(config, "resume_matrix_step_summary") or os.environ.get(GITHUB_STEP_SUMMARY) or None,
        budget=budget,
        env=_env(config),
        **_ray(config),
    )


def warn_of_old_mode(config: pytest.Config) -> None:
    """The deprecation note for ``--resume-matrix=MODE`` (said once, by the controller)."""
    old = config.getoption("resume_matrix_old_mode")
    if old and not hasattr(config, "workerinput"):
        config.issue_config_time_warning(pytest.PytestDeprecationWarning(DEPRECATED_MODE.format(
            old=f"{OPT_MATRIX}={old}", new=f"{OPT_MATRIX} {OPT_MODE}={old}", opt=OPT_MATRIX)), stacklevel=3)


def rerun_command(config: pytest.Config, name: str) -> str:
    """The command that reruns exactly the cell ``name`` with the same seed (run from the same
    directory): the session's paths, then ``--resume-matrix [--resume-matrix-mode=full]
    --resume-matrix-seed=SEED --resume-matrix-cell=NAME`` and the options that change a cell's result
    (``quick``, the default mode, unsaid)."""
    words = list(config.args) if config.args_source == pytest.Config.ArgsSource.ARGS else []
    return shlex.join(["pytest", *words, *_cell_words(config.stash[SETTINGS_KEY], name)])


def repro_command(config: pytest.Config, name: str, target: str) -> str:
    """The command that reruns the cell ``name`` in its reproduction folder (``--resume-matrix-repro``):
    as :func:`rerun_command`, without the session's paths, and naming the target (``NAME``), so a target
    an installed package ships is found there too."""
    return shlex.join(["pytest", *_cell_words(config.stash[SETTINGS_KEY], name), f"{OPT_TARGET}={target}"])


def group_command(config: pytest.Config, names: list[str]) -> list[str]:
    """The arguments of a pytest that runs exactly the cells ``names`` as this session would (a group's
    pytest on a cluster node): as :func:`rerun_command` for them all, with the outputs this session
    writes itself turned off there (JSON, HTML, reproductions, step summary), no budget, no cache and no
    pytest-xdist."""
    words = list(config.args) if config.args_source == pytest.Config.ArgsSource.ARGS else []
    words += ["-p", "no:cacheprovider", *_cell_words(config.stash[SETTINGS_KEY], *names)]
    for key in ("resume_matrix_json", "resume_matrix_html", "resume_matrix_repro", "resume_matrix_budget",
                "resume_matrix_step_summary", "resume_matrix_ray"):
        words += ["-o", f"{key}="]
    if config.pluginmanager.hasplugin("xdist"):
        words += ["-n", "0"]
    return words


def _cell_words(settings: Settings, *names: str) -> list[str]:
    """The options that select the cells ``names`` and give each the result it had in this session."""
    words = [OPT_MATRIX]
    if settings.mode and settings.mode != QUICK:
        words.append(f"{OPT_MODE}={settings.mode}")
    words += [f"{OPT_SEED}={settings.seed}", *(f"{OPT_CELL}={name}" for name in names)]
    if settings.isolation:
        words.append(f"{OPT_ISOLATION}={settings.isolation}")
    if settings.exhaustive:
        words.append(OPT_EXHAUSTIVE)
    if settings.hang_forced:  # else the ini (or a target) is read again
        words.append(f"{OPT_HANG}={settings.hang_timeout:g}")
    return words


def _take_node_ids(config: pytest.Config) -> tuple[str, ...]:
    """Move cell node ids out of ``config.args`` (pytest would look for a file named ``resume-matrix``).
    With only such ids given, nothing else is collected."""
    ids = tuple(a for a in config.args if a.startswith(NODE_PREFIX))
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:  # an xdist worker: the controller took them out and passes them on
        ids = tuple(worker_input.get(WORKER_NODE_IDS, ())) or ids
    if ids:
        config.args[:] = [a for a in config.args if not a.startswith(NODE_PREFIX)]
    return ids


def _setting(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    if value in (None, [], ""):
        value = config.getini(name if name != "resume_matrix_target" else "resume_matrix_targets")
    return value or None


def _mode(config: pytest.Config, node_ids_given: bool) -> str | None:
    """The matrix mode, or None when the matrix is off. On: ``--resume-matrix``, ``--resume-matrix-mode``,
    the old ``--resume-matrix=MODE``, a pasted cell node id, or the ``resume_matrix`` ini value."""
    mode = config.getoption("resume_matrix_mode") or config.getoption("resume_matrix_old_mode")
    on = bool(mode or config.getoption("resume_matrix") or node_ids_given)
    ini = config.getini("resume_matrix") or None
    if ini is not None and ini not in MODES:
        raise pytest.UsageError(ERR_MODE.format(opt="ini resume_matrix", value=ini))
    if mode is not None and mode not in MODES:
        raise pytest.UsageError(ERR_MODE.format(opt=OPT_MODE, value=mode))
    if mode is None and (on or ini):
        mode = ini or QUICK
    return mode


def _hang_timeout(config: pytest.Config) -> float:
    given = _numeric(config, HANG)
    return DEFAULT_HANG_TIMEOUT if given is None else float(check_number(HANG, *given))


def _numeric(config: pytest.Config, option: NumericOption) -> tuple[object, str] | None:
    """The value given for ``option`` and where (the option, else the ini key), or None when not given."""
    value = config.getoption(option.dest)
    if value not in (None, ""):
        return value, option.opt
    value = config.getini(option.ini)
    return (value, f"ini {option.ini}") if value not in (None, "") else None


def _budget(config: pytest.Config) -> int | None:
    given = _numeric(config, BUDGET)
    return None if given is None else int(check_number(BUDGET, *given))


def _ray(config: pytest.Config) -> dict[str, Any]:
    """The cluster options, checked; none in a group's pytest on a node (its task must not submit more)."""
    from pytest_resume_check.cluster import wire

    address = _setting(config, "resume_matrix_ray")
    out: dict[str, Any] = {}
    retries, copy = _numeric(config, RAY_RETRIES), _numeric(config, RAY_COPY)
    if retries is not None:
        out["ray_retries"] = int(check_number(RAY_RETRIES, *retries))
    if copy is not None:
        out["ray_copy_bytes"] = int(check_number(RAY_COPY, *copy) * 2**20)
    if address is not None and not wire.in_group():
        workers = config.getoption("numprocesses", None)
        if workers not in (None, 0, "0"):
            raise pytest.UsageError(ERR_RAY_XDIST.format(opt=OPT_RAY, n=workers))
        out["ray"] = str(address)
    return out


def _env(config: pytest.Config) -> tuple[str, ...]:
    """``--resume-matrix-env`` (each time it was given), else the ini's names."""
    from pytest_resume_check.records.environ import parse_names

    given = config.getoption("resume_matrix_env") or []
    opt, value = (OPT_ENV, given) if given else ("ini resume_matrix_env", config.getini("resume_matrix_env") or "")
    try:
        return parse_names(value)
    except ValueError as exc:
        shown = ",".join(value) if isinstance(value, list) else value
        raise pytest.UsageError(ERR_ENV.format(opt=opt, value=shown, bad=str(exc))) from None


def _isolation(config: pytest.Config) -> str | None:
    isolation = _setting(config, "resume_matrix_isolation")
    if isolation is not None and isolation not in ISOLATIONS:
        raise pytest.UsageError(ERR_ISOLATION.format(opt=OPT_ISOLATION, value=isolation))
    return isolation


def _seed(config: pytest.Config) -> int:
    """The controller's seed on an xdist worker; else the option, the cached one for ``last`` (and for
    ``--lf``/``--ff`` without one), or a new random one."""
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and WORKER_SEED in worker_input:
        return int(worker_input[WORKER_SEED])
    raw = _setting(config, "resume_matrix_seed")
    cache = getattr(config, "cache", None)
    if raw == "last":
        if cache is None:
            raise pytest.UsageError(ERR_SEED_NO_CACHE.format(opt=OPT_SEED))
        seed = cache.get(CACHE_SEED, None)
        if seed is None:
            raise pytest.UsageError(ERR_SEED_LAST.format(opt=OPT_SEED))
        return int(seed)
    if raw is None and cache is not None and _rerunning_failures(config):
        seed = cache.get(CACHE_SEED, None)  # --lf / --ff: the cells that failed exist only with their seed
        if seed is not None:
            return int(seed)
    if raw is None:
        return Random().randrange(10**6)
    return int(check_number(SEED, raw, OPT_SEED if config.getoption(SEED.dest) is not None else f"ini {SEED.ini}"))


def _rerunning_failures(config: pytest.Config) -> bool:
    return any(config.getoption(name, False) for name in ("lf", "failedfirst"))
