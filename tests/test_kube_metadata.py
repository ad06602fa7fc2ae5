"""Pod names, namespaces, container names and the LS/BE class from a real Kubernetes API,
attached to samples of real pod cgroups; and collection going on when the API is away."""

from __future__ import annotations

import itertools
import socket
import time
import uuid

from kubernetes import client

from sloguard.agent import Agent
from sloguard.collectors.cgroup_ids import CgroupAttribution
from sloguard.collectors.cgroups import CgroupCollector
from sloguard.collectors.config import CgroupCollectorConfig
from sloguard.collectors.kube_pods import PodMetadataCache, load_api_client
from sloguard.settings import load_settings
from sloguard.store import WindowQuery

NODE = "meta-node"


def _pod(core, namespace, name, labels, qos, containers):
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(node_name=NODE, containers=[
            client.V1Container(name=c, image="registry.invalid/app:1") for c, _ in containers]),
    )
    pod = core.create_namespaced_pod(namespace, body)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses = [{
        "name": c, "containerID": f"containerd://{cid}", "ready": True, "restartCount": 0,
        "image": "registry.invalid/app:1", "imageID": "", "state": {"running": {"startedAt": now}},
    } for c, cid in containers]
    core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Running", "qosClass": qos, "containerStatuses": statuses}})
    return pod.metadata.uid


