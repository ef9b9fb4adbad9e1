"""Known framework findings named under the headline (issue 29, item 5): the table's entries, each matched by
its category, its structured condition, the framework's evidence in the runs' state and the installed version;
never a planted bug of ours with the same shape but no framework; every anchor a heading of docs/findings.md.
No processes: the cells are judged from recorded events."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records import state as st
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import CellResult, Outcome, RunRecord
from pytest_resume_check.report import html, known_findings
from pytest_resume_check.report import text as report
from pytest_resume_check.targets import Contract, resume_target

FINDINGS = Path(__file__).resolve().parents[2] / "docs" / "findings.md"
LIGHTNING = next(k for k in known_findings.TABLE if k.id == "lightning-epoch-end-resume")
#: Two epochs of three steps, two inputs a step: step 3 ends epoch 0.
STEPS, PER_EPOCH = 6, 3
LINE = ("known: Lightning 2.6: a checkpoint at an epoch's last batch skips the next epoch "
        "(docs/findings.md#lightning-a-checkpoint-at-an-epochs-last-batch-skips-the-next-epoch); "
        "workaround: EpochEndResumeFix")


def trainer(run):
    """Never run: the cells below are judged from recorded events."""


TARGET = resume_target(trainer, name="t", steps=STEPS)


def epoch(step):
    return (step - 1) // PER_EPOCH


def record(events, outcome=Outcome.DONE, is_resume=False):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log", is_resume=is_resume)
    return RunRecord(plan, list(events), outcome, 0)


def state(step, components, **values):
    """A state event as RunContext.state sends it (``components``: the names reported, besides ``values``)."""
    values = {**{name: [step] for name in components}, **values}
    leaves = {name: st.leaf_digests(value) for name, value in values.items()}
    return ev.Event(ev.STATE, step=step, extra={ev.STATE_DIGESTS: {n: st.combine(v) for n, v in leaves.items()},
                                                ev.STATE_LEAVES: leaves})


def steps(first, last, components, values_at=None):
    """Steps ``first`` to ``last`` with their inputs and state (``values_at``: values of some steps, by step)."""
    out = []
    for s in range(first, last + 1):
        out += [ev.Event(ev.CONSUMED, step=s, epoch=epoch(s), ids=(2 * s - 2, 2 * s - 1)),
                ev.Event(ev.STEP_END, step=s), state(s, components, **(values_at or {}).get(s, {}))]
    return out


def cell_result(restored, resumed_events, components=("model", "fit_loop")):
    """A cell killed after the checkpoint of step ``restored``, whose resumed run reports ``resumed_events``."""
    reference = record(steps(1, STEPS, components))
    first = record([e for s in range(1, restored + 1) for e in (
        ev.Event(ev.CONSUMED, step=s, epoch=epoch(s), ids=(2 * s - 2, 2 * s - 1)), ev.Event(ev.STEP_END, step=s))]
        + [ev.Event(ev.CHECKPOINT, step=restored, path=f"/ckpt/step_{restored}.ckpt")], Outcome.KILLED)
    resumed = record([ev.Event(ev.RESUMED, step=restored, path=f"/ckpt/step_{restored}.ckpt"),
                      state(restored, components), *resumed_events], is_resume=True)
    verdict = vd.judge(reference, [first, resumed], Contract())
    cell = Cell(TARGET, {}, "auto", (KillSpec(restored),), STEPS)
    return CellResult(cell, verdict, reference, [first, resumed])


def skips_next_epoch(restored=3, components=("model", "fit_loop")):
    """The Lightning bug's shape: resumed at ``restored``, the run trains nothing more and ends."""
    return cell_result(restored, [], components)


@pytest.fixture
def installed(monkeypatch):
    """The installed framework versions, as the test says (none unless given)."""
    versions: dict[str, str] = {}
    monkeypatch.setattr(known_findings, "installed_version", versions.get)
    return versions


