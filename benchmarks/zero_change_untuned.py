"""A zero-change script that imports torch inside its ``main()``, under resume-check untuned, with ``preload=`` by
hand, and (``--against DIR``) untuned on another checkout; and under ckpt-chaos 0.1.8: what each flags and what a
point costs. Prints figures; asserts nothing.

    python benchmarks/zero_change_untuned.py [--repeat 3] [--variant in-place] [--against DIR]
                                             [--ckpt-chaos PATH | --no-ckpt-chaos]

The script is docs/examples/recipes/zero_change/train.py with its ``import torch`` moved into ``main()`` (as
``global torch``, so its other functions still see it): the import no top-level reading of the script finds.
``--variant`` picks its flags as in benchmarks/zero_change_vs_ckpt_chaos.py (default ``in-place``, a planted bug
both tools flag, so detection is counted on both sides). Each resume-check session is ``pytest --resume-matrix``
(the default quick matrix with its crash smoke cells, serial, seed 1) on a project whose conftest declares the
script with ``checkpoints="step_*.pt"`` and ``outputs=["model.pt"]``:

- ``untuned``: nothing else (the fork server preloads what the script's source imports, wherever it stands);
- ``preload``: ``preload=("torch",)`` by hand;
- ``before`` (with ``--against DIR``, a ``git worktree`` of an older commit): untuned, the package imported from
  ``DIR``.

The sessions are interleaved, ``--repeat`` rounds, medians printed: per session and per cell (a cell's runs
include their share of the session's start). ckpt-chaos runs once on the same script in its contract mode
(``--ckpt-chaos`` names its executable; without it one is installed into a temporary virtual environment);
its cost per point is its wall time over its crash points. The ratio is per explored point: ckpt-chaos's
seconds per point over resume-check's, beside what each flagged.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from side_by_side import ckpt_chaos, ckpt_chaos_executable, resume_check

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "examples" / "recipes" / "zero_change" / "train.py"
VARIANTS = {"correct": [], "in-place": ["--save", "in-place"], "by-name": ["--pick", "name"]}

CONFTEST = """from pytest_resume_check import resume_target

script = resume_target.command(
    ["{{python}}", "train.py", "--out", "{{checkpoint_dir}}", "--seed", "{{seed}}", *{flags!r}],
    name="unchanged_script", steps=6, checkpoints="step_*.pt", outputs=["model.pt"]{options},
)
"""


def function_import_script(folder: Path) -> Path:
    """The recipe's script with ``import torch`` inside ``main()``, written into ``folder``."""
    text = RECIPE.read_text()
    assert "\nimport torch\n" in text and "\ndef main():\n" in text
    text = text.replace("\nimport torch\n", "\n", 1)
    text = text.replace("\ndef main():\n", "\ndef main():\n    global torch\n    import torch\n\n", 1)
    path = folder / "train_function_import.py"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="in-place")
    parser.add_argument("--against", type=Path, default=None, help="an older checkout, run untuned as 'before'")
    parser.add_argument("--ckpt-chaos", default=None, help="the ckpt-chaos executable (default: a fresh venv)")
    parser.add_argument("--no-ckpt-chaos", action="store_true", help="leave ckpt-chaos out")
    args = parser.parse_args()
    flags = VARIANTS[args.variant]
    sessions = {"untuned": ("", None), "preload": (', preload=("torch",)', None)}
    if args.against is not None:
        sessions["before"] = ("", args.against.resolve())
    figures: dict[str, list[dict]] = {name: [] for name in sessions}
    with tempfile.TemporaryDirectory(prefix="zero-change-untuned-") as scratch:
        script = function_import_script(Path(scratch))
        for round_ in range(args.repeat):
            for name, (options, source) in sessions.items():
                env = {**os.environ, "PYTHONPATH": str(source)} if source is not None else None
                ours, _ = resume_check(script, CONFTEST.format(flags=flags, options=options), "unchanged_script",
                                       Path(scratch) / f"{name}-{round_}", env=env)
                figures[name].append(ours)
        per_point = report(figures, args.variant, args.repeat)
        if not args.no_ckpt_chaos:  # after ours are printed: under load it takes minutes
            executable = ckpt_chaos_executable(args.ckpt_chaos, Path(scratch))
            theirs = ckpt_chaos(executable, script, flags, "step_*.pt", Path(scratch) / "ckpt-chaos")
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(theirs["kinds"].items())) or "-"
            cost = theirs["seconds"] / max(1, theirs["points"])
            print(f"{'ckpt-chaos':<10} {theirs['points']:>5} {theirs['flagged']:>7} {theirs['seconds']:>7.2f} "
                  f"{cost:>7.3f} {'':>10}  {kinds} {theirs['note']}")
            for name, ours in per_point.items():
                print(f"ckpt-chaos s/point over resume-check {name}: {cost / ours:.1f}x")


def report(figures: dict[str, list[dict]], variant: str, repeat: int) -> dict[str, float]:
    """Print resume-check's sessions side by side (medians); their seconds per cell."""
    print(f"zero-change script importing torch inside main(), variant {variant}, {repeat} rounds "
          f"(load {os.getloadavg()[0]:.1f})")
    print(f"{'session':<10} {'cells':>5} {'flagged':>7} {'wall s':>7} {'s/cell':>7} {'vs preload':>10}"
          "  what was flagged")
    preload = statistics.median(r["seconds"] for r in figures["preload"])
    per_point = {}
    for name, runs in figures.items():
        wall = statistics.median(r["seconds"] for r in runs)
        points = runs[0]["points"]
        per_point[name] = wall / max(1, points)
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(runs[0]["kinds"].items())) or "-"
        print(f"{name:<10} {points:>5} {runs[0]['flagged']:>7} {wall:>7.2f} {per_point[name]:>7.3f} "
              f"{wall / preload:>9.2f}x  {kinds}", flush=True)
    return per_point

if __name__ == "__main__":
    main()
