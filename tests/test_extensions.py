"""The three extension points, each through its one way in: the example collector and lever
plugins (plugins/examples/) are pip-installed, found through their entry points, configured,
built and run by the real agent and on real cgroups; a broken plugin is reported by name and
the others still work. (The detector example, baseline_ratio, is tests/test_plugins.py's.)"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import need
from support.levers import context, make_env, workload

from sloguard.actuators.kinds import BUILTIN_STEPS, StepFactory, StepRegistry
from sloguard.actuators.policy import StepSpec
from sloguard.actuators.step import DONE, PROPOSED
from sloguard.agent import Agent
from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.hookspecs import hookimpl as collector_hook
from sloguard.collectors.registry import BUILTIN_COLLECTORS, CollectorPlugins
from sloguard.core.config import ConfigError
from sloguard.settings import load_settings

EXAMPLES = Path(__file__).resolve().parent.parent / "plugins" / "examples"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pip-install both example plugins (their entry points included) onto sys.path."""
    target = tmp_path_factory.mktemp("site")
    for example in ("loadavg_collector", "freeze_lever"):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--no-build-isolation", "--target", str(target), str(EXAMPLES / example)],
            check=True, timeout=300)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    for module in ("sloguard_loadavg", "sloguard_freeze"):
        sys.modules.pop(module, None)


def _settings(tmp_path, text: str):
    config = tmp_path / "sloguard.yaml"
    config.write_text(text)
    return load_settings(config, {"data_dir": ("--data-dir", tmp_path / "data")}).settings


# -- collectors ----------------------------------------------------------------------------


def test_the_collector_plugin_is_found_configured_and_run_by_the_agent(tmp_path, installed):
    plugins = CollectorPlugins()
    assert plugins.providers["loadavg"] == "loadavg" and plugins.errors == {}
    assert list(plugins.types)[:len(BUILTIN_COLLECTORS)] == list(BUILTIN_COLLECTORS)

    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "loadavg").write_text("1.50 0.75 0.25 3/412 9999\n")
    settings = _settings(tmp_path, f"collectors:\n  cgroups: {{enabled: false}}\n"
                                   f"  loadavg:\n    proc_root: {proc}\n")
    assert settings.collectors.loadavg.proc_root == str(proc)
    agent = Agent(settings)
    try:
        [loadavg] = [c for c in agent.collectors if c.name == "loadavg"]
        agent.tick()
        agent.tick()  # the first tick's samples are written by the second
        frame = agent.store.read(_query("node_loadavg"))
        assert list(frame["load1"])[:1] == [1.5] and list(frame["runnable"])[:1] == [3]
        status = next(c for c in agent.components() if c.name == "loadavg")
        assert status.ok and status.details["path"] == str(proc / "loadavg")
    finally:
        agent.stop()
    assert loadavg.error == ""


def _query(measurement: str):
    from sloguard.store import WindowQuery

    now = time.time_ns()
    return WindowQuery(measurement, now - 3_600 * 10**9, now + 10**9)


def test_a_plugin_section_is_checked_with_file_and_line(tmp_path, installed):
    with pytest.raises(ConfigError) as error:
        _settings(tmp_path, "collectors:\n  loadavg:\n    proc_rot: /host/proc\n")
    assert "sloguard.yaml:3" in str(error.value)
    assert "collectors.loadavg.proc_rot" in str(error.value)
    with pytest.raises(ConfigError, match=r"collectors.loadav: unknown setting: no collector"):
        _settings(tmp_path, "collectors:\n  loadav: {}\n")


def test_loadavg_turned_off_is_not_built(tmp_path, installed):
    settings = _settings(tmp_path, "collectors:\n  loadavg: {enabled: false}\n")
    built, errors = CollectorPlugins().build(CollectorContext("n", settings))
    assert "loadavg" not in {c.name for c in built} and errors == {}


class _Partial:
    class NoClose:
        name = "no_close"

        @classmethod
        def create(cls, ctx):
            return cls()

        def collect(self, now_ns):
            return []

        def status(self):
            return None

    @collector_hook
    def sloguard_collectors(self):
        return [self.NoClose]


class _Raises:
    class Broken(CollectorBase):
        name = "broken"

        @classmethod
        def create(cls, ctx):
            raise RuntimeError("no such device")

        def collect(self, now_ns):
            return []

        def status(self):
            return None

    @collector_hook
    def sloguard_collectors(self):
        return [self.Broken]


