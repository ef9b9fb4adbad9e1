"""Every Python block on the hand-written pages (writing a target, trainer configuration) is either
quoted from an example file that other tests run, or executed here. Outlines are marked ``text``."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = [p for p in (DOCS / "examples").rglob("*.py")]
FENCE = re.compile(r"^ *```python\n(.*?)^ *```", re.M | re.S)
DOWNSTREAM = DOCS / "examples" / "downstream"
HAS_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "torchdata"))
HAS_VERL = HAS_TORCH and importlib.util.find_spec("verl") is not None


def python_blocks(page: str) -> list[str]:
    return [block for block in FENCE.findall((DOCS / page).read_text())]


def quoted_from_an_example(block: str) -> bool:
    return any(block.strip() in path.read_text() for path in EXAMPLES)


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


BLOCKS = [(page, i, block) for page in ("writing-a-target.md", "trainer-configuration.md")
          for i, block in enumerate(python_blocks(page))]


@pytest.mark.parametrize(("page", "index", "block"), BLOCKS, ids=[f"{p}:{i}" for p, i, _ in BLOCKS])
def test_each_python_block_is_quoted_from_a_tested_example_or_runs(page, index, block, tmp_path):
    if quoted_from_an_example(block):
        return  # the example files are run by test_downstream_example.py and test_docs.py
    if block.startswith("def test_"):
        if not HAS_TORCH:
            pytest.skip("torch and torchdata are not installed")
        for name in ("trainer.py", "conftest.py", "pytest.ini"):
            (tmp_path / name).write_text((DOWNSTREAM / name).read_text())
        (tmp_path / "test_snippet.py").write_text(block)
        done = subprocess.run([sys.executable, "-m", "pytest", "test_snippet.py", "-p", "no:cacheprovider", "-q"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert "1 passed" in done.stdout, done.stdout[-3000:]
    elif "import trainer" in block:
        if not HAS_TORCH:
            pytest.skip("torch and torchdata are not installed")
        done = run_python(block + "\nassert regression.name == 'regression' and regression.cases\n", DOWNSTREAM)
    elif "agentlightning" in block:
        if not HAS_VERL:
            pytest.skip("verl is not installed")
        done = run_python(block, tmp_path)
    else:
        pytest.fail(f"docs/{page} python block {index} is neither quoted from docs/examples nor run here:\n{block}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_pages_have_python_blocks_at_all():
    assert len(BLOCKS) >= 5
