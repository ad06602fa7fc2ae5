"""Windows read back through InfluxQL on the 1.x /query endpoint, into the embedded store's shape.

InfluxQL over /query is the one read path every current InfluxDB serves: 1.x natively, 2.4+
through DBRP mappings, 3.x natively (Flux exists on neither 1.x before 1.7 nor 3.x). The frame
it returns must be indistinguishable from `EmbeddedStore.read()`'s: `time` (datetime64[ns, UTC]),
one column per tag key, one float column per field, sorted by time then tags.

Everything that comes from a rule or a series goes into the query escaped, never pasted:

- identifiers (measurement, fields, tag keys, database, retention policy) in double quotes,
  with backslash, double quote and newline escaped;
- string literals in single quotes, with backslash, single quote and newline escaped;
- regexes as `/^(?:...)$/` literals (anchored as selectors are), every `/` escaped and
  newlines written as `\\n`; the parser passes other backslash sequences through, and the
  anchor `$` keeps a trailing backslash away from the closing slash.

A pod named `x' OR "a"='a` is then a string that matches no pod, not a second condition.
Regexes run on the server's engine (Go RE2): Python-only constructs such as lookarounds come
back as a query error. PERCENTILE is InfluxQL's nearest-rank percentile, where the embedded
store interpolates; the two can differ between neighbouring samples.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import urllib3

from sloguard.core.percentiles import parse_percentile
from sloguard.core.samples import Sample
from sloguard.core.selectors import Matcher
from sloguard.store import StoreError, WindowQuery, check_aggregation
from sloguard.store.influx_write import Credentials, http_pool, redact_url, timeout_of

if TYPE_CHECKING:
    import pandas as pd

UNREACHABLE_PAUSE_S = 10.0
_FUNCTIONS = {"mean": "MEAN", "min": "MIN", "max": "MAX", "sum": "SUM", "count": "COUNT",
              "first": "FIRST", "last": "LAST", "median": "MEDIAN"}


def quote_ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def quote_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def regex_literal(pattern: str) -> str:
    """`/^(?:pattern)$/` that the InfluxQL scanner turns back into an equivalent regex."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append("\\/" if nxt == "/" else "\\n" if nxt == "\n" else "\\" + nxt)
            i += 2
            continue
        out.append("\\/" if ch == "/" else "\\n" if ch == "\n" else "\\r" if ch == "\r" else ch)
        i += 1
    return "/^(?:" + "".join(out) + ")$/"


def condition(matcher: Matcher) -> str:
    key = quote_ident(matcher.key)
    if matcher.op in ("=", "!="):
        return f"{key} {matcher.op} {quote_string(matcher.value)}"
    return f"{key} {matcher.op} {regex_literal(matcher.value)}"


def select_statement(query: WindowQuery, fields: list[str]) -> str:
    """The InfluxQL for one window: raw, or aggregated per `every_ns` (empty buckets left out).

    The database and retention policy go in the request's `db` and `rp` parameters rather than
    the FROM clause, which InfluxDB 3's InfluxQL does not accept qualified.
    """
    agg = check_aggregation(query.agg)
    where = " AND ".join([f"time >= {int(query.start_ns)}", f"time < {int(query.end_ns)}",
                          *(condition(m) for m in query.matchers)])
    src = quote_ident(query.measurement)
    if not query.every_ns:
        cols = ", ".join(quote_ident(f) for f in fields)
        return f"SELECT {cols} FROM {src} WHERE {where} GROUP BY *"
    if agg in _FUNCTIONS:
        calls = [f"{_FUNCTIONS[agg]}({quote_ident(f)}) AS {quote_ident(f)}" for f in fields]
    else:
        q = round(parse_percentile(agg) * 100, 9)
        calls = [f"PERCENTILE({quote_ident(f)}, {q!r}) AS {quote_ident(f)}" for f in fields]
    return (f"SELECT {', '.join(calls)} FROM {src} WHERE {where} "
            f"GROUP BY time({int(query.every_ns)}ns), * fill(none)")


