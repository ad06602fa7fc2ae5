"""Durations and sizes as people write them in config and rule files ("10s", "1m30s", "512MiB").

Prometheus users write durations as concatenated unit terms; accepting the same spelling keeps
rule files readable and avoids a class of "was that seconds or milliseconds?" mistakes.
"""

from __future__ import annotations

import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_TERM = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_duration(value: str | int | float) -> float:
    """Seconds from "1m30s", "500ms", "6h", or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value!r}")
        return float(value)
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return parse_duration(number)
    pos, total = 0, 0.0
    for match in _DURATION_TERM.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(
            f"not a duration: {value!r} (use e.g. 500ms, 10s, 5m, 1h30m, 7d)"
        )
    return total


def format_duration(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = [], round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out) or "0s"


def parse_size(value: str | int) -> int:
    """Bytes from "512MiB", "1GB", "4096"."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"size must not be negative: {value!r}")
        return int(value)
    match = _SIZE.fullmatch(str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 512MiB, 2GiB, 100MB)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])
