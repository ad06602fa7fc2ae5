"""The web UI reads the agent and the cluster server only through ui/view.py's NodeView: both
implement all of it, and the UI's modules use nothing else of them (the seam that let the UI
reach into the engine, the ladder and the stores, and the server fake them, is closed)."""

from __future__ import annotations

import re
from pathlib import Path

from sloguard.agent import Agent
from sloguard.cluster import ClusterServer
from sloguard.settings import load_settings
from sloguard.ui.view import NodeView

UI = Path(__file__).resolve().parent.parent / "ui"


def _members() -> set[str]:
    names = {n for n in vars(NodeView) if not n.startswith("_")}
    return names | set(NodeView.__annotations__)


def test_the_agent_and_the_server_implement_the_whole_view(tmp_path):
    settings = load_settings(None, {"data_dir": ("--data-dir", tmp_path / "a")}).settings
    agent = Agent(settings.model_copy(update={
        "collectors": settings.collectors.model_copy(update={
            "cgroups": settings.collectors.cgroups.model_copy(update={"enabled": False})})}))
    server = ClusterServer(load_settings(None, {"data_dir": ("--data-dir", tmp_path / "s")})
                           .settings)
    try:
        for view in (agent, server):
            missing = [name for name in _members() if not hasattr(view, name)]
            assert not missing, f"{type(view).__name__} lacks {missing}"
        assert agent.cluster is False and server.cluster is True
        assert server.rules_view() == ([], {}) and server.workloads() == []
        agent.tick()  # loads the rules, and evaluates them once
        loaded, errors = agent.rules_view()
        assert loaded and errors == {}  # the shipped rules, each with its status
    finally:
        agent.stop()
        server.stop()


def test_the_ui_uses_nothing_but_the_view():
    # ui/ingest.py is not a view of a node: it is the cluster server's own ingest API, which
    # ClusterServer.ingest_router() builds around itself (`server.ingest`, `server.refused`).
    used: dict[str, set[str]] = {}
    for module in sorted(set(UI.glob("*.py")) - {UI / "view.py"}):
        for name in re.findall(r"\b(?:agent|view)\.([a-z_]+)", module.read_text()):
            used.setdefault(name, set()).add(module.name)
    beyond = {name: sorted(files) for name, files in used.items()
              if name not in _members() and name != "py"}  # "ui/view.py" in a docstring
    assert not beyond, f"the UI reaches past ui/view.py: {beyond}"
    assert {"incidents", "rules_view", "change_incident"} <= set(used)  # the scan sees them
