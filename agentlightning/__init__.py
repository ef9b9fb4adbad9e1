"""The Agent Lightning VERL trainer piece: async training inputs that survive checkpoint and resume.

Only :mod:`agentlightning.verl` ships in this distribution. It shares its import name with the
upstream Agent Lightning distribution, so the two must not be installed in one environment.
Importing this package imports neither torch nor verl.

Every install of pytest-resume-check installs this package (extras add requirements, they cannot
choose which of a wheel's packages are installed). Where another distribution also provides the
``agentlightning`` import name (upstream's distribution ``agentlightning``), the two overwrite each
other's files, and the mix would fail later
and far from the cause; so importing raises :class:`ImportError` (:data:`ERR_SHARED_IMPORT_NAME`) at
once. Checking is all the import does: it looks up one distribution's metadata and starts nothing.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

#: This package's distribution, and upstream Agent Lightning's, which provides the same import name.
DISTRIBUTION = "pytest-resume-check"
UPSTREAM = "agentlightning"
#: The failure when upstream Agent Lightning is installed too.
ERR_SHARED_IMPORT_NAME = (
    "the 'agentlightning' import name is provided by two distributions: {ours} (its VERL trainer piece, "
    "agentlightning.verl) and {other} {version}; they overwrite each other's files. Uninstall one of them "
    "(pip uninstall {other}, or pip uninstall {ours}), or install them in separate virtual environments."
)


def _check_sole_provider() -> None:
    """Raise :class:`ImportError` when upstream Agent Lightning is installed as well. One metadata lookup
    by name (a few milliseconds); scanning every distribution's file list cost 0.2 s per process."""
    try:
        other = distribution(UPSTREAM)
    except PackageNotFoundError:
        return
    raise ImportError(ERR_SHARED_IMPORT_NAME.format(ours=DISTRIBUTION, other=UPSTREAM, version=other.version),
                      name=__name__)


_check_sole_provider()
