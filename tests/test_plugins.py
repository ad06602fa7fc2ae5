"""The plugin contract: built-ins registered in code, a real installed third-party plugin found
through its entry point, module paths from the config, and broken plugins reported without
disarming the others."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sloguard.agent import Agent
from sloguard.detector.api import Verdict, hookimpl
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleFileError, load_rule_file
from sloguard.settings import load_settings

EXAMPLE = Path(__file__).resolve().parent.parent / "plugins" / "examples" / "baseline_ratio"


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    """pip-install the example plugin (its entry point included) into a directory on sys.path."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(EXAMPLE)],
        check=True, timeout=300,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    sys.modules.pop("sloguard_baseline_ratio", None)


def test_builtins_are_registered_in_code():
    registry = DetectorRegistry()
    assert registry.providers["threshold"] == "threshold"
    assert registry.errors == {}
    assert registry.make("threshold", {"above": 1}).update(2.0, 0).crossed
    # detectors.entry_points: false turns off third parties, not the built-ins
    alone = DetectorRegistry(use_entry_points=False)
    assert set(alone.types) == set(registry.types) - {"baseline_ratio"}
    assert {"threshold", "ewma", "changepoint", "page_hinkley", "slo_latency", "burn_rate",
            "anomaly_likelihood", "anomaly_channels"} <= set(alone.types)


def test_installed_plugin_is_found_through_its_entry_point(installed_example):
    registry = DetectorRegistry()
    assert registry.providers["baseline_ratio"] == "baseline_ratio"
    assert {"threshold", "baseline_ratio"} <= set(registry.types)


def test_module_path_from_the_config(installed_example):
    registry = DetectorRegistry(["sloguard_baseline_ratio"], use_entry_points=False)
    assert registry.providers["baseline_ratio"] == "sloguard_baseline_ratio"
    assert set(registry.types) == set(DetectorRegistry(use_entry_points=False).types) | {
        "baseline_ratio"}


def test_example_plugin_learns_its_baseline_and_fires_on_a_step(installed_example):
    registry = DetectorRegistry(["sloguard_baseline_ratio"], use_entry_points=False)
    detector = registry.make("baseline_ratio", {"factor": 3, "warmup": 20, "half_life": 10})
    quiet = [10 + (i % 3) for i in range(60)]
    verdicts = [detector.update(float(v), i) for i, v in enumerate(quiet)]
    assert not any(v.crossed for v in verdicts)
    assert 10 < detector.baseline < 12
    step = [detector.update(45.0, 100 + i) for i in range(30)]
    assert all(v.crossed for v in step)  # an incident does not teach the baseline
    assert 10 < detector.baseline < 12
    back = detector.update(11.0, 200)
    assert back.recovered and not back.crossed
    assert detector.update(math.nan, 201).recovered
    with pytest.raises(ValueError, match="factor"):
        registry.make("baseline_ratio", {"factor": 0.5})
    with pytest.raises(ValueError, match="unknown baseline_ratio parameter"):
        registry.make("baseline_ratio", {"facter": 2})


class _BrokenHook:
    @hookimpl
    def sloguard_detectors(self):
        raise RuntimeError("boom")


class _Duplicate:
    class Threshold:
        name = "threshold"

        def __init__(self, params):
            pass

        def update(self, value, time_ns):
            return Verdict(True, False)

    @hookimpl
    def sloguard_detectors(self):
        return [self.Threshold]


def test_broken_plugins_are_reported_and_the_others_still_work():
    registry = DetectorRegistry(["no_such_module_anywhere"],
                                plugins=[_BrokenHook(), _Duplicate()])
    errors = " | ".join(registry.errors.values())
    assert "No module named 'no_such_module_anywhere'" in errors
    assert "RuntimeError: boom" in errors
    assert "already provided by threshold" in errors
    assert registry.providers["threshold"] == "threshold"  # the built-in was not replaced


def test_rule_with_an_unknown_detector_is_rejected_with_its_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: m\n"
                    "        field: v\n        detector: magic\n")
    registry = DetectorRegistry()
    expected = rf"{path}:7:9: groups.0.rules.0.detector: unknown detector 'magic'"
    with pytest.raises(RuleFileError, match=expected):
        load_rule_file(path, lambda spec: registry.make(spec.detector, spec.params))


def test_agent_reports_its_detectors(tmp_path, installed_example):
    config = tmp_path / "c.yaml"
    config.write_text("detectors:\n  plugins: [sloguard_baseline_ratio, missing_plugin_mod]\n"
                      "collectors: {cgroups: {enabled: false}}\n")
    agent = Agent(load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings)
    try:
        status = next(c for c in agent.components() if c.name == "detectors")
        assert not status.ok and "missing_plugin_mod" in status.reason
        assert {"threshold", "baseline_ratio"} <= set(status.details["available"])
    finally:
        agent.stop()
