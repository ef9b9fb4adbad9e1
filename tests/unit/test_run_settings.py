"""How a run's framework is set up (``run.settings``): plain values that travel on the event channel as they
are and read back from the run's record, a later report of a name winning. No processes."""

from __future__ import annotations

import pytest

from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.run import ERR_SETTING, RunContext

PLAN = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log")


class Sink:
    def __init__(self):
        self.events = []

    def send(self, event):
        self.events.append(event)


def test_settings_travel_as_plain_values_and_a_later_report_wins():
    sink = Sink()
    run = RunContext(PLAN, sink)
    run.settings({"dataloader_num_workers": 0, "generator": None})
    run.settings({"dataloader_num_workers": 2})
    wired = [ev.Event.from_wire(e.to_wire()) for e in sink.events]
    assert [e.kind for e in wired] == [ev.SETTINGS, ev.SETTINGS]
    assert RunRecord(PLAN, wired, Outcome.DONE, 0).settings == {"dataloader_num_workers": 2, "generator": None}


def test_a_multi_rank_runs_settings_are_rank_0s():
    events = [ev.Event(ev.SETTINGS, extra={"workers": 1}, rank=1), ev.Event(ev.SETTINGS, extra={"workers": 0}, rank=0)]
    assert RunRecord(PLAN, events, Outcome.DONE, 0).settings == {"workers": 0}


def test_a_setting_that_is_not_a_plain_value_is_refused():
    run = RunContext(PLAN, Sink())
    with pytest.raises(TypeError) as raised:
        run.settings({"loader": [1, 2]})
    assert str(raised.value) == ERR_SETTING.format(name="loader", type="list")