def test_a_broken_collector_is_reported_and_the_others_run(tmp_path):
    plugins = CollectorPlugins(plugins=(_Partial(), _Raises()))
    assert "no_close" not in plugins.types  # refused when loaded, not on the loop thread
    assert "collector 'no_close' lacks start, close" in " ".join(plugins.errors.values())
    settings = _settings(tmp_path, "collectors: {cgroups: {enabled: false}}\n")
    built, errors = plugins.build(CollectorContext("n", settings))
    assert "node" in {c.name for c in built}
    assert "RuntimeError: no such device" in errors["broken"]


# -- levers ----------------------------------------------------------------------------------


def test_the_lever_plugin_is_found_and_a_policy_may_name_it(tmp_path, installed):
    registry = StepRegistry()
    assert registry.providers["freeze"] == "freeze" and registry.errors == {}
    assert set(BUILTIN_STEPS) <= set(registry.types)
    factory = StepFactory(make_env(tmp_path), registry=registry)
    factory.check(StepSpec(step="freeze"))
    with pytest.raises(ValueError, match="unknown freeze parameter"):
        factory.check(StepSpec(step="freeze", params={"colder": True}))
    with pytest.raises(ValueError, match=r"unknown step 'freez'.*freeze"):
        factory.check(StepSpec(step="freez"))
    assert "freeze" not in StepRegistry(use_entry_points=False).types  # third parties: off


def _freezer(real_cgroups, rel: str) -> Path:
    need("freezer" in real_cgroups.layout.v1, "a v1 freezer hierarchy (this host's)")
    path = real_cgroups.layout.v1["freezer"] / rel
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True)
        real_cgroups.created.append(parent)
    path.mkdir()
    real_cgroups.created.append(path)
    return path


def _state(path: Path) -> str:
    return (path / "freezer.state").read_text().strip()


def test_the_lever_plugin_freezes_be_on_real_cgroups_and_thaws_it(real_cgroups, tmp_path,
                                                                installed):
    be, ls = real_cgroups.create("be"), real_cgroups.create("ls")
    frozen_be, frozen_ls = _freezer(real_cgroups, be), _freezer(real_cgroups, ls)
    hog = real_cgroups.spawn(be, "import time\nwhile True: time.sleep(0.01)")
    (frozen_be / "cgroup.procs").write_text(str(hog.pid))
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    step = StepFactory(make_env(tmp_path)).make(StepSpec(step="freeze"))
    assert step.available() is None
    try:
        shadow = step.apply(context(inventory, dry_run=True))
        assert shadow.status == PROPOSED and _state(frozen_be) == "THAWED"

        result = step.apply(context(inventory))
        assert result.status == DONE, result.detail
        for _ in range(100):  # FREEZING until every task has stopped
            if _state(frozen_be) == "FROZEN":
                break
            time.sleep(0.02)
        assert _state(frozen_be) == "FROZEN"
        assert _state(frozen_ls) == "THAWED"  # never an LS workload
        [record] = result.undo["writes"]
        assert record["old"] == "THAWED" and record["wrote"] == "FROZEN"

        lifted = step.undo(context(inventory), result.undo)
        assert lifted.status == DONE, lifted.detail
        assert _state(frozen_be) == "THAWED"
        assert hog.poll() is None  # thawed, it runs on
    finally:
        (frozen_be / "freezer.state").write_text("THAWED")  # a frozen task cannot be reaped


class _Shadow:
    """A third-party plugin that asks to run last: pluggy then calls it first."""

    class Notify:
        kind = "notify"

        def __init__(self, params, env):
            pass

    class Cgroups(CollectorBase):
        name = "cgroups"

        @classmethod
        def create(cls, ctx):
            return cls()

        def collect(self, now_ns):
            return []

        def status(self):
            return None

    from sloguard.actuators.hookspecs import hookimpl as step_hook

    @step_hook(trylast=True)
    def sloguard_steps(self):
        return [self.Notify]

    @collector_hook(trylast=True)
    def sloguard_collectors(self):
        return [self.Cgroups]


def test_a_plugin_cannot_take_a_builtins_name():
    steps = StepRegistry(plugins=(_Shadow(),))
    assert steps.providers["notify"] == "notify"  # the built-in
    assert "already provided by notify" in " ".join(steps.errors.values())
    collectors = CollectorPlugins(plugins=(_Shadow(),))
    assert collectors.providers["cgroups"] == "cgroups"
    assert list(collectors.types)[:2] == ["node", "cgroups"]  # the build order is kept
