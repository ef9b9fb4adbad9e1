"""pytest-xdist: what the controller hands its workers, and the scheduler that keeps a case's cells
together on one worker and does not run a crashed worker's cell again.

Used only with pytest-xdist installed; its modules are imported only here, and only when it is.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_resume_check.plugin.settings import NODE_PREFIX, SETTINGS_KEY, WORKER_NODE_IDS, WORKER_SEED


class WorkerHandoff:
    """Hands the controller's seed and named cells to every xdist worker, so all collect the same cells
    (also with the matrix off: the ``resume_check`` fixture runs with the session's seed)."""

    def pytest_configure_node(self, node: Any) -> None:
        settings = node.config.stash[SETTINGS_KEY]
        node.workerinput[WORKER_SEED] = settings.seed
        node.workerinput[WORKER_NODE_IDS] = list(settings.node_ids)


def case_group(nodeid: str) -> str:
    """The xdist work unit of a test: a matrix cell's (target, case, resume mode), any other test alone."""
    # Imported here: the handoff above is loaded in every session with xdist, the matrix on or not.
    from pytest_resume_check.records.kill_ids import split_cell_name

    parts = split_cell_name(nodeid[len(NODE_PREFIX):]) if nodeid.startswith(NODE_PREFIX) else None
    if parts is None:
        return nodeid
    target, case, mode, _ = parts
    return f"{NODE_PREFIX}{target} {case} {mode}"


def case_and_mode_scheduler(config: pytest.Config, log: Any) -> Any:
    """With xdist's default distribution, the cells of one case and resume mode go to one worker: they
    share a first run and a reference, which every worker that runs one of them would otherwise make again.
    A case's two modes may go to two workers (its reference is then made twice), which keeps a
    one-case target parallel. Other tests are spread one by one, as ``load`` does. None (xdist's own
    scheduler) for any other distribution."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByCaseAndMode(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return case_group(nodeid)

        def remove_node(self, node: Any) -> str | None:
            """As xdist's, but the cell that was running when the worker crashed is not run again: xdist
            reports it as crashed, and its scope's other cells go to another worker (xdist 3.8 queued the
            crashed cell again, which crashed every replacement worker in turn)."""
            workload = self.assigned_work.pop(node)
            if not self._pending_of(workload):
                return None
            crashed = next(n for unit in workload.values() for n, done in unit.items() if not done)
            for unit in workload.values():
                if crashed in unit:
                    unit[crashed] = True
            self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return ByCaseAndMode(config, log)
