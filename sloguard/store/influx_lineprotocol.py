"""Samples to InfluxDB line protocol, built as strings (no Point objects).

Building influxdb-client `Point` objects is the write path's bottleneck (~64k points/s measured
on this machine); a string per series prefix, cached, and `repr` of the values is several times
faster. The escaping follows the line-protocol reference (InfluxDB 1.x, 2.x and 3.x agree on it):

- measurement: backslash before comma and space;
- tag keys, tag values, field keys: backslash before comma, equals sign and space;
- string field values: in double quotes, backslash before double quote and backslash;
- newlines are not supported in keys, tag values or field values.

Other characters, quotes and unicode included, are written as they are. A literal backslash is
written as it is too (the reference: "line protocol does not require users to escape the
backslash"), which leaves two things no line can say: a name or tag value that ends with a
backslash, and a backslash just before a character that must be escaped (the parser reads
`\\,` as an escaped backslash followed by a separator). Those, an empty measurement, a
reserved key and a point without a writable field are rejected with a reason; the caller counts
and logs them, and never sends a line that would corrupt its batch.

Numbers are written as floats, integers included (`3`, without the `i` suffix, is the float 3):
InfluxDB fixes a field's type per shard, and a collector that reports 3 on one tick and 2.5 on
the next would otherwise have the second batch refused. Every reader (the pandas frames, the
detectors) uses floats anyway.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sloguard.core.samples import FieldValue, Sample

RESERVED_KEYS = frozenset({"time", "_field", "_measurement"})
_CACHE_MAX = 100_000
_NUMBERS = frozenset((float, int))  # not bool: True would print as "True"
_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1


class LineRejected(ValueError):
    """A sample that line protocol cannot carry; `reason` is a short label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _check(text: str, what: str, specials: str) -> None:
    if "\n" in text or "\r" in text:
        raise LineRejected("newline", f"{what} {text!r} contains a newline")
    if text.endswith("\\"):
        raise LineRejected("backslash", f"{what} {text!r} ends with a backslash")
    if "\\" in text and any(f"\\{c}" in text for c in specials):
        raise LineRejected(
            "backslash", f"{what} {text!r} has a backslash before one of {specials!r}")


def escape_measurement(name: str) -> str:
    if not name:
        raise LineRejected("empty", "empty measurement name")
    if name.startswith("#"):
        raise LineRejected("comment", f"measurement {name!r} starts with '#' (a comment line)")
    _check(name, "measurement", ", ")
    return name.replace(",", "\\,").replace(" ", "\\ ")


