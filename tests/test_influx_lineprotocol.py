"""Line protocol and InfluxQL quoting against the documented rules (no server here; the real
round trips are in test_influx_store.py)."""

from __future__ import annotations

import math

import pytest

from sloguard.core.samples import Sample
from sloguard.core.selectors import Matcher
from sloguard.store import WindowQuery
from sloguard.store.influx_lineprotocol import (
    LineEncoder,
    LineRejected,
    escape_key,
    escape_measurement,
    escape_string_field,
)
from sloguard.store.influx_query import quote_ident, quote_string, regex_literal, select_statement
from sloguard.store.influx_write import classify, parse_retry_after, path_for_version, redact_url


def test_escaping_follows_the_reference():
    # measurement: comma and space; keys and tag values: comma, equals sign and space
    assert escape_measurement("cpu load,x=1") == "cpu\\ load\\,x=1"
    assert escape_key("a b,c=d") == "a\\ b\\,c\\=d"
    # quotes, backslashes (not before a special character) and unicode are literal in tags
    assert escape_key('say "hi"') == 'say\\ "hi"'
    assert escape_key("C:\\dir") == "C:\\dir"
    assert escape_key("ünï😀") == "ünï😀"
    # string field values: double quotes and backslashes escaped, in double quotes
    assert escape_string_field('a "b" \\c') == '"a \\"b\\" \\\\c"'


@pytest.mark.parametrize("value, reason", [
    ("two\nlines", "newline"),
    ("carriage\rreturn", "newline"),
    ("ends with \\", "backslash"),
    ("back\\,comma", "backslash"),
    ("back\\ space", "backslash"),
    ("back\\=equals", "backslash"),
    ("", "empty"),
])
def test_what_cannot_be_written_is_rejected_with_a_reason(value, reason):
    with pytest.raises(LineRejected) as err:
        escape_key(value)
    assert err.value.reason == reason


def test_lines_and_values():
    encoder = LineEncoder()
    line = encoder.line(Sample("m", {"b": "2", "a": "x y", "empty": ""},
                               {"f": 1.5, "i": 3, "ok": True, "s": 'q"', "nan": math.nan},
                               1_700_000_000_123_456_789))
    # tags sorted, empty tag left out, ints as floats (no `i`), NaN left out, ns timestamp
    assert line == 'm,a=x\\ y,b=2 f=1.5,i=3,ok=true,s="q\\"" 1700000000123456789'
    assert encoder.skipped_values == 1
    with pytest.raises(LineRejected) as err:
        encoder.line(Sample("m", {}, {"nan": math.inf}, 1))
    assert err.value.reason == "no_fields"
    with pytest.raises(LineRejected) as err:
        encoder.line(Sample("m", {"time": "x"}, {"v": 1.0}, 1))
    assert err.value.reason == "reserved"
    lines, rejected = encoder.encode([Sample("m", {"t": "ok"}, {"v": 1.0}, 1),
                                      Sample("m", {"t": "bad\n"}, {"v": 1.0}, 2)])
    assert lines == ["m,t=ok v=1.0 1"] and rejected[0][1].reason == "newline"
    # the fast path (numbers only) and the general path agree
    fast = encoder.line(Sample("m", {"t": "x"}, {"a": 1.25, "b": 7, "c": -1e-300}, 5))
    slow = encoder.line(Sample("m", {"t": "x"}, {"a": 1.25, "b": 7, "c": -1e-300, "d": True},
                               5))
    assert fast == "m,t=x a=1.25,b=7,c=-1e-300 5" and slow == fast.replace(" 5", ",d=true 5")


def test_cached_templates_never_mix_series():
    encoder = LineEncoder()
    one = Sample("m", {"a": "b"}, {"c": 1.0}, 1)
    other = Sample("m", {}, {"a": 2.0, "b": 3.0, "c": 4.0}, 1)
    reordered = Sample("m", {"b": "a"}, {"c": 1.0}, 1)
    for _ in range(2):  # the second pass takes the cached fast path
        lines, rejected = encoder.encode([one, other, reordered])
        assert not rejected
        assert lines == ["m,a=b c=1.0 1", "m a=2.0,b=3.0,c=4.0 1", "m,b=a c=1.0 1"]


