"""Resume bugs of the frameworks themselves (docs/findings.md), recognised in a failing cell's verdict.

A framework's own bug looks like the trainer's: a Lightning fit resumed from a checkpoint at an epoch's last
batch loses the next epoch (``LOST 24 inputs ... (epoch 1)``), and nothing in the headline says that this is
a known Lightning bug with a one-line workaround. When a cell's failure matches a finding of :data:`TABLE`
for the framework and version in use, the report adds one line under the headline::

    known: Lightning 2.6: a checkpoint at an epoch's last batch skips the next epoch (docs/findings.md#lightning-a-
    checkpoint-at-an-epochs-last-batch-skips-the-next-epoch); check: the resumed fit trained no batch of epoch 1
    over a stateful train loader, without EpochEndResumeFix in its callbacks; workaround: EpochEndResumeFix

A wrong line is worse than none: a reviewer who trusts it declares the cell an expected failure and hides a
bug of the trainer's own. So a line comes only when every precondition of the finding's mechanism holds in
that cell, each read from a structured value, never from the headline's words. One table, many views: the
failure text, the JSON report (``known_finding``) and the HTML report read :data:`TABLE` through
:func:`match` and :func:`line`. Each entry holds

* the framework: its name as the findings page writes it, the distribution that carries its version and the
  versions the finding holds in (those the page was run with, up to the next release not checked);
* the evidence that the cell's runs used it: a state component only that framework's integration reports
  (``pytest_resume_check.integrations``), as recorded by the harness for the reference and every resumed run.
  A plain loop over the same libraries does not report it, so a planted bug of ours never reads as the
  framework's;
* the verdict signature: the category of the cell's headline finding, and a condition on the cell's
  structured values (:class:`Facts`): the steps each resume restored and whether that was inside an epoch,
  the components that differ at the step the finding starts (those the mechanism explains, and only those),
  the inputs of that step, how the integration says the framework was set up (``run.settings``: loader
  workers, a loader's generator, a workaround in place), and in a crash cell the fault and the save's file
  operations;
* what to check: a short clause, filled with the cell's values, that tells the user how to confirm it;
* the finding's title and anchor on docs/findings.md (a test checks the anchor is a heading of that page,
  whose section lists the same preconditions) and its workaround in a few words.

The version is the one installed where the report is made: a Python target's runs use the interpreter and
environment of the session that runs them (forked from its fork server, or spawned with ``sys.executable``).
A command target's program may run anywhere, so its cells are never matched. Standard library only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from pytest_resume_check.categories import LOST, RESUME_ERROR, STATE_DIVERGED
from pytest_resume_check.judge.state_verdict import differences
from pytest_resume_check.records.cell_json import KnownFindingJson
from pytest_resume_check.records.faults import FaultPlan, FileOp, leaves_incomplete
from pytest_resume_check.records.ledger import Ledger
from pytest_resume_check.records.results import CellResult, Finding, Outcome, RunRecord
from pytest_resume_check.records.state import CAPTURED, CAPTURED_CUDA, CAPTURED_TORCH

#: The page every entry's anchor is on, as the line names it.
FINDINGS_PAGE = "docs/findings.md"
#: The line under a matching cell's headline (its JSON form is :func:`to_json`).
MSG_KNOWN = "known: {framework} {versions}: {title} ({page}#{anchor})"
MSG_CHECK = "; check: {check}"
MSG_WORKAROUND = "; workaround: {workaround}"

#: What the conditions read of the integrations, copied here because an integration imports its framework (a
#: test checks each against the integration's constant): state components ...
MODEL, OPTIMIZER, RNG = "model", "optimizer", "rng"  # integrations.hf_trainer and .accelerate
BATCH = "batch"  # integrations.hf_trainer.STATE_BATCH: the inputs the model was called with in a step
#: ... and settings (``run.settings``).
SETTING_WORKERS = "dataloader_num_workers"  # integrations.hf_trainer.SETTING_WORKERS
SETTING_STATEFUL_LOADER = "stateful_train_loader"  # integrations.lightning.SETTING_STATEFUL_LOADER
SETTING_EPOCH_END_FIX = "epoch_end_fix"  # integrations.lightning.SETTING_EPOCH_END_FIX
SETTING_LOADER_GENERATOR = "loader_generator"  # integrations.accelerate.SETTING_LOADER_GENERATOR
#: The file ``Trainer._save_checkpoint`` writes last (integrations.hf_trainer.TRAINER_STATE_FILE).
TRAINER_STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class Versions:
    """The releases a finding holds in: from ``low`` up to, not including, ``below`` (``(2, 6)``, ``(2, 7)``:
    every 2.6.x)."""

    low: tuple[int, ...]
    below: tuple[int, ...]

    def holds(self, version: str) -> bool:
        """Whether the installed ``version`` (``2.6.6``, ``5.10.4``, ``2.13.0+cpu``) is in the range."""
        numbers = release(version)
        return numbers is not None and self.low <= numbers < self.below

    @property
    def label(self) -> str:
        """``2.6`` (one minor release), ``1.15-1.16`` (several of one major), ``5.x`` (a whole major)."""
        (major, minor), (top_major, top_minor) = self.low[:2], self.below[:2]
        if top_major == major + 1 and minor == 0 and top_minor == 0:
            return f"{major}.x"
        if top_major == major and top_minor == minor + 1:
            return f"{major}.{minor}"
        return f"{major}.{minor}-{top_major}.{top_minor - 1}" if top_major == major else f"{major}.{minor}+"


def release(version: str) -> tuple[int, ...] | None:
    """The numbers of a version's release part (``2.13.0+cpu`` -> ``(2, 13, 0)``); None when it has none."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in found.group(0).split(".")) if found else None


