"""The JSON form of one matrix cell, as types: what :func:`pytest_resume_check.report.text.cell_json` writes
and every reader (the terminal grid, the HTML and Markdown reports, the plugin's reports and summary, the
cluster's executor) reads, so a key a reader names is a key the writer gives.

These are the types of plain dicts (``TypedDict``): the JSON itself is unchanged, and a cell's JSON still
rides on a pytest-xdist report and through a Ray task as a dict. The keys every cell has are declared in the
``...Base`` classes; the keys only some cells have (a cell with no verdict has no ``step_unit``; the plugin
adds ``rerun``; a cell from a cluster node may name evidence that stayed there) are declared as optional.
Key names that other modules spell as constants are ``Final`` there, so a type checker reads them as keys.
"""

from __future__ import annotations

from typing import Any, TypedDict


class FindingJson(TypedDict):
    """One finding of a cell's verdict: its category, its line, the step and the ledger it is about."""

    category: str
    headline: str
    step: int | None
    ledger: str | None


class MarksJson(TypedDict):
    """The per-entry marks of the shown ledgers (one character per row of ``reference`` and ``composite``)."""

    reference: str
    composite: str


class CommitJson(TypedDict):
    """The commit point a zero-change program's runs followed: its file's glob, and whether the harness
    recognised it in the reference run (False: the target declared it)."""

    file: str
    recognised: bool


class KnownFindingJson(TypedDict):
    """A framework's own resume bug the cell shows (``report.known_findings``, docs/findings.md)."""

    id: str
    framework: str
    distribution: str
    version: str | None
    versions: str
    title: str
    page: str
    anchor: str
    check: str | None
    workaround: str | None


class EnvironmentJson(TypedDict, total=False):
    """Names (never values) of the variables of a cell's runs: ``read`` by the project's code, set by the
    ``harness``, set by a program run fresh (``ran_fresh``); the plugin adds the ``declared`` ones, and for a
    cell run on a cluster node those whose value ``differs`` there."""

    read: list[str]
    harness: list[str]
    ran_fresh: list[str]
    declared: list[str]
    differs: list[str]


class FrameJson(TypedDict):
    """One frame of a hung process's thread, innermost first."""

    file: str
    line: int | None
    function: str


class ThreadJson(TypedDict):
    """One thread of a hung process as faulthandler listed it."""

    thread: str
    main: bool
    frames: list[FrameJson]


class StacksJson(TypedDict):
    """The stacks one process of a hung run wrote into its log (``rank`` None in a one-process run)."""

    rank: int | None
    pid: int
    threads: list[ThreadJson]


class RunJsonBase(TypedDict):
    """What every run of a cell has: how it ended and its log."""

    outcome: str
    exitcode: int | None
    seconds: float
    log_file: str
    log_tail: list[str]


class RunJson(RunJsonBase, total=False):
    """One run of a cell (``text.run_json``): the keys below only where they apply (a hung run's ``stacks``,
    an early stop's ``converged_step``, a torchrun run's ``launcher`` and ``restart``, a multi-rank run's
    ``world_size`` and ``resumed_by_rank``, the signal it got, who ended its ranks)."""

    stacks: list[StacksJson]
    converged_step: int | None
    launcher: str
    restart: int
    world_size: int
    resumed_by_rank: dict[str, int | None]
    signalled: dict[str, Any]
    teardown: str


class CellJsonBase(TypedDict):
    """The keys every cell's JSON has, judged or not."""

    target: str
    #: The case's parameters, as the target declared them (any JSON value).
    case: dict[str, Any]
    case_id: str
    resume_mode: str
    kill: str
    #: Each kill in ``records.plan.KillSpec``'s JSON form (that module owns its keys).
    kills: list[dict[str, Any]]
    passed: bool
    xfail_reason: str | None
    categories: list[str]
    headline: str
    known_finding: KnownFindingJson | None
    resumed_from: list[int]
    state_diverged: int | None
    findings: list[FindingJson]
    ledger: str | None
    #: The shown ledgers' rows (``records.ledger.Ledger.to_json``).
    reference: list[list[Any]]
    composite: list[list[Any]]
    marks: MarksJson
    story: str
    runs: list[RunJson]


class EvidenceLostJson(TypedDict):
    """A cluster cell's kept folders that could not be placed here: the node, their paths there, and why."""

    node: dict[str, str]
    paths: list[str]
    why: str


class CellJson(CellJsonBase, total=False):
    """One matrix cell's JSON (the ``cells`` of ``--resume-matrix-json``). ``status`` is set by the writer
    from the keys above; the rest only where they apply."""

    status: str
    #: The unit of a step in the target's words (``step``, ``optimizer step``); judged cells only.
    step_unit: str
    commit: CommitJson | None
    environment: EnvironmentJson
    #: The command that reruns exactly this cell (the plugin's, with the session's options).
    rerun: str
    #: The reproduction folder written for a failing cell, or why it could not be (``report.repro``).
    repro: str
    repro_error: str
    #: A cluster cell's evidence: entries refused while unpacking it, what was lost, what stayed on the node.
    evidence_refused: list[dict[str, str]]
    evidence_lost: EvidenceLostJson
    kept_on_node: dict[str, Any]
