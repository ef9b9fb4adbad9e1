"""How a verdict reads: one headline, an excerpt around the first divergence, the story of the runs,
where the files are, and the command that reruns exactly this cell."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from pytest_resume_check.categories import status
from pytest_resume_check.ledger import Ledger
from pytest_resume_check.results import CellResult
from pytest_resume_check.verdict import entry_marks, resume_label

#: The story of a cell whose reference failed (no interrupted run was made).
NO_RUNS = "no interrupted run (the reference itself failed)"
EXCERPT_BEFORE = 4
EXCERPT_AFTER = 6


def excerpt(reference: Ledger, composite: Ledger, position: int | None) -> list[str]:
    """Two aligned lines of ids around ``position``; ``[x]`` marks the first difference and ``|``
    marks where a resumed run's entries begin."""
    if position is None:
        return []
    lo = max(0, position - EXCERPT_BEFORE)
    hi = position + EXCERPT_AFTER

    def line(ledger: Ledger) -> str:
        cells = []
        for i in range(lo, min(hi, len(ledger))):
            e = ledger[i]
            text = f"{e.id}@e{e.epoch}"
            if i == position:
                text = f"[{text}]"
            if i > 0 and ledger[i - 1].run != e.run:
                text = "| " + text
            cells.append(text)
        if position >= len(ledger):
            cells.append("[end]")
        return ("... " if lo else "") + " ".join(cells) + (" ..." if hi < len(ledger) else "")

    return [f"  reference: {line(reference)}", f"  resumed:   {line(composite)}"]


def story(result: CellResult) -> str:
    """``run 1: killed right after ... -> run 2: resume from global_step_3, ran to the end``."""
    parts = []
    for i, rec in enumerate(result.runs):
        text = f"run {i + 1}"
        if i:
            text += f" ({resume_label(rec.resumed_step, rec.resumed_path)})"
        text += f": {rec.describe()}"
        if rec.leftovers:
            text += f" ({rec.leftovers} process{'es' if rec.leftovers > 1 else ''} it detached killed after it)"
        parts.append(text)
    return " -> ".join(parts)


def failure_text(result: CellResult, rerun: str | None = None) -> str:
    """The whole failure report of one cell."""
    v = result.verdict
    lines = [v.headline]
    lines += [f"  also: {f.headline}" for f in v.findings[1:]]
    lines += excerpt(v.reference, v.composite, v.first_divergence())
    if result.runs:
        lines.append(f"  runs: {story(result)}")
    contract = result.cell.target.contract.describe()
    lines.append(f"  target: {result.cell.target.name} (contract: {contract}); case {result.cell.case_id}")
    for rec in result.runs:
        if rec.error and rec.outcome != "done":
            lines.append("  error of the failing run (last lines):")
            lines += ["    " + ln for ln in rec.error.strip().splitlines()[-6:]]
            break
    if result.workdir is not None:
        lines.append(f"  kept: {result.workdir} (checkpoints, run*.log)")
    lines.append(f"  seed: {result.seed}" if result.seed is not None else "")
    if rerun:
        lines.append(f"  rerun: {rerun}")
    lines = [ln for ln in lines if ln]
    return "\n".join(lines)


def cell_json(result: CellResult) -> dict[str, Any]:
    """Machine-readable verdict of one cell (for --resume-matrix-json)."""
    v = result.verdict
    reference, composite = v.reference.to_json(), v.composite.to_json()
    ref_marks, comp_marks = entry_marks(reference, composite)
    cell = {
        "target": result.cell.target.name,
        "case": dict(result.cell.case),
        "case_id": result.cell.case_id,
        "resume_mode": result.cell.resume_mode,
        "kill": result.cell.kill_id,
        "kills": [k.to_json() for k in result.cell.kills],
        "passed": v.passed,
        "xfail_reason": result.cell.xfail_reason,
        "categories": v.categories,
        "headline": v.headline,
        "resumed_from": v.resumed_from,
        "state_diverged": v.state_diverged,
        "findings": [{"category": f.category, "headline": f.headline, "step": f.step} for f in v.findings],
        "reference": reference,
        "composite": composite,
        "marks": {"reference": ref_marks, "composite": comp_marks},
        "story": story(result) if result.runs else NO_RUNS,
        "runs": [{"outcome": r.outcome, "exitcode": r.exitcode, "seconds": round(r.seconds, 3)}
                 for r in result.runs],
    }
    cell["status"] = status(cell)
    return cell


def rerun_command(cell_name: str, mode: str | None, seed: int | None, args: Sequence[str] = (),
                  options: Sequence[str] = ()) -> str:
    """The shell command that reruns exactly one cell: ``pytest [args] --resume-matrix=MODE
    --resume-matrix-seed=SEED --resume-matrix-cell=NAME [options]``."""
    parts = ["pytest", *args, f"--resume-matrix={mode}" if mode else "--resume-matrix"]
    if seed is not None:
        parts.append(f"--resume-matrix-seed={seed}")
    parts += [f"--resume-matrix-cell={cell_name}", *options]
    return " ".join(shlex.quote(str(p)) for p in parts)


def dump_json(results: Sequence[dict[str, Any]], seed: int) -> str:
    return json.dumps({"seed": seed, "cells": list(results)}, indent=1, sort_keys=True)
