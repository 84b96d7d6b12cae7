"""The aggregator on topologies from the fabric: named leaves of a fat tree localized by the real
Engine, NICs an import knows only by node GUID or netdev bound from the agents' hellos, shards that
own leaf groups by leaf name, and the topology exported as series for the recording rules."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.topology_reload import plan
from fabricmon.batch import NicHello, NodeBatch, NodeHello
from fabricmon.cli import main
from fabricmon.model import CounterDelta, Sample
from fabricmon.rank_timing import RankTiming
from fabricmon.topology import Topology, canonical_guid, load_topology
from support.paths import FIXTURES
from support.topology_fabrics import fat_tree_halves

T0 = 1_764_000_000.0
IMPORT = FIXTURES / "topology_import"





BEHIND_A3 = tuple(("gpu-a17-02", f"mlx5_{k}") for k in range(4, 8)) + tuple(("gpu-a17-03", f"mlx5_{k}")
                                                                             for k in range(4))
# a synchronous job over the 8 nodes in order: node i's GPU g is rank 8i+g
RANKS_A3 = {16 + g for g in range(4, 8)} | {24 + g for g in range(4)}


class Node:
    """One node's hello and batches, second by second, from the NICs its agent would discover."""

    def __init__(self, name: str, devices: list[tuple[str, str, str]], gpus: int = 8, seed: int = 0) -> None:
        self.name, self.devices, self.gpus = name, devices, gpus  # devices: (device, netdev, node_guid)
        self.rng = random.Random(seed)
        self.seq = 0
        self.extra: list[CounterDelta] = []

    def hello(self) -> NodeHello:
        return NodeHello(self.name, "test", 1.0, tuple(
            NicHello(d, "1", "", "InfiniBand", nd, 400.0, 4, i, guid) for i, (d, nd, guid) in enumerate(self.devices)),
            self.gpus, "boot-1")

    def batch(self, t: float, first: bool, ranks: tuple = ()) -> NodeBatch:
        self.seq += 1
        deltas = []
        gauges = []
        for d, _nd, _g in self.devices:
            lab = (("device", d), ("port", "1"))
            deltas += [CounterDelta("fabricmon_ib_port_transmit_bytes_total", lab, self.rng.uniform(1e9, 2e10)),
                       CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),), 0.0)]
            if first:
                gauges += [Sample("fabricmon_ib_port_state", lab, 4.0),
                           Sample("fabricmon_ib_port_physical_state", lab, 5.0),
                           Sample("fabricmon_ib_port_rate_bytes_per_second", lab, 400e9 / 8),
                           Sample("fabricmon_ib_port_width_lanes", lab, 4.0)]
        deltas += self.extra
        self.extra = []
        return NodeBatch(self.name, self.seq, t, 1.0, tuple(deltas), tuple(gauges), tuple(ranks))

    def flaky(self, device: str) -> None:
        lab = (("device", device), ("port", "1"))
        self.extra += [
            CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),),
                         float(self.rng.randint(200, 2000))),
            CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "port_rcv_errors"),),
                         float(self.rng.randint(5, 50))),
            CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "link_error_recovery"),), 1.0)]


class Rig:
    def __init__(self, topo: Topology, nodes: list[Node]) -> None:
        self.topo, self.nodes = topo, nodes
        self.engine = Engine(topo, DetectionSettings())
        for n in nodes:
            self.engine.hello(n.hello())
        self.t, self.first = T0, True

    def run(self, seconds: int, flaky: tuple[tuple[str, str], ...] = (), slow_ranks=frozenset()) -> None:
        """``slow_ranks``: (node, gpu) whose transfers are 0.3 s slower (a synchronous job on every GPU)."""
        rng = random.Random(7)
        for _ in range(seconds):
            self.t += 1.0
            step = int(self.t - T0)
            for i, n in enumerate(self.nodes):
                for node, dev in flaky:
                    if node == n.name:
                        n.flaky(dev)
                ranks = []
                for g in range(n.gpus):
                    transfer = 0.5 + rng.gauss(0, 0.005) + (0.3 if (n.name, g) in slow_ranks else 0.0)
                    ranks.append(RankTiming("llm", i * 8 + g, g, step, 1.5 + transfer, transfer, self.t, node=n.name))
                self.engine.ingest(n.batch(self.t, self.first, tuple(ranks)))
            self.first = False
            self.engine.tick(self.t)

    def open(self) -> list:
        return [i for i in self.engine.incidents() if i.open]