def _kubeconfig(tmp_path, server: str):
    """A kubeconfig for `server` with a token nobody checks: for an API that is away or hangs."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return kubeconfig


def _setup(kube, real_cgroups):
    core = client.CoreV1Api(kube.api_client())
    namespace = f"meta-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    batch_cid, web_cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    batch_uid = _pod(core, namespace, "batch-job", {"koordinator.sh/qosClass": "BE"},
                     "Burstable", [("worker", batch_cid)])
    web_uid = _pod(core, namespace, "web", {"app": "web"}, "Burstable", [("nginx", web_cid)])
    other = client.V1Pod(metadata=client.V1ObjectMeta(name="elsewhere"), spec=client.V1PodSpec(
        node_name="another-node", containers=[client.V1Container(name="c", image="x")]))
    core.create_namespaced_pod(namespace, other)
    batch = real_cgroups.create(f"kubepods/burstable/pod{batch_uid}/{batch_cid}")
    web = real_cgroups.create(f"kubepods/burstable/pod{web_uid}/{web_cid}")
    real_cgroups.spawn(batch, "import time\ntime.sleep(60)")
    real_cgroups.spawn(web, "import time\ntime.sleep(60)")
    return namespace, batch, web


def test_samples_carry_pod_metadata_and_koordinator_class(kube, real_cgroups):
    namespace, batch, web = _setup(kube, real_cgroups)
    cache = PodMetadataCache(load_api_client(kube.kubeconfig_path()), NODE, refresh_s=3600)
    cache.refresh()
    assert cache.status().ok and cache.status().details["pods"] == 2  # only this node's
    collector = CgroupCollector(
        NODE, CgroupCollectorConfig(include=[f"{real_cgroups.prefix}/kubepods"]),
        pod_lookup=cache.get)
    collector.collect(time.time_ns())
    time.sleep(0.2)
    samples = collector.collect(time.time_ns())
    tags = {s.tags["cgroup"]: s.tags for s in samples if s.measurement == "container_memory"}
    be = tags[f"/{batch}"]
    assert (be["pod"], be["namespace"], be["container"], be["class"], be["qos"]) == (
        "batch-job", namespace, "worker", "BE", "burstable")  # the label beats the QoS tier
    ls = tags[f"/{web}"]
    assert (ls["pod"], ls["container"], ls["class"]) == ("web", "nginx", "LS")
    pod_level = tags["/" + web.rsplit("/", 1)[0]]
    assert pod_level["level"] == "pod" and pod_level["pod"] == "web"
    assert "container" not in pod_level


def test_metadata_that_arrives_late_names_and_classes_the_pod_at_the_next_collection(
        kube, real_cgroups):
    """A pod's cgroup is found before the listing that knows the pod (the agent lists again
    within 2 s of such a cgroup): until then it carries what its path tells (BestEffort: BE).
    Once the listing knows it, the next collection names it and classes it by its label, not
    the next walk of the hierarchy (`rediscover`, 10 s by default): a BestEffort pod labelled
    LS was otherwise a lever's target for up to that long, and a lever's audit named a
    suspect by its cgroup path (the kube node test saw it once)."""
    core = client.CoreV1Api(kube.api_client())
    namespace = f"late-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    cache = PodMetadataCache(load_api_client(kube.kubeconfig_path()), NODE, refresh_s=3600)
    cache.refresh()  # the listing before the pod
    cid = uuid.uuid4().hex * 2
    uid = _pod(core, namespace, "late-ls", {"koordinator.sh/qosClass": "LS"}, "BestEffort",
               [("app", cid)])
    rel = real_cgroups.create(f"kubepods/besteffort/pod{uid}/{cid}")
    collector = CgroupCollector(
        NODE, CgroupCollectorConfig(include=[f"{real_cgroups.prefix}/kubepods"],
                                    rediscover=3600), pod_lookup=cache.get)

    def tags() -> dict[str, str]:
        samples = collector.collect(time.time_ns())
        return next(s.tags for s in samples if s.tags["cgroup"] == f"/{rel}"
                    and s.measurement == "container_memory")

    ebpf = CgroupAttribution(collector, "pid")  # what eBPF samples take their tags from
    before = tags()
    ebpf.refresh()
    assert before["class"] == "BE" and "pod" not in before and "pod" not in ebpf.tags(rel)
    pod_level = "/" + rel.rsplit("/", 1)[0]  # what a lever targets
    assert [w["class"] for w in collector.workloads() if w["cgroup"] == pod_level] == ["BE"]
    cache.refresh()  # the listing that knows it
    after = tags()
    assert (after["pod"], after["namespace"], after["container"], after["class"]) == (
        "late-ls", namespace, "app", "LS")
    assert [(w["pod"], w["class"]) for w in collector.workloads()
            if w["cgroup"] == pod_level] == [("late-ls", "LS")]
    assert collector.discoveries == 1  # named without walking the hierarchy again
    ebpf.refresh()
    assert (ebpf.tags(rel)["pod"], ebpf.tags(rel)["class"]) == ("late-ls", "LS")


def test_agent_uses_the_api_when_configured(kube, real_cgroups, tmp_path):
    namespace, batch, _ = _setup(kube, real_cgroups)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"node_name: {NODE}\n"
        f"kubernetes: {{enabled: true, kubeconfig: '{kube.kubeconfig_path()}'}}\n"
        f"collectors: {{cgroups: {{include: ['{real_cgroups.prefix}/kubepods']}}}}\n"
    )
    agent = Agent(load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings)
    try:
        agent.pods.refresh()
        agent.tick()
        frame = agent.store.read(WindowQuery(
            "container_memory", time.time_ns() - 60 * 10**9, time.time_ns(),
            fields=("usage_bytes",)))
        row = frame[frame["cgroup"] == f"/{batch}"].iloc[0]
        assert (row["pod"], row["namespace"], row["class"]) == ("batch-job", namespace, "BE")
        kube_status = next(c for c in agent.components() if c.name == "kubernetes")
        assert kube_status.ok
    finally:
        agent.stop()


def test_unreachable_api_is_reported_and_collection_goes_on(real_cgroups, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    kubeconfig = _kubeconfig(tmp_path, f"https://127.0.0.1:{port}")
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
    rel = real_cgroups.create(f"kubepods/besteffort/pod{uid}/{cid}")
    cache = PodMetadataCache(load_api_client(str(kubeconfig)), NODE, refresh_s=3600)
    cache.refresh()
    assert not cache.status().ok and "listing pods failed" in cache.status().reason
    collector = CgroupCollector(
        NODE, CgroupCollectorConfig(include=[f"{real_cgroups.prefix}/kubepods"]),
        pod_lookup=cache.get)
    samples = collector.collect(time.time_ns())
    tags = next(s.tags for s in samples if s.tags["cgroup"] == f"/{rel}")
    assert tags["class"] == "BE" and tags["pod_uid"] == uid and "pod" not in tags


def test_listings_asked_for_while_the_api_is_away_back_off(tmp_path):
    """The container collector looks up each unnamed pod at every collection, and a failed
    listing lets every uid ask again: with the API away, each node would list every `soon_s`.
    After each failed listing the gap before an asked one doubles, up to `refresh_s`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: each listing fails at once
    kubeconfig = _kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    cache = PodMetadataCache(load_api_client(str(kubeconfig)), NODE, refresh_s=3600,
                             soon_s=0.1)
    listings = []
    real_list = cache._core.list_pod_for_all_namespaces

    def counted(*args, **kwargs):  # the real call, to a port nothing listens on
        listings.append(time.monotonic())
        return real_list(*args, **kwargs)

    cache._core.list_pod_for_all_namespaces = counted
    uid = str(uuid.uuid4())
    cache.start()
    try:
        until = time.monotonic() + 3.5
        while time.monotonic() < until:  # a collection a tick, at 20 ticks a second
            assert cache.get(uid) is None
            time.sleep(0.05)
    finally:
        cache.stop()
    assert "listing pods failed" in cache.status().reason
    gaps = [b - a for a, b in itertools.pairwise(listings)]
    # 0.2, 0.4, 0.8, 1.6 s: five listings in 3.5 s, where a fixed 0.1 s gap gave over 20
    assert 3 <= len(listings) <= 6, gaps
    assert all(later > earlier for earlier, later in itertools.pairwise(gaps)), gaps
    assert cache.gap() == 0.1 * 2 ** len(listings)


