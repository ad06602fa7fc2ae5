"""What guarding costs each BE workload: time under each lever, CPU wanted and got, evictions.

A BE pod that is Running but held to nearly no CPU is not throughput, and a guard that keeps
one job suppressed all day, or evicts the same job every night, costs batch users more than
its incident list shows. Per BE workload this keeps:

- the seconds it spent under each lever kind (a rung in force whose step acts on BE workloads
  one by one and covers it: tier-wide, or narrowed to it as a suspect); node steps (cordon,
  capacity) cost a running workload nothing and are not counted;
- the CPU it got (cgroup usage) and the CPU it waited for (the eBPF run-queue wait of its
  tasks), while held and while free: wanted = got + waited, and satisfaction = got / wanted.
  Without the eBPF run-queue program the wait is unknown and satisfaction is not given
  (never guessed from PSI, which counts stalled wall time, not the tasks' CPU demand);
- how often it was evicted (the ledger's audit), and in how many incidents attribution named
  it the first suspect when the incident ended (its last ranking, the one with the most
  evidence: a ranking at the onset may name an innocent the evidence later clears): the
  repeat culprits.

A rung covers the cgroups it wrote (its undo record's `writes`, and everything beneath them:
a lever on the besteffort QoS cgroup holds every pod in it), else the cgroups a suspect rung
was narrowed to, else (a lever that records no paths, resctrl) every BE workload.

Kept in its own SQLite file beside the ledger (`guard_cost.db`, on the agent's hostPath), so a
restarted agent goes on counting; every change is written in one transaction every FLUSH_S
and on close (a crash loses at most that much, never half of it). Bounded: at most
MAX_WORKLOADS accounts (the least recently seen go first, counted in `dropped`), and the
working sets (counters, first suspects) to the workloads and incidents of now, because
pod names come from whoever may create pods. An unreadable file is moved aside and the
account starts again: what guarding cost is worth less than the guard starting.

Lever time is integrated over the agent's ticks, each step capped at `max_step_s` (a few
ticks): while the agent is down a lever stays in force but is not counted (a lower bound
across restarts, said in docs/attribution.md). Accounts are per workload name (namespace/pod):
a Job's next pod starts an account of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloguard.actuators.ladder import TARGETS_KEY
from sloguard.collectors.cgroup_ids import WORKLOAD_LEVELS
from sloguard.core.samples import Sample
from sloguard.core.suspects import workload_name
from sloguard.store import StoreError
from sloguard.store.sqlite import open_db

log = logging.getLogger(__name__)

MAX_WORKLOADS = 500
FLUSH_S = 10.0
MAX_STEP_S = 5.0  # default: a longer gap between ticks is the agent stopped, not lever time
MAX_COUNTED = 1000  # incidents whose first suspect was counted, kept so none counts twice
CPU_MEASUREMENT = "container_cpu"
WAIT_MEASUREMENT = "ebpf_runqueue"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS guard_cost (
    workload TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    last_seen_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS guard_first (
    incident TEXT PRIMARY KEY,
    workload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS guard_counted (
    incident TEXT PRIMARY KEY,
    time_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS guard_state (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


@dataclass
class WorkloadCost:
    """One BE workload's account. CPU figures are core-seconds."""

    workload: str  # how people name it (namespace/pod, the declared name, or the cgroup)
    tags: dict[str, str] = field(default_factory=dict)  # cgroup, namespace, pod, ...
    first_ns: int = 0
    last_seen_ns: int = 0
    lever_s: dict[str, float] = field(default_factory=dict)  # lever kind -> seconds under it
    held_s: float = 0.0  # seconds under any lever
    got_held: float = 0.0
    waited_held: float = 0.0
    got_free: float = 0.0
    waited_free: float = 0.0
    waits_seen: bool = False  # an eBPF run-queue sample arrived: the wait is known
    evictions: int = 0
    named_first: int = 0  # incidents that ended with attribution ranking it first

    def satisfaction(self, held: bool) -> float | None:
        """got / wanted while held (or free); None where the wait is unknown or nothing ran."""
        got, waited = (self.got_held, self.waited_held) if held else (self.got_free,
                                                                        self.waited_free)
        if not self.waits_seen or got + waited <= 0:
            return None
        return got / (got + waited)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "tags": dict(self.tags), "first_ns": self.first_ns,
            "last_seen_ns": self.last_seen_ns,
            "lever_seconds": {k: round(v, 3) for k, v in sorted(self.lever_s.items())},
            "held_seconds": round(self.held_s, 3),
            "cpu_held": {"got": round(self.got_held, 3),
                         "wanted": round(self.got_held + self.waited_held, 3)
                         if self.waits_seen else None,
                         "satisfaction": _round(self.satisfaction(True))},
            "cpu_free": {"got": round(self.got_free, 3),
                         "wanted": round(self.got_free + self.waited_free, 3)
                         if self.waits_seen else None,
                         "satisfaction": _round(self.satisfaction(False))},
            "evictions": self.evictions, "named_first": self.named_first,
        }

    def _state(self) -> dict[str, Any]:
        return {"tags": self.tags, "first_ns": self.first_ns, "lever_s": self.lever_s,
                "held_s": self.held_s, "got_held": self.got_held,
                "waited_held": self.waited_held, "got_free": self.got_free,
                "waited_free": self.waited_free, "waits_seen": self.waits_seen,
                "evictions": self.evictions, "named_first": self.named_first}

    @classmethod
    def _from_state(cls, workload: str, data: dict[str, Any], last_seen_ns: int) -> WorkloadCost:
        cost = cls(workload, last_seen_ns=last_seen_ns)
        cost.tags = {str(k): str(v) for k, v in dict(data.get("tags") or {}).items()}
        cost.first_ns = int(data.get("first_ns", 0))
        cost.lever_s = {str(k): float(v) for k, v in dict(data.get("lever_s") or {}).items()}
        for name in ("held_s", "got_held", "waited_held", "got_free", "waited_free"):
            setattr(cost, name, float(data.get(name, 0.0)))
        cost.waits_seen = bool(data.get("waits_seen", False))
        cost.evictions = int(data.get("evictions", 0))
        cost.named_first = int(data.get("named_first", 0))
        return cost


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def covered(undo: Any, cgroups: list[str]) -> list[str]:
    """The BE cgroups (tags) a rung in force holds: at or under a cgroup it wrote; else the
    suspects it was narrowed to; else, for a lever that records no paths, all of them."""
    if not isinstance(undo, dict):
        return list(cgroups)
    writes = undo.get("writes")
    if isinstance(writes, list):
        roots = {w["cgroup"].rstrip("/") or "/" for w in writes
                 if isinstance(w, dict) and isinstance(w.get("cgroup"), str)}
    elif isinstance(undo.get(TARGETS_KEY), list):
        roots = {c.rstrip("/") or "/" for c in undo[TARGETS_KEY] if isinstance(c, str)}
    else:
        return list(cgroups)
    if "/" in roots:
        return list(cgroups)
    held = []
    for cgroup in cgroups:  # its path and each ancestor: linear in the path's depth
        path = cgroup.rstrip("/")
        while path:
            if path in roots:
                held.append(cgroup)
                break
            path = path.rpartition("/")[0]
    return held


