"""Known framework findings named under the headline: the table's entries, each matched by its category, the
framework's evidence in the runs' state, the installed version and every precondition of its mechanism, read
from the cell's structured values (the components that differ and where, the inputs, the settings the
integration reported, a crash cell's fault); never a planted bug of ours with the same shape but no framework,
nor a user's bug in a framework target whose cell lacks a precondition; every line says what to check; every
anchor a heading of docs/findings.md whose section lists the preconditions. No processes: the cells are judged
from recorded events."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records import state as st
from pytest_resume_check.records.faults import MODE_CRASH, MODE_POWER, FaultPlan, FileOp
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
        "check: the resumed fit trained no batch of epoch 1 over a stateful train loader, without EpochEndResumeFix "
        "in its callbacks; workaround: EpochEndResumeFix")
#: The settings each integration reports when its framework's finding can apply (run.settings).
LIGHTNING_BUGGY = {known_findings.SETTING_STATEFUL_LOADER: True, known_findings.SETTING_EPOCH_END_FIX: False}
MAIN_PROCESS = {known_findings.SETTING_WORKERS: 0}
NO_GENERATOR = {known_findings.SETTING_LOADER_GENERATOR: False}


def trainer(run):
    """Never run: the cells below are judged from recorded events."""


TARGET = resume_target(trainer, name="t", steps=STEPS)


def epoch(step):
    return (step - 1) // PER_EPOCH


def record(events, outcome=Outcome.DONE, is_resume=False, error=None):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log", is_resume=is_resume)
    return RunRecord(plan, list(events), outcome, 0, error)


def settings(values):
    """A settings event as RunContext.settings sends it."""
    return [ev.Event(ev.SETTINGS, extra=dict(values))] if values else []


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


def cell_result(restored, resumed_events, components=("model", "fit_loop"), setup=LIGHTNING_BUGGY, contract=None,
                reference_at=None):
    """A cell killed after the checkpoint of step ``restored``, whose resumed run reports ``resumed_events``;
    every run reports the settings ``setup`` (``reference_at``: the reference's values of some steps)."""
    reference = record([*settings(setup), *steps(1, STEPS, components, reference_at)])
    first = record([*settings(setup)] + [e for s in range(1, restored + 1) for e in (
        ev.Event(ev.CONSUMED, step=s, epoch=epoch(s), ids=(2 * s - 2, 2 * s - 1)), ev.Event(ev.STEP_END, step=s))]
        + [ev.Event(ev.CHECKPOINT, step=restored, path=f"/ckpt/step_{restored}.ckpt")], Outcome.KILLED)
    resumed = record([*settings(setup), ev.Event(ev.RESUMED, step=restored, path=f"/ckpt/step_{restored}.ckpt"),
                      state(restored, components, **(reference_at or {}).get(restored, {})), *resumed_events],
                     is_resume=True)
    verdict = vd.judge(reference, [first, resumed], contract or Contract())
    cell = Cell(TARGET, {}, "auto", (KillSpec(restored),), STEPS)
    return CellResult(cell, verdict, reference, [first, resumed])


def skips_next_epoch(restored=3, components=("model", "fit_loop"), setup=LIGHTNING_BUGGY):
    """The Lightning bug's shape: resumed at ``restored``, the run trains nothing more and ends."""
    return cell_result(restored, [], components, setup)


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
                     "anchor": LIGHTNING.anchor, "workaround": "EpochEndResumeFix",
                     "check": "the resumed fit trained no batch of epoch 1 over a stateful train loader, without "
                              "EpochEndResumeFix in its callbacks"}
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


def test_a_loss_of_part_of_the_next_epoch_is_not_the_skipped_epoch(installed):
    """A user's bug that drops the first batch after an epoch-end resume: the next epoch was trained, in part."""
    installed["lightning"] = "2.6.6"
    components = ("model", "fit_loop")
    later = steps(5, STEPS, components)  # step 4's inputs never taken; steps 5 and 6 trained as the reference did
    result = cell_result(3, later, components)
    assert result.verdict.categories[0] == vd.LOST and result.verdict.findings[0].step == 4
    assert known_findings.match(result) is None


