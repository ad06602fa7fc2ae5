"""The agent as users run it (`sloguard run` as root, real HTTP): with eBPF it writes
ebpf_runqueue samples for a declared cgroup and /readyz shows the component; with a header
tree BCC cannot compile against it says "eBPF unavailable: <reason>" in /readyz and on the
page, stays ready, and writes the procfs fallback instead."""

from __future__ import annotations

import time
from pathlib import Path

from support.ebpf import need_bcc
from test_agent_e2e import AgentProcess

from sloguard.store import WindowQuery
from sloguard.store.embedded import open_store


def _config(tmp_path: Path, svc: str, extra: str = "") -> Path:
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "node_name: ebpf-node\n"
        "interval: 500ms\n"
        "collectors:\n"
        "  cgroups:\n    include: []\n    rediscover: 1s\n"
        f"    declare:\n      - {{path: '{svc}', class: LS, name: svc}}\n"
        f"{extra}"
    )
    return config


def _component(agent: AgentProcess, name: str) -> dict:
    body = agent.get("/readyz").json()
    return next(c for c in body["components"] if c["name"] == name)


def _rows(data: Path, measurement: str, field: str):
    store = open_store(data, 3600, 1 << 30)
    try:
        now = time.time_ns()
        return store.read(WindowQuery(measurement, now - 600 * 10**9, now, fields=(field,)))
    finally:
        store.close()


def test_agent_with_ebpf_writes_runqueue_latency(tmp_path, real_cgroups, sloguard_bin):
    need_bcc()
    svc = real_cgroups.create("svc")
    real_cgroups.spawn(svc, "import time\nwhile True: time.sleep(0.002)")
    real_cgroups.spawn(svc, "while True: pass")
    data = tmp_path / "data"
    agent = AgentProcess(sloguard_bin, _config(tmp_path, svc), data, tmp_path / "agent.log")
    try:
        ebpf = agent.wait_for(lambda: _component(agent, "collector:ebpf"), 20, "no component")
        assert ebpf["ok"], ebpf
        assert ebpf["details"]["signals"] == {
            "runqueue": "attached", "block_io": "attached", "reclaim": "attached",
            "syscall": "off"}
        cpi = _component(agent, "collector:cpi")
        assert cpi["ok"] or cpi["reason"].startswith("CPI unavailable: ")

        def written():
            frame = _rows(data, "ebpf_runqueue", "p99_us")
            if frame.empty or "workload" not in frame:
                return None
            mine = frame[frame["workload"] == "svc"]
            return [mine] if len(mine) >= 3 else None

        [mine] = agent.wait_for(written, 30, "no ebpf_runqueue samples for the declared cgroup")
        assert set(mine["class"]) == {"LS"} and (mine["p99_us"] > 0).all()
        metrics = agent.get("/metrics").text
        assert 'sloguard_samples_collected_total{collector="ebpf"}' in metrics
        # Compiled by the loader process: the agent itself never maps BCC's LLVM.
        maps = Path(f"/proc/{agent.proc.pid}/maps").read_text()
        assert "libbcc" not in maps and "LLVM" not in maps
        assert "collector:ebpf" in agent.get("/node").text  # the node page lists components
    finally:
        assert agent.terminate() == 0
    assert "eBPF attached: runqueue, block_io, reclaim" in (tmp_path / "agent.log").read_text()


def test_agent_without_working_ebpf_says_why_and_falls_back(tmp_path, real_cgroups,
                                                            sloguard_bin):
    need_bcc()
    svc = real_cgroups.create("svc")
    real_cgroups.spawn(svc, "while True: pass")
    empty = tmp_path / "no-headers"
    empty.mkdir()
    data = tmp_path / "data"
    config = _config(tmp_path, svc, f"  ebpf: {{kernel_source: '{empty}'}}\n")
    agent = AgentProcess(sloguard_bin, config, data, tmp_path / "agent.log")
    try:
        ebpf = agent.wait_for(lambda: _component(agent, "collector:ebpf"), 20, "no component")
        assert not ebpf["ok"]
        assert ebpf["reason"].startswith("eBPF unavailable: runqueue: Failed to compile")
        assert "fallback: run-queue wait from /proc/PID/schedstat" in ebpf["reason"]
        ready = agent.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"]  # rules keep guarding
        assert "eBPF unavailable: runqueue: Failed to compile" in agent.get("/node").text

        def written():
            frame = _rows(data, "container_runqueue", "wait_rate")
            if frame.empty or "workload" not in frame:
                return None
            mine = frame[frame["workload"] == "svc"]
            return [mine] if len(mine) >= 2 else None

        [mine] = agent.wait_for(written, 30, "no container_runqueue samples")
        assert (mine["wait_rate"] >= 0).all()
        assert _rows(data, "ebpf_runqueue", "p99_us").empty
    finally:
        assert agent.terminate() == 0
