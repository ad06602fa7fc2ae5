"""The wait before a delivery is tried again, shared by every receiver's sender: doubling from
`low` up to `high`, with ±20% jitter so that the agents of a fleet whose receiver came back do
not all retry in the same second."""

from __future__ import annotations

import random


def backoff_s(attempts: int, low: float, high: float) -> float:
    """Seconds to wait after the `attempts`-th failure in a row (1 for the first)."""
    return min(high, low * 2 ** max(0, attempts - 1)) * random.uniform(0.8, 1.2)