def _devices(n: int = 8) -> list[tuple[str, str, str]]:
    return [(f"mlx5_{k}", f"ib{k}", "") for k in range(n)]


def test_fat_tree_leaf_carrying_eight_nics_of_two_nodes_is_found_as_that_leaf(tmp_path) -> None:
    """Errors on the eight links leaf-a3 carries (four of each of two nodes) and the ranks behind them
    late in communication: one FabricLeafDegraded on leaf-a3, by its name and without a rail, the slow
    ranks riding on it; no link alert, no rail, no other leaf."""
    topo = load_topology(fat_tree_halves(tmp_path))
    assert topo.shape.nodes_on_leaf("leaf-a3") == ["gpu-a17-02", "gpu-a17-03"]
    rig = Rig(topo, [Node(n, _devices(), seed=i) for i, n in enumerate(topo.nodes)])
    slow = frozenset((n, int(d[-1])) for n, d in BEHIND_A3)
    rig.run(25)
    assert rig.open() == []
    rig.run(40, flaky=BEHIND_A3, slow_ranks=slow)
    incs = rig.open()
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLeafDegraded", "leaf", "leaf-a3")], incs
    leaf = incs[0]
    assert leaf.labels["leaf"] == "leaf-a3" and "rail" not in leaf.labels and "node" not in leaf.labels
    assert leaf.jobs == ["llm"] and set(leaf.ranks) == RANKS_A3
    a3 = next(c for c in rig.engine.links_by_leaf if c.id == "leaf-a3")
    assert sorted(str(lk.id) for lk in rig.engine.links_by_leaf[a3]) == sorted(f"{n}/{d}/1" for n, d in BEHIND_A3)


def test_fat_tree_slow_ranks_behind_one_leaf_without_counters_are_that_leaf_not_a_gpu(tmp_path) -> None:
    """No counter evidence at all: the ranks behind leaf-a3 late in communication are one straggler
    finding on leaf-a3 (the switch they share, by the topology), not eight GPUs or a rail."""
    topo = load_topology(fat_tree_halves(tmp_path))
    rig = Rig(topo, [Node(n, _devices(), seed=i) for i, n in enumerate(topo.nodes)])
    rig.run(40, slow_ranks=frozenset((n, int(d[-1])) for n, d in BEHIND_A3))
    incs = rig.open()
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("StragglerRank", "leaf", "leaf-a3")], incs
    assert set(incs[0].ranks) == RANKS_A3
    assert "no fabric evidence" in incs[0].full_description()


