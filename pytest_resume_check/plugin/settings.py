"""The plugin's settings: the values of its options and ini keys read, checked (one usage error naming
the fix for a bad value) and kept as :class:`Settings` on the config's stash.

Read in ``pytest_configure`` whether or not the matrix is on: the ``resume_check`` fixture runs with the
session's seed and hang limit too. So this module imports nothing of the engine; the few checks that
need a lower module import it only when their option is given.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from random import Random
from typing import Any

import pytest

from pytest_resume_check.plugin import options
from pytest_resume_check.records.names import (
    DEFAULT_HANG_TIMEOUT,
    ISOLATIONS,
    MODES,
    OPT_BUDGET,
    OPT_ENV,
    OPT_HANG,
    OPT_ISOLATION,
    OPT_MODE,
    OPT_RAY,
    OPT_RAY_COPY,
    OPT_RAY_RETRIES,
    OPT_SEED,
    OPT_SERVER,
    QUICK,
    SERVER_MODES,
    SERVER_ON,
)

#: Where ``--resume-matrix-seed=last`` finds the previous seed in pytest's cache.
CACHE_SEED = "resume_check/seed"
#: The node of the matrix, and how its cells' node ids start (``resume-matrix::t[case-auto-ckpt1]``).
MATRIX_NODE = "resume-matrix"
NODE_PREFIX = f"{MATRIX_NODE}::"
#: Keys of ``config.workerinput``: what an xdist controller hands every worker.
WORKER_SEED = "resume_matrix_seed"
WORKER_NODE_IDS = "resume_matrix_node_ids"


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
    ray_copy_bytes: int = int(options.DEFAULT_RAY_COPY_MB * 2**20)
    #: Variables every target's runs take from this environment (``--resume-matrix-env``).
    env: tuple[str, ...] = ()
    #: Fork the runs from a server shared with xdist's workers and kept warm for the next session.
    server: bool = False


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
SEED = NumericOption("resume_matrix_seed", "resume_matrix_seed", OPT_SEED, True, 0, options.MAX_SEED,
                     options.ERR_SEED)
HANG = NumericOption("resume_matrix_hang_timeout", "resume_matrix_hang_timeout", OPT_HANG, False, 0, math.inf,
                     options.ERR_HANG)
BUDGET = NumericOption("resume_matrix_budget", "resume_matrix_budget", OPT_BUDGET, True, 1, options.MAX_BUDGET,
                       options.ERR_BUDGET)
RAY_RETRIES = NumericOption("resume_matrix_ray_retries", "resume_matrix_ray_retries", OPT_RAY_RETRIES, True, 0,
                            options.MAX_RAY_RETRIES, options.ERR_RAY_RETRIES)
RAY_COPY = NumericOption("resume_matrix_ray_copy", "resume_matrix_ray_copy", OPT_RAY_COPY, False, 0,
                         options.MAX_RAY_COPY_MB, options.ERR_RAY_COPY)
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


def read_settings(config: pytest.Config) -> Settings:
    """The checked settings of this session (``pytest.UsageError`` naming the fix for a bad value). Cell
    node ids are taken out of ``config.args`` first: they turn the matrix on."""
    node_ids = _take_node_ids(config)
    mode = _mode(config, bool(node_ids))  # checked in this order: the first bad value is the one named
    hang = _hang_timeout(config)
    isolation = _isolation(config)
    server = _server(config)
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
        step_summary=(_setting(config, "resume_matrix_step_summary") or os.environ.get(options.GITHUB_STEP_SUMMARY)
                      or None),
        budget=budget,
        env=_env(config),
        server=server,
        **_ray(config),
    )


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
    a pasted cell node id, or the ``resume_matrix`` ini value."""
    mode = config.getoption("resume_matrix_mode")
    on = bool(mode or config.getoption("resume_matrix") or node_ids_given)
    ini = config.getini("resume_matrix") or None
    if ini is not None and ini not in MODES:
        raise pytest.UsageError(options.ERR_MODE.format(opt="ini resume_matrix", value=ini))
    if mode is not None and mode not in MODES:
        raise pytest.UsageError(options.ERR_MODE.format(opt=OPT_MODE, value=mode))
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
    address = _setting(config, "resume_matrix_ray")
    out: dict[str, Any] = {}
    retries, copy = _numeric(config, RAY_RETRIES), _numeric(config, RAY_COPY)
    if retries is not None:
        out["ray_retries"] = int(check_number(RAY_RETRIES, *retries))
    if copy is not None:
        out["ray_copy_bytes"] = int(check_number(RAY_COPY, *copy) * 2**20)
    if address is not None and not _in_group():
        workers = config.getoption("numprocesses", None)
        if workers not in (None, 0, "0"):
            raise pytest.UsageError(options.ERR_RAY_XDIST.format(opt=OPT_RAY, n=workers))
        out["ray"] = str(address)
    return out


def _in_group() -> bool:
    """Whether this pytest is a group's on a cluster node (asked only when a cluster is named, so a session
    without one does not load the cluster's modules)."""
    from pytest_resume_check.cluster import wire

    return wire.in_group()


def _env(config: pytest.Config) -> tuple[str, ...]:
    """``--resume-matrix-env`` (each time it was given), else the ini's names."""
    given = config.getoption("resume_matrix_env") or []
    opt, value = (OPT_ENV, given) if given else ("ini resume_matrix_env", config.getini("resume_matrix_env") or "")
    if not value:  # none given: the parser (and the records it imports) is left unloaded
        return ()
    from pytest_resume_check.records.environ import parse_names

    try:
        return parse_names(value)
    except ValueError as exc:
        shown = ",".join(value) if isinstance(value, list) else value
        raise pytest.UsageError(options.ERR_ENV.format(opt=opt, value=shown, bad=str(exc))) from None


def _isolation(config: pytest.Config) -> str | None:
    isolation = _setting(config, "resume_matrix_isolation")
    if isolation is not None and isolation not in ISOLATIONS:
        raise pytest.UsageError(options.ERR_ISOLATION.format(opt=OPT_ISOLATION, value=isolation))
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
            raise pytest.UsageError(options.ERR_SEED_NO_CACHE.format(opt=OPT_SEED))
        seed = cache.get(CACHE_SEED, None)
        if seed is None:
            raise pytest.UsageError(options.ERR_SEED_LAST.format(opt=OPT_SEED))
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


def _server(config: pytest.Config) -> bool:
    """Whether ``--resume-matrix-server`` (or the ini key) turns the shared fork server on."""
    server = _setting(config, "resume_matrix_server")
    if server is not None and server not in SERVER_MODES:
        raise pytest.UsageError(options.ERR_SERVER.format(opt=OPT_SERVER, value=server))
    return server == SERVER_ON
