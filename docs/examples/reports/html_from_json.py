"""Write the HTML report from a --resume-matrix-json file, e.g. one a CI run kept as an artifact.

    python html_from_json.py resume-matrix.json resume-matrix.html
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_resume_check import html


def main(json_path: str, html_path: str) -> None:
    data = json.loads(Path(json_path).read_text())
    written = html.write_report(data["cells"], html_path, seed=data["seed"])
    failing = sum(1 for cell in data["cells"] if not cell["passed"] and not cell.get("xfail_reason"))
    print(f"{written}: {len(data['cells'])} cells, {failing} failing")


if __name__ == "__main__":
    main(*sys.argv[1:3])