def test_hello_binds_nics_an_import_knows_only_by_node_guid(tmp_path) -> None:
    """forms-plane-a (ibnetdiscover against ibsim) describes gpu-a17-04's CAs as "HCA-1"/"HCA-2": the
    import keeps them by node GUID; the agent's hello (sysfs node_guid spelling) names mlx5_0/mlx5_1, and
    from then on their links carry the leaves the fabric says.  A reload of the same file stays a no-op."""
    out = tmp_path / "t.yaml"
    assert main(["topology", "import", "--cluster", "lab", "-o", str(out), "--log-level", "error",
                 "--ibnetdiscover", str(IMPORT / "ibsim" / "forms-plane-a.out")]) == 0
    topo = load_topology(out)
    assert topo.nodes["gpu-a17-04"].nics == () and len(topo.nodes["gpu-a17-04"].unbound) == 2
    # the agent exports sysfs' spelling; the expected map (forms-plane-a.expected.tsv) the import's
    expected = {(r[0], r[2]): r[4] for r in (ln.split("\t") for ln in
                (IMPORT / "ibsim" / "forms-plane-a.expected.tsv").read_text().splitlines()) if r[0] == "gpu-a17-04"}
    assert expected == {("gpu-a17-04", "0xb8cef60300a11010"): "leaf-a0",
                        ("gpu-a17-04", "0xb8cef60300a11020"): "leaf-a1"}
    node = Node("gpu-a17-04", [("mlx5_0", "ib0", "b8ce:f603:00a1:1020"), ("mlx5_1", "ib1", "b8ce:f603:00a1:1010"),
                               ("mlx5_2", "eth0", "b8ce:f603:00a1:9999")], gpus=8)
    rig = Rig(topo, [node])
    # mlx5_0 carries GUID ...1020 (leaf-a1), mlx5_1 ...1010 (leaf-a0): the GUID decides, not the order
    assert topo.leaf_of_nic("gpu-a17-04", "mlx5_0") == "leaf-a1"
    assert topo.leaf_of_nic("gpu-a17-04", "mlx5_1") == "leaf-a0"
    assert topo.nic("gpu-a17-04", "mlx5_2") is None  # not in the fabric's view: no leaf invented
    links = rig.engine.nodes["gpu-a17-04"].by_device
    assert links["mlx5_0"].id.labels("lab") == {"node": "gpu-a17-04", "leaf": "leaf-a1", "rail": "1",
                                                "cluster": "lab"}
    assert links["mlx5_1"].leaf.id == "leaf-a0"
    rig.run(5)
    rig.run(10, flaky=(("gpu-a17-04", "mlx5_0"),))
    incs = rig.open()
    assert [(i.alertname, i.component, i.labels.get("leaf")) for i in incs] == [
        ("FabricLinkErrors", "gpu-a17-04/mlx5_0/1", "leaf-a1")], incs
    # the same file again (SIGHUP): bound the same way, so nothing changed
    change = plan(rig.engine.topology, load_topology(out), str(out))
    assert change.empty


def test_hello_binds_lldp_interfaces_to_devices(tmp_path) -> None:
    """An LLDP import (real lldpctl JSON) knows netdevs only; the hello's netdev names the device."""
    out = tmp_path / "roce.yaml"
    assert main(["topology", "import", "--lldp", str(IMPORT / "lldp"), "--cluster", "roce-a", "-o", str(out),
                 "--log-level", "error"]) == 0
    topo = load_topology(out)
    rig = Rig(topo, [Node("gpu-a17-03", [("mlx5_0", "ens3f0np0", ""), ("mlx5_1", "ens3f1np1", "")], gpus=2)])
    assert {d: (lk.leaf.id if lk.leaf else None) for d, lk in rig.engine.nodes["gpu-a17-03"].by_device.items()} == {
        "mlx5_0": "leaf-r0", "mlx5_1": "leaf-r1"}
    assert rig.engine.links_by_leaf and {c.id for c in rig.engine.links_by_leaf} == {"leaf-r0", "leaf-r1"}


@pytest.mark.parametrize(("text", "want"), [
    ("0xb8cef60300a1b2c3", "0xb8cef60300a1b2c3"), ("b8ce:f603:00a1:b2c3", "0xb8cef60300a1b2c3"),
    ("B8CEF60300A1B2C3", "0xb8cef60300a1b2c3"), ("0x2c9", "0x00000000000002c9"),
    ("ens3f0np0", None), ("eth0", None), ("b8ce:f603:00a1", None), ("0x", None), ("0x1g", None)])
def test_canonical_guid(text: str, want: str | None) -> None:
    assert canonical_guid(text) == want


# ---------------------------------------------------------------------------- shards own leaf groups
def _import(tmp_path: Path, fixture: str, name: str) -> Path:
    out = tmp_path / name
    assert main(["topology", "import", "--cluster", "lab", "-o", str(out), "--log-level", "error",
                 "--ibnetdiscover", str(IMPORT / "ibsim" / fixture)]) == 0
    return out