def test_the_lightning_bug_gets_its_line_under_the_headline(installed):
    installed["lightning"] = "2.6.6"
    result = skips_next_epoch()
    assert result.verdict.headline.startswith("LOST 6 inputs after resume from step_3.ckpt: ids 6, 7, 8, 9, 10, 11")
    text = report.failure_text(result).splitlines()
    assert text[:2] == [result.verdict.headline, "  " + LINE]
    known = report.cell_json(result)["known_finding"]
    assert known == {"id": "lightning-epoch-end-resume", "framework": "Lightning", "distribution": "lightning",
                     "version": "2.6.6", "versions": "2.6", "title": LIGHTNING.title, "page": "docs/findings.md",
                     "anchor": LIGHTNING.anchor, "workaround": "EpochEndResumeFix"}
    assert known_findings.line(known) == LINE


def test_the_same_loss_without_lightning_in_the_runs_is_not_named(installed):
    """A plain loop of ours that skips the next epoch: no ``fit_loop`` component, so not Lightning's bug."""
    installed["lightning"] = "2.6.6"
    result = skips_next_epoch(components=("model", "loader"))
    assert result.verdict.categories == [vd.LOST]
    assert known_findings.match(result) is None
    assert report.cell_json(result)["known_finding"] is None
    assert "known:" not in report.failure_text(result)


@pytest.mark.parametrize("version", [None, "2.5.3", "2.7.0", "3.0.0"])
def test_other_lightning_versions_are_not_named(installed, version):
    if version is not None:
        installed["lightning"] = version
    assert known_findings.match(skips_next_epoch()) is None


def test_a_loss_after_a_resume_inside_an_epoch_is_not_the_epoch_end_bug(installed):
    installed["lightning"] = "2.6.6"
    result = skips_next_epoch(restored=2)  # step 2 is inside epoch 0
    assert result.verdict.categories == [vd.LOST]
    assert known_findings.match(result) is None


def test_a_loss_that_starts_later_than_the_next_epoch_is_not_named(installed):
    installed["lightning"] = "2.6.6"
    components = ("model", "fit_loop")
    result = cell_result(3, steps(4, 4, components))  # step 4 trained, then the run stops: loses steps 5, 6
    assert result.verdict.categories == [vd.LOST] and result.verdict.findings[0].step == 5
    assert known_findings.match(result) is None


def test_a_passing_cell_and_a_command_cell_are_never_named(installed):
    installed["lightning"] = "2.6.6"
    passing = cell_result(3, steps(4, STEPS, ("model", "fit_loop")))
    assert passing.passed and known_findings.match(passing) is None
    failing = skips_next_epoch()
    command = TARGET.with_options(command=object())
    failing.cell = Cell(command, {}, "auto", failing.cell.kills, STEPS)
    assert known_findings.match(failing) is None


# -- the state findings: the differing component at the first step after a mid-epoch resume -----------------

def test_hf_trainer_masks_after_a_mid_epoch_resume_are_named(installed):
    installed["transformers"] = "5.10.4"
    components = ("model", "trainer_state")
    result = cell_result(2, steps(3, STEPS, components, {s: {"model": [-s]} for s in range(3, STEPS + 1)}),
                         components)
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 3
    assert report.cell_json(result)["known_finding"]["id"] == "hf-trainer-rng-after-collate"
    assert report.failure_text(result).splitlines()[1] == (
        "  known: transformers 5.x: a mid-epoch resume collates its first batches before restoring the RNG "
        "(docs/findings.md#hugging-face-trainer-a-mid-epoch-resume-collates-its-first-batches-before-restoring-"
        "the-rng)")


def test_a_state_that_differs_at_the_restored_step_is_not_the_collator_finding(installed):
    """The recipe's planted optimizer loss: it differs where the checkpoint was restored."""
    installed["transformers"] = "5.10.4"
    components = ("model", "optimizer", "trainer_state")
    reference = steps(3, STEPS, components)
    result = cell_result(2, reference, components)
    result.runs[1].events[1] = state(2, components, optimizer=["fresh"])
    result.verdict = vd.judge(result.reference, result.runs, Contract())
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 2
    assert known_findings.match(result) is None


