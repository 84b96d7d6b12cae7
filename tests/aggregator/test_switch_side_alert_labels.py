"""What the switch side's alerts carry to Alertmanager (issue 40, the AgentDown decision): a host cable's
incident seen from its swept switch end is labelled ``switch_end`` ``<leaf>/p<port>`` (so the host's
FabricmonAgentDown, ``equal: [cluster, node]``, does not hide it: deploy/alertmanager/alertmanager.yml,
checked against a real Alertmanager in tests/deploy/test_alertmanager_inhibitions.py), and uplink and spine
alerts carry ``spine`` (FabricSpineDegraded hides only its own spine's uplinks: ``equal: [cluster, spine]``
holds between two alerts that both lack the label).  Topology imported from real ibnetdiscover output
against ibsim (tests/fixtures/ib_switches/README.md): leaf-00 ports 1-2 hosts, 3-4 uplinks."""

from __future__ import annotations

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.batch import NodeBatch
from fabricmon.cli import main
from fabricmon.model import CounterDelta, Sample
from fabricmon.topology import load_topology
from support.paths import FIXTURES

SWEEPER = "node-000"
CABLES = {("leaf-00", 2): ("node-001", 1, "host"), ("leaf-00", 3): ("spine-00", 1, "switch"),
          ("spine-00", 1): ("leaf-00", 3, "switch")}


def _sent_labels(tmp_path, errors_at: tuple[str, int]) -> list[dict[str, str]]:
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(FIXTURES / "ib_switches" / "ibnetdiscover-cache.out"),
                 "-o", str(out)]) == 0
    engine = Engine(load_topology(out), DetectionSettings(), cluster="c1")
    engine.switch_side.sources = frozenset({SWEEPER})
    gauges = [Sample("fabricmon_switch_sweep_seconds", (), 0.1)]
    for (sw, port), (peer, pport, ptype) in CABLES.items():
        gauges.append(Sample("fabricmon_switch_port_info", (
            ("switch", sw), ("switch_guid", "0x0"), ("port", str(port)), ("peer", peer),
            ("peer_port", str(pport)), ("peer_type", ptype)), 1.0))
        gauges.append(Sample("fabricmon_switch_port_up", (("switch", sw), ("port", str(port))), 1.0))
    assert engine.ingest(NodeBatch(SWEEPER, 1, 100.0, 1.0, gauges=tuple(gauges)))
    engine.tick(100.0)
    sw, port = errors_at
    for k in range(1, 4):
        delta = CounterDelta("fabricmon_switch_port_errors_total",
                             (("switch", sw), ("port", str(port)), ("counter", "symbol_error")), 200.0)
        assert engine.ingest(NodeBatch(SWEEPER, k + 1, 100.0 + k, 1.0, deltas=(delta,), gauges=(
            Sample("fabricmon_switch_sweep_seconds", (), 0.1 + k / 1000),)))
        engine.tick(100.0 + k)
    client = AlertmanagerClient(["http://127.0.0.1:9"], cluster="c1")
    return [client.payload(client._snapshot(i))["labels"] for i in engine.open_incidents()]


def test_a_host_cable_seen_from_its_switch_end_names_that_end(tmp_path):
    (labels,) = _sent_labels(tmp_path, ("leaf-00", 2))
    assert (labels["alertname"], labels["component"], labels["node"]) == (
        "FabricLinkErrors", "node-001/mlx5_0/1", "node-001")
    assert labels["switch_end"] == "leaf-00/p2"


def test_uplink_alerts_carry_their_spine_and_no_node(tmp_path):
    (labels,) = _sent_labels(tmp_path, ("leaf-00", 3))
    assert (labels["component_type"], labels["component"]) == ("uplink", "leaf-00/p3")
    assert (labels["leaf"], labels["spine"], labels["spine_port"]) == ("leaf-00", "spine-00", "1")
    assert "node" not in labels and "switch_end" not in labels
