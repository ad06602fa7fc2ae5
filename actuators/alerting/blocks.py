"""Block Kit messages: what an SRE needs in the channel without opening anything else.

For each alert of a group: severity, node, rule, the evidence (the latest value against its
threshold, the peak, and since when it fires), the BE suspects it is attributed to (the first
with its strongest clue), the actions taken and the ones the policy has
planned next, and a link to the incident in the web UI. Everything that comes from the
cluster or a rule is escaped for mrkdwn (`&`, `<`, `>`), so a pod name cannot inject a link
or a mention. Slack's limits (50 blocks, 3000 characters a section, 150 a header) are kept by
showing the first alerts in full and naming the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sloguard.actuators.alerting.alerts import Alert, shown_actions
from sloguard.actuators.alerting.grouping import FIRST, REPEAT, RESOLVED, Change, Flush
from sloguard.core.incidents import Incident
from sloguard.core.suspects import suspects_of
from sloguard.core.units import format_duration

MAX_DETAILED = 8
SHOWN_SUSPECTS = 3
SECTION_LIMIT = 2900
HEADER_LIMIT = 150
TEXT_LIMIT = 3000
SEVERITY_ICON = {"critical": ":red_circle:", "warning": ":large_orange_circle:",
                 "info": ":large_blue_circle:"}
RESOLVED_ICON = ":white_check_mark:"
REPEAT_NOTE = ("Possibly repeated: sloguard could not tell whether Slack received the previous "
               "attempt of this message.")


def escape(text: Any) -> str:
    """Slack's mrkdwn control characters; what remains is shown as written."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def incident_url(external_url: str, incident_id: str) -> str:
    return f"{external_url.rstrip('/')}/incidents/{incident_id}"


def when(ns: int | None) -> str:
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%b %d %H:%M:%S UTC")


def _number(value: float | None) -> str:
    if value is None:
        return "no data"
    return f"{value:.4g}"


