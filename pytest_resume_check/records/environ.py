"""Which environment variables make up a run's environment, and how two machines compare theirs without
either sending its values (docs/cluster.md, "The runs' environment").

A variable counts when it is

- *declared* for the target: named by its ``pass_env=``, by ``--resume-matrix-env``, or set by a command
  target's ``env=`` (the plugin knows these); or
- *read* by the project's own Python code in a run (``os.environ[...]``, ``.get``, ``in``, ``os.getenv``;
  in the run's process, or in the fork server while it imports the target's modules), as
  :mod:`pytest_resume_check.child.environ` records it, unless :func:`counts` says the name belongs to the
  machine (:data:`MACHINE`) or to the harness and the launchers (:data:`HARNESS`, and what the harness
  set for the run, :func:`harness_names`).

Values stay where they are: a cluster node sends keyed digests of the values its runs read
(:func:`digests`), and the machine pytest runs on compares them with its own (:func:`differing`); only a
declared variable's value is ever sent (to be set on the node) or written down (in a reproduction).

Stdlib only.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping

from pytest_resume_check.records.names import RUN_TOKEN_ENV
from pytest_resume_check.records.plan import RunPlan

#: What a variable's name may be (POSIX's portable names): anything else in a declaration is a typo.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: Variables that describe the machine or the login session rather than the run's configuration: they
#: differ from one machine to the next by design, so they are neither compared nor recorded.
MACHINE = frozenset({"HOME", "PATH", "PWD", "OLDPWD", "USER", "USERNAME", "LOGNAME", "HOSTNAME", "SHELL", "SHLVL",
                     "TERM", "COLUMNS", "LINES", "TMPDIR", "TEMP", "TMP", "DISPLAY", "LANG", "LANGUAGE", "_"})
MACHINE_PREFIXES = ("LC_", "SSH_", "XDG_")
#: What the shell sets anew for every command it starts (the folder it was typed in and the one before, how deep
#: the shell is nested, the command's own path): never a program's configuration, even where a library copied
#: the whole environment while it was imported.
SHELL = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
#: What ``torch.distributed``'s rendezvous reads, which the harness (or torchrun) sets for each rank.
RANK_NAMES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: Variables the harness, pytest-xdist, torchrun or Ray set per process or per run: the same run gets them
#: again anywhere it runs, so they are not the run's configuration.
HARNESS = frozenset({*RANK_NAMES, "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                     "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER",
                     "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"})
HARNESS_PREFIXES = ("PYTEST_RESUME_CHECK_", "RESUME_CHECK_", "TORCHELASTIC_", "RAY_")


def counts(name: str, harness: Iterable[str] = ()) -> bool:
    """Whether a variable the project's code read is part of the run's configuration: not the machine's,
    not the harness's, and not among ``harness`` (what the harness set for this run)."""
    if name in MACHINE or name in HARNESS or name.startswith((*MACHINE_PREFIXES, *HARNESS_PREFIXES)):
        return False
    return name not in set(harness)


def harness_names(plan: RunPlan) -> list[str]:
    """The variables the harness set for the run of ``plan``: its services' and devices' (``plan.env``),
    the run's token, and the rendezvous variables of a distributed run."""
    names = {*plan.env, RUN_TOKEN_ENV}
    if plan.world_size > 1 or plan.master_port:
        names.update(RANK_NAMES)
    return sorted(names)


def parse_names(values: str | Iterable[str]) -> tuple[str, ...]:
    """Names given as ``"A,B C"`` (or as a list of such strings), each once, in order; ``ValueError``
    naming the first that is no variable name, ``TypeError`` for anything but strings."""
    words = [values] if isinstance(values, str) else list(values)
    if not all(isinstance(word, str) for word in words):
        raise TypeError("variable names must be strings")
    names = [n for word in words for n in re.split(r"[,\s]+", word) if n]
    bad = next((n for n in names if not NAME.match(n)), None)
    if bad is not None:
        raise ValueError(bad)
    return tuple(dict.fromkeys(names))


def forwarded(names: Iterable[str], environ: Mapping[str, str]) -> dict[str, str | None]:
    """The values ``names`` have in ``environ``, to set on another machine (None: unset there too, as it is
    here)."""
    return {name: environ.get(name) for name in names}


def digest(key: str, value: str | None) -> str | None:
    """A digest of a variable's value keyed with the session's ``key`` (None for an unset variable): equal
    values give equal digests on two machines, and the digest alone does not give the value away."""
    if value is None:
        return None
    return hmac.new(key.encode(), value.encode("utf-8", "surrogateescape"), "sha256").hexdigest()[:32]


def digests(names: Iterable[str], key: str, environ: Mapping[str, str]) -> dict[str, str | None]:
    """:func:`digest` of each of ``names`` as ``environ`` has it."""
    return {name: digest(key, environ.get(name)) for name in names}


def differing(theirs: Mapping[str, str | None], key: str, environ: Mapping[str, str],
              declared: Iterable[str] = ()) -> list[str]:
    """The names whose value in ``environ`` (here) differs from the one ``theirs`` digested (unset on one
    side counts), sorted; ``declared`` ones were set from here, so they are not compared."""
    skip = set(declared)
    return sorted(n for n, d in theirs.items() if n not in skip and digest(key, environ.get(n)) != d)
