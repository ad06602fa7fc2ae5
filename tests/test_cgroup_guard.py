"""Guard.refusal answers "unrelated to every LS cgroup" from set lookups before comparing with
each one; the answer (and the reason given, which names the first LS cgroup in inventory
order) must be what comparing with each one gives. Fails if the shortcut lets through a
cgroup that is, holds or lies under an LS one."""

from __future__ import annotations

import random

import pytest

from sloguard.actuators.cgroupfs import Guard


def _compared_one_by_one(guard: Guard, parts: tuple[str, ...] | None) -> str | None:
    """Guard.refusal without the set lookups: every cgroup compared with each protected one."""
    if parts is None:
        return "not a plain cgroup path"
    if not parts:
        return "the hierarchy root holds every workload"
    return guard.compared_with_each(parts)


def _path(rng: random.Random) -> str:
    return "/".join(rng.choice("abc") for _ in range(rng.randrange(0, 4)))


@pytest.mark.parametrize("seed", range(30))
def test_the_shortcut_answers_as_comparing_each(seed):
    rng = random.Random(seed)
    inventory = [{"cgroup": _path(rng), "class": rng.choice(["LS", "BE", "LS", ""])}
                 for _ in range(rng.randrange(0, 6))]
    guard = Guard(inventory)
    asked = {tuple(p for p in _path(rng).split("/") if p) for _ in range(60)}
    for parts in [*asked, None, ()]:
        assert guard.refusal(parts) == _compared_one_by_one(guard, parts), (inventory, parts)


def test_be_beside_ls_passes_and_everything_related_is_refused():
    guard = Guard([{"cgroup": "/kubepods/burstable/podA", "class": "LS"},
                   {"cgroup": "/kubepods/besteffort/podB", "class": "BE"},
                   {"cgroup": "/batch", "class": "BE"}])
    assert guard.refusal(("kubepods", "besteffort", "podB")) is None
    assert guard.refusal(("batch", "x")) is None
    assert guard.refusal(("kubepods", "burstable", "podA")) == (
        "is the LS workload /kubepods/burstable/podA")
    assert guard.refusal(("kubepods", "burstable", "podA", "c1")) == (
        "lies under the LS workload /kubepods/burstable/podA")
    assert guard.refusal(("kubepods",)) == "holds the LS workload /kubepods/burstable/podA"
    root = Guard([{"cgroup": "/", "class": "LS"}])  # an LS workload at the root: nothing goes
    assert root.refusal(("batch",)) == "lies under the LS workload /"
