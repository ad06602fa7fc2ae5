"""The configured sample store: the embedded one by default, InfluxDB with `store.kind`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sloguard.store import Store

if TYPE_CHECKING:
    from sloguard.core.selfmetrics import AgentMetrics
    from sloguard.settings import Settings


def open_configured_store(settings: Settings, metrics: AgentMetrics | None = None,
                          writer: bool = True) -> Store:
    """The store `settings.store` describes. `writer=False` opens InfluxDB for reading only
    (a backtest must not replay the agent's spool behind its back)."""
    cfg = settings.store
    if cfg.kind == "influxdb":
        from sloguard.store.influx import InfluxStore

        return InfluxStore(cfg, Path(settings.data_dir),
                           metrics.influx() if metrics is not None else None, writer=writer)
    from sloguard.store.embedded import open_store

    return open_store(settings.data_dir, cfg.retention, cfg.max_size)