class GuardCost:
    """The accountant, fed by the agent's loop: `observe(samples)` after each collection,
    `tick(...)` after the ladder. Reads (`costs`) are safe from the API's threads."""

    def __init__(self, path: Path, per_workload: Callable[[str], bool],
                 max_workloads: int = MAX_WORKLOADS, max_step_s: float = MAX_STEP_S,
                 audit_start: int = 0) -> None:
        """`audit_start`: on a new account, the audit id evictions are counted after (the
        ledger's last, so that an upgraded agent does not fill the account with the pods it
        evicted before it kept one)."""
        if max_workloads < 1:
            raise ValueError("max_workloads must be >= 1")
        if max_step_s <= 0:
            raise ValueError("max_step_s must be > 0")
        self.path = Path(path)
        self.per_workload = per_workload
        self.max_workloads = max_workloads
        self.max_step_s = max_step_s
        self._lock = threading.Lock()  # the accounts (API threads read them)
        self._conn = self._open()
        self._costs: dict[str, WorkloadCost] = {}
        self._held: dict[str, set[str]] = {}  # cgroup -> lever kinds in force over it
        self._usage_prev: dict[str, float] = {}  # cgroup -> usage_seconds_total last seen
        self._first: dict[str, str] = {}  # firing incident -> its first suspect now
        self._counted: dict[str, int] = {}  # incident -> when its first suspect was counted
        self._dirty: set[str] = set()
        self._gone: set[str] = set()  # accounts dropped, deleted on the next flush
        self._last_mono: float | None = None
        self._last_flush: float | None = None
        self.dropped = 0
        self._audit_cursor: int | None = None
        self._load()
        if self._audit_cursor is None:
            self._audit_cursor = audit_start

    def _open(self) -> sqlite3.Connection:
        try:
            return open_db(self.path, _SCHEMA, "the guard-cost account")
        except StoreError as exc:
            aside = self.path.with_name(f"{self.path.name}.unreadable-{int(time.time())}")
            log.error("%s; moved aside to %s, the account starts again", exc, aside.name)
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    Path(f"{self.path}{suffix}").rename(f"{aside}{suffix}")
            return open_db(self.path, _SCHEMA, "the guard-cost account")

    # -- feeding -------------------------------------------------------------------------

    def observe(self, samples: Iterable[Sample]) -> None:
        """CPU got and waited by BE workloads in the interval these samples close, charged
        to held or free by the levers in force over it (as of the last tick)."""
        with self._lock:
            for sample in samples:
                measurement = sample.measurement
                if measurement != CPU_MEASUREMENT and measurement != WAIT_MEASUREMENT:
                    continue  # asked first: most samples are of neither
                tags = sample.tags
                if tags.get("class") != "BE" or tags.get("level") not in WORKLOAD_LEVELS:
                    continue
                cgroup = tags.get("cgroup", "")
                if measurement == CPU_MEASUREMENT:
                    total = sample.fields.get("usage_seconds_total")
                    if total is None:
                        continue
                    prev = self._usage_prev.get(cgroup)
                    self._usage_prev[cgroup] = total
                    if prev is None or total < prev:  # first sight, or a new cgroup by name
                        continue
                    cost = self._cost(tags, sample.time_ns)
                    if cost is None:
                        continue
                    if self._held.get(cgroup):
                        cost.got_held += total - prev
                    else:
                        cost.got_free += total - prev
                else:  # WAIT_MEASUREMENT
                    waited = sample.fields.get("total_us")
                    cost = self._cost(tags, sample.time_ns)
                    if waited is None or cost is None:
                        continue
                    cost.waits_seen = True
                    if self._held.get(cgroup):
                        cost.waited_held += waited / 1e6
                    else:
                        cost.waited_free += waited / 1e6
                self._dirty.add(cost.workload)

    def tick(self, now_ns: int, mono_s: float, inventory: list[dict[str, str]],
             rungs: Iterable[Any], firing: Iterable[Any],
             audit: Callable[[int], list[Any]] | None = None) -> None:
        """Lever time since the last tick, the levers in force from now on, the incidents'
        first suspects, and (every FLUSH_S) the evictions in the audit and a flush to disk."""
        be = [w for w in inventory if w.get("class") == "BE" and w.get("cgroup")]
        cgroups = [w["cgroup"] for w in be]
        held: dict[str, set[str]] = {}
        for rung in rungs:
            if rung.status != "done" or rung.dry_run or not self.per_workload(rung.kind):
                continue
            for cgroup in covered(rung.undo, cgroups):
                held.setdefault(cgroup, set()).add(rung.kind)
        firing = list(firing)
        with self._lock:
            step = 0.0 if self._last_mono is None else min(max(0.0, mono_s - self._last_mono),
                                                           self.max_step_s)
            self._last_mono = mono_s
            live = set(cgroups)
            self._usage_prev = {c: v for c, v in self._usage_prev.items() if c in live}
            for w in be:
                cost = self._cost(w, now_ns)
                if cost is None:
                    continue
                kinds = self._held.get(w["cgroup"], set())
                if kinds and step:
                    cost.held_s += step
                    for kind in kinds:
                        cost.lever_s[kind] = cost.lever_s.get(kind, 0.0) + step
                self._dirty.add(cost.workload)
            self._held = held
            ids = {str(incident.id) for incident in firing}
            for incident in firing:
                suspects = getattr(incident, "suspects", None) or []
                if suspects and isinstance(suspects[0], dict):
                    first = suspects[0]
                    name = workload_name({**dict(first.get("workload") or {}),
                                          "cgroup": str(first.get("cgroup", ""))})
                    if name:
                        self._first[str(incident.id)] = name
            for incident_id in [i for i in self._first if i not in ids]:  # it has ended
                name = self._first.pop(incident_id)
                if incident_id in self._counted:
                    continue
                self._counted[incident_id] = now_ns
                while len(self._counted) > MAX_COUNTED:
                    del self._counted[next(iter(self._counted))]
                cost = self._costs.get(name)
                if cost is not None:
                    cost.named_first += 1
                    self._dirty.add(name)
            due = self._last_flush is None or mono_s - self._last_flush >= FLUSH_S
        if due:
            if audit is not None:
                self._count_evictions(audit, now_ns)
            self.flush()
            self._last_flush = mono_s

    def _count_evictions(self, audit: Callable[[int], list[Any]], now_ns: int) -> None:
        """Evictions done for real since the last look (the audit's ids only grow)."""
        for _ in range(100):  # at most 10,000 entries a look: the rest on the next
            entries = audit(self._audit_cursor or 0)
            if not entries:
                return
            with self._lock:
                for entry in entries:
                    self._audit_cursor = max(self._audit_cursor or 0, int(entry.id or 0))
                    if entry.kind != "evict" or entry.action != "apply" or \
                            entry.status != "done" or entry.dry_run:
                        continue
                    ref = entry.target.removeprefix("pod/")
                    namespace, _, pod = ref.partition("/")
                    cost = self._cost({"namespace": namespace, "pod": pod},
                                      min(now_ns, int(entry.time_ns)))
                    if cost is not None:
                        cost.evictions += 1
                        self._dirty.add(cost.workload)

    def _cost(self, tags: dict[str, str], now_ns: int) -> WorkloadCost | None:
        """The workload's account, made on first sight (lock held)."""
        name = workload_name(tags)
        if not name:
            return None
        cost = self._costs.get(name)
        if cost is None:
            if len(self._costs) >= self.max_workloads:
                oldest = min(self._costs.values(), key=lambda c: c.last_seen_ns)
                del self._costs[oldest.workload]
                self._gone.add(oldest.workload)  # deleted on disk by the next flush
                self._dirty.discard(oldest.workload)
                self.dropped += 1
            cost = self._costs[name] = WorkloadCost(name, first_ns=now_ns)
            self._gone.discard(name)
        if tags.get("cgroup"):
            cost.tags = {k: v for k, v in tags.items()
                         if k in ("cgroup", "namespace", "pod", "workload", "qos")}
        cost.last_seen_ns = max(cost.last_seen_ns, now_ns)
        return cost

    # -- persistence ---------------------------------------------------------------------

    def _load(self) -> None:
        try:
            rows = self._conn.execute(
                "SELECT workload, data, last_seen_ns FROM guard_cost").fetchall()
            first = self._conn.execute("SELECT incident, workload FROM guard_first").fetchall()
            counted = self._conn.execute(
                "SELECT incident, time_ns FROM guard_counted ORDER BY time_ns").fetchall()
            state = dict(self._conn.execute("SELECT name, value FROM guard_state").fetchall())
        except sqlite3.Error:
            return  # an unreadable account starts again; the ledger is what must not be lost
        for workload, data, last_seen in rows:
            try:
                self._costs[workload] = WorkloadCost._from_state(workload, json.loads(data),
                                                                  int(last_seen))
            except (ValueError, TypeError, AttributeError):
                continue
        self._first = {str(i): str(w) for i, w in first}
        self._counted = {str(i): int(t) for i, t in counted}
        if "audit_cursor" in state:
            self._audit_cursor = int(state["audit_cursor"])

    def flush(self) -> None:
        """Every change since the last flush in one transaction (the loop's thread only): the
        accounts, the incidents' first suspects and the counted incidents that go with their
        counts, the audit cursor."""
        with self._lock:
            rows = [(c.workload, json.dumps(c._state()), c.last_seen_ns)
                    for name in self._dirty if (c := self._costs.get(name)) is not None]
            gone, cursor = list(self._gone), self._audit_cursor
            first, counted = list(self._first.items()), list(self._counted.items())
            self._dirty.clear()
            self._gone.clear()
        try:  # the API's readers go on meanwhile: they read the accounts, not the file
            self._conn.execute("BEGIN")
            self._conn.executemany("DELETE FROM guard_cost WHERE workload = ?",
                                   [(name,) for name in gone])
            self._conn.executemany("INSERT OR REPLACE INTO guard_cost VALUES (?, ?, ?)", rows)
            self._conn.execute("DELETE FROM guard_first")
            self._conn.executemany("INSERT INTO guard_first VALUES (?, ?)", first)
            self._conn.execute("DELETE FROM guard_counted")
            self._conn.executemany("INSERT INTO guard_counted VALUES (?, ?)", counted)
            self._conn.execute("INSERT OR REPLACE INTO guard_state VALUES (?, ?)",
                               ("audit_cursor", cursor or 0))
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            log.warning("the guard-cost account could not be written (kept in memory, "
                        "written again next time): %s", exc)
            with self._lock:  # kept in memory; the next flush writes it
                self._dirty.update(r[0] for r in rows)
                self._gone.update(name for name in gone if name not in self._costs)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._conn.close()

    # -- reading -------------------------------------------------------------------------

    def costs(self) -> list[dict[str, Any]]:
        """Every workload's account, the most held first."""
        with self._lock:
            found = [c.to_dict() for c in self._costs.values()]
        found.sort(key=lambda c: (-c["held_seconds"], -c["evictions"], c["workload"]))
        return found

    def held_now(self) -> dict[str, list[str]]:
        """cgroup -> the lever kinds in force over it now."""
        with self._lock:
            return {cgroup: sorted(kinds) for cgroup, kinds in self._held.items()}
