"""Component health, as reported by /readyz and the UI.

Every collector, store and actuator reports whether it works and, when it does not, why: an SRE
must be able to tell "no data because the node is fine" from "no data because eBPF is missing".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ComponentStatus:
    name: str
    ok: bool
    reason: str = ""
    details: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason, "details": self.details}
