"""The scorers' clues -> the incident's ranked suspects.

A suspect's score is the weighted mean of its grades over the scorers that had evidence for
this case (a scorer that abstained, e.g. run-queue blame where eBPF is unavailable or the
incident is about I/O, is left out instead of counted as "innocent"). Only candidates some
scorer implicated (score > 0) become suspects: with no evidence at all there are none, and the
levers then act on the whole BE tier as they always did.
"""

from __future__ import annotations

from sloguard.core.suspects import Clue, Suspect

MAX_SUSPECTS = 10  # what an incident carries: the UI and Slack show the first few


def rank(candidates: list[dict[str, str]], clues: dict[str, dict[str, Clue]],
         weights: dict[str, float]) -> list[Suspect]:
    voting = [name for name, given in clues.items() if given and weights.get(name, 0) > 0]
    total = sum(weights[name] for name in voting)
    if not total:
        return []
    found = []
    for candidate in candidates:
        cgroup = candidate["cgroup"]
        mine = [clues[name][cgroup] for name in voting if cgroup in clues[name]]
        score = sum(weights[c.scorer] * min(1.0, max(0.0, c.score)) for c in mine
                    if c.scorer in weights) / total
        if score <= 0:
            continue
        strongest = max(mine, key=lambda c: weights.get(c.scorer, 0) * c.score)
        tags = {k: v for k, v in candidate.items() if k != "node"}
        found.append(Suspect(cgroup, round(score, 4), 0, strongest.resource, tags,
                             sorted(mine, key=lambda c: -c.score)))
    found.sort(key=lambda s: (-s.score, s.cgroup))
    for n, suspect in enumerate(found[:MAX_SUSPECTS], start=1):
        suspect.rank = n
    return found[:MAX_SUSPECTS]