@dataclass(frozen=True)
class Facts:
    """What a condition reads of a cell: structured values only."""

    #: The steps each resumed run reported restoring, in order (None: it never said).
    restored: tuple[int | None, ...]
    #: The steps after which the reference's epoch label goes up (each epoch's last step but the last).
    epoch_ends: frozenset[int]
    reference: RunRecord | None
    #: The resumed runs, in order (``restored[i]`` is ``resumed[i]``'s).
    resumed: tuple[RunRecord, ...]
    #: The inputs of the uninterrupted run and of the interrupted job (the judged ledger of each).
    reference_ledger: Ledger = field(default_factory=Ledger)
    composite: Ledger = field(default_factory=Ledger)
    #: How the framework was set up, as the integration reported it (the reference's, then each resumed run's).
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: A crash cell's fault, and the file operations of the save it lands in (None and empty elsewhere).
    fault: FaultPlan | None = None
    save_ops: tuple[FileOp, ...] = ()

    def differing_at(self, step: int) -> dict[str, str]:
        """The components that differ from the reference's at ``step`` in the resumed run that reached that
        step last (each with its first differing key), as the state verdict compares them."""
        expected = self.reference.states.get(step) if self.reference is not None else None
        if expected is None:
            return {}
        for rec in reversed(self.resumed):
            got = rec.states.get(step)
            if got is not None:
                return differences(expected, got)
        return {}

    def same_inputs_at(self, step: int) -> bool:
        """Whether the interrupted job took the reference's inputs in ``step``, in the same order."""
        return [e.id for e in self.reference_ledger if e.step == step] == [e.id for e in self.composite
                                                                            if e.step == step]

    def resumed_inside_an_epoch(self, finding: Finding) -> int | None:
        """The restored step, when ``finding`` starts at the first step after a resume from a checkpoint
        inside an epoch (not at an epoch's last step, where the next epoch starts afresh); else None."""
        restored = finding.step - 1 if finding.step is not None else None
        if not restored or restored not in self.restored or restored in self.epoch_ends:
            return None
        return restored


#: A finding's condition: None when the preconditions of its mechanism do not all hold in the cell (``finding``
#: is the cell's headline finding, of the entry's category); else the values its check clause names.
Condition = Callable[[Facts, Finding], "Mapping[str, Any] | None"]


def next_epoch_skipped(facts: Facts, finding: Finding) -> Mapping[str, Any] | None:
    """Lightning 2.6: a resume restored the checkpoint of an epoch's last step (not the fit's last epoch's),
    the inputs lost start at the next step, and the job trained no input of that next epoch at all; the
    train loader is stateful (a plain one resumes right, by accident) and no ``EpochEndResumeFix`` is among
    the trainer's callbacks."""
    restored = finding.step - 1 if finding.step is not None else None
    if not restored or restored not in facts.restored or restored not in facts.epoch_ends:
        return None
    settings = facts.settings
    if settings.get(SETTING_STATEFUL_LOADER) is not True or settings.get(SETTING_EPOCH_END_FIX) is not False:
        return None
    epoch = next((e.epoch for e in facts.reference_ledger if e.step == finding.step), None)
    if epoch is None or any(e.epoch == epoch for e in facts.composite):
        return None
    return {"epoch": epoch}


#: The components the HF Trainer's late RNG restore explains: the batches collated before it, what trains on
#: them, and the generators the collation drew from.
COLLATED_EARLY = frozenset({BATCH, MODEL, OPTIMIZER, RNG, *CAPTURED})


