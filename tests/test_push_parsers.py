"""Every parser of outside input (line protocol, JSON observations, scraped exposition pages)
answers any text with its documented error or a result, never another exception (which the API
would turn into a 500), and takes time linear in the input: doubling an adversarial input
doubles the time, it does not quadruple it.

Time is compared within the run (no absolute figure): the CPU time of this thread (not the wall
clock, which other processes on a shared machine stretch at random) for 4N KB of an adversarial
input against N KB of the same, each the best of five rounds. A linear parser comes out at about
4, a quadratic one at about 16; the bound is 10.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloguard.collectors.app_latency import AppLatencyCollector
from sloguard.collectors.config import AppLatencyConfig, SloConfig
from sloguard.collectors.exposition import OPENMETRICS, ExpositionError, ReadSpec, read
from sloguard.ui import receive
from sloguard.ui.line_protocol import LineProtocolError, parse_lines
from sloguard.ui.receive import receive_router

TOKEN = "fuzz-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LINEAR = 10.0  # 4N against N: ~4 when linear (up to ~6 seen on a loaded machine), ~16 quadratic
EXAMPLES = 300
# The figures of the fuzz runs, printed at the end (docs/reliability.md quotes them).
FIGURES: dict[str, dict[str, list[float] | int]] = {}


def _note(name: str, size: int, seconds: float, failed: bool) -> None:
    """Count an example; CPU time per KB is taken over at least 1 KB (tiny examples are all
    constant overhead)."""
    figures = FIGURES.setdefault(name, {"examples": 0, "exceptions": 0, "per_kb": []})
    figures["examples"] += 1
    figures["exceptions"] += failed
    figures["per_kb"].append(seconds * 1000 / max(size / 1024, 1.0))


@pytest.fixture(scope="module", autouse=True)
def _print_figures():
    yield
    for name, figures in sorted(FIGURES.items()):
        per_kb = sorted(figures["per_kb"])
        print(f"\nfuzz {name}: {figures['examples']} examples, {figures['exceptions']} "
              f"undocumented exceptions, CPU ms per KB: median {per_kb[len(per_kb) // 2]:.3f}, "
              f"worst {per_kb[-1]:.3f}")


def cost(work: Callable[[], object]) -> float:
    """CPU seconds of this thread per call: the best of five rounds of at least 0.05 s."""
    number, total = 1, 0.0
    while True:
        started = time.thread_time()
        for _ in range(number):
            work()
        total = time.thread_time() - started
        if total >= 0.05:
            break
        number *= 2
    rounds = [total]
    for _ in range(4):
        started = time.thread_time()
        for _ in range(number):
            work()
        rounds.append(time.thread_time() - started)
    return min(rounds) / number


def growth(make: Callable[[int], str], parse: Callable[[str], object], kb: int) -> float:
    """How much longer 4 * kb KB of `make`'s input takes than kb KB."""
    small, large = make(kb * 1024), make(4 * kb * 1024)
    return cost(lambda: parse(large)) / cost(lambda: parse(small))


# -- line protocol ----------------------------------------------------------------------------

LP_ALPHABET = [*'am ,=\\"01.9eE-+iutTfF\n\r#²٣x_', "app_latency", "service=", "p99="]


def _lp(text: str) -> None:
    with contextlib.suppress(LineProtocolError):
        parse_lines(text)


def _repeat(unit: str, size: int) -> str:
    return unit * (size // len(unit) + 1)


LP_ADVERSARIAL = {
    "digits then x": lambda n: "m f=" + "1" * n + "x",
    "digits with a dot then x": lambda n: "m f=" + "1" * (n // 2) + "." + "1" * (n // 2) + "x",
    "digits as an integer": lambda n: "m f=" + "1" * n + "i",
    "digits as a timestamp": lambda n: "m f=1 " + "1" * n,
    "zeros as a timestamp": lambda n: "m f=1 " + "0" * n + "1",
    "exponent digits": lambda n: "m f=1e" + "9" * n + "x",
    "escaped tag value": lambda n: "m,t=" + _repeat("\\,", n)[:n] + " f=1",
    "tags": lambda n: "m" + _repeat(",t=v", n)[:n] + " f=1",
    "fields": lambda n: "m " + _repeat("f=1,", n)[:n] + "f=1",
    "escaped string": lambda n: 'm f="' + _repeat('\\"', n)[:n] + '"',
    "lines": lambda n: _repeat("app_latency,service=a p99=1.5,requests=3i 1\n", n),
}


@pytest.mark.parametrize("name", sorted(LP_ADVERSARIAL))
def test_line_protocol_time_is_linear(name):
    ratio = growth(LP_ADVERSARIAL[name], _lp, 2)
    print(f"\nline protocol, {name}: 8 KB / 2 KB = {ratio:.2f}x CPU time")
    assert ratio < LINEAR, f"{name}: 8 KB took {ratio:.1f}x as long as 2 KB"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(LP_ALPHABET), max_size=400).map("".join),
       st.sampled_from(["ns", "us", "ms", "s"]))
