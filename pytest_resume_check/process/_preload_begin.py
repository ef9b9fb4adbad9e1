"""Fork-server preload entry, imported first and only by the fork server: silences its stdout and
stderr while the targets' modules are imported and warmed up (verl and torch print loader sizes and
warn about missing accelerators), until :mod:`._preload_end`, imported last, restores them. That
output would otherwise land in whichever test or collection started the server."""

from __future__ import annotations

import os

SAVED_STDOUT = os.dup(1)
SAVED_STDERR = os.dup(2)
_devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(_devnull, 1)
os.dup2(_devnull, 2)
os.close(_devnull)
