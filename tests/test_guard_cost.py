"""What guarding costs each BE workload (actuators/guard_cost.py, docs/attribution.md): the
time under each lever follows the rungs the real ladder keeps on real cgroups, the CPU got
and wanted splits at the levers, the first suspect and the evictions are counted once, the
account survives a restart and stays bounded; and `sloguard run` with eBPF on this kernel
shows a real cpu_quota lever's cost (API, /metrics, node page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.ebpf import need_bcc
from support.suspects_node import T0, Node, S
from test_agent_e2e import AgentProcess

from sloguard.actuators.guard_cost import FLUSH_S, GuardCost, covered
from sloguard.actuators.ladder import TARGETS_KEY
from sloguard.actuators.ledger import AuditEntry, RungState
from sloguard.core.samples import Sample
from sloguard.core.selfmetrics import GuardCostMetrics


@pytest.fixture
def node(suspects_node):
    return suspects_node


class Feed:
    """The agent's loop in miniature: the interval's samples, then the ladder, then the
    account. Each BE workload runs 0.5 core and waits 0.5 core-s a second while free, and gets
    0.25 and waits 0.75 while a lever holds it."""

    def __init__(self, node: Node, cost: GuardCost) -> None:
        self.node, self.cost = node, cost
        self.usage = dict.fromkeys(node.be, 0.0)
        # what the cgroup collector lists: the same tags as its samples'
        self.inventory = [{"cgroup": "/" + rel, "class": "BE", "level": "cgroup",
                           "workload": name} for name, rel in node.be.items()] + [
            {"cgroup": "/ls", "class": "LS", "level": "cgroup", "workload": "ls"}]

    def step(self, second: int, firing: bool = True) -> None:
        now = T0 + second * S
        held = self.cost.held_now()
        samples = []
        for name, rel in self.node.be.items():
            got, waited = (0.25, 0.75) if held.get("/" + rel) else (0.5, 0.5)
            self.usage[name] += got
            tags = {"cgroup": "/" + rel, "class": "BE", "level": "cgroup", "workload": name}
            samples.append(Sample("container_cpu", tags, {"usage_seconds_total":
                                                          self.usage[name]}, now))
            if second:  # like the usage counter, the wait is an interval's: none before 0
                samples.append(Sample("ebpf_runqueue", tags, {"total_us": waited * 1e6,
                                                              "count": 9.0}, now))
        samples.append(Sample("container_cpu", {"cgroup": "/ls", "class": "LS",
                                                "level": "cgroup"},
                              {"usage_seconds_total": float(second)}, now))
        self.cost.observe(samples)
        self.node.tick(second, firing)
        self.cost.tick(now, float(second), self.inventory, self.node.ledger.rungs(),
                       [self.node.incident] if firing else [], self.node.ledger.audit_after)


def _account(node: Node, tmp_path: Path) -> GuardCost:
    return GuardCost(tmp_path / "guard_cost.db",
                     lambda kind: getattr(node.factory.type_of(kind), "per_workload", False))


def test_lever_time_cpu_and_the_first_suspect_follow_the_ladder(node, tmp_path):
    node.suspect("antagonist", "napper")
    cost = _account(node, tmp_path)
    feed = Feed(node, cost)
    for second in range(0, 21):  # suspect #1 at 0, #2 at 10, the rest at 20
        feed.step(second)
    for second in range(21, 46):  # undone in reverse at 21, 31, 41
        feed.step(second, firing=False)
    assert node.ledger.rungs() == []
    costs = {c["workload"]: c for c in cost.costs()}
    # held from the tick a rung went on to the tick it came off
    assert costs["antagonist"]["lever_seconds"] == {"cpu_idle": 41.0}
    assert costs["napper"]["lever_seconds"] == {"cpu_idle": 21.0}
    assert costs["steady"]["lever_seconds"] == {"cpu_idle": 1.0}
    assert [c["workload"] for c in cost.costs()] == ["antagonist", "napper", "steady"]
    antagonist = costs["antagonist"]
    assert antagonist["held_seconds"] == 41.0
    assert antagonist["cpu_held"] == {"got": 10.25, "wanted": 41.0, "satisfaction": 0.25}
    # 45 intervals observed (the first sample only primes the counter): 4 free ones
    assert antagonist["cpu_free"]["satisfaction"] == 0.5
    assert antagonist["cpu_free"]["got"] == pytest.approx(4 * 0.5)
    # named first once for the incident, when it ended, however many ticks it was ranked
    assert antagonist["named_first"] == 1
    assert costs["napper"]["named_first"] == 0 and costs["steady"]["evictions"] == 0
    assert set(costs) == {"antagonist", "napper", "steady"}  # never an LS workload
    assert cost.held_now() == {}

    # evictions for real are counted from the audit; proposals and failures are not
    for status, dry_run, pod in (("done", False, "be-x"), ("proposed", True, "be-y"),
                                 ("failed", False, "be-z")):
        node.ledger.audit(AuditEntry(T0 + 50 * S, "node-a", "inc-1", "guard", 3, "evict",
                                     "apply", dry_run, status, f"pod/batch/{pod}", "", ""))
    feed.step(46 + int(FLUSH_S), firing=False)
    costs = {c["workload"]: c for c in cost.costs()}
    assert costs["batch/be-x"]["evictions"] == 1
    assert "batch/be-y" not in costs and "batch/be-z" not in costs
    before = cost.costs()
    cost.close()

    # the account goes on after a restart: nothing lost, nothing counted twice
    again = _account(node, tmp_path)
    assert again.costs() == before
    again.tick(T0 + 60 * S, 60.0, feed.inventory, [], [], node.ledger.audit_after)
    after = {c["workload"]: c for c in again.costs()}
    assert after["batch/be-x"]["evictions"] == 1  # the same audit entry
    assert after["antagonist"]["named_first"] == 1
    node.incident.id, node.incident.state = "inc-2", "firing"
    again.tick(T0 + 61 * S, 61.0, feed.inventory, [], [node.incident], node.ledger.audit_after)
    assert {c["workload"]: c for c in again.costs()}["antagonist"]["named_first"] == 1
    again.tick(T0 + 62 * S, 62.0, feed.inventory, [], [], node.ledger.audit_after)  # ended
    assert {c["workload"]: c for c in again.costs()}["antagonist"]["named_first"] == 2
    again.close()


def test_without_run_queue_waits_satisfaction_is_not_guessed(tmp_path):
    cost = GuardCost(tmp_path / "g.db", lambda kind: True)
    tags = {"cgroup": "/be", "class": "BE", "level": "cgroup", "workload": "be"}
    for second in range(3):
        cost.observe([Sample("container_cpu", tags, {"usage_seconds_total": float(second)},
                             T0 + second * S)])
    [account] = cost.costs()
    assert account["cpu_free"] == {"got": 2.0, "wanted": None, "satisfaction": None}
    registry = CollectorRegistry()
    registry.register(GuardCostMetrics(cost.costs, lambda: cost.dropped))
    text = generate_latest(registry).decode()
    assert 'sloguard_be_cpu_got_seconds_total{held="false",workload="be"} 2.0' in text
    assert "sloguard_be_cpu_wanted_seconds_total{" not in text
    cost.close()


def test_the_account_is_bounded_whatever_pods_a_node_sees(tmp_path):
    """Pod names come from whoever may create pods: at most `max_workloads` accounts, the
    least recently seen dropped first (counted), on disk as in memory."""
    cost = GuardCost(tmp_path / "g.db", lambda kind: True, max_workloads=3)
    for n in range(5):
        tags = {"cgroup": f"/be-{n}", "class": "BE", "level": "pod", "namespace": "batch",
                "pod": f"job-{n}" + "x" * 200}
        cost.tick(T0 + n * S, float(n), [tags], [], [])
    names = [c["workload"] for c in cost.costs()]
    assert len(names) == 3 and all(name.startswith("batch/job-") for name in names)
    assert {name[len("batch/job-")] for name in names} == {"2", "3", "4"}
    assert cost.dropped == 2
    # the working sets follow the workloads and incidents of now, whatever came before
    cost.observe([Sample("container_cpu", {"cgroup": f"/gone-{n}", "class": "BE",
                                           "level": "pod", "namespace": "x", "pod": str(n)},
                         {"usage_seconds_total": 1.0}, T0) for n in range(1000)])
    cost.tick(T0 + 9 * S, 9.0, [], [], [])
    assert cost._usage_prev == {} and cost._first == {}
    cost.close()
    again = GuardCost(tmp_path / "g.db", lambda kind: True, max_workloads=3)
    assert sorted(c["workload"] for c in again.costs()) == sorted(names)
    registry = CollectorRegistry()
    registry.register(GuardCostMetrics(again.costs, lambda: again.dropped))
    assert len(re.findall(r"^sloguard_be_held_seconds_total\{", generate_latest(registry)
                          .decode(), re.M)) == 3
    again.close()


def _rung(kind: str, undo: dict, status: str = "done", dry_run: bool = False) -> RungState:
    return RungState("guard", 0, kind, status, "inc-1", dry_run, undo, T0)


def test_a_rung_holds_what_it_wrote_and_only_levers_on_workloads_count(tmp_path):
    """A lever on the besteffort QoS cgroup holds the pods under it, not a BE cgroup beside
    it; a suspect rung its suspects; a lever that records no paths the whole tier. Dry-run,
    proposed and failed rungs hold nothing, and node steps (cordon) cost a workload nothing."""
    qos = "/kubepods/besteffort"
    inventory = [{"cgroup": f"{qos}/pod-a", "class": "BE", "level": "pod", "namespace": "b",
                  "pod": "a"},
                 {"cgroup": f"{qos}/pod-b", "class": "BE", "level": "pod", "namespace": "b",
                  "pod": "b"},
                 {"cgroup": "/batch/declared", "class": "BE", "level": "cgroup",
                  "workload": "declared"},
                 {"cgroup": f"{qos}x/pod-c", "class": "BE", "level": "pod", "namespace": "b",
                  "pod": "c"},  # a name that only begins like the QoS cgroup
                 {"cgroup": "/kubepods/pod-ls", "class": "LS", "level": "pod",
                  "namespace": "shop", "pod": "redis"}]
    cgroups = [w["cgroup"] for w in inventory if w["class"] == "BE"]
    assert covered({"writes": [{"cgroup": qos, "file": "x"}]}, cgroups) == [
        f"{qos}/pod-a", f"{qos}/pod-b"]
    assert covered({"writes": [], TARGETS_KEY: ["/batch/declared"]}, cgroups) == []
    assert covered({TARGETS_KEY: ["/batch/declared"]}, cgroups) == ["/batch/declared"]
    assert covered({"group": "/sys/fs/resctrl/sloguard-be"}, cgroups) == cgroups
    assert covered({"writes": [{"cgroup": "/"}]}, cgroups) == cgroups

    per_workload = {"cpu_idle": True, "resctrl": True, "cordon": False}
    cost = GuardCost(tmp_path / "g.db", per_workload.__getitem__)
    rungs = [_rung("cpu_idle", {"writes": [{"cgroup": qos}]}),
             _rung("resctrl", {"group": "g"}, dry_run=True),
             _rung("resctrl", {"group": "g"}, status="proposed"),
             _rung("resctrl", {"group": "g"}, status="failed"),
             _rung("cordon", {"was_unschedulable": False})]
    for second in range(4):
        cost.tick(T0 + second * S, float(second), inventory, rungs, [])
    held = {c["workload"]: c["lever_seconds"] for c in cost.costs()}
    assert held == {"b/a": {"cpu_idle": 3.0}, "b/b": {"cpu_idle": 3.0}, "declared": {},
                    "b/c": {}}
    cost.close()


def test_a_crash_loses_at_most_the_last_flush_and_never_counts_twice(node, tmp_path):
    """SIGKILL-like: no close. The first suspect counted is the one of the incident's last
    ranking (the onset's may name an innocent that the evidence then clears), once, whatever
    crash comes between: what was not flushed is counted again from what was."""
    node.suspect("napper")  # the onset's ranking names an innocent ...
    feed = Feed(node, _account(node, tmp_path))
    feed.step(0)  # the first tick flushes: the incident with its first suspect so far
    node.suspect("antagonist")  # ... the evidence then names the antagonist
    feed.step(1)  # not flushed
    crashed = _account(node, tmp_path)  # the old one never closed
    rungs = node.ledger.rungs()
    crashed.tick(T0 + 2 * S, 2.0, feed.inventory, rungs, [node.incident])  # flushes
    crashed.tick(T0 + 3 * S, 3.0, feed.inventory, rungs, [])  # it ended: counted, unflushed

    def named(cost: GuardCost) -> dict[str, int]:
        return {c["workload"]: c["named_first"] for c in cost.costs()}

    assert named(crashed) == {"antagonist": 1, "napper": 0, "steady": 0}
    again = _account(node, tmp_path)  # crashed again before its flush
    assert named(again)["antagonist"] == 0
    again.tick(T0 + 4 * S, 4.0, feed.inventory, rungs, [])
    assert named(again) == {"antagonist": 1, "napper": 0, "steady": 0}  # not lost
    again.close()
    last = _account(node, tmp_path)
    last.tick(T0 + 5 * S, 5.0, feed.inventory, rungs, [])
    assert named(last)["antagonist"] == 1  # not twice
    last.close()


def test_an_unreadable_account_is_moved_aside_and_history_is_not_replayed(tmp_path):
    path = tmp_path / "g.db"
    path.write_bytes(b"not a database" * 100)
    cost = GuardCost(path, lambda kind: True, audit_start=7)
    assert cost.costs() == [] and list(tmp_path.glob("g.db.unreadable-*"))
    seen: list[int] = []
    cost.tick(T0, 0.0, [], [], [], lambda after: seen.append(after) or [])
    assert seen == [7]  # evictions before the account existed are not counted
    cost.close()


RULES = """\
groups:
  - name: cost
    rules:
      - alert: BEBusy
        expr: container_cpu{class="BE", workload="batch"}
        field: usage_cores
        aggregate: mean
        window: 1s
        params: {above: 0.4, recover_below: 0.05}
        for: 1s
        recover_for: 5s
        severity: warning
        policy: squeeze
"""

POLICY = """\
policies:
  - name: squeeze
    undo_hold: 5s
    steps:
      - step: cpu_quota
        params: {threshold_percent: 10, min_cores: 0.2, sample: 300ms}
"""


def test_the_agent_shows_what_a_real_quota_costs_a_be_workload(tmp_path, real_cgroups,
                                                                sloguard_bin):
    """Two CPU hogs in a BE cgroup: free, they get much of the two CPUs they want (what this
    busy machine leaves them); once the rule puts a real cpu_quota of 0.2 cores on them, the
    eBPF run-queue wait shows they want many times what they get. The API, /metrics and the
    node page say so, and the account survives a restart."""
    need_bcc()
    batch = real_cgroups.create("batch")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "cost.yaml").write_text(RULES)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "squeeze.yaml").write_text(POLICY)
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "node_name: cost-node\n"
        "interval: 500ms\n"
        f"rules:\n  paths: [{tmp_path / 'rules'}]\n"
        f"actuators:\n  dry_run: false\n  policies: [{tmp_path / 'policies'}]\n"
        "collectors:\n  cgroups:\n    include: []\n    rediscover: 1s\n"
        f"    declare:\n      - {{path: '{batch}', class: BE, name: batch}}\n"
        "  ebpf:\n    block_io: false\n    reclaim: false\n")
    data, log = tmp_path / "data", tmp_path / "agent.log"
    agent = AgentProcess(sloguard_bin, config, data, log)

    def account() -> dict:
        found = agent.get("/api/workloads/cost").json()["workloads"]
        return found[0] if found else {}

    try:
        for _ in range(2):
            real_cgroups.spawn(batch)
        held = agent.wait_for(lambda: (a := account()).get("held_seconds", 0) >= 8 and a, 60,
                              "the BE workload was never held")
        assert held["lever_seconds"]["cpu_quota"] >= 8, held
        free, squeezed = held["cpu_free"], held["cpu_held"]
        print(f"\nfree: {free}\nheld: {squeezed}")
        # held: ~0.2 core got of the ~2 wanted; free: most of what it wants
        assert squeezed["got"] / held["held_seconds"] < 0.35, held
        assert squeezed["wanted"] / held["held_seconds"] > 1.2, held
        assert squeezed["satisfaction"] < 0.3, held
        assert free["satisfaction"] > 2 * squeezed["satisfaction"], held
        metrics = agent.get("/metrics").text
        assert re.search(r'sloguard_be_lever_seconds_total\{lever="cpu_quota",workload="batch"\}'
                         r" \d+", metrics), metrics
        assert 'sloguard_be_cpu_wanted_seconds_total{held="true",workload="batch"}' in metrics
        page = agent.get("/node").text
        assert re.search(r"<title>[^<]*</title>", page), page[:500]  # the table is not in it
        main = page.split("<main", 1)[1]
        row = re.search(r'<table id="guard-cost">.*?<td>batch</td>(.*?)</tr>', main, re.S)
        assert row and "cpu_quota" in row.group(1), main[-3000:]
        assert agent.terminate() == 0
        agent = AgentProcess(sloguard_bin, config, data, log)
        assert account()["held_seconds"] >= held["held_seconds"]
    finally:
        if agent.proc.poll() is None:
            agent.terminate()