@dataclass
class Renderer:
    external_url: str
    planned: Callable[[Incident], list[str]]
    silence_hint: bool = True

    # -- the group's message -------------------------------------------------------------------

    def group(self, flush: Flush, now_ns: int) -> dict[str, Any]:
        """The whole group: posted first, then updated in place (or re-sent by webhooks)."""
        firing, resolved = flush.firing, flush.resolved
        header = self._title(flush)
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": header[:HEADER_LIMIT],
                                        "emoji": True}}]
        if flush.reason not in (FIRST, REPEAT) and flush.changes:
            lines = [self._change(c) for c in flush.changes[:10]]
            blocks.append(_section("*What changed*\n" + "\n".join(lines)))
        if flush.reason == REPEAT:
            blocks.append(_section(f"Still firing, last notified "
                                   f"{format_duration(_age(flush.previous_ns, now_ns))} "
                                   f"ago (repeat_interval)"))
        shown = [*firing, *resolved]
        for alert in shown[:MAX_DETAILED]:
            blocks.append({"type": "divider"})
            blocks.append(_section(self._alert(alert, now_ns)))
        rest = shown[MAX_DETAILED:]
        if rest:
            names = ", ".join(escape(a.incident.rule) for a in rest[:20])
            blocks.append(_section(f"…and {len(rest)} more: {names}"))
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": self._context(flush)[:TEXT_LIMIT]}]})
        return {"text": header[:TEXT_LIMIT], "blocks": blocks[:50]}

    def _title(self, flush: Flush) -> str:
        firing = flush.firing
        alerts = firing or flush.resolved
        names = sorted({a.incident.rule for a in alerts})
        nodes = sorted({a.incident.node for a in alerts})
        what = names[0] if len(names) == 1 else f"{len(names)} rules"
        where = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes"
        if firing:
            worst = max(firing, key=lambda a: ("info", "warning", "critical").index(
                a.incident.severity) if a.incident.severity in ("info", "warning", "critical")
                else 0).incident.severity
            icon = SEVERITY_ICON.get(worst, ":warning:")
            resolved = f", {len(flush.resolved)} resolved" if flush.resolved else ""
            return f"{icon} [FIRING:{len(firing)}{resolved}] {what} on {where}"
        return f"{RESOLVED_ICON} [RESOLVED] {what} on {where}"

    def _alert(self, alert: Alert, now_ns: int) -> str:
        i = alert.incident
        state = "firing" if alert.firing else "resolved"
        lines = [f"*{escape(i.rule)}* · {escape(i.severity)} · node `{escape(i.node)}` · "
                 f"{state}"]
        if i.summary:
            lines.append(escape(i.summary))
        last = next((e for e in reversed(i.evidence) if e.value is not None), None)
        since = i.fired_ns or i.started_ns
        evidence = []
        if last is not None:
            evidence.append(f"{_number(last.value)} against threshold {_number(last.threshold)}"
                            if last.threshold is not None else f"value {_number(last.value)}")
        if i.peak is not None:
            evidence.append(f"peak {_number(i.peak)}")
        if alert.firing:
            evidence.append(f"firing since {when(since)} "
                            f"({format_duration(_age(since, now_ns))})")
        else:
            evidence.append(f"fired {when(since)}, resolved {when(i.resolved_ns)}")
            because = i.annotations.get("resolved_because")
            if because:
                evidence.append(escape(because))
        lines.append("*Evidence:* " + " · ".join(evidence))
        suspects = suspects_of(i)[:SHOWN_SUSPECTS] if alert.firing else []
        if suspects:
            lines.append("*Suspects:* " + "; ".join(
                f"{s.rank}. `{escape(s.name)}` {s.score:.2f}"
                + (f" {escape(s.resource)}" if s.resource else "")
                + (f" ({escape(s.clues[0].text)})" if s.clues and s.rank == 1 else "")
                for s in suspects))
        actions = shown_actions(i)
        if actions:
            lines.append("*Actions:* " + "; ".join(
                f"{escape(a.step)} {escape(a.status)}{' (dry-run)' if a.dry_run else ''} "
                f"{escape(a.target)} at {when(a.time_ns)}" for a in actions[-6:]))
        planned = self.planned(i) if alert.firing else []
        if planned:
            lines.append("*Planned:* " + "; ".join(escape(p) for p in planned))
        series = ", ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(i.series.items())
                           if k != "node")
        if series:
            lines.append(f"_{series}_")
        lines.append(f"<{incident_url(self.external_url, i.id)}|Open incident {escape(i.id)}>")
        text = "\n".join(lines)
        return text if len(text) <= SECTION_LIMIT else text[:SECTION_LIMIT - 1] + "…"

    def _context(self, flush: Flush) -> str:
        parts = [f"sloguard · receiver {escape(flush.group.receiver)}"]
        labels = ", ".join(f"{escape(k)}={escape(v)}" for k, v in flush.group.labels.items())
        if labels:
            parts.append(f"group {labels}")
        if flush.muted:
            parts.append(f"{flush.muted} more muted (silenced or inhibited)")
        if self.silence_hint and flush.firing:
            names = sorted({a.incident.rule for a in flush.firing})
            nodes = sorted({a.incident.node for a in flush.firing})
            if len(names) == 1 and len(nodes) == 1:
                parts.append(f"silence: `sloguard silence add alertname={escape(names[0])} "
                             f"node={escape(nodes[0])} --duration 2h -m '…'`")
        return " · ".join(parts)

    # -- the timeline in the message's thread ---------------------------------------------------

    def timeline(self, flush: Flush, now_ns: int) -> dict[str, Any]:
        if flush.reason == REPEAT:
            text = (f":alarm_clock: Still firing: {len(flush.firing)} alert(s), last notified "
                    f"{format_duration(_age(flush.previous_ns, now_ns))} ago")
        elif flush.reason == RESOLVED and not flush.firing:
            text = f"{RESOLVED_ICON} All resolved at {when(now_ns)}"
        else:
            text = f"Update at {when(now_ns)}"
        lines = [self._change(c) for c in flush.changes[:30]]
        body = "\n".join([text, *lines])[:TEXT_LIMIT]
        return {"text": body, "blocks": [_section(body)]}

    def _change(self, change: Change) -> str:
        i = change.alert.incident
        who = f"*{escape(i.rule)}* `{escape(_subject(i))}`"
        if change.kind == "fired":
            return f"• {when(i.fired_ns or i.started_ns)} {who} fired: {escape(i.summary)}"
        if change.kind == "resolved":
            return f"• {when(i.resolved_ns)} {who} resolved"
        if change.kind == "action" and change.action is not None:
            a = change.action
            dry = " (dry-run)" if a.dry_run else ""
            return (f"• {when(a.time_ns)} {who}: {escape(a.step)} {escape(a.status)}{dry} "
                    f"{escape(a.target)}: {escape(a.detail)}"[:500])
        return f"• {who} updated (severity {escape(i.severity)})"


def mark_possible_repeat(payload: dict[str, Any]) -> dict[str, Any]:
    """The webhook's only honest option when a send's outcome is unknown: say so."""
    out = dict(payload)
    out["text"] = f"(possibly repeated) {payload.get('text', '')}"[:TEXT_LIMIT]
    note = {"type": "context", "elements": [{"type": "mrkdwn", "text": f":warning: {REPEAT_NOTE}"}]}
    out["blocks"] = [*payload.get("blocks", [])[:49], note]
    return out


def text_only(payload: dict[str, Any]) -> dict[str, Any]:
    """The fallback when Slack rejects the blocks: the same news as plain text."""
    sections = [b["text"]["text"] for b in payload.get("blocks", [])
                if b.get("type") == "section" and isinstance(b.get("text"), dict)]
    text = "\n".join([payload.get("text", ""), *sections])
    return {"text": text[:TEXT_LIMIT] or "sloguard alert"}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:TEXT_LIMIT]}}


def _age(since_ns: int | None, now_ns: int) -> float:
    return max(0.0, (now_ns - (since_ns or now_ns)) / 1e9) // 1


def _subject(incident: Incident) -> str:
    """The series in a few words: the pod, workload or device it is about."""
    for key in ("pod", "workload", "container", "device", "cgroup"):
        if incident.series.get(key):
            return incident.series[key]
    return incident.node
