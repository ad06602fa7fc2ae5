"""Series selectors in the PromQL spelling SREs read: `container_cpu{class="LS", pod=~"web-.*"}`.

Shared by rule files, the store's read path and the API. Regexes are anchored, and a tag that a
series lacks matches as the empty string, exactly as in Prometheus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPS = ("=~", "!~", "!=", "=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_:.]*")
_BARE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_:.]*)\s*(=~|!~|!=|=)\s*([^\"',{}\s=~][^\"',{}\s]*)\s*")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"' + "|" + r"'((?:[^'\\]|\\.)*)'")


@dataclass(frozen=True, slots=True)
class Matcher:
    key: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown matcher operator {self.op!r} (use =, !=, =~, !~)")
        if self.op in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(
                    f"invalid regex {self.value!r} for tag {self.key!r}: {exc}"
                ) from exc

    def matches(self, tags: dict[str, str]) -> bool:
        actual = tags.get(self.key, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.key}{self.op}"{escaped}"'


@dataclass(frozen=True, slots=True)
class Selector:
    measurement: str
    matchers: tuple[Matcher, ...] = ()

    def matches(self, tags: dict[str, str]) -> bool:
        return all(m.matches(tags) for m in self.matchers)

    def __str__(self) -> str:
        inner = ", ".join(str(m) for m in self.matchers)
        return f"{self.measurement}{{{inner}}}" if inner else self.measurement


def parse_selector(text: str) -> Selector:
    """Parse `measurement{key="value", key=~"regex", ...}`; raise ValueError saying where."""
    text = text.strip()
    name = _NAME.match(text)
    if not name:
        raise ValueError(f"selector must start with a measurement name: {text!r}")
    pos = name.end()
    matchers: list[Matcher] = []
    rest = text[pos:].strip()
    if rest:
        if not (rest.startswith("{") and rest.endswith("}")):
            raise ValueError(f"expected {{...}} after the measurement in {text!r}")
        body, pos = rest[1:-1], 0
        while True:
            while pos < len(body) and body[pos] in " \t,":
                pos += 1
            if pos >= len(body):
                break
            key = _NAME.match(body, pos)
            if not key:
                raise ValueError(f"expected a tag name at {body[pos:]!r} in {text!r}")
            pos = key.end()
            while pos < len(body) and body[pos] == " ":
                pos += 1
            op = next((o for o in OPS if body.startswith(o, pos)), None)
            if op is None:
                raise ValueError(f"expected =, !=, =~ or !~ after {key.group()!r} in {text!r}")
            pos += len(op)
            while pos < len(body) and body[pos] == " ":
                pos += 1
            value = _STRING.match(body, pos)
            if not value:
                raise ValueError(f"expected a quoted value for {key.group()!r} in {text!r}")
            raw = value.group(1) if value.group(1) is not None else value.group(2)
            matchers.append(Matcher(key.group(), op, re.sub(r"\\(.)", r"\1", raw)))
            pos = value.end()
            while pos < len(body) and body[pos] == " ":
                pos += 1
            if pos < len(body) and body[pos] != ",":
                raise ValueError(f"expected ',' or '}}' at {body[pos:]!r} in {text!r}")
    return Selector(name.group(), tuple(matchers))


def parse_matchers(items: list[str] | str) -> tuple[Matcher, ...]:
    """Alertmanager-style matchers, in the selector spelling: `severity="critical"`,
    `node=~"w-.*"`, a `{a="b", c!="d"}` set, or an unquoted value (`alertname=LSCpuStall`).

    Routes, inhibition rules and silences use them, so an SRE writes labels the same way in
    rules, config and the CLI; each item may hold several matchers separated by commas.
    """
    out: list[Matcher] = []
    for item in [items] if isinstance(items, str) else items:
        text = item.strip()
        if text.startswith("{") and text.endswith("}"):
            text = text[1:-1]
        if not text.strip():
            continue
        bare = _BARE.fullmatch(text)
        if bare:  # one unquoted value, as amtool accepts
            out.append(Matcher(bare.group(1), bare.group(2), bare.group(3)))
            continue
        try:
            out.extend(parse_selector(f"alert{{{text}}}").matchers)
        except ValueError as exc:
            message = str(exc).replace(f" in 'alert{{{text}}}'", "")
            raise ValueError(f"{message} in matcher {item!r}") from None
    return tuple(out)