def escape_key(key: str, what: str = "key") -> str:
    """Tag keys, tag values and field keys share one rule."""
    if not key:
        raise LineRejected("empty", f"empty {what}")
    _check(key, what, ", =")
    return key.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def escape_string_field(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise LineRejected("newline", f"string field value {value!r} contains a newline")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def series_prefix(measurement: str, tags: dict[str, str]) -> str:
    """`measurement,k=v,...` with tags sorted by key (the server's own order, fastest to index).

    Empty tag values are left out: line protocol has no empty tag value, and InfluxQL reads a
    missing tag as "" anyway.
    """
    parts = [escape_measurement(measurement)]
    for key in sorted(tags):
        value = tags[key]
        if value == "":
            continue
        if key in RESERVED_KEYS:
            raise LineRejected("reserved", f"tag key {key!r} is reserved by InfluxDB")
        parts.append(f"{escape_key(key, 'tag key')}={escape_key(str(value), 'tag value')}")
    return ",".join(parts)


def format_value(value: FieldValue) -> str | None:
    """The field value as line protocol, or None when it cannot be written (NaN, infinity)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, str):
        return escape_string_field(value)
    raise LineRejected("type", f"field value {value!r} is a {type(value).__name__}")


def _template_key(sample: Sample) -> tuple:
    """Measurement, tag count, tag keys, tag values, field names: one flat tuple (no tuple per
    tag item to allocate and hash), unambiguous because the tag count says where keys end."""
    tags = sample.tags
    return (sample.measurement, len(tags), *tags, *tags.values(), *sample.fields)


class LineEncoder:
    """Encodes samples, caching what it has escaped once.

    The common sample (every value a finite float or an int, as collectors produce) takes a
    fast path: one `%` template per series and field set, with the escaped prefix and `key=`
    parts already in it, formats the whole line in one C call (`%r` of each value, which is the
    shortest exact float). Anything else (bool, str, NaN, infinity) takes the general path.
    """

    def __init__(self) -> None:
        self._prefixes: dict[tuple, str] = {}
        self._fieldsets: dict[tuple[str, ...], tuple[str, ...]] = {}
        # _template_key(sample) -> (line template, series prefix)
        self._templates: dict[tuple, tuple[str, str]] = {}
        self.skipped_values = 0  # NaN / infinite field values left out of otherwise good lines

    def prefix(self, sample: Sample) -> str:
        cache_key = (sample.measurement, *sample.tags.items())
        prefix = self._prefixes.get(cache_key)
        if prefix is None:
            prefix = series_prefix(sample.measurement, sample.tags)
            if len(self._prefixes) >= _CACHE_MAX:
                self._prefixes.clear()
            self._prefixes[cache_key] = prefix
        return prefix

    def _keys(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """`key=` for each field name (escaped), cached per field set."""
        keys = self._fieldsets.get(names)
        if keys is None:
            for name in names:
                if name in RESERVED_KEYS:
                    raise LineRejected("reserved", f"field key {name!r} is reserved by InfluxDB")
            keys = tuple(escape_key(name, "field key") + "=" for name in names)
            if len(self._fieldsets) >= _CACHE_MAX:
                self._fieldsets.clear()
            self._fieldsets[names] = keys
        return keys

    def line(self, sample: Sample) -> str:
        """One line (without the newline); raises LineRejected."""
        return self.series_and_line(sample)[1]

    def series_and_line(self, sample: Sample) -> tuple[str, str]:
        """The series prefix (its identity on the server) and the line; raises LineRejected."""
        prefix = self.prefix(sample)
        fields = sample.fields
        keys = self._keys(tuple(fields))
        time_ns = sample.time_ns
        if type(time_ns) is not int or not _MIN_NS <= time_ns <= _MAX_NS:
            raise LineRejected("timestamp", f"timestamp {time_ns!r} is not an int64")
        values = fields.values()
        if _NUMBERS.issuperset(map(type, values)) and math.isfinite(sum(values)):
            template = (prefix.replace("%", "%%") + " "
                        + ",".join(k.replace("%", "%%") + "%r" for k in keys) + " %d")
            if len(self._templates) >= _CACHE_MAX:
                self._templates.clear()
            self._templates[_template_key(sample)] = (template, prefix)
            return prefix, template % (*values, time_ns)
        return prefix, f"{prefix} {self._general(keys, fields)} {time_ns}"

    def _general(self, keys: tuple[str, ...], fields: dict[str, FieldValue]) -> str:
        parts = []
        for key, value in zip(keys, fields.values(), strict=True):
            text = format_value(value)
            if text is None:
                self.skipped_values += 1
                continue
            parts.append(key + text)
        if not parts:
            raise LineRejected("no_fields", f"no field value can be written "
                                            f"(fields: {sorted(fields)})")
        return ",".join(parts)

    def encode(
        self, samples: Iterable[Sample], series: dict[str, int] | None = None,
        max_series: int = 0,
    ) -> tuple[list[str], list[tuple[Sample, LineRejected]]]:
        """Lines for the writable samples, and the rejected ones with their reasons.

        With `series`, each sample's series prefix is recorded there with its timestamp, and
        a series not yet in it is refused once it holds `max_series`.
        """
        lines: list[str] = []
        rejected: list[tuple[Sample, LineRejected]] = []
        append = lines.append
        templates = self._templates
        numbers, isfinite = _NUMBERS, math.isfinite
        for sample in samples:
            fields, tags = sample.fields, sample.tags
            # _template_key(), inlined: this loop runs for every point the agent writes
            entry = templates.get((sample.measurement, len(tags), *tags, *tags.values(),
                                   *fields))
            values = fields.values()
            time_ns = sample.time_ns
            if (entry is not None and numbers.issuperset(map(type, values))
                    and isfinite(sum(values)) and type(time_ns) is int
                    and _MIN_NS <= time_ns <= _MAX_NS):
                template, prefix = entry
                line = template % (*values, time_ns)
            else:
                try:
                    prefix, line = self.series_and_line(sample)
                except LineRejected as exc:
                    rejected.append((sample, exc))
                    continue
            if series is not None:
                if prefix not in series and len(series) >= max_series:
                    rejected.append((sample, LineRejected(
                        "cardinality", f"{prefix}: more than store.max_series={max_series} "
                                       "series written in the last hour")))
                    continue
                series[prefix] = time_ns
            append(line)
        return lines, rejected
