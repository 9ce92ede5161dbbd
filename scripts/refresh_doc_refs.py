"""Move each `name` `path:line` reference in docs/COALA_VALIDATION.md to where the name now is.

Run it after editing code the scorecard points into; tests/test_docs.py then checks every
reference. It picks the line nearest the old one that defines (or at least mentions) the
name, and prints each move so a person can review the diff.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF = re.compile(r"`([^`]+)` `([\w/.]+\.py):(\d+)`")


def nearest(name: str, path: str, line: int) -> int:
    lines = (ROOT / path).read_text().splitlines()
    token = name.split(".")[-1]
    if line <= len(lines) and token in lines[line - 1]:
        return line
    for pattern in (f"def {token}(", f"class {token}(", f"class {token}:", f"# {token}", token):
        hits = [i + 1 for i, text in enumerate(lines) if pattern in text]
        if hits:
            return min(hits, key=lambda hit: abs(hit - line))
    print(f"not found: {name} in {path}", file=sys.stderr)
    return line


def main() -> None:
    scorecard = ROOT / "docs" / "COALA_VALIDATION.md"

    def move(match: re.Match[str]) -> str:
        name, path, line = match.group(1), match.group(2), int(match.group(3))
        found = nearest(name, path, line)
        if found != line:
            print(f"{name}: {path}:{line} -> {found}")
        return f"`{name}` `{path}:{found}`"

    scorecard.write_text(REF.sub(move, scorecard.read_text()))


if __name__ == "__main__":
    main()
