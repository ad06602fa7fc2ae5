"""The filters, order and page size of the two lists the UI pages through (the incidents and
the audit log) as one SQL text for both stores: the agent's SQLite files and the cluster
server's PostgreSQL. Written once so that a filter, or the keyset cursor and the order it
depends on, cannot come to mean one thing on a node and another on the server; only the
placeholder differs (sqlite3 takes `?`, psycopg `%s`).

Values travel only as parameters; the column names are the literals here, never input.
"""

from __future__ import annotations

from typing import Literal

Placeholder = Literal["?", "%s"]
# The incident list's comparisons, in the order of incident_page's arguments: a fixed set, so
# no caller can name a column or an operator.
_INCIDENT_FILTERS = ("state =", "severity =", "rule =", "node =", "started_ns >=",
                     "started_ns <")


def _mark(placeholder: str) -> str:
    """The placeholder is pasted into the SQL text: refuse anything but the two there are."""
    if placeholder not in ("?", "%s"):
        raise ValueError(f"placeholder {placeholder!r}: '?' (sqlite3) or '%s' (psycopg)")
    return placeholder


def incident_page(placeholder: Placeholder, limit: int, *, state: str | None = None,
                  severity: str | None = None, rule: str | None = None,
                  node: str | None = None, since_ns: int | None = None,
                  until_ns: int | None = None, before: tuple[int, str] | None = None,
                  ) -> tuple[str, list[object]]:
    """The tail of `SELECT ... FROM incidents` for cluster_db.IncidentReader.query, and its
    parameters. A filter given as "" matches "" (only None leaves it out). The cursor
    `before` is the (started_ns, id) the previous page ended on; it is only right with the
    order given here, which is why the order comes with it."""
    p = _mark(placeholder)
    clauses: list[str] = []
    params: list[object] = []
    values = (state, severity, rule, node, since_ns, until_ns)
    for comparison, value in zip(_INCIDENT_FILTERS, values, strict=True):
        if value is not None:
            clauses.append(f"{comparison} {p}")
            params.append(value)
    if before is not None:
        clauses.append(f"(started_ns, id) < ({p}, {p})")
        params.extend(before)
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    return f"{where}ORDER BY started_ns DESC, id DESC LIMIT {p}", [*params, limit]


def audit_page(placeholder: Placeholder, limit: int, *, since_ns: int = 0,
               kind: str | None = None, incident: str | None = None,
               ) -> tuple[str, list[object]]:
    """The tail of `SELECT ... FROM audit` for cluster_db.AuditReader.audit_log, and its
    parameters: newest (highest id) first. Unlike the incidents' filters, an empty `kind` or
    `incident` leaves the filter out, as /api/actions?step= always has."""
    p = _mark(placeholder)
    clauses = [f"time_ns >= {p}"]
    params: list[object] = [since_ns]
    if kind:
        clauses.append(f"kind = {p}")
        params.append(kind)
    if incident:
        clauses.append(f"incident = {p}")
        params.append(incident)
    return f"WHERE {' AND '.join(clauses)} ORDER BY id DESC LIMIT {p}", [*params, limit]