@pytest.mark.parametrize("setup", [
    {known_findings.SETTING_STATEFUL_LOADER: True, known_findings.SETTING_EPOCH_END_FIX: True},
    {known_findings.SETTING_STATEFUL_LOADER: False, known_findings.SETTING_EPOCH_END_FIX: False},
    {known_findings.SETTING_STATEFUL_LOADER: None, known_findings.SETTING_EPOCH_END_FIX: False},
    {},
], ids=["with-the-workaround", "plain-loader", "no-loader", "not-reported"])
def test_a_skipped_epoch_where_lightning_cannot_skip_it_is_not_named(installed, setup):
    """The same skipped epoch in a fit with EpochEndResumeFix, or over a plain DataLoader (which Lightning
    resumes right at an epoch's end): the user's own bug, such as max_epochs counted from the resumed epoch."""
    installed["lightning"] = "2.6.6"
    result = skips_next_epoch(setup=setup)
    assert result.verdict.categories == [vd.LOST]
    assert known_findings.match(result) is None
    assert "known:" not in report.failure_text(result)


def test_a_passing_cell_and_a_command_cell_are_never_named(installed):
    installed["lightning"] = "2.6.6"
    passing = cell_result(3, steps(4, STEPS, ("model", "fit_loop")))
    assert passing.passed and known_findings.match(passing) is None
    failing = skips_next_epoch()
    command = TARGET.with_options(command=object())
    failing.cell = Cell(command, {}, "auto", failing.cell.kills, STEPS)
    assert known_findings.match(failing) is None


# -- the HF Trainer's collator: the batch differs at the first step after a mid-epoch resume ----------------

HF = ("batch", "model", "optimizer", "lr_scheduler", "trainer_state", "rng")


def hf_cell(restored=2, differ=("batch", "model", "optimizer"), setup=MAIN_PROCESS, at=None):
    """An HF Trainer cell whose components ``differ`` from the first step after ``restored`` on (``at``: only at
    that step)."""
    first = restored + 1
    values = {s: {name: [-s] for name in differ} for s in range(first, STEPS + 1) if at is None or s == at}
    return cell_result(restored, steps(first, STEPS, HF, values), HF, setup)


def test_hf_trainer_masks_after_a_mid_epoch_resume_are_named_with_what_to_check(installed):
    installed["transformers"] = "5.10.4"
    result = hf_cell()
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 3
    assert result.verdict.headline.endswith("batch differs (0), model differs (0), optimizer differs (0), "
                                            "lr_scheduler, trainer_state and rng agree")
    known = report.cell_json(result)["known_finding"]
    assert known["id"] == "hf-trainer-rng-after-collate"
    assert report.failure_text(result).splitlines()[1] == (
        "  known: transformers 5.x: a mid-epoch resume collates its first batches before restoring the RNG "
        "(docs/findings.md#hugging-face-trainer-a-mid-epoch-resume-collates-its-first-batches-before-restoring-"
        "the-rng); check: the batch of step 3 holds the uninterrupted run's ids with other values, and the "
        "collator or dataset draws random numbers in the main process (dataloader_num_workers=0)")


def test_a_model_that_differs_on_the_same_batches_is_the_users_own_bug(installed):
    """A Trainer subclass whose loss keys on a counter kept on ``self``: the model differs after the resume, the
    batches it trained on agree. Under "rng agree" and "batch agree" the collator finding cannot be the cause."""
    installed["transformers"] = "5.10.4"
    result = hf_cell(differ=("model", "optimizer"))
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 3
    assert "batch, lr_scheduler, trainer_state and rng agree" in result.verdict.headline
    assert known_findings.match(result) is None
    assert "known:" not in report.failure_text(result)


@pytest.mark.parametrize("setup", [{known_findings.SETTING_WORKERS: 2}, {}], ids=["two-workers", "not-reported"])
def test_other_batches_collated_by_loader_workers_are_not_the_main_process_finding(installed, setup):
    installed["transformers"] = "5.10.4"
    result = hf_cell(setup=setup)
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert known_findings.match(result) is None


@pytest.mark.parametrize("differ", [("batch", "model", "lr_scheduler"), ("batch", "model", "trainer_state"),
                                    ("batch", "model", "sampler")], ids=["lr_scheduler", "trainer_state", "extra"])
def test_a_component_the_late_rng_restore_does_not_explain_is_not_named(installed, differ):
    """The first differing components must all be the finding's: a schedule, the trainer's counters or a
    component of the user's own that differs there has a cause of its own."""
    installed["transformers"] = "5.10.4"
    if "sampler" in differ:
        components = (*HF, "sampler")
        values = {s: {name: [-s] for name in differ} for s in range(3, STEPS + 1)}
        result = cell_result(2, steps(3, STEPS, components, values), components, MAIN_PROCESS)
    else:
        result = hf_cell(differ=differ)
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 3
    assert known_findings.match(result) is None


def test_other_batches_after_an_epoch_end_resume_are_not_named(installed):
    """At an epoch's end the Trainer restores the RNG before the loader starts: other batches there are not its."""
    installed["transformers"] = "5.10.4"
    result = hf_cell(restored=3)
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 4
    assert known_findings.match(result) is None


