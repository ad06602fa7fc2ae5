"""A node in miniature for the `target: suspects` tests: three BE cgroups and one LS cgroup on
this machine's real cgroups, the real ladder and ledger, one incident under a cpu_idle policy
whose suspects a test sets."""

from __future__ import annotations

from pathlib import Path

from conftest import need

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicySet
from sloguard.core.incidents import FIRING, Evidence, Incident
from sloguard.core.suspects import Clue, Suspect
from sloguard.store.incidents_db import IncidentStore
from support.levers import workload

S = 1_000_000_000
T0 = 1_800_000_000 * S
POLICY = """\
policies:
  - name: guard
    undo_hold: 10s
    steps:
      - step: suppress
        hold: 10s
        order: written
        levers:
          - step: cpu_idle
            target: suspects
            suspects: 2
"""


class Node:
    def __init__(self, tmp_path: Path, real_cgroups, policy: str = POLICY) -> None:
        need("cpu" in real_cgroups.layout.v1, "a v1 cpu hierarchy (this host's)")
        self.cpu = real_cgroups.layout.v1["cpu"]
        self.be = {name: real_cgroups.create(f"be-{name}") for name in
                   ("antagonist", "napper", "steady")}
        self.ls = real_cgroups.create("ls")
        self.inventory = [workload(rel, "BE") for rel in self.be.values()] + [
            workload(self.ls, "LS")]
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "p.yaml").write_text(policy)
        self.ledger = Ledger(tmp_path / "actuators.db")
        self.factory = factory = StepFactory(ActuatorEnv("node-a", self.ledger))
        self.policies = PolicySet([str(tmp_path / "policies")], validate_step=factory.check)
        assert self.policies.reload().ok, self.policies.errors
        self.incidents = IncidentStore(tmp_path / "incidents.db")
        self.ladder = Ladder("node-a", self.policies, self.ledger, factory.make,
                             self.incidents.save, self.incidents.get,
                             inventory=lambda: [dict(w) for w in self.inventory], dry_run=False,
                             open_incidents=self.incidents.open_incidents)
        self.incident = Incident("inc-1", "f", "LSLatencyInterference", "ls", "critical",
                                 "node-a", FIRING, {"slo": "redis"}, T0, T0, fired_ns=T0,
                                 policy="guard", labels={"resource": "cpu"})

    def suspect(self, *names: str) -> None:
        self.incident.suspects = [
            Suspect("/" + self.be[name], 0.9 - 0.2 * n, n + 1, "cpu", {"workload": name},
                    [Clue("runqueue_blame", 0.9, "cpu", f"{name} ran")]).to_dict()
            for n, name in enumerate(names)]

    def tick(self, second: int, firing: bool = True) -> None:
        now = T0 + second * S
        if firing:
            self.incident.add_evidence(Evidence(now, 3.0, 1.0, "crossed"))
        else:
            self.incident.state = "resolved"
        self.incidents.save(self.incident)
        self.ladder.tick(now, [self.incident] if firing else [])

    def idle(self) -> dict[str, str]:
        return {name: (self.cpu / rel / "cpu.idle").read_text().strip()
                for name, rel in self.be.items()}
