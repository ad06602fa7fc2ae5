"""What outside input costs to parse: adversarial bodies against a normal one of the same size.

The three parsers of outside input (line protocol on /api/v1/write, JSON observations on
/api/v1/observations, exposition pages of scraped targets) are timed on bodies built to be
slow (long digit runs, escapes, many labels or counters per line...) and on an ordinary body of
the same size, in the same run. Times are this thread's CPU time (other processes on a shared
machine stretch the wall clock, not this), the best of five rounds. Printed: CPU ms per KB and
the ratio to the normal body; then how the cost grows from N to 4N KB (about 4 when linear,
16 when quadratic).

    .venv/bin/python benchmarks/parse_cost.py [--kb 64]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable

from pydantic import ValidationError

from sloguard.collectors.exposition import ExpositionError, ReadSpec, read
from sloguard.ui.line_protocol import LineProtocolError, parse_lines
from sloguard.ui.receive import ObservationBatchIn

HISTOGRAM = ("# TYPE rpc_seconds histogram\n"
             'rpc_seconds_bucket{le="0.1"} 1\nrpc_seconds_bucket{le="+Inf"} 2\n'
             "rpc_seconds_count 2\nrpc_seconds_sum 0.3\n")
SPEC = ReadSpec(max_series=10**7)


def repeat(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def cost(work: Callable[[], object]) -> float:
    """CPU seconds of this thread per call, best of five rounds of at least 0.05 s."""
    number = 1
    while True:
        started = time.thread_time()
        for _ in range(number):
            work()
        if time.thread_time() - started >= 0.05:
            break
        number *= 2
    rounds = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(number):
            work()
        rounds.append(time.thread_time() - started)
    return min(rounds) / number


def line_protocol(text: str) -> None:
    with contextlib.suppress(LineProtocolError):
        parse_lines(text)


def observations(text: str) -> None:
    with contextlib.suppress(ValueError, RecursionError, ValidationError):
        ObservationBatchIn.model_validate(json.loads(text))


def exposition(text: str) -> None:
    with contextlib.suppress(ExpositionError):
        read(text, "text/plain", SPEC)


CASES: dict[str, tuple[Callable[[str], None], Callable[[int], str], dict[str, Callable]]] = {
    "line protocol": (line_protocol, lambda n: repeat(
        "app_latency,service=web,namespace=shop p99=12.5,p50=3.1,requests=120i 1764500000000\n",
        n), {
        "digits then x": lambda n: "m f=" + "1" * n + "x",
        "digits, dot, digits then x": lambda n: "m f=" + "1" * (n // 2) + "." + "1" * (n // 2)
        + "x",
        "integer digits": lambda n: "m f=" + "1" * n + "i",
        "timestamp digits": lambda n: "m f=1 " + "1" * n,
        "escaped tag value": lambda n: "m,t=" + repeat("\\,", n) + " f=1",
        "tags": lambda n: "m" + repeat(",t=v", n) + " f=1",
        "escaped string": lambda n: 'm f="' + repeat('\\"', n) + '"',
    }),
    "observations": (observations, lambda n: json.dumps({"observations": [
        {"service": "web", "latency_ms": [12.5, 3.25, 140.0] * max(1, n // 24)}]}), {
        "deep nesting": lambda n: "[" * n,
        "long number": lambda n: '{"observations": [{"service": "w", "latency_ms": [1'
        + "0" * n + "]}]}",
        "escaped string": lambda n: '{"observations": [{"service": "' + repeat("\\u00e9", n)
        + '", "latency_ms": [1]}]}',
    }),
    "exposition": (exposition, lambda n: HISTOGRAM + repeat(
        'rpc_seconds_bucket{le="0.1",method="get",code="200"} 12\n', n), {
        "counter families": lambda n: HISTOGRAM + "".join(
            f'# TYPE c{i} counter\nc{i}_total{{code="500"}} 1\n' for i in range(n // 40)),
        "labels per line": lambda n: HISTOGRAM + repeat("m{" + "".join(
            f'l{i}="b",' for i in range(SPEC.max_line // 6))[:SPEC.max_line - 20].rsplit(
            ",", 1)[0] + "} 1\n", n),
        "escaped label values": lambda n: HISTOGRAM + repeat('m{a="' + '\\"' * 100 + '"} 1\n',
                                                             n),
        "one long line": lambda n: HISTOGRAM + "m{" + "a" * n + "} 1\n",
    }),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=64, help="size of the bodies (KB)")
    args = parser.parse_args()
    size = args.kb * 1024
    worst_ratio, worst_growth = 0.0, 0.0
    for name, (parse, normal, adversarial) in CASES.items():
        def timed(text: str, parse: Callable[[str], None] = parse) -> float:
            return cost(lambda: parse(text))

        body = normal(size)
        reference = timed(body) / (len(body) / 1024)
        print(f"{name}: normal body {reference * 1000:.4f} ms/KB")
        for case, make in adversarial.items():
            body, quarter = make(size), make(size // 4)
            seconds = timed(body)
            per_kb = seconds / (len(body) / 1024)
            growth = seconds / timed(quarter)
            worst_ratio = max(worst_ratio, per_kb / reference)
            worst_growth = max(worst_growth, growth)
            print(f"  {case:28s} {per_kb * 1000:9.4f} ms/KB  {per_kb / reference:7.2f}x normal"
                  f"  {args.kb // 4}->{args.kb} KB: {growth:5.2f}x")
    print(f"worst: {worst_ratio:.2f}x the normal body's cost per KB; growth {worst_growth:.2f}x "
          "for 4x the input (4 = linear)")


if __name__ == "__main__":
    main()