def test_line_protocol_raises_only_its_own_error(text, precision):
    started = time.process_time()
    failed = False
    try:
        points = parse_lines(text, precision)
    except LineProtocolError as exc:
        assert str(exc).startswith("line ") or "precision" in str(exc)
    except Exception:
        failed = True
        raise
    else:
        for point in points:  # what it accepts, a store can take
            assert point.time_ns is None or -(2**63) <= point.time_ns < 2**63
            for value in point.fields.values():
                assert not isinstance(value, int) or -(2**63) <= value < 2**64
    finally:
        _note("line protocol", len(text.encode()), time.process_time() - started, failed)


def test_superscript_and_other_unicode_digits_are_a_400_not_a_500():
    for line, message in [("m f=1 ²", "timestamp must be an integer"),
                          ("m f=1 ٣", "timestamp must be an integer"),
                          ("m f=٣", "is not a number"),
                          ("m f=²i", "is not a number"),
                          ("m f=1 " + "1" * 5000, "out of range"),
                          ("m f=" + "1" * 5000 + "i", "out of range for a 64-bit signed"),
                          ("m f=18446744073709551616u", "out of range for a 64-bit unsigned"),
                          ("m f=1 9223372036854775808", "out of range"),
                          ("m f=1 9223372037", "out of range")]:
        with pytest.raises(LineProtocolError, match=message):
            parse_lines(line, "s" if line.endswith("9223372037") else "ns")


# -- the receive endpoints, in process --------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    cfg = AppLatencyConfig.model_validate({"receive": {
        "enabled": True, "token": TOKEN, "max_series": 1_000_000,
        "measurements": ["app_latency", "m"]}})
    slo = SloConfig.model_validate({"service": "web", "latency_ms": 100})
    collector = AppLatencyCollector("fuzz-node", cfg, [slo])
    app = FastAPI()
    app.include_router(receive_router(collector, cfg.receive, "fuzz-node"))
    with TestClient(app) as test_client:  # re-raises what the app does not handle
        test_client.collector = collector
        yield test_client


def _post(client, path: str, body: bytes, name: str, allowed: set[int]) -> None:
    started = time.process_time()
    failed = True
    try:
        answer = client.post(path, content=body, headers=AUTH)
        assert answer.status_code in allowed, (answer.status_code, answer.text[:300])
        failed = False
    finally:
        _note(name, len(body), time.process_time() - started, failed)
        client.collector.collect(time.time_ns())  # drain what was accepted


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(LP_ALPHABET), max_size=400).map("".join))
def test_write_answers_204_or_a_400(client, text):
    _post(client, "/api/v1/write", text.encode(), "POST /api/v1/write", {204, 400})


NOW = time.time_ns()
WEIRD_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
    st.sampled_from(["²", "1e400", "-0", "NaN", "١٢", "", "0x10"]), st.booleans(), st.none())
OBSERVATION = st.fixed_dictionaries({}, optional={
    "service": st.one_of(st.text(max_size=20), st.integers()),
    "namespace": st.text(max_size=10), "pod": st.text(max_size=10),
    "target": st.text(max_size=10), "class": st.sampled_from(["LS", "BE", "XX", 1]),
    "time_ns": st.one_of(WEIRD_NUMBERS, st.integers(NOW - 10**12, NOW + 10**12)),
    "latency_ms": st.lists(WEIRD_NUMBERS, max_size=5),
    "histogram": st.fixed_dictionaries({}, optional={
        "bounds_ms": st.lists(WEIRD_NUMBERS, max_size=4),
        "counts": st.lists(WEIRD_NUMBERS, max_size=5)}),
    "percentiles": st.dictionaries(st.sampled_from(["p99", "p50", "p²", "p", "x", "p100"]),
                                   WEIRD_NUMBERS, max_size=3),
    "requests": WEIRD_NUMBERS, "errors": WEIRD_NUMBERS, "interval_s": WEIRD_NUMBERS,
    "extra": st.just(1),
})
JSON_NOISE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=5)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3), max_leaves=20)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(
    st.fixed_dictionaries({"observations": st.lists(OBSERVATION, max_size=3)}).map(json.dumps),
    JSON_NOISE.map(json.dumps),
    st.sampled_from(["[" * 100_000, "{" * 50_000, '{"observations": [' * 20_000,
                     '{"observations": 1e999999}', "\ud800", '"\\ud800"']),
    st.binary(max_size=50).map(lambda b: b.decode("latin-1"))))
def test_observations_answer_200_or_a_4xx(client, body):
    _post(client, "/api/v1/observations", body.encode("utf-8", "surrogatepass"),
          "POST /api/v1/observations", {200, 400, 422})


# -- scraped exposition pages -----------------------------------------------------------------

