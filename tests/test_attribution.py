"""Culprit attribution (detector/attribution/): the scorers, the ranking and the attributor,
on samples written to the real embedded store and read back as the agent reads them.

The shapes are the general ones, not the lab's: an antagonist that starts with the LS
slowdown, an innocent that sleeps, an innocent that ran flat out all along; a scorer that
has no evidence abstains instead of voting "innocent"."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sloguard.core.incidents import FIRING, Incident
from sloguard.core.samples import Sample
from sloguard.core.suspects import Clue, Suspect, suspects_of
from sloguard.detector.attribution.attributor import Attributor
from sloguard.detector.attribution.case import STEP_NS, Case, as_reader, correlation
from sloguard.detector.attribution.ranking import rank
from sloguard.detector.attribution.registry import ScorerRegistry
from sloguard.detector.config import AttributionConfig
from sloguard.store.embedded import open_store

S = STEP_NS
ANTAGONIST, NAPPER, STEADY = "/be/antagonist", "/be/napper", "/be/steady"
LS_CGROUP = "/ls/redis"


def _workload(cgroup: str, cls: str = "BE") -> dict[str, str]:
    return {"cgroup": cgroup, "class": cls, "level": "cgroup",
            "workload": cgroup.rsplit("/", 1)[1]}


CANDIDATES = [_workload(ANTAGONIST), _workload(NAPPER), _workload(STEADY)]


def test_correlation_is_robust_to_spikes_and_refuses_too_few_points():
    x = np.arange(20.0)
    assert correlation(x, x * 3 + 1) == pytest.approx(1.0)
    assert correlation(x, -x) == pytest.approx(-1.0)
    rng = np.random.default_rng(1)
    step = np.where(np.arange(90) >= 60, 2.0, 0.0)
    noisy = step + rng.normal(0, 0.1, 90)
    spiky = noisy.copy()
    spiky[10] = 1000.0  # one slow second before the onset
    assert correlation(step + rng.normal(0, 0.05, 90), spiky) > 0.9
    assert correlation(np.zeros(20), x) == 0.0  # a flat series moves with nothing
    assert correlation(x[:5], x[:5]) is None
    gappy = x.copy()
    gappy[::2] = np.nan
    assert correlation(gappy, x, min_points=8) == pytest.approx(1.0)
    assert correlation(gappy, x, min_points=11) is None


def _case(read=None, **kw) -> Case:
    start = 1_000 * S
    defaults = dict(incident_id="i", resource="", victims=[_workload(LS_CGROUP, "LS")],
                    candidates=CANDIDATES, onset_ns=start + 60 * S, start_ns=start,
                    end_ns=start + 90 * S, read=read)
    return Case(**{**defaults, **kw})


def test_bucketing_sums_a_workloads_series_and_leaves_empty_seconds_nan():
    case = _case()
    t0 = case.start_ns
    points = {"sda": [(4, 0), (6, S // 2), (1, 2 * S), (7, 200 * S)], "sdb": [(10, S // 3)]}
    series = [({"cgroup": ANTAGONIST, "device": d}, [t0 + o for _, o in p], [c for c, _ in p])
              for d, p in points.items()]
    [values] = case.bucket(series, "cgroup").values()
    assert values[0] == 15.0  # sda's two samples averaged (5), plus sdb's 10
    assert np.isnan(values[1]) and values[2] == 1.0
    assert len(values) == 90  # the sample past the window is not in it


def _episode(start_ns: int, n: int = 90, onset: int = 60) -> tuple[np.ndarray, dict]:
    """An LS p99 that rises at the onset, an antagonist that starts with it, a napper (2% of
    a CPU, jittering), a steady job (0.8 cores throughout)."""
    rng = np.random.default_rng(7)
    t = np.arange(n)
    ls = np.where(t >= onset, 3.0, 1.0) + rng.normal(0, 0.15, n)
    be = {ANTAGONIST: np.where(t >= onset - 1, 1.9, 0.0) + rng.normal(0, 0.03, n).clip(0),
          NAPPER: 0.02 + rng.normal(0, 0.005, n).clip(-0.02),
          STEADY: 0.8 + rng.normal(0, 0.05, n)}
    return ls, be


def _write_episode(store, start_ns: int, onset: int = 60, n: int = 90) -> None:
    ls, be = _episode(start_ns, n, onset)
    samples = []
    for i in range(n):
        at = start_ns + i * S + S // 4
        samples.append(Sample("app_slo", {"node": "n", "slo": "redis"},
                              {"latency_ratio": float(ls[i])}, at))
        for cgroup, values in be.items():
            samples.append(Sample("container_cpu", {**_workload(cgroup), "node": "n"},
                                  {"usage_cores": float(values[i])}, at))
        samples.append(Sample("container_cpu", {**_workload(LS_CGROUP, "LS"), "node": "n"},
                              {"usage_cores": 0.5}, at))
        if i >= onset:  # the LS task waited behind the antagonist, a little behind the others
            for culprit, wait in ((ANTAGONIST, 900.0), (STEADY, 60.0), (NAPPER, 5.0),
                                  ("(other)", 30.0)):
                samples.append(Sample("ebpf_runqueue_blame",
                                      {**_workload(LS_CGROUP, "LS"), "culprit": culprit},
                                      {"wait_us": wait, "count": 10}, at))
    store.write(samples)


@pytest.fixture
def store(tmp_path):
    opened = open_store(tmp_path / "data", 86400, 2**30)
    yield opened
    opened.close()


def _incident(onset_ns: int, resource: str = "cpu") -> Incident:
    return Incident(id="inc-1", fingerprint="f", rule="LSLatencyInterference", group="ls",
                    severity="warning", node="n", state=FIRING,
                    series={"node": "n", "slo": "redis"}, started_ns=onset_ns,
                    updated_ns=onset_ns, fired_ns=onset_ns, policy="ls-interference",
                    labels={"resource": resource}, affected=[_workload(LS_CGROUP, "LS")],
                    signal={"measurement": "app_slo", "field": "latency_ratio",
                            "expr": "app_slo", "aggregate": "last", "window": "2s"})


def _attributor(store, config: AttributionConfig | None = None, saved=None, **kw):
    return Attributor(config or AttributionConfig(), as_reader(store),
                      lambda: [dict(c, node="n") for c in CANDIDATES]
                      + [dict(_workload(LS_CGROUP, "LS"), node="n")],
                      (saved if saved is not None else []).append, **kw)


def test_the_antagonist_ranks_first_and_the_innocents_are_not_suspects(store):
    start = (time.time_ns() // S - 120) * S
    _write_episode(store, start)
    incident = _incident(start + 60 * S)
    saved: list[Incident] = []
    attributor = _attributor(store, saved=saved)
    attributor.tick(start + 90 * S, [incident])
    assert saved == [incident] and incident.suspects_ns == start + 90 * S
    suspects = suspects_of(incident)
    first = suspects[0]
    assert first.cgroup == ANTAGONIST and first.rank == 1 and first.resource == "cpu"
    assert first.score > 0.6, first
    assert {c.scorer for c in first.clues} == {"runqueue_blame", "co_movement"}
    blame = next(c for c in first.clues if c.scorer == "runqueue_blame")
    assert blame.figures["share"] == pytest.approx(900 / 995, abs=1e-3)
    assert "ms for a CPU behind its tasks" in blame.text
    assert blame.text.startswith("redis waited "), blame.text  # the victim by its name
    others = {s.cgroup: s.score for s in suspects[1:]}
    assert all(score < first.score / 5 for score in others.values()), others
    assert first.name == "antagonist"
    assert attributor.status().ok, attributor.status()
    # again only after `every`; then ranked afresh
    attributor.tick(start + 99 * S, [incident])
    assert len(saved) == 1
    attributor.tick(start + 100 * S, [incident])
    assert len(saved) == 2


def test_without_ebpf_co_movement_alone_still_names_the_antagonist(store):
    start = (time.time_ns() // S - 120) * S
    _write_episode(store, start)
    config = AttributionConfig(scorers={"co_movement": {}, "runqueue_blame": {}})
    attributor = _attributor(store, config)
    class NoBlame:  # the store as a node without eBPF has it
        def __init__(self, inner):
            self.inner = inner

        def series(self, m, *a):
            return [] if m == "ebpf_runqueue_blame" else self.inner.series(m, *a)

        def totals(self, m, *a):
            return [] if m == "ebpf_runqueue_blame" else self.inner.totals(m, *a)

    attributor.read = NoBlame(attributor.read)
    incident = _incident(start + 60 * S)
    suspects = attributor.attribute(incident, start + 90 * S)
    assert suspects[0].cgroup == ANTAGONIST
    assert [c.scorer for c in suspects[0].clues] == ["co_movement"]  # blame abstained
    assert suspects[0].score > 0.6  # its own grade (~0.68), not halved by the abstainer


def test_an_io_incident_is_not_blamed_on_the_run_queue(store):
    start = (time.time_ns() // S - 120) * S
    _write_episode(store, start)
    suspects = _attributor(store).attribute(_incident(start + 60 * S, "io"), start + 90 * S)
    assert all(c.scorer != "runqueue_blame" for s in suspects for c in s.clues)


def test_ranking_is_a_weighted_mean_over_the_scorers_that_voted():
    a = {"/a": Clue("one", 0.9, "cpu"), "/b": Clue("one", 0.1, "cpu")}
    b = {"/b": Clue("two", 0.6, "io")}
    candidates = [{"cgroup": "/a", "node": "n"}, {"cgroup": "/b"}, {"cgroup": "/c"}]
    ranked = rank(candidates, {"one": a, "two": b, "silent": {}},
                  {"one": 1.0, "two": 3.0, "silent": 5.0})
    assert [(s.cgroup, s.rank) for s in ranked] == [("/b", 1), ("/a", 2)]
    assert ranked[0].score == pytest.approx((0.1 + 3 * 0.6) / 4)
    assert ranked[0].resource == "io"  # the clue that weighs most
    assert ranked[1].workload == {"cgroup": "/a"}  # the node tag is not carried
    assert rank(candidates, {"silent": {}}, {"silent": 1.0}) == []


class _Slow:
    name = "slow"

    def __init__(self, params):
        self.seconds = params.get("seconds", 2.0)

    def score(self, case):
        time.sleep(self.seconds)
        return {}


class _Broken:
    name = "broken"

    def __init__(self, params):
        pass

    def score(self, case):
        raise RuntimeError("boom")


class _Plugin:
    from sloguard.detector.attribution.api import hookimpl

    @staticmethod
    @hookimpl
    def sloguard_suspect_scorers():
        return [_Slow, _Broken]


def test_a_broken_scorer_costs_its_vote_and_a_slow_one_keeps_the_previous_suspects(store):
    start = (time.time_ns() // S - 120) * S
    _write_episode(store, start)
    registry = ScorerRegistry(plugins=[_Plugin()], use_entry_points=False)
    config = AttributionConfig(scorers={"co_movement": {}, "broken": {}})
    attributor = _attributor(store, config, registry=registry)
    incident = _incident(start + 60 * S)
    attributor.tick(start + 90 * S, [incident])
    assert suspects_of(incident)[0].cgroup == ANTAGONIST
    status = attributor.status()
    assert not status.ok and "broken: RuntimeError: boom" in status.reason
    slow = _attributor(store, AttributionConfig(
        timeout=0.2, scorers={"slow": {"params": {"seconds": 1.0}}}), registry=registry)
    incident.suspects_ns = None
    before = list(incident.suspects)
    slow.tick(start + 95 * S, [incident])
    assert incident.suspects == before and incident.suspects_ns is None
    assert "took over 0.2s" in slow.status().reason


def test_an_unknown_scorer_or_bad_params_are_named_and_the_rest_still_rank(store):
    config = AttributionConfig(scorers={"no_such": {}, "co_movement": {"params": {"x": 1}},
                                        "runqueue_blame": {"params": {"min_wait_ms": 2}}})
    attributor = _attributor(store, config)
    reason = attributor.status().reason
    assert "attribution.scorers.no_such: unknown scorer 'no_such'" in reason
    assert "attribution.scorers.co_movement" in reason and "parameter(s): x" in reason
    assert list(attributor.scorers) == ["runqueue_blame"]


def test_agent_events_and_incidents_without_a_policy_are_not_attributed(store):
    attributor = _attributor(store)
    incident = _incident(time.time_ns())
    incident.policy = ""
    attributor.tick(time.time_ns(), [incident])
    assert incident.suspects_ns is None


def test_suspects_round_trip_as_the_incident_carries_them():
    suspect = Suspect("/be/x", 0.5, 1, "io", {"pod": "x", "namespace": "batch"},
                      [Clue("co_movement", 0.5, "io", "why", {"rho": 0.9})])
    incident = _incident(1)
    incident.suspects = [suspect.to_dict()]
    again = Incident.from_dict(incident.to_dict())
    assert suspects_of(again) == [suspect] and suspect.name == "batch/x"


def test_the_documented_scorer_example_loads_by_module_and_ranks(store, tmp_path, monkeypatch):
    """docs/attribution.md's "Writing a scorer" block, verbatim, loaded as the config would
    (`attribution.plugins`): it abstains without PSI samples and grades with them."""
    import re
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "attribution.md").read_text()
    [code] = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "PsiBlame" in b]
    (tmp_path / "psi_blame_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("psi_blame_example", None)
    config = AttributionConfig(plugins=["psi_blame_example"], scorers={"psi_blame": {}})
    start = (time.time_ns() // S - 120) * S
    _write_episode(store, start)
    attributor = _attributor(store, config)
    assert list(attributor.scorers) == ["psi_blame"], attributor.status()
    assert attributor.attribute(_incident(start + 60 * S), start + 90 * S) == []  # abstained
    _, be = _episode(start)
    store.write([Sample("container_pressure", {**_workload(cgroup), "resource": "memory"},
                        {"some_rate": float(values[i]) * 10}, start + i * S + S // 4)
                 for cgroup, values in be.items() for i in range(90)])
    [first, *_] = attributor.attribute(_incident(start + 60 * S), start + 90 * S)
    assert first.cgroup == ANTAGONIST and first.resource == "memory"


def test_a_long_incident_is_ranked_on_a_bounded_window(store):
    attributor = _attributor(store)
    onset = 1_000_000 * S
    incident = _incident(onset)
    early = attributor.case(incident, onset + 30 * S)
    assert early.start_ns == onset - 60 * S and early.onset_index == 60
    late = attributor.case(incident, onset + 3600 * S)
    assert late.end_ns - late.start_ns == 240 * S and late.onset_index == 0


def test_a_settled_incident_is_ranked_half_as_often(store):
    saved: list[Incident] = []
    attributor = _attributor(store, saved=saved)
    onset = (time.time_ns() // S - 1000) * S
    incident = _incident(onset)
    attributor.tick(onset + 10 * S, [incident])
    attributor.tick(onset + 20 * S, [incident])  # young: every 10 s
    assert len(saved) == 2
    attributor.tick(onset + 300 * S, [incident])
    attributor.tick(onset + 310 * S, [incident])  # past 3 x lookback: every 20 s
    assert len(saved) == 3
    attributor.tick(onset + 320 * S, [incident])
    assert len(saved) == 4


def test_a_read_cut_at_its_bound_is_said_in_readyz(store, monkeypatch):
    from sloguard.detector.attribution import case as case_module

    start = (time.time_ns() // S - 120) * S
    _write_episode(store, start)
    monkeypatch.setattr(case_module, "MAX_SERIES_PER_READ", 1)
    attributor = _attributor(store)
    attributor.attribute(_incident(start + 60 * S), start + 90 * S)
    reason = attributor.status().reason
    assert "reads:" in reason and "only 1 read" in reason, reason
    monkeypatch.setattr(case_module, "MAX_SERIES_PER_READ", 20_000)
    attributor.attribute(_incident(start + 60 * S), start + 90 * S)
    assert attributor.status().ok
