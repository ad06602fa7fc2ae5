"""docs/architecture.md shows the examples that tests install; each block marked
`<!-- example: PATH -->` must be a verbatim part of PATH, so the page cannot drift from them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", re.S)


def test_the_examples_shown_are_the_examples_tested():
    page = (ROOT / "docs/architecture.md").read_text()
    blocks = BLOCK.findall(page)
    assert len(blocks) >= 5  # the detector's, the lever's two and the collector's two
    for path, code in blocks:
        source = (ROOT / path).read_text()
        assert code in source, f"docs/architecture.md's block for {path} is not in {path}"