def test_a_hung_api_never_blocks_the_agent(tmp_path):

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    port = listener.getsockname()[1]
    kubeconfig = _kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    cache = PodMetadataCache(load_api_client(str(kubeconfig)), NODE, refresh_s=3600)
    started = time.monotonic()
    cache.start()
    assert time.monotonic() - started < 1  # the first listing runs in its own thread
    assert not cache.status().ok and cache.status().reason == "not listed yet"
    deadline = time.monotonic() + 30
    while cache.status().reason == "not listed yet" and time.monotonic() < deadline:
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    assert "listing pods failed" in cache.status().reason
    assert elapsed < 25, f"one refresh took {elapsed:.0f} s: retries multiply the timeout"
    cache.stop()
    listener.close()


def test_a_pod_unknown_to_the_cache_is_listed_soon_not_at_the_next_refresh(kube):
    """A pod created after a listing is looked up by its uid (its cgroup appeared): the cache
    lists again within `soon_s`, not `refresh_s` later; a second lookup asks nothing more."""
    core = client.CoreV1Api(kube.api_client())
    namespace = f"meta-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    cache = PodMetadataCache(load_api_client(kube.kubeconfig_path()), NODE, refresh_s=3600,
                             soon_s=3)  # the window in which `_wanted` stays set, below
    cache.start()
    try:
        deadline = time.monotonic() + 30
        while not cache.status().ok:  # the first listing
            assert time.monotonic() < deadline, cache.status().reason
            time.sleep(0.05)
        uid = _pod(core, namespace, "late-job", {"koordinator.sh/qosClass": "BE"},
                   "BestEffort", [("worker", uuid.uuid4().hex * 2)])
        assert cache.get(uid) is None  # unknown: the lookup asks for a listing
        deadline = time.monotonic() + 10
        while (meta := cache.get(uid)) is None:
            assert time.monotonic() < deadline, "no listing after the lookup of an unknown pod"
            time.sleep(0.05)
        assert (meta.name, meta.namespace) == ("late-job", namespace)
        assert not cache._wanted.is_set()
        unknown = str(uuid.uuid4())
        assert cache.get(unknown) is None and cache._wanted.is_set()  # asks once...
        time.sleep(4.5)  # (the listing it asked for, soon_s after the one before)
        assert not cache._wanted.is_set()
        assert cache.get(unknown) is None and not cache._wanted.is_set()  # ...not again
    finally:
        cache.stop()