class QueryClient:
    """POST /query?db=&epoch=ns; InfluxQL errors and HTTP errors become StoreError."""

    def __init__(self, creds: Credentials, timeout_s: float, verify_tls: bool) -> None:
        self.creds = creds
        self._url = creds.url.rstrip("/") + "/query"
        self._headers = creds.auth_headers()
        self._timeout = timeout_of(timeout_s)
        self._http = http_pool(verify_tls)
        self._down_until = 0.0
        self._down_reason = ""

    def run(self, statement: str) -> list[dict[str, Any]]:
        """The series of the statement's result (one dict per series).

        A server that could not be reached is not tried again for UNREACHABLE_PAUSE_S: the
        agent backfills one window per rule signal at start, and each would otherwise wait for
        its own connect timeout.
        """
        if time.monotonic() < self._down_until:
            raise StoreError(self._down_reason)
        fields = {"db": self.creds.db, "q": statement, "epoch": "ns"}
        if self.creds.retention_policy:
            fields["rp"] = self.creds.retention_policy
        try:
            response = self._http.request_encode_body(
                "POST", self._url, fields=fields, headers=self._headers,
                encode_multipart=False, timeout=self._timeout)
        except urllib3.exceptions.HTTPError as exc:
            self._down_reason = f"InfluxDB {redact_url(self.creds.url)}: cannot query: {exc}"
            self._down_until = time.monotonic() + UNREACHABLE_PAUSE_S
            raise StoreError(self._down_reason) from exc
        try:
            body = json.loads(response.data or b"{}")
        except ValueError:
            body = {}
        error = body.get("error") or next(
            (r.get("error") for r in body.get("results", []) if r.get("error")), None)
        if response.status != 200 or error:
            raise StoreError(f"InfluxDB {redact_url(self.creds.url)}: query failed "
                             f"(HTTP {response.status}): {error or response.data[:300]!r}")
        results = body.get("results") or [{}]
        return results[0].get("series") or []

    def field_keys(self, measurement: str) -> list[tuple[str, str]]:
        """(field, type) of a measurement, sorted by field name."""
        series = self.run(f"SHOW FIELD KEYS FROM {quote_ident(measurement)}")
        return sorted((name, kind) for s in series for name, kind in s.get("values") or [])

    def close(self) -> None:
        self._http.clear()


def _number(value: Any) -> float:
    if value is None or isinstance(value, str):
        return float("nan")
    return float(value)


def to_frame(series: list[dict[str, Any]], fields: list[str], drop_empty: bool) -> pd.DataFrame:
    """The embedded store's frame from /query series: time, tag columns, float fields.

    `GROUP BY *` reports every tag key of the measurement, with "" for a series without it;
    keys that no returned series has are left out, as the embedded store leaves them out.
    With `drop_empty` (no fields were asked for), fields without any value are left out too.
    """
    import numpy as np
    import pandas as pd

    times: list[np.ndarray] = []
    tag_rows: list[tuple[dict[str, str], int]] = []
    columns: dict[str, list[np.ndarray]] = {f: [] for f in fields}
    for s in series:
        values = s.get("values") or []
        if not values:
            continue
        names = s["columns"]
        index = {name: i for i, name in enumerate(names)}
        data = list(zip(*values, strict=True))
        times.append(np.asarray(data[0], dtype="int64"))
        for f in fields:
            col = data[index[f]] if f in index else (None,) * len(values)
            columns[f].append(np.fromiter((_number(v) for v in col), dtype=float,
                                          count=len(values)))
        tag_rows.append((s.get("tags") or {}, len(values)))
    tag_keys = sorted({k for tags, _ in tag_rows for k, v in tags.items() if v != ""})
    ts = np.concatenate(times) if times else np.asarray([], dtype="int64")
    out = pd.DataFrame({"time": pd.to_datetime(ts, unit="ns", utc=True)})
    for key in tag_keys:
        out[key] = np.repeat(np.asarray([tags.get(key, "") for tags, _ in tag_rows], dtype=object),
                             [n for _, n in tag_rows]) if tag_rows else []
    for f in fields:
        values = np.concatenate(columns[f]) if columns[f] else np.asarray([], dtype=float)
        if drop_empty and np.isnan(values).all():
            continue
        out[f] = values
    return out.sort_values(["time", *tag_keys], kind="stable").reset_index(drop=True)


def to_samples(measurement: str, series: list[dict[str, Any]]) -> list[Sample]:
    """Raw rows as samples, oldest first; tags without a value are left out (as written)."""
    out: list[Sample] = []
    for s in series:
        tags = {k: v for k, v in (s.get("tags") or {}).items() if v != ""}
        names = s["columns"][1:]
        for row in s.get("values") or []:
            fields = {name: (float(v) if isinstance(v, int | float) and not isinstance(v, bool)
                             else v)
                      for name, v in zip(names, row[1:], strict=True) if v is not None}
            if fields:
                out.append(Sample(measurement, dict(tags), fields, int(row[0])))
    out.sort(key=lambda sample: sample.time_ns)
    return out
