"""The agent reads its unit from its Kubernetes node label: request, errors, retries, /readyz, metrics.

A loopback HTTPS server with a test CA stands in for the API server (tests/support/kubeapi.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fabricmon.agent.kube_node import NodeLabelError, in_cluster_api_server, read_node_label
from fabricmon.agent.shard_target import ShardCollector, ShardTarget, label_lookup, resolve_static
from fabricmon.config import KubernetesShardsConfig, NodeLabelConfig, ShardConfig

pytest.importorskip("cryptography", reason="tests/support/certs.py makes the test CA with cryptography")

from support.kubeapi import FakeApiServer  # noqa: E402
from support.waiting import wait_until  # noqa: E402

KEY = "fabricmon.io/unit"


@pytest.fixture
def api(tmp_path):
    server = FakeApiServer(tmp_path)
    yield server
    server.close()


def _read(api: FakeApiServer, node: str = "gpu-node-7", timeout: float = 2.0) -> str:
    return read_node_label(api.url, node, KEY, str(api.token_file), api.ca, timeout)


def test_label_read_with_the_service_account_token(api):
    api.nodes["gpu-node-7"] = {KEY: "5", "kubernetes.io/os": "linux"}
    assert _read(api) == "5"
    assert api.requests == [("/api/v1/nodes/gpu-node-7", f"Bearer {api.token}")]


def test_token_is_read_again_on_every_call(api):
    """Projected service-account tokens are rotated by the kubelet: a cached one would expire."""
    api.nodes["gpu-node-7"] = {KEY: "1"}
    _read(api)
    api.token = "sa-token-2"
    api.token_file.write_text("sa-token-2")
    assert _read(api) == "1"
    assert api.requests[-1][1] == "Bearer sa-token-2"


def test_node_name_is_quoted_into_one_path_segment(api):
    with pytest.raises(NodeLabelError, match="404"):
        _read(api, node="a/../../secrets")
    assert api.paths() == ["/api/v1/nodes/a%2F..%2F..%2Fsecrets"]


def test_404_names_the_node(api):
    with pytest.raises(NodeLabelError, match=r"404: no Node named 'gpu-node-7'.*spec.nodeName"):
        _read(api)


def test_403_says_the_clusterrole_is_missing(api):
    api.status = 403
    with pytest.raises(NodeLabelError, match=r"403 .*needs get on nodes \(ClusterRole"):
        _read(api)


def test_401_with_a_wrong_token(api):
    api.token_file.write_text("stale")
    with pytest.raises(NodeLabelError, match=r"401"):
        _read(api)


def test_500_is_reported(api):
    api.status = 500
    with pytest.raises(NodeLabelError, match=r"HTTP 500"):
        _read(api)


def test_timeout_is_an_error_not_a_hang(api):
    api.hang.set()
    with pytest.raises(NodeLabelError, match=r"(?i)timed out|timeout"):
        _read(api, timeout=0.3)


def test_untrusted_certificate_is_refused(api, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    from support.certs import make_pki

    wrong_ca = make_pki(other, {})["ca"]
    api.nodes["gpu-node-7"] = {KEY: "1"}
    with pytest.raises(NodeLabelError, match=r"(?i)certificate"):
        read_node_label(api.url, "gpu-node-7", KEY, str(api.token_file), wrong_ca, 2.0)
    assert api.requests == []  # the token never left the agent


def test_missing_token_file_and_label_and_unreachable_server(api, tmp_path):
    api.nodes["gpu-node-7"] = {"other": "x"}
    with pytest.raises(NodeLabelError, match=r"has no label fabricmon.io/unit.*kubectl label node"):
        _read(api)
    with pytest.raises(NodeLabelError, match=r"cannot read service-account token"):
        read_node_label(api.url, "gpu-node-7", KEY, str(tmp_path / "nope"), api.ca, 1.0)
    url = api.url
    api.close()
    with pytest.raises(NodeLabelError, match=r"cannot reach the API server"):
        read_node_label(url, "gpu-node-7", KEY, str(api.token_file), api.ca, 1.0)


def test_in_cluster_address_from_the_kubelet_env():
    assert in_cluster_api_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) \
        == "https://10.96.0.1:443"
    assert in_cluster_api_server({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}) \
        == "https://[fd00::1]:6443"
    with pytest.raises(NodeLabelError, match="KUBERNETES_SERVICE_HOST unset"):
        in_cluster_api_server({})


def _select(api: FakeApiServer) -> ShardConfig:
    return ShardConfig(kubernetes=KubernetesShardsConfig(units_per_shard=4, namespace="fm"),
                       node_label=NodeLabelConfig(api_server=api.url, token_file=str(api.token_file), ca_file=api.ca,
                                            timeout=1.0))


def test_label_that_is_not_a_unit_number(api):
    api.nodes["n1"] = {KEY: "rack-3"}
    lookup = label_lookup(_select(api), "n1")
    with pytest.raises(NodeLabelError, match=r"label fabricmon.io/unit: expected a unit number.*'rack-3'"):
        lookup()


def test_shard_target_retries_until_the_api_server_answers(api):
    """403 (RBAC not yet applied) and a missing label: /readyz says why, the lookup retries with
    backoff; once the label is there the stream starts, once, towards the unit's replica."""
    sel = _select(api)
    replicas, target = resolve_static(sel, "n1", "agent.yaml")
    assert target is None  # only the API server knows the unit
    started: list[str] = []
    began = threading.Event()

    def start(address: str):
        started.append(address)
        began.set()
        return None

    api.status = 403
    shard = ShardTarget("n1", replicas, start, lookup=label_lookup(sel, "n1"), backoff=(0.02, 0.1)).start()
    try:
        assert wait_until(lambda: shard.failures_total >= 2)
        assert shard.not_ready() and "403" in shard.not_ready()[0]
        assert _samples(shard)["fabricmon_agent_shard_resolved"] == 0.0
        api.nodes["n1"] = {"kubernetes.io/os": "linux"}  # not labelled yet
        api.status = None
        assert wait_until(lambda: "has no label" in shard.problem)
        api.nodes["n1"] = {KEY: "9"}  # unit 9 of 4 per shard: replica 2
        assert began.wait(10.0)
        assert wait_until(lambda: shard.target is not None)
        assert started == ["fabricmon-aggregator-2.fabricmon-aggregator.fm.svc:9721"]
        assert shard.not_ready() == []
        assert shard.target.via == "node_label" and shard.target.replica == "fabricmon-aggregator-2"
        s = _samples(shard)
        assert s["fabricmon_agent_shard_resolved"] == 1.0
        assert s["fabricmon_agent_shard_lookup_failures_total"] >= 3
        n = len(api.requests)
        assert not wait_until(lambda: len(api.requests) > n, timeout=0.3)  # no lookups after it resolved
    finally:
        shard.stop()
    assert started == ["fabricmon-aggregator-2.fabricmon-aggregator.fm.svc:9721"]


