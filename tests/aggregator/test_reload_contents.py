"""SIGHUP re-reads the contents of the files the aggregator's config names, and applies them or
refuses them with one line (issue 26, "Reloads that lie").

Real ``run_aggregator`` with its reload event, real gRPC (TLS with real certificates) and HTTP on
127.0.0.1, real stream clients; every check is read back over HTTP or the stream.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from fabricmon.agent.stream import TlsFiles
from support.aggrig import Agent, Aggregator, Rig, link_errors, topology_doc
from support.waiting import wait_until

pytest.importorskip("cryptography", reason="the TLS test makes its certificates with cryptography")


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def _open(agg: Aggregator, alertname: str, component: str) -> dict | None:
    return next((i for i in agg.incidents("open") if (i["alertname"], i["component"]) == (alertname, component)), None)


def test_topology_additions_apply_removals_resolve_and_ownership_changes_are_refused(tmp_path, rig):
    nodes = {"node-000": 0, "node-001": 0, "node-002": 0, "node-003": 0}
    agg = rig(Aggregator, {"insecure": True}, topology=topology_doc(nodes),
              extra={"detection": {"agent_down_s": 1.0, "restart_grace_s": 1.0}})
    gone = rig(Agent, agg, "node-003", interval=0.2)
    gone.send()
    assert wait_until(lambda: gone.client.stats()["batches_acked_total"] >= 1, 10)
    gone.stop()
    assert wait_until(lambda: _open(agg, "FabricmonAgentDown", "node-003"), 15), agg.incidents()

    # node-003 leaves the fabric, node-004 joins it in a new unit
    grown = {**{k: v for k, v in nodes.items() if k != "node-003"}, "node-004": 1}
    agg.topology.write_text(yaml.safe_dump(topology_doc(grown)))
    assert agg.hup()
    down = next(i for i in agg.incidents() if (i["alertname"], i["component"]) == ("FabricmonAgentDown", "node-003"))
    assert down["resolved_at"] is not None and down["resolved_reason"] == "topology_removed", down
    # the new node is monitored with its place in the fabric: its errors carry its leaf
    new = rig(Agent, agg, "node-004", interval=0.2)
    for _ in range(40):
        new.send(link_errors("mlx5_0"))
        if wait_until(lambda: _open(agg, "FabricLinkErrors", "node-004/mlx5_0/1"), 0.2):
            break
    inc = _open(agg, "FabricLinkErrors", "node-004/mlx5_0/1")
    assert inc is not None and inc["labels"]["leaf"] == "leaf-u1-r0", agg.incidents()

    # a node moved to another unit (another replica's in a sharded fabric) needs a restart
    moved = {**grown, "node-001": 1}
    agg.topology.write_text(yaml.safe_dump(topology_doc(moved)))
    assert not agg.hup()
    # a file that does not parse is refused the same way; the running topology stays
    agg.topology.write_text("nodes: [")
    assert not agg.hup()
    agg.topology.write_text(yaml.safe_dump(topology_doc(grown)))
    assert agg.hup()  # the same contents as running: nothing to apply, and the gauge is 1 again
    assert _open(agg, "FabricLinkErrors", "node-004/mlx5_0/1") is not None


def test_certificate_and_ca_bundle_rotation_apply_to_new_handshakes(tmp_path, rig):
    from support.certs import make_pki

    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = make_pki(tmp_path / "old", {"c0": ("node-000", ()), "c2": ("node-002", ())})
    new = make_pki(tmp_path / "new", {"c1": ("node-001", ())}, ca_name="fabricmon test CA 2")
    live = tmp_path / "live"
    live.mkdir()
    cert, key, bundle = live / "server.crt", live / "server.key", live / "clients.pem"
    shutil.copy(old["server"][1], cert)
    shutil.copy(old["server"][0], key)
    shutil.copy(old["ca"], bundle)
    agg = rig(Aggregator, {"tls_cert": str(cert), "tls_key": str(key), "tls_client_ca": str(bundle)})

    def tls(pki_ca: str, pair) -> TlsFiles:
        return TlsFiles(ca=pki_ca, cert=pair[1], key=pair[0], server_name="aggregator.test")

    a = rig(Agent, agg, "node-000", tls=tls(old["ca"], old["c0"]))
    assert wait_until(lambda: a.client.connected, 15), a.client.last_error

    # the new server certificate (from the new CA) and a bundle of both CAs
    shutil.copy(new["server"][1], cert)
    shutil.copy(new["server"][0], key)
    bundle.write_text(open(old["ca"]).read() + open(new["ca"]).read())
    assert agg.hup()
    b = rig(Agent, agg, "node-001", tls=tls(new["ca"], new["c1"]))  # trusts only the new CA
    assert wait_until(lambda: b.client.connected, 15), b.client.last_error
    c = rig(Agent, agg, "node-002", tls=tls(new["ca"], old["c2"]))  # an agent whose certificate is not rolled yet
    assert wait_until(lambda: c.client.connected, 15), c.client.last_error
    assert a.client.connected and a.connects() == 1  # the live stream kept its handshake

    # a key that does not match the certificate: refused, new handshakes keep the running material
    shutil.copy(old["server"][0], key)
    assert not agg.hup()
    d = rig(Agent, agg, "node-003", tls=tls(new["ca"], new["c1"]))
    assert not wait_until(lambda: d.client.connected, 1.0)  # node-003 is not this certificate's CN...
    assert "PERMISSION_DENIED" in d.client.last_error  # ...but the handshake with the new chain worked


def test_a_topology_rewritten_while_a_reload_reads_it_is_applied_by_the_next_sighup(tmp_path, rig, monkeypatch):
    """The race a SIGHUP storm hit (tests/aggregator/test_reload_storm.py): the reload fingerprints the
    file, a writer replaces it, the reload parses the new contents.  Recorded as the old version while
    running the new one, the file put back to the old version was "unchanged" to every later SIGHUP."""
    from fabricmon.aggregator import reload as reload_mod

    four = {"node-000": 0, "node-001": 0, "node-002": 0, "node-003": 0}
    five = {**four, "node-004": 1}
    agg = rig(Aggregator, {"insecure": True}, topology=topology_doc(four))
    three = {k: v for k, v in four.items() if k != "node-003"}
    real_digest = reload_mod.file_digest
    raced: list[str] = []

    def digest_then_rewritten(path: str) -> str:
        d = real_digest(path)
        if not raced:  # the first reload only: a writer lands between the fingerprint and the parse
            raced.append(d)
            agg.topology.write_text(yaml.safe_dump(topology_doc(five)))
        return d

    monkeypatch.setattr(reload_mod, "file_digest", digest_then_rewritten)
    agg.topology.write_text(yaml.safe_dump(topology_doc(three)))
    assert agg.hup()
    assert raced and agg.value("fabricmon_topology_nodes") == 5  # it runs what it parsed
    agg.topology.write_text(yaml.safe_dump(topology_doc(three)))  # the version the race fingerprinted
    assert agg.hup()
    assert agg.value("fabricmon_topology_nodes") == 3, agg.reloads()


def test_agent_client_certificate_rotation_reconnects_and_a_bad_one_is_refused(tmp_path, rig):
    """What the agent's reload does when its TLS files change (the file watch or SIGHUP): reconnect
    with the new certificate once OpenSSL accepts it; a key that does not match keeps the live stream."""
    from fabricmon.agent.stream_channel import tls_problem
    from support.certs import make_pki

    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = make_pki(tmp_path / "old", {"c0": ("node-000", ())})
    new = make_pki(tmp_path / "new", {"c0": ("node-000", ())}, ca_name="fabricmon test CA 2")
    bundle = tmp_path / "clients.pem"  # the aggregator trusts client certificates of both CAs (a rotation)
    bundle.write_text(open(old["ca"]).read() + open(new["ca"]).read())
    agg = rig(Aggregator, {"tls_cert": old["server"][1], "tls_key": old["server"][0], "tls_client_ca": str(bundle)})
    live = tmp_path / "agent"
    live.mkdir()
    cert, key = live / "agent.crt", live / "agent.key"
    shutil.copy(old["c0"][1], cert)
    shutil.copy(old["c0"][0], key)
    files = TlsFiles(ca=old["ca"], cert=str(cert), key=str(key), server_name="aggregator.test")
    a = rig(Agent, agg, "node-000", tls=files)
    assert wait_until(lambda: a.client.connected, 15), a.client.last_error
    assert a.client.credentials_changed() is None and not a.client.refresh_credentials()

    shutil.copy(new["c0"][0], key)  # the new key, its certificate not written yet: OpenSSL refuses the pair
    assert tls_problem(files) is not None
    shutil.copy(new["c0"][1], cert)
    assert tls_problem(files) is None
    assert a.client.credentials_changed() == "TLS files" and a.client.refresh_credentials()
    assert wait_until(lambda: a.client.connected and a.connects() == 2, 15), a.client.last_error
    assert a.client.credentials_changed() is None