def test_other_batches_of_other_inputs_are_not_the_collators(installed):
    """Under a contract without order, a step that took its inputs in another order shows in its batch too:
    not the same ids with other masks."""
    installed["transformers"] = "5.10.4"
    values = {s: {name: [-s] for name in ("batch", "model", "optimizer")} for s in range(3, STEPS + 1)}
    swapped = steps(3, STEPS, HF, values)
    swapped[0] = ev.Event(ev.CONSUMED, step=3, epoch=epoch(3), ids=(5, 4))
    result = cell_result(2, swapped, HF, MAIN_PROCESS, contract=Contract(ordered=False))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert known_findings.match(result) is None


def test_a_state_that_differs_at_the_restored_step_is_not_the_collator_finding(installed):
    """The recipe's planted optimizer loss: it differs where the checkpoint was restored."""
    installed["transformers"] = "5.10.4"
    components = ("model", "optimizer", "trainer_state")
    reference = steps(3, STEPS, components)
    result = cell_result(2, reference, components, MAIN_PROCESS)
    result.runs[1].events[2] = state(2, components, optimizer=["fresh"])
    result.verdict = vd.judge(result.reference, result.runs, Contract())
    assert result.verdict.categories == [vd.STATE_DIVERGED] and result.verdict.findings[0].step == 2
    assert known_findings.match(result) is None


# -- Accelerate: one more torch draw after a mid-epoch resume, from a loader without a generator ------------

ACCELERATE = ("model", "optimizer", "scheduler", "registered", "rng", "data")


def accelerate_cell(shifted=("torch",), differ=("model", "optimizer"), setup=NO_GENERATOR):
    """An Accelerate cell resumed at step 2 whose RNGs named ``shifted`` and components ``differ`` differ from
    step 3 on."""
    def rng(s, moved=()):
        return {"rng": {name: [s, "shifted"] if name in moved else [s] for name in ("python", "numpy", "torch")}}

    values = {s: {**rng(s, shifted), **{name: [-s] for name in differ}} for s in range(3, STEPS + 1)}
    return cell_result(2, steps(3, STEPS, ACCELERATE, values), ACCELERATE, setup,
                       reference_at={s: rng(s) for s in range(1, STEPS + 1)})


def test_accelerate_torch_rng_after_a_mid_epoch_resume_is_named_with_its_workaround(installed):
    installed["accelerate"] = "1.16.0"
    result = accelerate_cell()
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert "rng differs (torch." in result.verdict.headline
    known = report.cell_json(result)["known_finding"]
    assert known["id"] == "accelerate-loader-rng" and known["versions"] == "1.15-1.16"
    assert known["check"] == ("the torch RNG differs from step 3 on, and the DataLoader given to "
                              "accelerator.prepare has no generator=")
    assert known_findings.line(known).endswith("; workaround: DataLoader(..., generator=torch.Generator()"
                                               ".manual_seed(seed))")


@pytest.mark.parametrize("kwargs", [
    {"setup": {known_findings.SETTING_LOADER_GENERATOR: True}},
    {"setup": {}},
    {"shifted": ("python", "torch")},
    {"shifted": ()},
    {"differ": ("model", "optimizer", "scheduler")},
], ids=["loader-with-a-generator", "not-reported", "python-rng-too", "rng-agrees", "scheduler-too"])
def test_a_torch_rng_shift_the_loader_cannot_explain_is_not_named(installed, kwargs):
    """A user's extra draw after a resume with a loader that has its own generator, a draw from Python's RNG
    too, a model that differs while the RNG agrees, or a schedule that differs: not the loader's seed."""
    installed["accelerate"] = "1.16.0"
    result = accelerate_cell(**kwargs)
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert known_findings.match(result) is None


# -- the HF Trainer's save: a crash cell whose fault leaves trainer_state.json empty -------------------------

#: The watched save of checkpoint-2: the weights, then trainer_state.json, written in place and never fsynced.
SAVE_OPS = (FileOp(0, "mkdir", "checkpoint-2"), FileOp(1, "open", "checkpoint-2/model.safetensors"),
            FileOp(2, "write", "checkpoint-2/model.safetensors"), FileOp(3, "close", "checkpoint-2/model.safetensors"),
            FileOp(4, "open", "checkpoint-2/trainer_state.json"), FileOp(5, "write", "checkpoint-2/trainer_state.json"),
            FileOp(6, "close", "checkpoint-2/trainer_state.json"))
TRACEBACK = ("Traceback (most recent call last):\n"
             "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)")


