"""The configured sample store: the embedded one by default, InfluxDB with `store.kind`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sloguard.store import Store

if TYPE_CHECKING:
    from sloguard.core.selfmetrics import AgentMetrics
    from sloguard.store.config import StoreConfig


def open_configured_store(cfg: StoreConfig, data_dir: str | Path,
                          metrics: AgentMetrics | None = None, writer: bool = True) -> Store:
    """The store the `store` section describes, keeping its files in data_dir. `writer=False`
    opens InfluxDB for reading only (a backtest must not replay the agent's spool behind its
    back)."""
    if cfg.kind == "influxdb":
        from sloguard.store.influx import InfluxStore

        return InfluxStore(cfg, Path(data_dir),
                           metrics.influx() if metrics is not None else None, writer=writer)
    from sloguard.store.embedded import open_store

    return open_store(data_dir, cfg.retention, cfg.max_size)