def test_stop_ends_a_lookup_that_never_succeeds(api):
    api.status = 503
    sel = _select(api)
    replicas, _ = resolve_static(sel, "n1", "agent.yaml")
    shard = ShardTarget("n1", replicas, lambda a: pytest.fail("no stream without a unit"),
                        lookup=label_lookup(sel, "n1"), backoff=(0.02, 0.05)).start()
    assert wait_until(lambda: shard.failures_total >= 1)
    shard.stop()
    assert not shard.alive()



def _samples(shard: ShardTarget) -> dict[str, float]:
    return {s.name: s.value for fam in ShardCollector(shard).collect() for s in fam.samples}


def test_info_metric_names_the_replica(tmp_path: Path):
    sel = ShardConfig(kubernetes=KubernetesShardsConfig(units_per_shard=2, namespace="fm", port=9731), unit=5)
    replicas, target = resolve_static(sel, "n1", "agent.yaml")
    shard = ShardTarget("n1", replicas, lambda a: None, target=target).start()
    info = [s for fam in ShardCollector(shard).collect() for s in fam.samples if s.name == "fabricmon_agent_shard_info"]
    assert [(s.labels, s.value) for s in info] == [(
        {"node": "n1", "unit": "5", "replica": "fabricmon-aggregator-2",
         "aggregator": "fabricmon-aggregator-2.fabricmon-aggregator.fm.svc:9731", "via": "unit"}, 1.0)]