def crash_cell(mode=MODE_POWER, op=5, raised=True, components=("model", "trainer_state")):
    """A crash cell of the save of step 2 (``mode`` at ``op``) whose resumed run raises (``raised``) or passes."""
    fault = FaultPlan(2, mode, op, total=len(SAVE_OPS))
    reference = record(steps(1, STEPS, components))
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log", faults=fault, kill=KillSpec(2, fault=fault))
    first = RunRecord(plan, [e for s in (1, 2) for e in (
        ev.Event(ev.CONSUMED, step=s, epoch=epoch(s), ids=(2 * s - 2, 2 * s - 1)), ev.Event(ev.STEP_END, step=s))],
        Outcome.KILLED, None)
    if raised:
        resumed = record([], Outcome.RAISED, is_resume=True, error=TRACEBACK)
    else:
        resumed = record([ev.Event(ev.RESUMED, step=1, path="/ckpt/checkpoint-1"), *steps(2, STEPS, components)],
                         is_resume=True)
    cell = Cell(TARGET, {}, "auto", (KillSpec(2, fault=fault),), STEPS, save_ops=SAVE_OPS)
    return CellResult(cell, vd.judge(reference, [first, resumed], Contract(), newest_complete=1), reference,
                      [first, resumed])


@pytest.mark.parametrize(("mode", "op"), [(MODE_POWER, 5), (MODE_POWER, 7), (MODE_CRASH, 6)],
                         ids=["power-loss-while-written", "power-loss-before-any-fsync", "kill-before-its-close"])
def test_a_resume_that_fails_on_an_emptied_trainer_state_is_the_non_durable_save(installed, mode, op):
    installed["transformers"] = "5.10.4"
    result = crash_cell(mode, op)
    assert result.verdict.categories == [vd.RESUME_ERROR]
    known = report.cell_json(result)["known_finding"]
    assert known["id"] == "hf-trainer-state-not-durable"
    assert known_findings.line(known) == (
        "known: transformers 5.x: a crash while trainer_state.json is written leaves a checkpoint the resume cannot "
        "read (docs/findings.md#hugging-face-trainer-a-crash-while-trainer_statejson-is-written-leaves-a-checkpoint-"
        "the-resume-cannot-read); check: checkpoint-2/trainer_state.json in the cell's folder is empty or cut, and "
        "the job's resume took that folder; workaround: resume from the newest checkpoint-N whose "
        "trainer_state.json parses")


@pytest.mark.parametrize("kwargs", [
    {"op": 3},  # a power loss before trainer_state.json was opened: the folder holds no such file
    {"mode": MODE_CRASH, "op": 7},  # a kill after it was closed: written whole
    {"raised": False, "op": 5},  # the resume took the older checkpoint and went on
    {"components": ("model", "fit_loop")},  # not the Trainer's run
], ids=["before-its-open", "after-its-close", "resume-passes", "another-framework"])
def test_a_crash_cell_without_an_emptied_trainer_state_is_not_named(installed, kwargs):
    installed["transformers"] = "5.10.4"
    assert known_findings.match(crash_cell(**kwargs)) is None


def test_a_resume_error_outside_a_crash_cell_is_not_the_non_durable_save(installed):
    installed["transformers"] = "5.10.4"
    result = crash_cell()
    result.cell = Cell(TARGET, {}, "auto", (KillSpec(2),), STEPS)
    assert result.verdict.categories == [vd.RESUME_ERROR]
    assert known_findings.match(result) is None


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
    # The section says when a report names it: the preconditions the condition checks.
    assert "**Named in a report when:**" in body, f"{known.id}: its section does not list its preconditions"
    # The page was run with a version inside the entry's range.
    versions = re.search(r"\*\*Versions?:\*\*(.*)", body).group(1)
    shown = re.findall(rf"{known.distribution} (\d+\.\d+(?:\.\d+)?)", versions, re.I)
    assert shown and any(known.versions.holds(v) for v in shown), (known.id, versions)
    if known.workaround:
        assert known.workaround.split("(")[0] in body


def test_ids_are_unique_and_versions_read_as_the_page_writes_them():
    assert len({k.id for k in known_findings.TABLE}) == len(known_findings.TABLE)
    assert [k.versions.label for k in known_findings.TABLE] == ["2.6", "5.x", "5.x", "1.15-1.16"]
    assert known_findings.release("2.13.0+cpu") == (2, 13, 0) and known_findings.release("dev") is None


def test_the_components_the_conditions_name_are_the_integrations_own():
    accelerate = pytest.importorskip("pytest_resume_check.integrations.accelerate")
    assert {known_findings.MODEL, known_findings.OPTIMIZER, known_findings.RNG} <= set(accelerate.STATE_COMPONENTS)


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
