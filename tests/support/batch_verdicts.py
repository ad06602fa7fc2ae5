"""The check both anomaly batch tests make: a batch's verdict for one slot is the per-series
detector's, field for field."""

from __future__ import annotations

import math
from typing import Any

import pytest


def assert_same_verdict(out: Any, i: int, verdict: Any, where: Any) -> None:
    """`out` (BatchVerdicts) at slot `i` against `verdict` (Verdict); `where` names the case."""
    assert (bool(out.crossed[i]), bool(out.recovered[i])) == (
        verdict.crossed, verdict.recovered), where
    assert out.score[i] == pytest.approx(verdict.score, abs=1e-9), where
    if verdict.threshold is None:
        assert math.isnan(out.threshold[i]), where
    else:
        assert out.threshold[i] == pytest.approx(verdict.threshold, rel=1e-12), where
    assert out.note(i) == verdict.note, where