def test_influxql_quoting():
    assert quote_ident('we"ird\\') == '"we\\"ird\\\\"'
    assert quote_string("x' OR 'a'='a") == "'x\\' OR \\'a\\'=\\'a'"
    assert quote_string("a\nb\\") == "'a\\nb\\\\'"
    # every slash escaped, anchored, and a trailing backslash never reaches the closing slash
    assert regex_literal("a/b") == "/^(?:a\\/b)$/"
    assert regex_literal("a\\/b") == "/^(?:a\\/b)$/"
    assert regex_literal("x\\\\") == "/^(?:x\\\\)$/"
    statement = select_statement(WindowQuery(
        "container_cpu", 10, 20, fields=("usage_cores",),
        matchers=(Matcher("pod", "=", "a'b"), Matcher("ns", "!~", "kube-.*")),
        every_ns=5_000_000_000, agg="p99.9"), ["usage_cores"])
    assert statement == (
        'SELECT PERCENTILE("usage_cores", 99.9) AS "usage_cores" FROM "container_cpu" '
        "WHERE time >= 10 AND time < 20 AND \"pod\" = 'a\\'b' AND \"ns\" !~ /^(?:kube-.*)$/ "
        "GROUP BY time(5000000000ns), * fill(none)")


def test_write_outcomes_and_version_choice():
    assert classify(204, "", None).ok
    assert classify(503, "busy", "7").retryable and classify(503, "", "7").retry_after == 7.0
    assert classify(429, "", None).retryable
    assert classify(401, "auth", None).retryable  # kept for when the token is fixed
    assert classify(404, "database not found", None).retryable
    refused = classify(400, "partial write: field type conflict dropped=3", None)
    assert not refused.retryable and refused.dropped_points == 3
    assert classify(413, "", None).too_large
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None
    assert path_for_version("1.6.7~rc0") == "v1"
    assert path_for_version("1.8.10") == "v2"
    assert path_for_version("v2.7.4") == "v2"
    assert path_for_version("3.0.1") == "v2"
    assert path_for_version("") == "v1"
    assert redact_url("http://u:secret@h:8086/x") == "http://***@h:8086/x"


def test_gzip_auto_compresses_unless_the_server_is_on_loopback():
    from sloguard.store.config import StoreConfig
    from sloguard.store.influx import wants_gzip

    def gz(url: str, setting: bool | str = "auto") -> bool:
        return wants_gzip(StoreConfig(kind="influxdb", url=url, bucket="b", gzip=setting))

    assert not gz("http://127.0.0.1:8086") and not gz("http://localhost:8086")
    assert not gz("http://[::1]:8086") and not gz("http://127.8.9.10")
    assert gz("https://influx.example.net") and gz("http://10.1.2.3:8086")
    assert gz("http://127.0.0.1:8086", True) and not gz("https://influx.example.net", False)


def test_backoff_grows_with_jitter_and_honours_retry_after(tmp_path):
    """The writer's own retry schedule (no server involved: nothing listens on the port)."""
    import time

    from support.influxenv import free_port

    from sloguard.store import StoreError, WindowQuery
    from sloguard.store.config import StoreConfig
    from sloguard.store.influx import InfluxStore
    from sloguard.store.influx_write import SendResult

    cfg = StoreConfig(kind="influxdb", url=f"http://127.0.0.1:{free_port()}", database="x",
                      api="v1", max_backoff=8, timeout=1)
    store = InfluxStore(cfg, tmp_path / "d")
    try:
        failing = SendResult(False, retryable=True, message="HTTP 503: busy")
        waits = []
        for _ in range(8):
            store._backoff(failing)
            waits.append(store._next_attempt - time.monotonic())
        assert 0.4 < waits[0] <= 1.0 and all(w <= 8.0 for w in waits)
        assert waits[-1] >= 4.0 - 0.1  # capped at max_backoff, at least half of it
        assert len({round(w, 3) for w in waits[4:]}) > 1  # jitter
        store._backoff(SendResult(False, retryable=True, retry_after=20.0))
        assert store._next_attempt - time.monotonic() >= 19.9  # Retry-After beats the cap
        assert "503" in store.status().reason or store.status().reason
        # a server that cannot be reached is not asked again for every read at once
        started = time.monotonic()
        for _ in range(5):
            with pytest.raises(StoreError):
                store.read_samples(WindowQuery("m", 0, 1, fields=("v",)))
        assert time.monotonic() - started < 1.5
    finally:
        store.close()
