"""Resume bugs of the frameworks themselves (docs/findings.md), recognised in a failing cell's verdict.

A framework's own bug looks like the trainer's: a Lightning fit resumed from a checkpoint at an epoch's last
batch loses the next epoch (``LOST 24 inputs ... (epoch 1)``), and nothing in the headline says that this is
a known Lightning bug with a one-line workaround (issue 29). When a cell's failure matches a finding of
:data:`TABLE` for the framework and version in use, the report adds one line under the headline::

    known: Lightning 2.6: a checkpoint at an epoch's last batch skips the next epoch (docs/findings.md#lightning-a-
    checkpoint-at-an-epochs-last-batch-skips-the-next-epoch); workaround: EpochEndResumeFix

One table, many views: the failure text, the JSON report (``known_finding``) and the HTML report read
:data:`TABLE` through :func:`match` and :func:`line`. Each entry holds

* the framework: its name as the findings page writes it, the distribution that carries its version and the
  versions the finding holds in (those the page was run with, up to the next release not checked);
* the evidence that the cell's runs used it: a state component only that framework's integration reports
  (``pytest_resume_check.integrations``), as recorded by the harness for the reference and every resumed run.
  A component's name is a structured value the harness already keeps; a plain loop over the same libraries
  does not report it, so a planted bug of ours never reads as the framework's;
* the verdict signature: the finding's category and a condition on the cell's structured values (the steps
  each resume restored, the epochs of the reference ledger, the step the finding starts at, the components
  that differ there);
* the finding's title and anchor on docs/findings.md (a test checks the anchor is a heading of that page)
  and its workaround in a few words.

The version is the one installed where the report is made: a Python target's runs use the interpreter and
environment of the session that runs them (forked from its fork server, or spawned with ``sys.executable``).
A command target's program may run anywhere, so its cells are never matched. Standard library only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pytest_resume_check.categories import LOST, STATE_DIVERGED
from pytest_resume_check.judge.state_verdict import differences
from pytest_resume_check.records.ledger import Ledger
from pytest_resume_check.records.results import CellResult, Finding, RunRecord

#: The page every entry's anchor is on, as the line names it.
FINDINGS_PAGE = "docs/findings.md"
#: The line under a matching cell's headline (its JSON form is :func:`to_json`).
MSG_KNOWN = "known: {framework} {versions}: {title} ({page}#{anchor})"
MSG_WORKAROUND = "; workaround: {workaround}"


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


#: A finding's condition: does ``finding`` (of the entry's category) of the cell match it?
Condition = Callable[[Facts, Finding], bool]


def lost_from_the_epoch_after_its_end(facts: Facts, finding: Finding) -> bool:
    """Lightning 2.6: a resume restored the checkpoint of an epoch's last step (not the fit's last epoch's),
    and the inputs lost start at the next step, the first of the next epoch."""
    return finding.step is not None and any(
        step in facts.epoch_ends and finding.step == step + 1 for step in facts.restored if step)


def _first_step_after_a_mid_epoch_resume(facts: Facts, finding: Finding) -> bool:
    """The state first differs at the first step after a resume from a checkpoint inside an epoch (at the
    restored step itself it agreed: the checkpoint was restored right)."""
    return finding.step is not None and any(
        step and step not in facts.epoch_ends and finding.step == step + 1 for step in facts.restored)


def model_after_a_mid_epoch_resume(facts: Facts, finding: Finding) -> bool:
    """The HF Trainer's RNG restored after its first batches were collated: the first step after a resume
    inside an epoch trains on other masks, so the model differs there."""
    return _first_step_after_a_mid_epoch_resume(facts, finding) and "model" in facts.differing_at(finding.step or 0)


def torch_rng_after_a_mid_epoch_resume(facts: Facts, finding: Finding) -> bool:
    """Accelerate: the resumed loop's loader iterator draws its seed from the torch RNG the checkpoint restored,
    so the torch generator differs from the first step after a resume inside an epoch."""
    if not _first_step_after_a_mid_epoch_resume(facts, finding):
        return False
    return facts.differing_at(finding.step or 0).get("rng", "").startswith("torch")


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
        category=LOST, condition=lost_from_the_epoch_after_its_end,
        title="a checkpoint at an epoch's last batch skips the next epoch",
        anchor="lightning-a-checkpoint-at-an-epochs-last-batch-skips-the-next-epoch",
        workaround="EpochEndResumeFix"),
    KnownFinding(
        id="hf-trainer-rng-after-collate",
        framework="transformers", distribution="transformers", versions=Versions((5, 0), (6, 0)),
        evidence="trainer_state",  # integrations.hf_trainer.STATE_TRAINER
        category=STATE_DIVERGED, condition=model_after_a_mid_epoch_resume,
        title="a mid-epoch resume collates its first batches before restoring the RNG",
        anchor="hugging-face-trainer-a-mid-epoch-resume-collates-its-first-batches-before-restoring-the-rng",
        workaround=None),
    KnownFinding(
        id="accelerate-loader-rng",
        framework="Accelerate", distribution="accelerate", versions=Versions((1, 15), (1, 17)),
        evidence="registered",  # integrations.accelerate.STATE_COMPONENTS: the register_for_checkpointing objects
        category=STATE_DIVERGED, condition=torch_rng_after_a_mid_epoch_resume,
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
    return Facts(tuple(rec.resumed_step for rec in resumed), epoch_ends(result.verdict.reference), result.reference,
                 resumed)


def used(result: CellResult, evidence: str) -> bool:
    """Whether a run of the cell (the reference, or a resumed one) reported the state component ``evidence``."""
    runs = [result.reference, *result.runs] if result.reference is not None else list(result.runs)
    return any(evidence in state.digests or evidence in state.compared
               for rec in runs for state in rec.states.values())


def match(result: CellResult, table: Sequence[KnownFinding] = TABLE) -> tuple[KnownFinding, str] | None:
    """The first entry of ``table`` the cell's headline finding matches, with the installed version of its
    framework; None for a passing cell, a command target's cell, or one that matches none."""
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
        if known.condition(facts, first):
            return known, version
    return None


def to_json(known: KnownFinding, version: str) -> dict[str, Any]:
    """The JSON report's ``known_finding`` of a cell: the finding's fields and the version it was seen with."""
    return {"id": known.id, "framework": known.framework, "distribution": known.distribution, "version": version,
            "versions": known.versions.label, "title": known.title, "page": FINDINGS_PAGE, "anchor": known.anchor,
            "workaround": known.workaround}


def line(known: Mapping[str, Any]) -> str:
    """The line under the headline, from a cell's ``known_finding`` (:func:`to_json`)."""
    text = MSG_KNOWN.format(framework=known["framework"], versions=known["versions"], title=known["title"],
                            page=known["page"], anchor=known["anchor"])
    return text + (MSG_WORKAROUND.format(workaround=known["workaround"]) if known.get("workaround") else "")


def known_finding_json(result: CellResult) -> dict[str, Any] | None:
    """The cell's ``known_finding`` for the JSON report (None when it matches no known finding)."""
    found = match(result)
    return to_json(*found) if found is not None else None
