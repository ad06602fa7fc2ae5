"""Culprit attribution: which of the node's BE workloads an LS slowdown is due to.

A node runs several BE jobs and most of them are innocent; acting on the whole BE tier wastes
the capacity co-location exists for, and evicting by priority may kill the wrong job. CPI2
(Google) named the antagonist by correlating each task's usage with the victim's slowdown;
Caladan punishes the job with the most LLC misses. Here, for every firing incident under a
policy, scorer plugins grade each BE workload on evidence an SRE can check (the run-queue wait
an LS task spent behind that workload's tasks, measured at sched_switch; how its own CPU, I/O
and memory signals moved with the LS signal), and `ranking.py` combines the grades into the
incident's ranked suspects (sloguard/core/suspects.py). The ladder acts on the top suspects
first (`target: suspects` in a policy), eviction ranks by them.

    attributor.py   when: at firing, then every `attribution.every` while firing
    case.py         what a scorer sees: the incident, the BE candidates, store windows on a
                    one-second grid
    hookspecs.py    the scorer plugin contract (`sloguard_suspect_scorers`)
    api.py          what a scorer plugin imports
    registry.py     the built-in scorers by name, third parties by entry point
    ranking.py      the scorers' grades -> ranked suspects
"""
