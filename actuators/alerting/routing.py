"""The route tree, as in Alertmanager: an alert walks down from the root; at each level the
first child whose matchers match takes it (and the walk goes on past it only with `continue`);
a route none of whose children matched handles the alert itself. Children inherit the
receiver and the grouping settings they do not set."""

from __future__ import annotations

from dataclasses import dataclass, field

from sloguard.actuators.alerting.config import RouteConfig
from sloguard.core.selectors import Matcher, parse_matchers

# Alertmanager's defaults
GROUP_WAIT_S = 30.0
GROUP_INTERVAL_S = 300.0
REPEAT_INTERVAL_S = 4 * 3600.0
ALL_LABELS = "..."


@dataclass
class Route:
    id: str  # position in the tree ("root", "root.0.1"): names the group keys it makes
    receiver: str
    matchers: tuple[Matcher, ...]
    continue_: bool
    group_by: tuple[str, ...]
    group_all: bool  # group_by: ['...']: every distinct label set is its own group
    group_wait: float
    group_interval: float
    repeat_interval: float
    routes: list[Route] = field(default_factory=list)

    def match(self, labels: dict[str, str]) -> list[Route]:
        """The routes that handle an alert with these labels (several with `continue`)."""
        if not all(m.matches(labels) for m in self.matchers):
            return []
        found: list[Route] = []
        for child in self.routes:
            matched = child.match(labels)
            found.extend(matched)
            if matched and not child.continue_:
                break
        return found or [self]

    def group_labels(self, labels: dict[str, str]) -> dict[str, str]:
        if self.group_all:
            return dict(sorted(labels.items()))
        return {name: labels.get(name, "") for name in self.group_by}

    def walk(self) -> list[Route]:
        return [self, *(r for child in self.routes for r in child.walk())]


def build_route(config: RouteConfig, parent: Route | None = None, route_id: str = "root") -> Route:
    if config.group_by is not None:
        group_by = list(config.group_by)
    elif parent is not None:
        group_by = [ALL_LABELS] if parent.group_all else list(parent.group_by)
    else:
        group_by = []  # Alertmanager's default: one group for everything the route takes
    route = Route(
        id=route_id,
        receiver=config.receiver or (parent.receiver if parent else ""),
        matchers=parse_matchers(config.matchers),
        continue_=config.continue_,
        group_by=tuple(sorted(set(group_by) - {ALL_LABELS})),
        group_all=ALL_LABELS in group_by,
        group_wait=_pick(config.group_wait, parent and parent.group_wait, GROUP_WAIT_S),
        group_interval=_pick(config.group_interval, parent and parent.group_interval,
                             GROUP_INTERVAL_S),
        repeat_interval=_pick(config.repeat_interval, parent and parent.repeat_interval,
                              REPEAT_INTERVAL_S),
    )
    route.routes = [build_route(child, route, f"{route_id}.{index}")
                    for index, child in enumerate(config.routes)]
    return route


def _pick(own: float | None, inherited: float | None, default: float) -> float:
    if own is not None:
        return own
    return inherited if inherited is not None else default
