"""One spelling of percentiles for rules, SLOs, pushed fields and stored fields.

p50, p90, p99 are percents; in the tail, more digits are decimals of the percent (p999 is
99.9, p9999 is 99.99), as dashboards write them; p99.9 says the same with a dot. p200 or p100
are refused rather than guessed. Rules, SLOs, the push
receiver and the stores all parse them here, so a spelling one accepts the others accept too.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+(\.[0-9]+)?")  # ASCII only: str.isdigit() accepts "²"


def parse_percentile(value: str) -> float:
    """The quantile (0 < q < 1) a percentile names: 0.99 from "p99", 0.999 from "p999" or
    "p99.9", 0.05 from "p5"; ValueError for anything else."""
    text = str(value).strip().lower()
    digits = text[1:]
    if not text.startswith("p") or len(digits) > 20 or not _DIGITS.fullmatch(digits):
        raise ValueError(f"not a percentile: {value!r} (use e.g. p50, p99, p999 or p99.9)")
    if "." in digits or len(digits) <= 2:
        percent = float(digits)
    elif digits.startswith("9"):  # the tail: p999 -> 99.9, p9995 -> 99.95
        percent = float(f"{digits[:2]}.{digits[2:]}")
    else:  # p200 or p100: not a tail percentile, and 20 or 200 would both be a guess
        raise ValueError(f"not a percentile: {value!r} (more than two digits without a dot "
                         "are for the tail, e.g. p999; write p20 or p99.5)")
    if not 0 < percent < 100:
        raise ValueError(f"not a percentile: {value!r} (between p0 and p100, both excluded)")
    return percent / 100


def is_percentile(value: str) -> bool:
    try:
        parse_percentile(value)
    except ValueError:
        return False
    return True


def percentile_name(q: float) -> str:
    """The field name of a quantile: 0.5 -> p50, 0.99 -> p99, 0.999 -> p999, 0.05 -> p05
    0.125 -> p12.5 (parse_percentile reads each back to the same quantile)."""
    text = f"{q:.6f}".rstrip("0")
    digits = text.split(".", 1)[1] if "." in text else ""
    if len(digits) > 2 and not digits.startswith("9"):
        return f"p{digits[:2].lstrip('0') or '0'}.{digits[2:]}"  # 0.125 -> p12.5, 0.001 -> p0.1
    return "p" + (digits.ljust(2, "0") if digits else "100")
