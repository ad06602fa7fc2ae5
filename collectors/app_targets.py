"""Which endpoints to scrape and probe: those in the config, and pods that ask to be scraped.

Pods opt in with annotations in the style Prometheus users know (`prometheus.io/scrape` and
friends), under sloguard's own prefix so that enabling sloguard never changes what Prometheus
scrapes:

    sloguard.io/scrape: "true"
    sloguard.io/port: "8080"        # default: the pod's first declared container port
    sloguard.io/path: /metrics      # default /metrics
    sloguard.io/scheme: http        # or https
    sloguard.io/service: checkout   # default: app.kubernetes.io/name, app, owner, pod name
    sloguard.io/metric: rpc_latency_seconds   # default: the first latency histogram

Only pods bound to this node are listed (the agent guards its own node), and only running pods
with an IP; a malformed annotation is reported (in /readyz), never guessed around.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sloguard.collectors.exposition import ReadSpec
from sloguard.core.pods import PodMeta, pod_class

PREFIX = "sloguard.io/"


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint and how to treat it. Immutable and hashable: a target whose settings change
    (a pod's new IP, an edited annotation) is a new target, scraped from a clean slate."""

    kind: str  # scrape | http | tcp
    service: str
    url: str  # scrape and http: the URL; tcp: HOST:PORT
    interval: float
    timeout: float
    namespace: str = ""
    pod: str = ""
    class_: str = "LS"
    source: str = "config"  # config, or pod <namespace>/<name>
    read: ReadSpec | None = None
    method: str = "GET"
    expect_status: tuple[int, ...] = ()
    tls_verify: bool = True
    ca_file: str | None = None

    @property
    def key(self) -> str:
        return f"{self.kind} {self.url} {self.service}"

    def tags(self, node: str) -> dict[str, str]:
        """Tags of this target's samples: who it is, so rules and SREs can tell services apart."""
        tags = {"node": node, "service": self.service, "target": self.url}
        if self.kind != "scrape":
            tags["kind"] = self.kind
        for name, value in (("namespace", self.namespace), ("pod", self.pod),
                            ("class", self.class_)):
            if value:
                tags[name] = value
        return tags


def _read_spec(cfg: Any, errors: Any, metric: str | None = None,
               labels: dict[str, str] | None = None, unit: str = "auto") -> ReadSpec:
    return ReadSpec(metric=metric, labels=tuple(sorted((labels or {}).items())), unit=unit,
                    error_metric=errors.metric, error_label=errors.label, error_match=errors.match,
                    max_series=cfg.max_series, max_labels=cfg.max_labels,
                    max_label_length=cfg.max_label_length)


def _timeout(timeout: float | None, default: float, interval: float) -> float:
    """A scrape may not outlast its interval (as in Prometheus), or rounds would pile up."""
    return min(timeout or default, interval)


def targets_from_config(cfg: Any) -> list[Target]:
    """The scrape targets and probes of `app_latency` in the config."""
    out = []
    for t in cfg.targets:
        interval = t.interval or cfg.scrape_interval
        out.append(Target(
            kind="scrape", service=t.service, url=t.url, interval=interval,
            timeout=_timeout(t.timeout, cfg.timeout, interval), namespace=t.namespace or "",
            pod=t.pod or "", class_=t.class_,
            read=_read_spec(cfg, t.errors or cfg.errors, t.metric, t.labels, t.unit),
            tls_verify=t.tls_verify, ca_file=t.ca_file))
    for p in cfg.probes:
        interval = p.interval or cfg.probe_interval
        out.append(Target(
            kind=p.kind, service=p.service, url=p.url if p.kind == "http" else p.address,
            interval=interval, timeout=_timeout(p.timeout, cfg.timeout, interval),
            namespace=p.namespace or "", method=p.method.upper(),
            expect_status=tuple(p.expect_status), tls_verify=p.tls_verify, ca_file=p.ca_file))
    return out


def service_of(pod: PodMeta) -> str:
    """The service a pod belongs to, when no annotation says: the names Kubernetes tools use."""
    labels = pod.labels
    for key in ("app.kubernetes.io/name", "app"):
        if labels.get(key):
            return labels[key]
    if pod.owner:
        suffix = labels.get("pod-template-hash")  # Deployment -> ReplicaSet name-<hash>
        if suffix and pod.owner.endswith(f"-{suffix}"):
            return pod.owner[: -len(suffix) - 1]
        return pod.owner
    return pod.name


def targets_from_pods(pods: list[PodMeta], cfg: Any, class_label: str,
                      trusted: list[str] | None = None) -> tuple[list[Target], list[str]]:
    """Scrape targets of annotated running pods, and what is wrong with the annotations of the
    pods that asked to be scraped but cannot be."""
    targets, problems = [], []
    interval = cfg.pods.interval or cfg.scrape_interval
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        notes = pod.annotations
        if notes.get(PREFIX + "scrape", "").strip().lower() != "true":
            continue
        if pod.phase != "Running" or not pod.ip:
            continue  # not started yet or gone: nothing to scrape, nothing wrong
        where = f"pod {pod.namespace}/{pod.name}"
        port_text = notes.get(PREFIX + "port", "").strip()
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                problems.append(f"{where}: {PREFIX}port {port_text!r} is not a port number")
                continue
            port = int(port_text)
        elif pod.ports:
            port = pod.ports[0]
        else:
            problems.append(f"{where}: no {PREFIX}port annotation and no container port")
            continue
        scheme = notes.get(PREFIX + "scheme", "http").strip().lower()
        if scheme not in ("http", "https"):
            problems.append(f"{where}: {PREFIX}scheme {scheme!r} is not http or https")
            continue
        path = notes.get(PREFIX + "path", "/metrics").strip() or "/metrics"
        if not path.startswith("/"):
            problems.append(f"{where}: {PREFIX}path {path!r} must start with /")
            continue
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        targets.append(Target(
            kind="scrape", service=notes.get(PREFIX + "service", "").strip() or service_of(pod),
            url=f"{scheme}://{host}:{port}{path}", interval=interval,
            timeout=_timeout(None, cfg.timeout, interval), namespace=pod.namespace,
            pod=pod.name, class_=pod_class(pod, "", class_label, trusted), source=where,
            read=_read_spec(cfg, cfg.errors, notes.get(PREFIX + "metric", "").strip() or None),
            tls_verify=cfg.pods.tls_verify, ca_file=cfg.pods.ca_file))
    return targets, problems
