"""Fork-server preload entry, imported last and only by the fork server: importing it *is* the call
(the server's preload list can only name modules). See :func:`._server_setup.finish`."""

from pytest_resume_check.process import _server_setup

_server_setup.finish()
