"""Pods that ask to be scraped (sloguard.io/ annotations), found through a real kube-apiserver and
scraped at their pod IP: here 127.0.0.1, where a real instrumented service listens."""

from __future__ import annotations

import time
import uuid

from kubernetes import client
from support.latency_service import LatencyService, Traffic

from sloguard.collectors.app_latency import AppLatencyCollector
from sloguard.collectors.config import AppLatencyConfig
from sloguard.collectors.kube_pods import PodMetadataCache, load_api_client

NODE = "app-node"


def _pod(core, namespace, name, annotations, labels=None, node=NODE, ip="127.0.0.1",
         owner=None):
    meta = client.V1ObjectMeta(name=name, annotations=annotations, labels=labels or {})
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=meta,
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(
            name="app", image="registry.invalid/app:1",
            ports=[client.V1ContainerPort(container_port=8080)])])))
    if owner:  # a controlling owner, as a ReplicaSet is; a ConfigMap here, so that neither
        # the ReplicaSet controller nor the garbage collector (the owner must exist) touch it
        owned_by = core.create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=owner)))
        core.patch_namespaced_pod(name, namespace, {"metadata": {"ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner,
            "uid": owned_by.metadata.uid, "controller": True}]}})
    core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "qosClass": "Burstable"}})


def test_annotated_pods_are_discovered_and_scraped(kube):
    core = client.CoreV1Api(kube.api_client())
    namespace = f"app-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    with LatencyService() as svc, Traffic(f"{svc.url}/work"):
        port = str(svc.port)
        _pod(core, namespace, "checkout-7d9f-abcde",
             {"sloguard.io/scrape": "true", "sloguard.io/port": port},
             labels={"pod-template-hash": "7d9f"}, owner="checkout-7d9f")
        _pod(core, namespace, "named", {"sloguard.io/scrape": "true", "sloguard.io/port": port,
                                        "sloguard.io/path": "/metrics",
                                        "sloguard.io/service": "payments"},
             labels={"app": "ignored-when-annotated"})
        _pod(core, namespace, "not-asked", {"sloguard.io/port": port})
        _pod(core, namespace, "bad-port", {"sloguard.io/scrape": "true",
                                           "sloguard.io/port": "http"})
        _pod(core, namespace, "elsewhere", {"sloguard.io/scrape": "true",
                                            "sloguard.io/port": port}, node="other-node")
        pods = PodMetadataCache(load_api_client(kube.kubeconfig_path()), NODE, refresh_s=3600)
        pods.refresh()
        assert pods.status().ok, pods.status().reason
        cfg = AppLatencyConfig.model_validate({"scrape_interval": 0.5, "timeout": 0.4})
        collector = AppLatencyCollector(NODE, cfg, [], pods=pods)
        collector.start()
        try:
            samples: list = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                samples.extend(collector.collect(time.time_ns()))
                if {s.tags.get("pod") for s in samples} >= {"checkout-7d9f-abcde", "named"}:
                    break
                time.sleep(0.2)
            by_pod = {s.tags["pod"]: s for s in samples if s.measurement == "app_latency"}
            assert set(by_pod) == {"checkout-7d9f-abcde", "named"}, collector.status()
            checkout = by_pod["checkout-7d9f-abcde"]
            assert checkout.tags["service"] == "checkout"  # the ReplicaSet's Deployment
            assert checkout.tags["namespace"] == namespace and checkout.tags["class"] == "LS"
            assert checkout.tags["target"] == f"http://127.0.0.1:{port}/metrics"
            assert checkout.fields["requests"] > 0 and "p99" in checkout.fields
            assert by_pod["named"].tags["service"] == "payments"
            status = collector.status()
            sources = {t["source"] for t in status.details["targets"]}
            assert sources == {f"pod {namespace}/checkout-7d9f-abcde", f"pod {namespace}/named"}
            assert not status.ok  # the malformed annotation is reported
            assert (f"pod {namespace}/bad-port: sloguard.io/port 'http' is not a port number"
                    in status.details["discovery"])

            core.delete_namespaced_pod("named", namespace, grace_period_seconds=0)
            pods.refresh()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(collector.status().details["targets"]) > 1:
                time.sleep(0.2)
            assert [t["pod"] for t in collector.status().details["targets"]] == [
                "checkout-7d9f-abcde"]  # a pod gone is no longer scraped
        finally:
            collector.stop()
