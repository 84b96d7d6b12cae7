"""One fault model (fabricmon/sim/faults.py) for both writers: the single-node fixture writer
(sim/fixture.py) and the cluster simulator (sim/cluster.py, which sim/tree.py and sim/inmemory.py
render) give the same counters, link state and NVML state for the same fault and seed.

Where they overlap: the fault's own part.  Each writer's traffic and background noise come from its own
generators (dicts of Python ints against numpy arrays over nodes), so the comparison is of what the
fault adds, each writer's faulted run against its own fault-free run with the same seed, snapshot by
snapshot: a one-node cluster stepped by the fixture's --interval, the fault starting at snapshot 1.
"""

from __future__ import annotations

import pytest

from fabricmon.sim import faults as fm
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.fixture import fixture_node
from fabricmon.sim.hw import FRONTEND, NVL_FIELDS, SPEEDS, K
from fabricmon.sim.scenario import ClusterSpec, Scenario

pytest.importorskip("numpy")

SNAPSHOTS, INTERVAL, SEED = 6, 15.0, 5

# (kind, layout, fixture options, the same fault in a scenario)
CASES = [
    ("flaky_cable", "ib", {"fault_dev": "mlx5_3"}, {"node": "node-000", "rail": 3}),
    ("flaky_cable", "roce", {"fault_dev": "mlx5_1"}, {"node": "node-000", "rail": 1}),
    ("pfc_storm", "roce", {"fault_dev": "mlx5_2"}, {"node": "node-000", "rail": 2}),
    ("pfc_storm", "ib", {"fault_dev": "mlx5_8"}, {"node": "node-000"}),  # the frontend: ib's only Ethernet
    ("ecn_congestion", "roce", {"fault_dev": "mlx5_4"}, {"unit": 0, "rail": 4}),
    ("ecn_congestion", "ib", {"fault_dev": "mlx5_4"}, {"unit": 0, "rail": 4}),
    ("rdma_retransmits", "roce", {"fault_dev": "mlx5_6"}, {"node": "node-000", "rail": 6}),
    ("rdma_retransmits", "ib", {"fault_dev": "mlx5_6"}, {"node": "node-000", "rail": 6}),
    ("link_down", "ib", {"fault_dev": "mlx5_3"}, {"node": "node-000", "rail": 3}),
    ("link_flap", "roce", {"fault_dev": "mlx5_3"}, {"node": "node-000", "rail": 3, "period": 2 * INTERVAL}),
    ("link_degraded", "ib", {"fault_dev": "mlx5_0", "degrade": "width"}, {"node": "node-000", "rail": 0}),
    ("link_degraded", "ib", {"fault_dev": "mlx5_0", "degrade": "speed"},
     {"node": "node-000", "rail": 0, "degrade": "speed"}),
    ("config_drift", "roce", {"fault_dev": "mlx5_5"}, {"node": "node-000", "rail": 5}),
    ("nvlink_errors", "ib", {"fault_gpu": 2, "fault_link": 5}, {"node": "node-000", "gpu": 2, "link": 5}),
    ("nvlink_down", "ib", {"fault_gpu": 6, "fault_link": 11}, {"node": "node-000", "gpu": 6, "link": 11}),
    ("slow_gpu", "roce", {"fault_gpu": 1}, {"node": "node-000", "gpu": 1}),
]


def _fixture(kind: str, layout: str, opts: dict) -> list[dict]:
    """Per snapshot, the fixture node's state: port counters by K name, link state, config, NVML."""
    node = fixture_node(layout=layout, fault=kind, seed=SEED, snapshots=SNAPSHOTS, interval=INTERVAL,
                        **(opts if kind != "none" else {}))
    dev = next(d for d in node.devs if d["name"] == opts.get("fault_dev", "mlx5_0"))
    gpu, link = opts.get("fault_gpu", 0), opts.get("fault_link", 0)
    out = []
    for t in range(SNAPSHOTS):
        node.step(t)
        p = dev["port"]
        counters = {f"pma:{k}": v for k, v in p.pma.items()} | {f"hw:{k}": v for k, v in p.hw.items()} \
            | {f"eth:{k}": v for k, v in p.eth.items()}
        g = node.gpus[gpu].nvml
        drift = kind == "config_drift" and node.active(t)
        out.append({"counters": counters, "up": p.up, "rate": (p.lanes, p.speed), "pfc3": p.ethernet and not drift,
                    "nvl": {f"nvl:{f}": g["links"][link][f] for f in NVL_FIELDS},
                    "nvl_state": g["links"][link]["state"], "throttle": g["throttle_reasons"]})
    return out


def _cluster(kind: str, layout: str, where: dict, dev: int, gpu: int, link: int) -> list[dict]:
    scn = Scenario(ClusterSpec(nodes=1, layout=layout, nodes_per_unit=1, seed=SEED), SNAPSHOTS * INTERVAL)
    if kind != "none":
        scn = scn.with_fault(kind, start=INTERVAL, **where)
    c = ClusterState(scn)
    out = []
    for t in range(SNAPSHOTS):
        if t:
            c.advance(INTERVAL)
        links, C = c.links, c.counters.C
        out.append({"counters": {name: int(C[i, 0, dev]) for name, i in K.items()}, "up": bool(links.up[0, dev]),
                    "rate": (int(links.lanes[0, dev]), SPEEDS[int(links.speed[0, dev])]),
                    "pfc3": bool(links.pfc[0, dev, 3]),
                    "nvl": {f"nvl:{f}": int(c.gpus.nvl[j, 0, gpu, link]) for j, f in enumerate(NVL_FIELDS)},
                    "nvl_state": int(c.gpus.nvl_up[0, gpu, link]), "throttle": int(c.gpus.throttle[0, gpu])})
    return out


