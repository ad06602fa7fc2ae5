"""The sample vocabulary every part of sloguard speaks.

A sample is one InfluxDB point: measurement, tags, fields and a nanosecond timestamp. Using the
InfluxDB model from the start means the embedded store and InfluxDB are interchangeable, and the
line-protocol writer needs no translation layer. This module must stay dependency-free: the
collectors, the stores, the detector and the UI all import it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

FieldValue = float | int | bool | str


@dataclass(slots=True)
class Sample:
    measurement: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    time_ns: int = field(default_factory=time.time_ns)
