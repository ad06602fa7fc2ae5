"""InfluxDB line protocol, parsed strictly, for the receive endpoint.

    measurement[,tag=value...] field=value[,field=value...] [timestamp]

Escaping follows InfluxDB's reference: in measurements a backslash escapes commas and spaces; in
tag keys, tag values and field keys it escapes commas, equals signs and spaces; inside a
double-quoted string field it escapes double quotes and backslashes. A backslash before any other
character is kept as it is. Field values are floats (1, 1.5, -2e3), integers (12i), unsigned
integers (12u), booleans (t, T, true, True, TRUE and the f forms) or strings ("..."). A pusher's
mistake must come back as "line 3, column 17: ...", never as a half-written batch, so the whole
body is parsed before anything is accepted.

The body comes from outside, so every step is linear in its length. Numbers are matched by
patterns that backtrack at most once per character (the old one, digits, an optional dot,
digits, split a run of digits every possible way: 8,000 digits took seconds, holding the GIL and
so the whole agent). Integers and timestamps are length-checked before `int()`, whose cost grows
with the square of the digits and which refuses more than 4,300 of them with a ValueError, not a
LineProtocolError. Digits are ASCII only: `str.isdigit` says yes to "²", which `int` refuses.
Integers and timestamps are InfluxDB's: 64 bits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

PRECISIONS = {"ns": 1, "us": 1_000, "u": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TRUE = frozenset({"t", "T", "true", "True", "TRUE"})
_FALSE = frozenset({"f", "F", "false", "False", "FALSE"})
# One way to match any text: after the digits, only a "." may start the fraction.
_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_INTEGER = re.compile(r"-?[0-9]+")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
_MAX_DIGITS = 20  # 2**64 has 20 digits: anything longer is out of range without int()


def _int64ish(text: str) -> int | None:
    """The integer `text` (ASCII digits, maybe a minus) spells, or None when it has more digits
    than any 64-bit integer: int() is not called on those (quadratic, and over 4,300 digits a
    ValueError)."""
    negative = text.startswith("-")
    digits = text[negative:].lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS:
        return None
    return -int(digits) if negative else int(digits)


class LineProtocolError(ValueError):
    """A line that is not valid line protocol; the message names the line and column."""


@dataclass(slots=True)
class Point:
    measurement: str
    tags: dict[str, str]
    fields: dict[str, float | int | bool | str]
    time_ns: int | None
    line: int


def parse_lines(text: str, precision: str = "ns") -> list[Point]:
    """Every point of a body; LineProtocolError on the first bad line (nothing is kept)."""
    if precision not in PRECISIONS:
        raise LineProtocolError(f"precision must be one of {', '.join(PRECISIONS)}")
    factor = PRECISIONS[precision]
    points = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        points.append(_Line(line, number).parse(factor))
    return points


class _Line:
    def __init__(self, text: str, number: int) -> None:
        self.text = text
        self.number = number
        self.pos = 0

    def fail(self, message: str) -> LineProtocolError:
        return LineProtocolError(f"line {self.number}, column {self.pos + 1}: {message}")

    def parse(self, factor: int) -> Point:
        measurement, stop = self.token(", ", escapable=", ")
        if not measurement:
            raise self.fail("missing measurement name")
        tags: dict[str, str] = {}
        while stop == ",":
            self.pos += 1
            key, stop = self.token("=, ", escapable=",= ")
            if not key or stop != "=":
                raise self.fail(f"expected tag key=value, got {key!r} without a value"
                                if key else "expected tag key=value")
            self.pos += 1
            value, stop = self.token(", ", escapable=",= ", forbidden="=")
            if not value:
                raise self.fail(f"tag {key!r} has an empty value")
            tags[key] = value
        if stop != " ":
            raise self.fail("no fields: a point needs at least one field=value")
        self.skip_spaces()
        fields: dict[str, float | int | bool | str] = {}
        while True:
            key, stop = self.token("=, ", escapable=",= ")
            if not key or stop != "=":
                raise self.fail(f"expected field key=value, got {key!r} without a value"
                                if key else "expected field key=value")
            self.pos += 1
            fields[key] = self.field_value(key)
            if self.pos >= len(self.text) or self.text[self.pos] == " ":
                break
            if self.text[self.pos] != ",":
                raise self.fail(f"unexpected {self.text[self.pos]!r} after field {key!r}")
            self.pos += 1
        self.skip_spaces()
        time_ns = None
        if self.pos < len(self.text):
            stamp = self.text[self.pos:].strip()
            if not _INTEGER.fullmatch(stamp):
                raise self.fail(f"timestamp must be an integer, got {stamp[:40]!r}")
            stamp_value = _int64ish(stamp)
            if stamp_value is None or not INT64_MIN <= stamp_value * factor <= INT64_MAX:
                raise self.fail(f"timestamp {stamp[:40]!r} is out of range (64-bit "
                                "nanoseconds: 1677-09-21 to 2262-04-11)")
            time_ns = stamp_value * factor
        return Point(measurement, tags, fields, time_ns, self.number)

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def token(self, stops: str, escapable: str, forbidden: str = "") -> tuple[str, str]:
        """Read up to an unescaped stop character; returns the unescaped text and the stop
        ("" at the end of the line)."""
        out = []
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char == "\\" and self.pos + 1 < len(text) and text[self.pos + 1] in escapable:
                out.append(text[self.pos + 1])
                self.pos += 2
                continue
            if char in stops:
                return "".join(out), char
            if char in forbidden:
                raise self.fail(f"unescaped {char!r}")
            out.append(char)
            self.pos += 1
        return "".join(out), ""

    def field_value(self, key: str) -> float | int | bool | str:
        text = self.text
        if self.pos < len(text) and text[self.pos] == '"':
            self.pos += 1
            out = []
            while self.pos < len(text):
                char = text[self.pos]
                if char == "\\" and self.pos + 1 < len(text) and text[self.pos + 1] in '"\\':
                    out.append(text[self.pos + 1])
                    self.pos += 2
                    continue
                if char == '"':
                    self.pos += 1
                    return "".join(out)
                out.append(char)
                self.pos += 1
            raise self.fail(f"field {key!r}: unterminated string")
        start = self.pos
        while self.pos < len(text) and text[self.pos] not in ", ":
            self.pos += 1
        raw = text[start:self.pos]
        if not raw:
            self.pos = start
            raise self.fail(f"field {key!r} has no value")
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        if raw[-1] in "iu" and _INTEGER.fullmatch(raw[:-1]) and not (
                raw[-1] == "u" and raw.startswith("-")):
            low, high = (INT64_MIN, INT64_MAX) if raw[-1] == "i" else (0, UINT64_MAX)
            number = _int64ish(raw[:-1])
            if number is None or not low <= number <= high:
                self.pos = start
                raise self.fail(f"field {key!r}: {raw[:40]!r} is out of range for a 64-bit "
                                f"{'signed' if raw[-1] == 'i' else 'unsigned'} integer")
            return number
        if not _FLOAT.fullmatch(raw):
            self.pos = start
            raise self.fail(f"field {key!r}: {raw[:40]!r} is not a number, boolean or "
                            "quoted string")
        value = float(raw)
        if not math.isfinite(value):
            self.pos = start
            raise self.fail(f"field {key!r}: {raw[:40]!r} is not a finite number")
        return value
