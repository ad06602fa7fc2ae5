"""The incident store's change numbers, which the forwarder's cursor follows: never handed out
twice (not after the row holding the highest is deleted, not across a restart), a deletion is a
change of its own, and a firing incident that only gathers evidence is not news every save."""

from __future__ import annotations

import json
import sqlite3
import threading

from sloguard.core.incidents import FIRING, PENDING, RESOLVED, Evidence, Incident
from sloguard.store.incidents_db import IncidentStore

S = 10**9


def _incident(n: int, state: str = FIRING, updated_s: float = 100, node: str = "node-a",
              incident_id: str | None = None) -> Incident:
    return Incident(id=incident_id or f"inc-{n}", fingerprint=f"fp-{n}", rule="R", group="g",
                    severity="warning", node=node, state=state, series={"n": str(n)},
                    started_ns=int(updated_s * S), updated_ns=int(updated_s * S))


def _seqs(changes) -> list[int]:
    return [c[0] for c in changes]  # the number is first, whatever else a change carries


def test_deleting_the_latest_change_never_lends_its_number(tmp_path):
    """A cursor that has passed the number of an incident later deleted (or pruned) must still
    see the next save: `max(seq) + 1` handed that number out again and the cursor skipped it."""
    store = IncidentStore(tmp_path / "i.db")
    store.save(_incident(1))
    store.save(_incident(2, RESOLVED, updated_s=1))
    cursor = _seqs(store.changed_since(0))[-1]  # a forwarder sent both
    assert store.prune(resolved_before_ns=50 * S) == 1  # inc-2, holding the highest number
    store.save(_incident(3))
    after = store.changed_since(cursor)
    assert len(after) == 1 and after[0][0] > cursor, after
    cursor = after[0][0]

    # the same after a delete, and after the store is opened again (a restarted agent)
    store.delete("inc-3")
    store.close()
    store = IncidentStore(tmp_path / "i.db")
    store.save(_incident(4))
    after = store.changed_since(cursor)
    assert [c.id for c in after] == ["inc-3", "inc-4"]
    assert after[0].incident is None and after[1].incident.id == "inc-4"
    assert all(n > cursor for n in _seqs(after))
    assert store.last_seq() == after[-1].seq


def test_concurrent_saves_get_distinct_numbers_committed_in_order(tmp_path):
    """Saves from several threads (the loop, the ladder, the API's acknowledge): every change
    its own number, and a reader never sees a number while a lower one is still to come."""
    store = IncidentStore(tmp_path / "i.db")
    seen: list[list[int]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.append(_seqs(store.changed_since(0, limit=10_000)))

    def writer(base: int) -> None:
        for n in range(50):
            store.save(_incident(base + n))

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    final = _seqs(store.changed_since(0, limit=10_000))
    assert len(final) == len(set(final)) == 200
    for snapshot in seen:  # each a prefix of the final order: nothing filled in below later
        assert snapshot == final[:len(snapshot)]


def test_only_more_evidence_is_not_news_until_refresh(tmp_path):
    """A firing incident is saved on every evaluation with one more piece of evidence: that is
    numbered again only every `refresh`; anything else about it is numbered at once."""
    store = IncidentStore(tmp_path / "i.db", refresh_s=10)
    incident = _incident(1, updated_s=100)
    store.save(incident)
    [first] = store.changed_since(0)
    for t in range(101, 110):  # nine evaluations within the refresh
        incident.add_evidence(Evidence(t * S, 1.0, 0.5))
        incident.updated_ns = t * S
        store.save(incident)
    assert store.changed_since(first.seq) == []
    assert len(store.get("inc-1").evidence) == 9  # the row itself is the latest
    incident.annotations["acknowledged_by"] = "sre"  # news
    store.save(incident)
    [acked] = store.changed_since(first.seq)
    assert acked.incident.annotations["acknowledged_by"] == "sre"
    incident.updated_ns = 120 * S  # the refresh is due
    incident.add_evidence(Evidence(120 * S, 2.0, 0.5))
    store.save(incident)
    [refreshed] = store.changed_since(acked.seq)
    assert refreshed.incident.evidence[-1].value == 2.0


def test_a_deletion_is_a_change_and_only_the_owner_deletes(tmp_path):
    store = IncidentStore(tmp_path / "i.db")
    store.save(_incident(1, PENDING))
    store.save(_incident(2, node="node-b"))
    assert not store.delete("inc-2", node="node-a")  # another node's: left alone
    assert store.get("inc-2") is not None
    assert not store.delete("nope")
    assert store.delete("inc-1", node="node-a")
    changes = store.changed_since(0, node="node-a")
    assert [(c.id, c.incident) for c in changes] == [("inc-1", None)]
    assert store.count_changed_since(0, node="node-a") == 1
    # tombstones go with retention
    store.prune(resolved_before_ns=2**62)
    assert store.changed_since(0, node="node-a") == []


def test_an_older_file_keeps_its_numbers(tmp_path):
    """incidents.db written by a version that numbered changes in `incidents.seq`: each keeps its
    number (a forwarder's cursor counts in those), one saved before numbering gets a new one."""
    path = tmp_path / "i.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE incidents (id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, state TEXT NOT "
        "NULL, severity TEXT NOT NULL, rule TEXT NOT NULL, node TEXT NOT NULL, started_ns "
        "INTEGER NOT NULL, updated_ns INTEGER NOT NULL, doc TEXT NOT NULL, seq INTEGER NOT NULL "
        "DEFAULT 0);")
    for n, seq in ((1, 0), (2, 5), (3, 7)):
        i = _incident(n)
        conn.execute("INSERT INTO incidents VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (i.id, i.fingerprint, i.state, i.severity, i.rule, i.node, i.started_ns,
                      i.updated_ns, json.dumps(i.to_dict()), seq))
    conn.commit()
    conn.close()
    store = IncidentStore(path)
    assert [(c.seq, c.id) for c in store.changed_since(0)] == [
        (5, "inc-2"), (7, "inc-3"), (8, "inc-1")]
    assert [c.id for c in store.changed_since(5)] == ["inc-3", "inc-1"]
    store.close()
    assert [c.seq for c in IncidentStore(path).changed_since(0)] == [5, 7, 8]  # once only