def test_accelerate_torch_rng_after_a_mid_epoch_resume_is_named_with_its_workaround(installed):
    installed["accelerate"] = "1.16.0"
    components = ("model", "registered")
    shifted = {s: {"rng": {"torch": [s, "shifted"], "python": [s]}} for s in range(3, STEPS + 1)}
    result = cell_result(2, steps(3, STEPS, components, shifted), components)
    result.reference = record(steps(1, STEPS, components, {s: {"rng": {"torch": [s], "python": [s]}}
                                                           for s in range(1, STEPS + 1)}))
    result.verdict = vd.judge(result.reference, result.runs, Contract())
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    known = report.cell_json(result)["known_finding"]
    assert known["id"] == "accelerate-loader-rng" and known["versions"] == "1.15-1.16"
    assert known_findings.line(known).endswith("; workaround: DataLoader(..., generator=torch.Generator()"
                                               ".manual_seed(seed))")


# -- the table ----------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """A heading's anchor as mkdocs makes it (Python-Markdown's toc extension, its default slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def sections() -> dict[str, tuple[str, str]]:
    """The findings page's sections by anchor: (heading, text)."""
    parts = re.split(r"^## (.+)$", FINDINGS.read_text(encoding="utf-8"), flags=re.M)
    return {slug(heading): (heading, body) for heading, body in zip(parts[1::2], parts[2::2])}


def test_slug_is_the_one_mkdocs_makes():
    toc = pytest.importorskip("markdown.extensions.toc")
    for heading, _ in sections().values():
        assert slug(heading) == toc.slugify(heading, "-")


@pytest.mark.parametrize("known", known_findings.TABLE, ids=lambda k: k.id)
def test_every_entry_points_at_its_finding_on_the_findings_page(known):
    found = sections()
    assert known.anchor in found, f"{known.id}: no heading of docs/findings.md has the anchor #{known.anchor}"
    heading, body = found[known.anchor]
    assert heading.endswith(": " + known.title)
    # The page was run with a version inside the entry's range.
    versions = re.search(r"\*\*Versions?:\*\*(.*)", body).group(1)
    shown = re.findall(rf"{known.distribution} (\d+\.\d+(?:\.\d+)?)", versions, re.I)
    assert shown and any(known.versions.holds(v) for v in shown), (known.id, versions)
    if known.workaround:
        assert known.workaround.split("(")[0] in body


def test_ids_are_unique_and_versions_read_as_the_page_writes_them():
    assert len({k.id for k in known_findings.TABLE}) == len(known_findings.TABLE)
    assert [k.versions.label for k in known_findings.TABLE] == ["2.6", "5.x", "1.15-1.16"]
    assert known_findings.release("2.13.0+cpu") == (2, 13, 0) and known_findings.release("dev") is None


@pytest.mark.parametrize("module, constant, evidence", [
    ("pytest_resume_check.integrations.lightning", "STATE_FIT_LOOP", "lightning-epoch-end-resume"),
    ("pytest_resume_check.integrations.hf_trainer", "STATE_TRAINER", "hf-trainer-rng-after-collate"),
])
def test_the_evidence_is_the_integrations_own_component(module, constant, evidence):
    integration = pytest.importorskip(module)
    entry = next(k for k in known_findings.TABLE if k.id == evidence)
    assert entry.evidence == getattr(integration, constant)


def test_the_accelerate_evidence_is_a_component_of_its_integration():
    integration = pytest.importorskip("pytest_resume_check.integrations.accelerate")
    entry = next(k for k in known_findings.TABLE if k.id == "accelerate-loader-rng")
    assert entry.evidence in integration.STATE_COMPONENTS


# -- the HTML report shows the line --------------------------------------------------------------------------

def test_the_html_report_shows_the_line_under_the_headline(installed):
    installed["lightning"] = "2.6.6"
    data = report.cell_json(skips_next_epoch())
    page = html.render([data], seed=1)
    details = re.search(r'<details class="failure".*?</summary>', page, re.S).group(0)
    assert f'<span class="known">{LINE.replace(chr(39), "&#x27;")}</span></summary>' in details
