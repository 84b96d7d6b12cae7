"""Alertmanager HA behind a headless Service: every address the name resolves to gets every alert.

Two real Alertmanagers listen on the same port at two loopback addresses (127.0.0.2, 127.0.0.3), as
two replicas behind one headless Service name would; the name is resolved by a resolver the test
controls (no DNS server here), which is the only part not real.
"""

from __future__ import annotations

import pytest

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.am_peers import PeerSet, expand
from fabricmon.aggregator.config import ConfigError, load_aggregator_config
from fabricmon.aggregator.incidents import IncidentManager
from support.amrig import Webhook, _incident, _start_am
from support.net import free_port
from support.waiting import wait_until

NAME = "alertmanager-headless.monitoring.svc.cluster.local"


def _fixed(table: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError(f"{host}: Name or service not known")
        return list(table[host])
    return resolve


def test_expand_names_keep_literals_localhost_and_https() -> None:
    r = _fixed({NAME: ["198.51.100.7", "198.51.100.5", "198.51.100.5", "fd00::9"]})
    assert expand(f"http://{NAME}:9093", r) == (
        "http://198.51.100.5:9093", "http://198.51.100.7:9093", "http://[fd00::9]:9093")
    assert expand(f"http://user:pw@{NAME}/prefix", r) == (
        "http://user:pw@198.51.100.5:80/prefix", "http://user:pw@198.51.100.7:80/prefix", "http://user:pw@[fd00::9]:80/prefix")
    for kept in ("http://127.0.0.1:9093", "http://[::1]:9093", "http://localhost:9093", f"https://{NAME}:9093"):
        assert expand(kept, r) == (kept,)
    with pytest.raises(OSError):
        expand("http://nowhere.invalid:9093", r)


def test_a_failed_resolution_keeps_the_addresses_it_had() -> None:
    table = {NAME: ["198.51.100.5"]}
    peers = PeerSet([f"http://{NAME}:9093", "http://127.0.0.1:9093"], _fixed(table))
    assert peers.urls() == [f"http://{NAME}:9093", "http://127.0.0.1:9093"]  # before the first resolution
    assert peers.refresh() and peers.urls() == ["http://198.51.100.5:9093", "http://127.0.0.1:9093"]
    del table[NAME]
    assert not peers.refresh() and peers.failures == 1
    assert peers.urls() == ["http://198.51.100.5:9093", "http://127.0.0.1:9093"]
    assert peers.counts() == {f"http://{NAME}:9093": 1, "http://127.0.0.1:9093": 1}


def test_resolve_seconds_is_validated(tmp_path) -> None:
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text("auth: {insecure: true}\nalertmanager: {urls: ['http://am:9093'], resolve_seconds: 0.01}\n")
    with pytest.raises(ConfigError, match=r"alertmanager\.resolve_seconds"):
        load_aggregator_config(str(cfg))


@pytest.mark.integration
def test_every_replica_behind_a_headless_name_gets_every_alert(tmp_path) -> None:
    hook = Webhook()
    port = free_port()
    table = {NAME: ["127.0.0.2"]}
    ams = {}
    client = None
    try:
        for host in ("127.0.0.2", "127.0.0.3"):
            ams[host] = _start_am(tmp_path / host, hook.url, port=port, host=host)
        client = AlertmanagerClient([f"http://{NAME}:{port}"], cluster="test", resend_seconds=3600,
                                    resolve_seconds=3600, resolver=_fixed(table))
        client.start()
        wait_until(lambda: client.peer_counts() == {f"http://{NAME}:{port}": 1}, 10, "first resolution")
        mgr = IncidentManager()
        client.submit(_incident(mgr, 1000.0), sample_now=1000.0)
        wait_until(lambda: len(ams["127.0.0.2"].get_alerts()) == 1, 15, "the first replica holds the alert")
        assert ams["127.0.0.3"].get_alerts() == []

        # a second replica appears behind the name: it gets the active alert at once, not at the next resend
        table[NAME] = ["127.0.0.3", "127.0.0.2"]
        assert client.refresh_peers()
        wait_until(lambda: len(ams["127.0.0.3"].get_alerts()) == 1, 15, "the new replica holds the active alert")
        assert client.peer_counts() == {f"http://{NAME}:{port}": 2}

        # the first replica leaves: the next alert goes to the one that is left only
        table[NAME] = ["127.0.0.3"]
        assert client.refresh_peers()
        before = len(ams["127.0.0.2"].get_alerts())
        from fabricmon import components
        from fabricmon.aggregator.incidents import Finding

        f = Finding("FabricLinkDown", components.link("node-009", "mlx5_1", 1),
                    {"node": "node-009", "rail": "1", "leaf": "leaf-u0-r1", "cluster": "test"},
                    ["link down"], fire=True, keep=True)
        client.submit(mgr.update([f], 1010.0), sample_now=1010.0)
        wait_until(lambda: any(a["labels"]["alertname"] == "FabricLinkDown" for a in ams["127.0.0.3"].get_alerts()),
                   15, "the remaining replica holds the new alert")
        assert len(ams["127.0.0.2"].get_alerts()) == before
        assert client.sent_total["error"] == 0
    finally:
        if client is not None:
            client.stop(flush_timeout=1.0)
        for am in ams.values():
            am.stop()
        hook.close()


@pytest.mark.parametrize(("url", "problem"), [
    ("http://am:99999", "Port out of range"),
    ("http://am:x", "Port could not be cast"),
    ("http://[::1:9093", "Invalid IPv6 URL"),
    ("http://:9093", "no host"),
])
def test_an_alertmanager_url_the_sender_cannot_read_is_one_line(tmp_path, url, problem) -> None:
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(f"auth: {{insecure: true}}\nalertmanager: {{urls: ['{url}']}}\n")
    with pytest.raises(ConfigError, match=r"alertmanager\.urls\[0\]: .*" + problem):
        load_aggregator_config(str(cfg))