def batches_collated_before_the_rng(facts: Facts, finding: Finding) -> Mapping[str, Any] | None:
    """The HF Trainer restores the RNG after it collated the first batches of an epoch it resumes inside: the
    state first differs at the first step after such a resume, the batches the model was called with there
    differ (``batch``) though their ids are the reference's, nothing differs there that the late restore does
    not explain, and the batches were collated in the main process (``dataloader_num_workers=0``)."""
    if facts.resumed_inside_an_epoch(finding) is None or facts.settings.get(SETTING_WORKERS) != 0:
        return None
    step = finding.step or 0
    differing = facts.differing_at(step)
    if BATCH not in differing or not set(differing) <= COLLATED_EARLY or not facts.same_inputs_at(step):
        return None
    return {"step": step}


#: The components one more draw from the torch RNG explains: the generator, and the dropout that draws next.
TORCH_DRAW = frozenset({RNG, MODEL, OPTIMIZER, CAPTURED_TORCH, CAPTURED_CUDA})


def loader_seed_from_the_restored_rng(facts: Facts, finding: Finding) -> Mapping[str, Any] | None:
    """Accelerate: the resumed loop's loader iterator draws its seed from the torch RNG the checkpoint restored.
    The state first differs at the first step after a resume inside an epoch, the torch generator is the
    first of the RNGs to differ, nothing differs there that one more torch draw does not explain, and a
    prepared loader has no generator of its own."""
    if facts.resumed_inside_an_epoch(finding) is None or facts.settings.get(SETTING_LOADER_GENERATOR) is not False:
        return None
    step = finding.step or 0
    differing = facts.differing_at(step)
    if not differing.get(RNG, "").startswith("torch") or not set(differing) <= TORCH_DRAW:
        return None
    return {"step": step}


def trainer_state_left_empty(facts: Facts, finding: Finding) -> Mapping[str, Any] | None:
    """The HF Trainer writes ``checkpoint-N`` in place and never fsyncs it: in a crash cell whose fault leaves
    that save's ``trainer_state.json`` empty or cut (a kill while it was open, a power loss before it was
    durable), the first resume raised."""
    if facts.fault is None or not facts.resumed or facts.resumed[0].outcome != Outcome.RAISED:
        return None
    if not leaves_incomplete(facts.fault, facts.save_ops, TRAINER_STATE_FILE):
        return None
    return {"step": facts.fault.step}


@dataclass(frozen=True)
class KnownFinding:
    """One finding of docs/findings.md, as a verdict shows it."""

    #: A stable name (the JSON report's ``known_finding.id``).
    id: str
    #: The framework as the findings page names it, and the distribution whose version decides.
    framework: str
    distribution: str
    versions: Versions
    #: A state component only this framework's integration reports: the cell's runs used the framework.
    evidence: str
    category: str
    condition: Condition
    #: What the user checks to confirm it, with the values ``condition`` returns (``{step}``, ``{epoch}``).
    check: str
    #: The finding's title (its heading on the page after ``FRAMEWORK: ``) and the heading's anchor.
    title: str
    anchor: str
    #: The way around it, in a few words (None: the page knows none).
    workaround: str | None


#: The known findings. The evidence components are the integrations' own constants, copied here because an
#: integration imports its framework (a test checks each against the integration's constant).
TABLE: tuple[KnownFinding, ...] = (
    KnownFinding(
        id="lightning-epoch-end-resume",
        framework="Lightning", distribution="lightning", versions=Versions((2, 6), (2, 7)),
        evidence="fit_loop",  # integrations.lightning.STATE_FIT_LOOP
        category=LOST, condition=next_epoch_skipped,
        check="the resumed fit trained no batch of epoch {epoch} over a stateful train loader, without "
              "EpochEndResumeFix in its callbacks",
        title="a checkpoint at an epoch's last batch skips the next epoch",
        anchor="lightning-a-checkpoint-at-an-epochs-last-batch-skips-the-next-epoch",
        workaround="EpochEndResumeFix"),
    KnownFinding(
        id="hf-trainer-rng-after-collate",
        framework="transformers", distribution="transformers", versions=Versions((5, 0), (6, 0)),
        evidence="trainer_state",  # integrations.hf_trainer.STATE_TRAINER
        category=STATE_DIVERGED, condition=batches_collated_before_the_rng,
        check="the batch of step {step} holds the uninterrupted run's ids with other values, and the collator "
              "or dataset draws random numbers in the main process (dataloader_num_workers=0)",
        title="a mid-epoch resume collates its first batches before restoring the RNG",
        anchor="hugging-face-trainer-a-mid-epoch-resume-collates-its-first-batches-before-restoring-the-rng",
        workaround=None),
    KnownFinding(
        id="hf-trainer-state-not-durable",
        framework="transformers", distribution="transformers", versions=Versions((5, 0), (6, 0)),
        evidence="trainer_state",  # integrations.hf_trainer.STATE_TRAINER
        category=RESUME_ERROR, condition=trainer_state_left_empty,
        check="checkpoint-{step}/trainer_state.json in the cell's folder is empty or cut, and the job's resume "
              "took that folder",
        title="a crash while trainer_state.json is written leaves a checkpoint the resume cannot read",
        anchor="hugging-face-trainer-a-crash-while-trainer_statejson-is-written-leaves-a-checkpoint-the-resume-"
               "cannot-read",
        workaround="resume from the newest checkpoint-N whose trainer_state.json parses"),
    KnownFinding(
        id="accelerate-loader-rng",
        framework="Accelerate", distribution="accelerate", versions=Versions((1, 15), (1, 17)),
        evidence="registered",  # integrations.accelerate.STATE_COMPONENTS: the register_for_checkpointing objects
        category=STATE_DIVERGED, condition=loader_seed_from_the_restored_rng,
        check="the torch RNG differs from step {step} on, and the DataLoader given to accelerator.prepare has no "
              "generator=",
        title="a resumed loop shifts the restored torch RNG when its DataLoader has no generator",
        anchor="accelerate-a-resumed-loop-shifts-the-restored-torch-rng-when-its-dataloader-has-no-generator",
        workaround="DataLoader(..., generator=torch.Generator().manual_seed(seed))"),
)