EXPOSITION_PARTS = [
    "# TYPE ", "# HELP ", "# EOF\n", "histogram", "summary", "counter", "gauge", "untyped",
    "rpc_seconds", "_bucket", "_count", "_sum", "_created", "_total", "{", "}", "=", '"', ",",
    "le", "quantile", "code", "500", "+Inf", "-Inf", "NaN", "0.5", "1", "1e3", "-2", " ", "\n",
    "\\", "\\n", "\\\"", "\t", "²", "# ", "http_requests",
]
SPEC = ReadSpec()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(EXPOSITION_PARTS), max_size=200).map("".join),
       st.sampled_from(["text/plain; version=0.0.4", f"{OPENMETRICS}; version=1.0.0"]))
def test_exposition_raises_only_its_own_error(text, content_type):
    started = time.process_time()
    failed = False
    try:
        read(text, content_type, SPEC)
    except ExpositionError:
        pass
    except Exception:
        failed = True
        raise
    finally:
        _note("exposition", len(text.encode()), time.process_time() - started, failed)


HISTOGRAM = ("# TYPE rpc_seconds histogram\n"
             'rpc_seconds_bucket{le="0.1"} 1\nrpc_seconds_bucket{le="+Inf"} 2\n'
             "rpc_seconds_count 2\nrpc_seconds_sum 0.3\n")
TIGHT = ReadSpec(max_series=10**7, max_labels=8, max_label_length=256)  # lines of <= 8 KiB


def _page_of(line: str) -> Callable[[int], str]:
    return lambda n: HISTOGRAM + _repeat(line, n)


def _line_of_labels(n: int) -> str:
    """Lines as long as TIGHT allows, each with as many tiny labels as fit."""
    labels = "".join(f'l{i}="b",' for i in range(TIGHT.max_line // 6))  # distinct names
    line = "m{" + labels[:TIGHT.max_line - 20].rsplit(",", 1)[0] + "} 1\n"
    return HISTOGRAM + _repeat(line, n)


EXPOSITION_ADVERSARIAL = {
    "counter families": lambda n: HISTOGRAM + "".join(
        f'# TYPE c{i} counter\nc{i}_total{{code="500"}} 1\n' for i in range(n // 40)),
    "histogram series": _page_of('rpc_seconds_bucket{le="0.1",p="1"} 1\n'),
    "labels per line": _line_of_labels,
    "escaped label values": lambda n: HISTOGRAM + _repeat(
        'm{a="' + "\\\"" * 100 + '"} 1\n', n),
    "one long line": lambda n: HISTOGRAM + "m{" + "a" * n + "} 1\n",
}


@pytest.mark.parametrize("name", sorted(EXPOSITION_ADVERSARIAL))
def test_exposition_time_is_linear(name):
    def parse(text: str) -> None:
        with contextlib.suppress(ExpositionError):
            read(text, "text/plain", TIGHT)

    ratio = growth(EXPOSITION_ADVERSARIAL[name], parse, 64)
    print(f"\nexposition, {name}: 256 KB / 64 KB = {ratio:.2f}x CPU time")
    assert ratio < LINEAR, f"{name}: 256 KB took {ratio:.1f}x as long as 64 KB"


def test_scraped_pages_over_the_bounds_are_errors_that_name_the_bound():
    spec = ReadSpec(max_series=5, max_labels=2, max_label_length=16)
    with pytest.raises(ExpositionError, match=r"more than 5 series .*app_latency\.max_series"):
        read(HISTOGRAM + "a 1\nb 1\n", "", spec)
    with pytest.raises(ExpositionError, match=r"3 labels, more than app_latency\.max_labels"):
        read(HISTOGRAM.replace('{le="0.1"}', '{le="0.1",a="1",b="2"}'), "", spec)
    with pytest.raises(ExpositionError, match=r"longer than app_latency\.max_label_length"):
        read(HISTOGRAM.replace('{le="0.1"}', '{le="0.1",a="' + "x" * 17 + '"}'), "", spec)
    with pytest.raises(ExpositionError, match=r"line 6 has \d+ characters"):
        read(HISTOGRAM + "m " + "1" * spec.max_line + "\n", "", spec)


def test_only_bodies_over_inline_body_are_parsed_in_a_worker_thread(client, monkeypatch):
    """A small push is parsed on the event loop: the thread hop cost more than the parsing
    (issue #23). A large one must not hold the loop up, so it goes to a worker thread."""
    hops: list[str] = []

    async def counting(call, *args):
        hops.append(call.__name__)
        return call(*args)

    monkeypatch.setattr(receive, "run_in_threadpool", counting)
    lines = "".join(f"m,host=a v={i}\n" for i in range(1000)).encode()
    values = json.dumps({"observations": [{"service": "web",
                                           "latency_ms": [1.5] * 3000}]}).encode()
    assert len(lines) > receive.INLINE_BODY and len(values) > receive.INLINE_BODY
    for path, small, large in (("/api/v1/write", b"m,host=a v=1\n", lines),
                               ("/api/v1/observations", values[:60] + b"]}]}", values)):
        for body in (small, large):
            answer = client.post(path, content=body, headers=AUTH)
            assert answer.status_code in (200, 204), answer.text
    assert hops == ["parse_lines", "model_validate"]
    client.collector.collect(time.time_ns())