def _shard_map(tmp_path: Path, topology: str, replicas: list[dict]) -> Path:
    p = tmp_path / "shards.yaml"
    p.write_text(yaml.safe_dump({"topology": topology, "replicas": replicas}, sort_keys=False))
    return p


def test_shards_of_an_imported_topology_own_leaf_groups_by_leaf_name(tmp_path, capsys) -> None:
    """rail-optimized.out (ibnetdiscover against ibsim): scalable units su00.. of four leaves each.  A replica
    naming one leaf of a unit owns the unit whole, check-config says so, and an agent of that unit and the
    aggregator replica agree on the owner."""
    from fabricmon.agent.shard_target import resolve_static
    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.aggregator.service import build_engine
    from fabricmon.config import ShardConfig

    topo_path = _import(tmp_path, "rail-optimized.out", "topology.yaml")
    topo = load_topology(topo_path)
    groups = topo.shape.leaf_groups()
    assert len(groups) >= 2 and groups[0] == ["leaf-su00-r0", "leaf-su00-r1", "leaf-su00-r2", "leaf-su00-r3"]
    rest = [leaf for u, g in groups.items() if u >= 1 for leaf in g]
    p = _shard_map(tmp_path, "topology.yaml", [
        {"name": "agg-0", "address": "127.0.0.1:9721", "leaves": ["leaf-su00-r2"]},
        {"name": "agg-1", "address": "127.0.0.1:9731", "leaves": rest}])
    assert main(["check-config", str(p)]) == 0
    out = capsys.readouterr().out
    n0 = len(topo.shape.nodes_in_unit(0))
    assert f"agg-0 (127.0.0.1:9721): 1 leaf group(s), {n0} nodes: unit 0 (leaf-su00-r0, leaf-su00-r1, leaf-su00-r2, " \
           f"leaf-su00-r3)" in out, out
    assert "agg-0 also owns leaf-su00-r0, leaf-su00-r1, leaf-su00-r3: they share nodes with the leaves it names" in out
    assert f"agg-1 (127.0.0.1:9731): {len(groups) - 1} leaf group(s), {len(topo.nodes) - n0} nodes" in out
    # the agent of a node in unit 1 finds agg-1 by the same rule
    node1 = topo.shape.nodes_in_unit(1)[0]
    _, target = resolve_static(ShardConfig(map=str(p), topology=str(topo_path)), node1, "agent.yaml")
    assert (target.replica, target.address, target.via) == ("agg-1", "127.0.0.1:9731", "topology")
    node0 = topo.shape.nodes_in_unit(0)[0]
    _, target = resolve_static(ShardConfig(map=str(p), topology=str(topo_path)), node0, "a.yaml")
    assert target.replica == "agg-0"
    # and the aggregator replica with shard.leaves owns exactly those nodes
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({"topology": "topology.yaml", "auth": {"insecure": True},
                                   "shard": {"leaves": ["leaf-su00-r2"]}}))
    engine = build_engine(load_aggregator_config(cfg), hostname="agg-0")
    assert engine.shard_units == frozenset({0})
    assert sorted(engine.nodes) == sorted(topo.shape.nodes_in_unit(0))
    assert engine.registry.owned(topo.shape.nodes_in_unit(0)[1]) and not engine.registry.owned(node1)


