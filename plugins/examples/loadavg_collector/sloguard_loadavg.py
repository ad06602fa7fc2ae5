"""An example collector plugin: the node's load averages and runnable tasks, from
/proc/loadavg, as the measurement `node_loadavg`.

Its settings are its own section, `collectors.loadavg`, checked against `Config` when the
config file is loaded (a typo is an error naming the file and line, as for the built-ins):

    collectors:
      loadavg:
        proc_root: /host/proc   # the node's procfs, mounted into the agent's container
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.hookspecs import hookimpl
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    proc_root: str = Field("/proc", min_length=1)


class LoadavgCollector(CollectorBase):
    name: ClassVar[str] = "loadavg"
    Config: ClassVar[type[BaseModel]] = Config

    @classmethod
    def create(cls, ctx: CollectorContext) -> LoadavgCollector | None:
        cfg = ctx.section(cls.name) or Config()  # no section in the file: the defaults
        return cls(ctx.node, cfg.proc_root) if cfg.enabled else None

    def __init__(self, node: str, proc_root: str = "/proc") -> None:
        self.node = node
        self.path = Path(proc_root) / "loadavg"
        self.error = ""

    def collect(self, now_ns: int) -> list[Sample]:
        try:
            load1, load5, load15, tasks, _ = self.path.read_text().split(maxsplit=4)
            runnable, total = tasks.split("/")
            fields = {"load1": float(load1), "load5": float(load5), "load15": float(load15),
                      "runnable": int(runnable), "tasks": int(total)}
        except (OSError, ValueError) as exc:
            self.error = f"{self.path}: {exc}"
            return []
        self.error = ""
        return [Sample("node_loadavg", {"node": self.node}, fields, now_ns)]

    def status(self) -> ComponentStatus:
        return ComponentStatus(self.name, ok=not self.error, reason=self.error,
                               details={"path": str(self.path)})


@hookimpl
def sloguard_collectors() -> list[type]:
    return [LoadavgCollector]