def _fault_part(faulted: list[dict], clean: list[dict], names: list[str], key: str) -> list[dict]:
    return [{n: f[key][n] - c[key][n] for n in names} for f, c in zip(faulted, clean, strict=True)]


def _rule_counters(rules: tuple[fm.CounterRule, ...], ethernet: bool) -> list[str]:
    out = []
    for r in rules:
        if r.ethernet_only and not ethernet:
            continue
        out.append(r.counter)
        out += [name for name, _ in r.also]
    return out


@pytest.mark.parametrize(("kind", "layout", "opts", "where"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2].get('degrade', '')}".rstrip("-") for c in CASES])
def test_fixture_and_cluster_give_the_same_counters_for_the_same_fault_and_seed(kind, layout, opts, where):
    m = fm.MODELS[kind]
    dev = int(opts["fault_dev"][5:]) if "fault_dev" in opts else 0
    ethernet = layout == "roce" or dev == FRONTEND
    gpu, link = opts.get("fault_gpu", 0), opts.get("fault_link", 0)
    fx, fx0 = _fixture(kind, layout, opts), _fixture("none", layout, opts)
    cl, cl0 = _cluster(kind, layout, where, dev, gpu, link), _cluster("none", layout, where, dev, gpu, link)

    # every counter a rule moves: the same amount in every snapshot (gauges: the same value)
    names = _rule_counters(m.counters, ethernet)
    if m.link in ("down", "flap"):
        names += ["pma:link_downed", "pma:link_error_recovery"] + (["eth:link_down_events_phy"] if ethernet else [])
    gauges = [r.counter for r in m.counters if r.how == "gauge"]
    adds = [n for n in names if n not in gauges]
    fx_part, cl_part = _fault_part(fx, fx0, adds, "counters"), _fault_part(cl, cl0, adds, "counters")
    assert fx_part == cl_part
    assert [{g: s["counters"][g] for g in gauges} for s in fx] == [{g: s["counters"][g] for g in gauges} for s in cl]
    nvl = _rule_counters(m.nvlink, False)
    assert _fault_part(fx, fx0, nvl, "nvl") == _fault_part(cl, cl0, nvl, "nvl")
    # state: link up/down and rate, PFC on the RoCE priority, the NVLink's state, throttle reasons
    for key in ("up", "rate", "pfc3", "nvl_state", "throttle"):
        assert [s[key] for s in fx] == [s[key] for s in cl], key

    # and the fault is really there: before snapshot 1 nothing, from it its evidence or state
    if names:
        assert all(v == 0 for v in fx_part[0].values()), fx_part[0]
        assert any(v for s in fx_part[1:] for v in s.values()), fx_part
    if nvl:
        assert any(v for s in _fault_part(fx, fx0, nvl, "nvl")[1:] for v in s.values())
    changed = {key for key in ("up", "rate", "pfc3", "nvl_state", "throttle")
               if [s[key] for s in fx] != [s[key] for s in fx0]}
    want = {"down": {"up"}, "flap": {"up"}, "degraded": {"rate"}}.get(m.link or "", set()) \
        | ({"pfc3"} if m.config_off else set()) | ({"nvl_state"} if m.nvlink_down else set()) \
        | ({"throttle"} if m.throttle else set())
    assert changed == want


def test_a_faults_evidence_is_its_own_whatever_else_the_scenario_holds():
    """Per-fault RNGs: adding a second fault after it changes none of the first fault's evidence."""
    spec = ClusterSpec(nodes=2, layout="roce", nodes_per_unit=2, seed=3)
    base = Scenario(spec, 60.0).with_fault("flaky_cable", node="node-000", rail=2, start=10.0)
    more = base.with_fault("rdma_retransmits", node="node-001", rail=5, start=5.0)
    a, b = ClusterState(base), ClusterState(more)
    for _ in range(30):
        a.advance(2.0)
        b.advance(2.0)
    for name in ("pma:symbol_error", "pma:port_rcv_errors", "eth:rx_pcs_symbol_err_phy", "eth:rx_crc_errors_phy"):
        assert a.counters.C[K[name], 0, 2] == b.counters.C[K[name], 0, 2] > 0, name
    assert b.counters.C[K["hw:packet_seq_err"], 1, 5] > a.counters.C[K["hw:packet_seq_err"], 1, 5]


def test_every_scenario_fault_kind_has_a_model():
    from fabricmon.sim.scenario import KINDS

    assert set(KINDS) <= set(fm.MODELS)
    assert fm.GAUGES == ("eth:outbound_pci_stalled_wr",)


def test_flap_and_cable_degrading_share_the_down_rule():
    period = 6.0
    flap = [fm.link_down("link_flap", s, period) for s in (0, 2.9, 3.0, 5.9, 6.0)]
    assert flap == [True, True, False, False, True]
    # cable_degrading: up until fails_after, then the same flap
    assert [fm.link_down("cable_degrading", s, period, fails_after=100.0) for s in (0, 99, 100, 103, 106)] == \
        [False, False, True, False, True]
    assert fm.link_down("link_down", 1e9, None) and not fm.link_down("flaky_cable", 0.0, None)


def test_a_fault_with_the_same_seed_draws_the_same_evidence_and_another_seed_does_not():
    def draw(seed: int) -> list:
        rng = fm.fault_rng(seed, 0)
        return [list(fm.port_evidence("rdma_retransmits", rng, 1.0, s, 1.0, True)) for s in range(8)]

    assert draw(1) == draw(1) != draw(2)
    # the late rules wait for their after_s
    firsts = {name for name, _, _ in draw(1)[0]}
    assert "hw:req_cqe_error" not in firsts and any(name == "hw:req_cqe_error" for name, _, _ in draw(1)[6])