def test_shard_leaves_split_a_group_or_name_no_leaf_are_refused(tmp_path, capsys) -> None:
    topo_path = _import(tmp_path, "rail-optimized.out", "topology.yaml")
    topo = load_topology(topo_path)
    rest = [leaf for u, g in topo.shape.leaf_groups().items() if u >= 1 for leaf in g]
    split = _shard_map(tmp_path, "topology.yaml", [
        {"name": "agg-0", "address": "127.0.0.1:9721", "leaves": ["leaf-su00-r0", "leaf-su00-r1"]},
        {"name": "agg-1", "address": "127.0.0.1:9731", "leaves": ["leaf-su00-r3", *rest]}])
    assert main(["check-config", str(split)]) == 2
    err = capsys.readouterr().err
    assert ("shards.yaml: replicas: unit 0 (leaf-su00-r0, leaf-su00-r1, leaf-su00-r2, leaf-su00-r3): owned by "
            "2 replicas (agg-0, agg-1); a unit's leaves must stay in one shard") in err, err
    typo = _shard_map(tmp_path, "topology.yaml", [
        {"name": "agg-0", "address": "127.0.0.1:9721", "leaves": ["leaf-su00-r0"]},
        {"name": "agg-1", "address": "127.0.0.1:9731", "leaves": ["leaf-su0l-r0", *rest]}])
    assert main(["check-config", str(typo)]) == 2
    assert "shards.yaml: replicas[1].leaves[0]: leaf 'leaf-su0l-r0' is not in the topology" in capsys.readouterr().err
    both = _shard_map(tmp_path, "topology.yaml", [
        {"name": "agg-0", "address": "127.0.0.1:9721", "leaves": ["leaf-su00-r0"], "units": [0]}])
    assert main(["check-config", str(both)]) == 2
    assert "replicas[0].leaves: give units or leaves, not both" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the topology as series
def _exposition(engine: Engine) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from fabricmon.aggregator.http_api import AggregatorCollector

    reg = CollectorRegistry()
    reg.register(AggregatorCollector(engine))
    return generate_latest(reg).decode()


def test_aggregator_exports_the_topology_it_owns_with_named_leaves(tmp_path) -> None:
    """/metrics carries fabricmon_topology_port_info (what the recording rules join rail and leaf from, as
    deploy/prometheus/tests/fabricmon-topology.test.yml feeds them) and fabricmon_topology_leaf_info; a
    shard exports only the ports it owns; a NIC known only by GUID appears once a hello binds it; the
    exposition passes promtool check metrics."""
    import subprocess

    from fabricmon.aggregator.config import DetectionSettings as Settings
    from support.promtools import PROMTOOL, require_binary

    topo = load_topology(fat_tree_halves(tmp_path))
    text = _exposition(Engine(topo, Settings()))
    ports = [ln for ln in text.splitlines() if ln.startswith("fabricmon_topology_port_info{")]
    assert len(ports) == 64
    assert ('fabricmon_topology_port_info{device="mlx5_5",leaf="leaf-a3",node="gpu-a17-02",port="1",rail=""} 1.0'
            in ports)
    assert 'fabricmon_topology_leaf_info{leaf="leaf-a3",spine="spine-02"} 1.0' in text
    lint = subprocess.run([require_binary(PROMTOOL), "check", "metrics"], input=text.encode(), capture_output=True,
                          timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint
    # a shard owning leaf group 0 of rail-optimized.out exports only its nodes' ports
    ro = load_topology(_import(tmp_path, "rail-optimized.out", "ro.yaml"))
    shard = Engine(ro, Settings(), shard_units=(0,))
    nodes = {ln.split('node="')[1].split('"')[0] for ln in _exposition(shard).splitlines()
             if ln.startswith("fabricmon_topology_port_info{")}
    assert nodes == set(ro.shape.nodes_in_unit(0))
    # forms-plane-a: gpu-a17-04's CAs are known by GUID only; its hello binds them, then they are series
    fa = load_topology(_import(tmp_path, "forms-plane-a.out", "fa.yaml"))
    eng = Engine(fa, Settings())
    assert 'node="gpu-a17-04"' not in _exposition(eng)
    eng.hello(Node("gpu-a17-04", [("mlx5_0", "ib0", "b8ce:f603:00a1:1010")]).hello())
    got = [ln for ln in _exposition(eng).splitlines() if 'node="gpu-a17-04"' in ln]
    assert got == ['fabricmon_topology_port_info{device="mlx5_0",leaf="leaf-a0",node="gpu-a17-04",port="1",'
                   'rail="0"} 1.0'], got