@functools.cache
def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` installed here (None when it is not)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def epoch_ends(reference: Ledger) -> frozenset[int]:
    """The steps after which the reference's epoch label goes up: every epoch's last step but the last's."""
    epoch_of: dict[int, int] = {}
    for entry in reference:
        epoch_of[entry.step] = max(epoch_of.get(entry.step, entry.epoch), entry.epoch)
    steps = sorted(epoch_of)
    return frozenset(a for a, b in zip(steps, steps[1:]) if epoch_of[b] > epoch_of[a])


def facts_of(result: CellResult) -> Facts:
    """The structured values the conditions read, of one judged cell."""
    resumed = tuple(result.runs[1:])
    settings: dict[str, Any] = dict(result.reference.settings) if result.reference is not None else {}
    for rec in resumed:
        settings.update(rec.settings)
    kills = result.cell.kills
    verdict = result.verdict
    return Facts(tuple(rec.resumed_step for rec in resumed), epoch_ends(verdict.reference), result.reference,
                 resumed, verdict.reference, verdict.composite, settings, kills[0].fault if kills else None,
                 tuple(result.cell.save_ops))


def used(result: CellResult, evidence: str) -> bool:
    """Whether a run of the cell (the reference, or a resumed one) reported the state component ``evidence``."""
    runs = [result.reference, *result.runs] if result.reference is not None else list(result.runs)
    return any(evidence in state.digests or evidence in state.compared
               for rec in runs for state in rec.states.values())


@dataclass(frozen=True)
class Named:
    """A failing cell's known finding: the entry, the framework's version installed here, and what the user
    checks in this cell (the entry's check clause with the cell's values)."""

    known: KnownFinding
    version: str
    check: str


def match(result: CellResult, table: Sequence[KnownFinding] = TABLE) -> Named | None:
    """The first entry of ``table`` whose preconditions the cell's headline finding meets, with the installed
    version of its framework; None for a passing cell, a command target's cell, or one that matches none."""
    findings = result.verdict.findings
    if not findings or result.cell.target.command is not None:
        return None
    first = findings[0]
    facts: Facts | None = None
    for known in table:
        if first.category != known.category:
            continue
        version = installed_version(known.distribution)
        if version is None or not known.versions.holds(version) or not used(result, known.evidence):
            continue
        facts = facts or facts_of(result)
        values = known.condition(facts, first)
        if values is not None:
            return Named(known, version, known.check.format(**values))
    return None


def to_json(named: Named) -> KnownFindingJson:
    """The JSON report's ``known_finding`` of a cell: the finding's fields, the version it was seen with and
    what to check in this cell."""
    known = named.known
    return {"id": known.id, "framework": known.framework, "distribution": known.distribution,
            "version": named.version, "versions": known.versions.label, "title": known.title, "page": FINDINGS_PAGE,
            "anchor": known.anchor, "check": named.check, "workaround": known.workaround}


def line(known: Mapping[str, Any]) -> str:
    """The line under the headline, from a cell's ``known_finding`` (:func:`to_json`)."""
    text = MSG_KNOWN.format(framework=known["framework"], versions=known["versions"], title=known["title"],
                            page=known["page"], anchor=known["anchor"])
    text += MSG_CHECK.format(check=known["check"]) if known.get("check") else ""
    return text + (MSG_WORKAROUND.format(workaround=known["workaround"]) if known.get("workaround") else "")


def known_finding_json(result: CellResult) -> KnownFindingJson | None:
    """The cell's ``known_finding`` for the JSON report (None when it matches no known finding)."""
    named = match(result)
    return to_json(named) if named is not None else None
