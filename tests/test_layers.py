"""The layer rule (docs/architecture.md) holds, and its check would catch a break of it.

`make test` runs the same contract (scripts/lint_imports.py) before pytest; this test also
proves the contract can fail: the vocabulary importing an application, or a part importing a
part above it, is refused.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts/lint_imports.py")
lint_imports = importlib.util.module_from_spec(spec)
sys.modules["lint_imports"] = lint_imports
spec.loader.exec_module(lint_imports)


def test_the_tree_keeps_the_contract(tmp_path):
    lint_imports.lay_out(tmp_path)
    assert (tmp_path / "sloguard/collectors/cgroups.py").exists()  # the mapped folders too
    assert lint_imports.lint(tmp_path) == 0


@pytest.mark.parametrize("module, bad_import", [
    ("sloguard/core/units.py", "from sloguard.agent import Agent"),  # the ground imports the roof
    ("sloguard/collectors/node.py", "from sloguard.actuators import step"),  # a part imports up
    ("sloguard/store/factory.py", "from sloguard.collectors import node"),  # independent siblings
    ("sloguard/detector/engine.py", "import sloguard.ui.app"),
])
def test_a_break_of_the_rule_is_caught(tmp_path, module, bad_import):
    lint_imports.lay_out(tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{bad_import}  # noqa\n")
    assert lint_imports.lint(tmp_path) == 1


def test_a_new_top_level_module_needs_a_layer(tmp_path):
    lint_imports.lay_out(tmp_path)
    (tmp_path / "sloguard/newthing.py").write_text("X = 1\n")
    assert lint_imports.lint(tmp_path) != 0


def test_self_metrics_are_defined_in_one_place():
    """Every metric sloguard exposes about itself is defined in sloguard/core/selfmetrics.py
    (dashboards are written from one file); the parts only count on what it hands them."""
    import re

    definition = re.compile(r"\b(Counter|Gauge|Histogram|Summary|Info|Enum|\w*MetricFamily)\(|"
                            r"from sloguard\.core\.selfmetrics import _")
    offenders = []
    for folder in ("sloguard", "collectors", "detector", "actuators", "ui", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "sloguard/core/selfmetrics.py" or "examples" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if definition.search(line) and "collections" not in line and \
                        "Counter({" not in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
