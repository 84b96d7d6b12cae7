"""Fixture nodes: fake-but-realistic RDMA node trees (sysfs, ethtool, NVML) for fabricmon tests.

The repository's own fixture writer (tests use it through ``tests/conftest.py``'s ``make_fixture``;
also ``python -m fabricmon.sim.fixture --root DIR ...``).  Unlike ``sim.tree``, which renders a node of a
simulated *cluster* over time, this writes one node in isolation as N numbered snapshots with a single
fault and a manifest (``fixture.json``) saying what evidence each snapshot must show.  The hardware facts
(devices, counter names and widths, formats) are ``sim.hw``'s, so both writers agree.  Writes, under ROOT
(with --snapshots N > 1: under ROOT/t0 .. ROOT/t{N-1}):

  hostname                      the node name (--node-name, default node-000), as in /etc/hostname
  sys/class/infiniband/<dev>/{node_guid,sys_image_guid,fw_ver,hca_type,board_id,hw_rev,node_type,node_desc}
  sys/class/infiniband/<dev>/ports/1/{state,phys_state,rate,link_layer,lid,sm_lid,lid_mask_count,sm_sl,cap_mask}
  sys/class/infiniband/<dev>/ports/1/counters/*      (IB PMA PortCounters/PortCountersExtended)
  sys/class/infiniband/<dev>/ports/1/counters_ext/*  (only with --legacy-ext, pre-4.5 kernels)
  sys/class/infiniband/<dev>/ports/1/hw_counters/*   (mlx5 Q / RoCE accel / congestion / PPCNT counters)
  sys/class/infiniband/<dev>/ports/1/gids/0..1, gid_attrs/{types,ndevs}/0..1 (RoCE only)
  sys/class/infiniband/mlx5_8/ports/2/...             (only with --dual-port; its netdev enp170s0f1np1)
  sys/class/infiniband/<dev> -> ../../devices/<pci>/infiniband/<dev>  (symlink, as in real sysfs)
  sys/devices/<pci>/{numa_node,vendor,device,...,infiniband/<dev>/,net/<ifname>/}
  <pci>: pci<dom>:<bus>/<root port>/.../<bdf>, rail NIC i and GPU i under one PCIe switch (sim.hw.pci_device_path)
  sys/class/net/<ifname> -> ../../devices/<pci>/net/<ifname>  (symlink)
  sys/class/net/<ifname>/{operstate,carrier,carrier_changes,carrier_{up,down}_count,speed,mtu,address,type}
  sys/class/net/<ifname>/statistics/*, ecn/roce_{np,rp}/enable/0..7 (RoCE netdevs)
  ethtool/<ifname>.txt          `ethtool -S <ifname>` text, mlx5 names (Ethernet netdevs only)
  ethtool/<ifname>.pfc.txt      `mlnx_qos -i <ifname>`-like PFC/trust summary (config checks)
  nvml.json                     fake NVML (DESIGN.md "Contract"): {"gpus": [{index, uuid, name, pci_bus_id,
                                utilization, throttle_reasons, xid, links: [{state, tx_kib, rx_kib, replay,
                                recovery, crc_flit, crc_data}] x 18}]} for 8 "NVIDIA H100 80GB HBM3"
  fixture.json                  manifest (ROOT only): layout, node, canonical fault, its device/GPU, component
                                id and type, fault_start/fault_end, devices, GPUs, expected evidence per snapshot

The node is DGX-H100-like: rail NICs mlx5_0..mlx5_7 (CX-7, 400 Gb/s 4X NDR, InfiniBand with --layout ib or
RoCE with --layout roce), NIC i beside GPU i (GPU PCI bus = NIC bus + 3, same PCIe switch and NUMA node), and
a frontend storage NIC mlx5_8 (BlueField-3, 200 GbE RoCE "4X HDR", PFC and ECN on priority 3, trust pcp; no
rail, so the rail profile checks do not apply to it).  Every file is written atomically (a temporary
".<name>.<pid>.tmp" in the same directory, then a rename), so a reader polling a tree that is being
rewritten never sees a partial or empty file.

Time: snapshot t holds counters advanced by t * --interval seconds of simulated traffic (monotonic, except
where a fault says otherwise).  A fault is active in snapshots fault_start <= t < fault_end: --fault-start
defaults to 1 when --snapshots > 1 (t0 is a clean baseline) and to 0 otherwise; --fault-end defaults to
never.  Outside the window the device behaves normally (links up, error counters keep their values).

Fault kinds (--fault; the names of DESIGN.md "Scenario files"; old names symbol_errors = flaky_cable and
rdma_retries = rdma_retransmits are still accepted; fixture.json records the canonical name):
  none               nothing
  flaky_cable        symbol_error, port_rcv_errors, link_error_recovery rise (+ FEC/PCS/CRC phy stats on RoCE)
  link_down          port DOWN (phys_state Polling/Disabled, fallback rate, carrier 0), link_downed +1
  link_flap          port DOWN in snapshots start, start+2, ...; ACTIVE in between; one down event per flap
  link_degraded      port stays ACTIVE at half rate: --degrade width "200 Gb/sec (2X NDR)" (default) or
                     --degrade speed "200 Gb/sec (4X HDR)"; netdev speed follows; traffic capped
  pfc_storm          slow receiver (Ethernet NIC): it EMITS pauses (tx_prio3_pause_duration ~85% of each
                     interval, tx_pause_storm_* events), receives only background pauses, and shows the host-
                     side cause (outbound_pci_stalled_wr, rx_out_of_buffer, dev_internal_queue_oob); config unchanged
  ecn_congestion     RoCE: ECN marks and CNPs (np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled) and
                     port_xmit_wait rise; IB: only port_xmit_wait rises (IB ports have no ECN/CNP counters)
  rdma_retransmits   transport retries: local_ack_timeout_err, packet_seq_err, out_of_sequence, ... rise
  config_drift       a RoCE rail NIC loses PFC and ECN on priority 3 (pfc.txt and ecn/*/enable/3)
  hot_unplug         the NIC vanishes (PCI function, class/infiniband, class/net, ethtool files); with
                     --fault-end it is re-probed and its counters restart
  counter_saturation narrow PMA error counters pinned at 2^n-1; hw out_of_sequence wraps past 2^32
  nvlink_errors      nvml.json: replay, recovery, crc_flit, crc_data rise on one NVLink (--fault-gpu/-link)
  nvlink_down        nvml.json: one NVLink state 0, its tx_kib/rx_kib flat
  slow_gpu           nvml.json: throttle_reasons gains HwThermalSlowdown 0x40 + SwThermalSlowdown 0x20;
                     utilization stays high; no fabric or NVLink error evidence anywhere
  counter_reset      NOT a fault (driver reload): at --fault-start every counter of every mlx5 device
                     (PMA, hw_counters, ethtool -S, netdev statistics, carrier counts) restarts near zero and
                     grows again; links stay up.  Nothing must be raised.
Combinations that would fault nothing (an unknown --fault-dev, pfc_storm or config_drift on an InfiniBand
port, config_drift on the frontend, options of another kind, a window outside the snapshots) exit 2.

Formats follow the kernel ABI (Documentation/ABI/stable/sysfs-class-infiniband):
  state       "4: ACTIVE"            phys_state  "5: LinkUp"
  rate        "<Gb/s> Gb/sec (<lanes>X <speed>)" as rate_show() prints it: per lane SDR 2.5, DDR 5, QDR 10,
              FDR10 10, FDR 14, EDR 25, HDR 50, NDR 100, XDR 200 ("56 Gb/sec (4X FDR)", "400 Gb/sec (4X NDR)")
  link_layer  "InfiniBand" | "Ethernet"   lid "0x1a"   node_guid "a088:c203:0012:3456"
Counter files hold a decimal integer and a newline.  port_xmit_data / port_rcv_data count 4-octet words.
PMA error counters SATURATE at their IBTA width; mlx5 Q and RoCE accel hw_counters are 32-bit and WRAP (always
written masked to 32 bits); congestion and PPCNT hw_counters are 64-bit.  NVML pci_bus_id uses NVML's own
format ("00000000:1B:00.0"); nvml.json tx_kib/rx_kib are cumulative KiB per link.

Usage:
  python -m fabricmon.sim.fixture --root FX --layout ib --fault none --seed 1
  python -m fabricmon.sim.fixture --root FX --layout roce --fault pfc_storm --snapshots 4 --interval 15
  python -m fabricmon.sim.fixture --root FX --layout ib --fault link_down --snapshots 5 --fault-start 1 --fault-end 3
  python -m fabricmon.sim.fixture --root FX --layout roce --fault nvlink_errors --fault-gpu 3 --snapshots 3
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import sys
from typing import Any

from fabricmon.sim import hw as simhw
from fabricmon.sim.faults import (
    GAUGES,
    MODELS,
    FaultModel,
    degraded,
    fault_rng,
    link_down,
    nvlink_evidence,
    port_evidence,
    reset_fraction,
)
from fabricmon.sim.hw import (
    DOWN_RATE,
    ETH_STATS,
    GPU_NAME,
    HW_CONG64,
    HW_LIFESPAN_MS,
    HW_PPCNT64,
    HW_Q32,
    HW_ROCE_ACCL32,
    LANE_DGBPS,
    NGPU,
    NVLINK_KIB_S,
    NVLINKS,
    PMA_ERR_WIDTH,
    PMA_TRAFFIC,
    PRIO_SHARE,
    SPEED_IDX,
    SPEEDS,
    U32,
    gpu_pci_bus_id,
    mac_from_guid,
    rate_str,
)
from fabricmon.sim.scenario import MAGNITUDE

# --fault kind -> its target: "nic" (--fault-dev), "gpu" (--fault-gpu, --fault-link) or None.
FAULTS = {"none": None, "flaky_cable": "nic", "link_down": "nic", "link_flap": "nic", "link_degraded": "nic",
          "pfc_storm": "nic", "ecn_congestion": "nic", "rdma_retransmits": "nic", "config_drift": "nic",
          "hot_unplug": "nic", "counter_saturation": "nic", "nvlink_errors": "gpu", "nvlink_down": "gpu",
          "slow_gpu": "gpu", "counter_reset": None}
ALIASES = {"symbol_errors": "flaky_cable", "rdma_retries": "rdma_retransmits"}
# DESIGN.md component_type of the faulted component; the other NIC kinds are "link" (<node>/<dev>/1).
COMPONENT_TYPE = {"hot_unplug": "nic", "config_drift": "config", "nvlink_errors": "nvlink",
                  "nvlink_down": "nvlink", "slow_gpu": "gpu"}

# counters_ext names (kernels < 4.5 exposed 64-bit values here only).
PMA_EXT = {
    "port_xmit_data_64": "port_xmit_data", "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets", "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets", "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets", "port_multicast_rcv_packets": "multicast_rcv_packets",
}


def saturate(v: int, bits: int) -> int:
    return min(v, (1 << bits) - 1)


def wrap(v: int, bits: int) -> int:
    return v & ((1 << bits) - 1)


def w(path: str, content) -> None:
    """Write f"{content}\\n" atomically: a temporary file in the same directory, renamed over path."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        f = open(tmp, "w")
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(tmp, "w")
    with f:
        f.write(f"{content}\n")
    os.replace(tmp, path)


def symlink(target: str, link: str) -> None:
    """Create or replace a symlink atomically (made beside it, then renamed over it)."""
    tmp = os.path.join(os.path.dirname(link), f".{os.path.basename(link)}.{os.getpid()}.tmp")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def guid(rng: random.Random, oui: str) -> str:
    raw = oui + f"{rng.getrandbits(40):010x}"
    return ":".join(raw[i:i + 4] for i in range(0, 16, 4))


def device_specs(layout: str) -> list[dict]:
    """The node's 9 HCAs for a layout (static part; Node adds GUIDs, LIDs and port state)."""
    return [{k: v for k, v in dataclasses.asdict(d).items() if k != "index"} for d in simhw.device_specs(layout)]


class Port:
    """One RDMA port and its netdev across snapshots: link state and cumulative counters."""

    def __init__(self, rng: random.Random, link_layer: str, lanes: int, speed: str, util: float, wrap32: bool):
        self.rng, self.ethernet = rng, link_layer == "Ethernet"
        self.nominal = (lanes, speed)
        self.lanes, self.speed = lanes, speed
        self.util = util  # offered load, fraction of the nominal line rate
        self.up = True
        self.reset()
        self.downs = self.pma["link_downed"] = rng.randint(0, 1)  # carrier down events so far
        if self.eth:
            self.eth["link_down_events_phy"] = self.downs
        self.advance(rng.uniform(3600, 30 * 86400), baseline=True)  # a believable uptime
        if wrap32:  # --wrap: a little below 2^32, so the counters that move wrap during the snapshots
            for k in HW_Q32 + HW_ROCE_ACCL32:
                self.hw[k] = (1 << 32) - rng.randint(1, 1000)

    def reset(self):
        """Every counter at zero, as right after the driver (re)loads; the netdev is new too."""
        self.pma = dict.fromkeys(PMA_TRAFFIC + tuple(PMA_ERR_WIDTH), 0)
        self.hw = dict.fromkeys(HW_Q32 + HW_ROCE_ACCL32 + HW_CONG64 + HW_PPCNT64, 0)
        self.eth = dict.fromkeys(ETH_STATS, 0) if self.ethernet else {}
        self.downs = 0

    def counters(self, name: str) -> tuple[dict, str]:
        """The dict and key of a ``sim.hw.K`` counter name ("pma:symbol_error" -> (self.pma, "symbol_error"))."""
        kind, short = name.split(":", 1)
        return {"pma": self.pma, "hw": self.hw, "eth": self.eth}[kind], short

    def gbps(self, lanes_speed=None) -> float:
        lanes, speed = lanes_speed or (self.lanes, self.speed)
        return LANE_DGBPS[speed] * lanes / 10

    def set_up(self, up: bool, recoveries_per_down: int = 0):
        if self.up and not up:  # one down event: PMA link_downed, PHY link_down_events, netdev carrier
            self.downs += 1
            self.pma["link_downed"] += 1
            self.pma["link_error_recovery"] += recoveries_per_down
            if self.eth:
                self.eth["link_down_events_phy"] += 1
        self.up = up

    def advance(self, s: float, baseline: bool = False, rx_scale: float = 1.0):
        """Add s seconds of traffic at the offered load, capped by the current link rate."""
        if not self.up or s <= 0:
            return
        rng, pma, hw, e = self.rng, self.pma, self.hw, self.eth
        gbps = min(self.gbps(self.nominal) * self.util * rng.uniform(0.9, 1.1), self.gbps() * 0.97)
        tx = int(gbps * 1e9 / 8 * s)
        rx = int(tx * rx_scale)
        txp, rxp = tx // 4096, rx // 4096
        for d, octets, pkts in (("xmit", tx, txp), ("rcv", rx, rxp)):
            pma[f"port_{d}_data"] += octets // 4  # 4-octet words
            pma[f"port_{d}_packets"] += pkts
            pma[f"unicast_{d}_packets"] += pkts - pkts // 5000
            pma[f"multicast_{d}_packets"] += pkts // 5000
        pma["port_xmit_wait"] += int(s * 1e3 * gbps / self.gbps() * rng.uniform(0, 2))
        hw["rx_write_requests"] += rxp // 3  # RDMA operations arriving
        hw["rx_read_requests"] += rxp // 50
        hw["rx_atomic_requests"] += rxp // 100000
        if e:
            for k, v in (("rx_bytes_phy", rx), ("tx_bytes_phy", tx), ("rx_packets_phy", rxp),
                         ("tx_packets_phy", txp),
                         ("rx_vport_rdma_unicast_bytes", rx), ("tx_vport_rdma_unicast_bytes", tx),
                         ("rx_vport_rdma_unicast_packets", rxp), ("tx_vport_rdma_unicast_packets", txp),
                         ("rx_bytes", rx // 50), ("tx_bytes", tx // 50),  # netdev (non-RDMA) share
                         ("rx_packets", rxp // 50), ("tx_packets", txp // 50)):
                e[k] += v
            for prio, share in enumerate(PRIO_SHARE):
                e[f"rx_prio{prio}_bytes"] += int(rx * share)
                e[f"rx_prio{prio}_packets"] += int(rxp * share)
                e[f"tx_prio{prio}_bytes"] += int(tx * share)
                e[f"tx_prio{prio}_packets"] += int(txp * share)
            for d, n in (("rx", rng.randint(0, int(2 * s))), ("tx", rng.randint(0, int(s)))):
                e[f"{d}_prio3_pause"] += n  # background PFC: a few short pauses now and then
                e[f"{d}_prio3_pause_duration"] += n * rng.randint(1, 10)  # microseconds
            e["rx_prio3_pause_transition"] = e["rx_prio3_pause"] // 2
            e["rx_corrected_bits_phy"] += rng.randint(0, int(s))
        if baseline:  # a little history, as on a real long-running node
            hw["out_of_sequence"] += rng.randint(0, 40)
            hw["duplicate_request"] += rng.randint(0, 10)
            hw["local_ack_timeout_err"] += rng.randint(0, 3)
            hw["req_cqe_flush_error"] += rng.randint(0, 200)
            hw["resp_cqe_flush_error"] += rng.randint(0, 200)
            pma["link_error_recovery"] += rng.randint(0, 1)
            if e:
                e["rx_discards_phy"] += rng.randint(0, 5)
                e["rx_out_of_buffer"] += rng.randint(0, 20)
                e["rx_buffer_passed_thres_phy"] += rng.randint(0, 50)
                e["rx_corrected_bits_phy"] += rng.randint(0, 5000)
                e["rx_prio3_marked"] += rng.randint(0, 10000)
                hw["np_ecn_marked_roce_packets"] += rng.randint(1000, 100000)
                hw["np_cnp_sent"] += hw["np_ecn_marked_roce_packets"] // 3
                hw["rp_cnp_handled"] += rng.randint(1000, 100000)


class Gpu:
    """One H100 as the fake NVML file shows it: identity, utilization, throttle reasons, 18 NVLinks."""

    def __init__(self, rng: random.Random, index: int, uptime: float):
        self.rng = rng
        self.load = rng.uniform(0.15, 0.4)  # NVLink utilization of the running job
        h = f"{rng.getrandbits(128):032x}"
        self.nvml: dict[str, Any] = {"index": index, "uuid": f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}",
                     "name": GPU_NAME, "pci_bus_id": gpu_pci_bus_id(index),
                     "utilization": 0, "throttle_reasons": 0, "xid": [],
                     "links": [dict(state=1, tx_kib=0, rx_kib=0, replay=0, recovery=0,
                                    crc_flit=rng.choice((0, 0, 0, 1, 2)), crc_data=0) for _ in range(NVLINKS)]}
        self.advance(uptime)

    def advance(self, s: float, down_link: int | None = None):
        rng = self.rng
        for j, link in enumerate(self.nvml["links"]):
            link["state"] = 0 if j == down_link else 1
            tx = int(NVLINK_KIB_S * self.load * s * rng.uniform(0.9, 1.1))
            rx = int(tx * rng.uniform(0.95, 1.05))
            if j != down_link:  # a down link carries nothing: its throughput counters stay flat
                link["tx_kib"] += tx
                link["rx_kib"] += rx
        self.nvml["utilization"] = rng.randint(88, 99)


class Node:
    def __init__(self, args):
        self.args = a = args
        rng = random.Random(a.seed)
        self.devs = device_specs(a.layout)
        for d in self.devs:  # each port and GPU has its own RNG, so a fault leaves the others' values alone
            d["node_guid"] = guid(rng, "a088c2" if d["role"] == "compute" else "b83fd2")
            d["lid"] = rng.randint(0x10, 0x7fff) if d["link_layer"] == "InfiniBand" else 0
            util = rng.uniform(0.15, 0.55) if d["role"] == "compute" else rng.uniform(0.01, 0.1)
            d["port"] = Port(random.Random(rng.getrandbits(64)), d["link_layer"], d["lanes"], d["speed"],
                             util, a.wrap)
        uptime = rng.uniform(3600, 30 * 86400)
        self.gpus = [Gpu(random.Random(rng.getrandbits(64)), i, uptime) for i in range(NGPU)]
        rng.getrandbits(64)  # (the fault RNG's seed until sim.faults): drawn so the --dual-port values stay
        # fault evidence: the fault's own RNG, the cluster simulator's for the same seed (sim.faults)
        self.frng = fault_rng(a.seed, 0)
        # --dual-port: the frontend HCA gets a port 2 (drawn last, so every other value stays the same).
        self.extra_ports = []
        if a.dual_port:
            fe = self.devs[-1]
            self.extra_ports.append(dict(fe, port_num=2, ifname=fe["ifname"][:-4] + "1np1",
                                         port=Port(random.Random(rng.getrandbits(64)), fe["link_layer"],
                                                   fe["lanes"], fe["speed"], rng.uniform(0.01, 0.1), a.wrap)))
        self.dev: dict[str, Any] | None = next((d for d in self.devs if d["name"] == a.fault_dev), None)
        self.model = MODELS.get(a.fault, FaultModel())  # "none": a model that does nothing
        self.mag = MAGNITUDE.get(a.fault, 1.0)  # the scenario default (fixture-only kinds: 1)
        if a.fault == "link_degraded":
            dev = self.fault_device
            lanes, speed = degraded(dev["lanes"], SPEED_IDX[dev["speed"]], a.degrade)
            self.degraded = (lanes, SPEEDS[speed])

    @property
    def fault_device(self) -> dict[str, Any]:
        """The --fault-dev device of a NIC fault (main() refuses a name this node lacks)."""
        if self.dev is None:
            raise ValueError(f"--fault-dev {self.args.fault_dev}: no such device")
        return self.dev

    def active(self, t: int) -> bool:
        a = self.args
        return a.fault != "none" and a.fault_start <= t and (a.fault_end is None or t < a.fault_end)

    # ---- simulation step -----------------------------------------------------
    def step(self, t: int):
        """Snapshot t: t * --interval seconds in.  What the fault does is sim.faults' model, asked with
        the seconds since the fault began; a flap is down for one snapshot, up for the next."""
        a, m, mag = self.args, self.model, self.mag
        s, on = (a.interval if t > 0 else 0.0), self.active(t)
        since = (t - (a.fault_start or 0)) * a.interval  # seconds since the fault began
        reset_all = m.resets_counters and t == a.fault_start
        replug = m.link == "absent" and t == a.fault_end
        frac = reset_fraction(self.frng) if reset_all or replug else 0.0
        for d in self.devs:
            p, hit = d["port"], d is self.dev
            if hit:  # link state in this snapshot (the change happened at the start of its interval)
                p.set_up(not (on and link_down(a.fault, since, 2 * a.interval)), m.recoveries_per_down)
                p.lanes, p.speed = self.degraded if on and m.link == "degraded" else p.nominal
            if reset_all or (hit and replug):
                p.reset()  # driver (re)load part-way through the interval: every counter restarts
                p.advance(frac * a.interval)
            elif not (hit and on and m.link == "absent"):
                p.advance(s, rx_scale=1 - mag if hit and on and m.rx_share else 1.0)
            if hit:
                for gauge in GAUGES:
                    counters, short = p.counters(gauge)
                    if short in counters:
                        counters[short] = 0  # a gauge shows what the active fault sets it to, else 0
                if on:
                    self._fault(p, since, a.interval)
        for d in self.extra_ports:
            d["port"].advance(s)
        for g in self.gpus:
            hit = on and g.nvml["index"] == a.fault_gpu
            g.advance(s, down_link=a.fault_link if hit and m.nvlink_down else None)
            g.nvml["throttle_reasons"] = m.throttle if hit else 0
            if hit and m.nvlink:
                link = g.nvml["links"][a.fault_link]
                for name, v, _ in nvlink_evidence(a.fault, self.frng, a.interval, since, mag):
                    link[name.split(":", 1)[1]] += v

    def _fault(self, p: Port, since: float, dt: float):
        """Counter evidence of the active fault on its port over one interval (sim.faults)."""
        current = {f"hw:{k}": v for k, v in p.hw.items()}  # for a rule that moves a counter to a value
        for name, v, is_set in port_evidence(self.args.fault, self.frng, dt, since, self.mag, p.ethernet, current):
            counters, short = p.counters(name)
            counters[short] = v if is_set else counters[short] + v

    # ---- writers -------------------------------------------------------------
    def write(self, root: str, t: int):
        a = self.args
        w(os.path.join(root, "hostname"), a.node_name)
        sysd = os.path.join(root, "sys")
        for d in self.devs + self.extra_ports:
            if self.dev and d["name"] == self.dev["name"] and a.fault == "hot_unplug" and self.active(t):
                continue  # device gone (PCI remove / driver unbind)
            self._write_dev(sysd, root, d, drift=d is self.dev and a.fault == "config_drift" and self.active(t))
        # The GPUs on the PCI bus (H100 SXM5: 10de:2330, 3D controller 0x030200), linked from
        # /sys/bus/pci/devices as the kernel does (the agent's "pci" source counts them beside NVML).
        bus = os.path.join(sysd, "bus", "pci", "devices")
        for g in self.gpus:
            bdf = g.nvml["pci_bus_id"][4:].lower()  # NVML's 8-digit domain -> sysfs' 4
            fn = os.path.join(sysd, "devices", simhw.pci_device_path(bdf))
            w(os.path.join(fn, "vendor"), "0x10de")
            w(os.path.join(fn, "device"), "0x2330")
            w(os.path.join(fn, "class"), "0x030200")
            symlink(os.path.relpath(fn, bus), os.path.join(bus, bdf))
        w(os.path.join(root, "nvml.json"),  # one GPU per line
          '{"gpus": [\n' + ",\n".join(json.dumps(g.nvml) for g in self.gpus) + "\n]}")

    def _write_dev(self, sysd, root, d, drift):
        a, p = self.args, d["port"]
        pci = os.path.join(sysd, "devices", simhw.pci_device_path(d["bdf"]))
        ibdev = os.path.join(pci, "infiniband", d["name"])
        w(os.path.join(pci, "numa_node"), d["numa"])
        w(os.path.join(pci, "vendor"), "0x15b3")
        w(os.path.join(pci, "device"), "0x1021" if d["role"] == "compute" else "0xa2dc")
        w(os.path.join(pci, "current_link_speed"), "32.0 GT/s PCIe")
        w(os.path.join(pci, "current_link_width"), "16")
        w(os.path.join(pci, "max_link_speed"), "32.0 GT/s PCIe")
        w(os.path.join(pci, "max_link_width"), "16")
        # As in real sysfs, class/infiniband/<dev> is a symlink to the PCI function's infiniband/<dev>.
        symlink(os.path.relpath(ibdev, os.path.join(sysd, "class", "infiniband")),
                os.path.join(sysd, "class", "infiniband", d["name"]))
        symlink(os.path.relpath(pci, ibdev), os.path.join(ibdev, "device"))
        w(os.path.join(ibdev, "node_guid"), d["node_guid"])
        w(os.path.join(ibdev, "sys_image_guid"), d["node_guid"])
        w(os.path.join(ibdev, "fw_ver"), d["fw_ver"])
        w(os.path.join(ibdev, "hca_type"), d["hca_type"])
        w(os.path.join(ibdev, "board_id"), d["board_id"])
        w(os.path.join(ibdev, "hw_rev"), "0x0")
        w(os.path.join(ibdev, "node_type"), "1: CA")
        w(os.path.join(ibdev, "node_desc"), f"{a.node_name} {d['name']}")
        port = os.path.join(ibdev, "ports", str(d.get("port_num", 1)))
        up, ll = p.up, d["link_layer"]
        w(os.path.join(port, "link_layer"), ll)
        w(os.path.join(port, "state"), "4: ACTIVE" if up else "1: DOWN")
        w(os.path.join(port, "phys_state"),
          "5: LinkUp" if up else ("2: Polling" if ll == "InfiniBand" else "3: Disabled"))
        w(os.path.join(port, "rate"), rate_str(p.lanes, p.speed) if up else rate_str(*DOWN_RATE[ll]))
        w(os.path.join(port, "lid"), hex(d["lid"] if up else 0))
        w(os.path.join(port, "sm_lid"), "0x1" if ll == "InfiniBand" and up else "0x0")
        w(os.path.join(port, "lid_mask_count"), 0)
        w(os.path.join(port, "sm_sl"), 0)
        w(os.path.join(port, "cap_mask"), "0xa751e848" if ll == "InfiniBand" else "0x04010000")
        # PMA counters
        cdir = os.path.join(port, "counters")
        for k in PMA_TRAFFIC:  # --legacy-ext (kernels < 4.5): 32-bit PortCounters, saturating
            w(os.path.join(cdir, k), saturate(p.pma[k], 32) if a.legacy_ext else wrap(p.pma[k], 64))
        for k, bits in PMA_ERR_WIDTH.items():
            w(os.path.join(cdir, k), saturate(p.pma[k], bits))
        if a.legacy_ext:
            for ext, base in PMA_EXT.items():
                w(os.path.join(port, "counters_ext", ext), wrap(p.pma[base], 64))
        # hw_counters (mlx5): 32-bit ones as firmware shows them, wrapped
        hdir = os.path.join(port, "hw_counters")
        w(os.path.join(hdir, "lifespan"), HW_LIFESPAN_MS)
        for k in HW_Q32:
            w(os.path.join(hdir, k), p.hw[k] & U32)
        if ll == "Ethernet":
            for k in HW_ROCE_ACCL32:
                w(os.path.join(hdir, k), p.hw[k] & U32)
            for k in HW_CONG64 + HW_PPCNT64:
                w(os.path.join(hdir, k), wrap(p.hw[k], 64))
            # RoCE GID table: index 1 = RoCE v2 (link-local), bound to the netdev
            mac = mac_from_guid(d["node_guid"]).split(":")
            gid = "fe80:0000:0000:0000:" + ":".join(
                [mac[0] + mac[1], mac[2] + "ff", "fe" + mac[3], mac[4] + mac[5]])
            for idx, typ in ((0, "IB/RoCE v1"), (1, "RoCE v2")):
                w(os.path.join(port, "gids", str(idx)), gid)
                w(os.path.join(port, "gid_attrs", "types", str(idx)), typ)
                w(os.path.join(port, "gid_attrs", "ndevs", str(idx)), d["ifname"])
        self._write_netdev(sysd, root, d, pci, drift)

    def _write_netdev(self, sysd, root, d, pci, drift):
        p, e = d["port"], d["port"].eth
        nd = os.path.join(pci, "net", d["ifname"])
        symlink(os.path.relpath(nd, os.path.join(sysd, "class", "net")),
                os.path.join(sysd, "class", "net", d["ifname"]))
        symlink(os.path.relpath(pci, nd), os.path.join(nd, "device"))
        up, eth = p.up, d["link_layer"] == "Ethernet"
        w(os.path.join(nd, "operstate"), "up" if up else "down")
        w(os.path.join(nd, "carrier"), 1 if up else 0)
        # a new netdev went down once (probe) and up once; each down event adds one down and, once it
        # recovers, one up
        w(os.path.join(nd, "carrier_changes"), 2 + 2 * p.downs - (0 if up else 1))
        w(os.path.join(nd, "carrier_down_count"), 1 + p.downs)
        w(os.path.join(nd, "carrier_up_count"), 1 + p.downs - (0 if up else 1))
        w(os.path.join(nd, "speed"), LANE_DGBPS[p.speed] * p.lanes * 100 if up else -1)  # Mb/s
        w(os.path.join(nd, "mtu"), 9000 if eth else 4092)
        w(os.path.join(nd, "type"), 1 if eth else 32)  # ARPHRD_ETHER / ARPHRD_INFINIBAND
        if self.extra_ports and d["name"] == self.extra_ports[0]["name"]:
            # netdevs of one PCI function are told apart by dev_port (0-based port index)
            w(os.path.join(nd, "dev_port"), d.get("port_num", 1) - 1)
        if eth:
            w(os.path.join(nd, "address"), mac_from_guid(d["node_guid"]))
        else:
            w(os.path.join(nd, "address"), "00:00:10:29:fe:80:00:00:00:00:00:00:" + ":".join(
                d["node_guid"].replace(":", "")[i:i + 2] for i in range(0, 16, 2)))
        st = os.path.join(nd, "statistics")
        w(os.path.join(st, "rx_bytes"), e.get("rx_bytes", p.pma["port_rcv_data"] * 4 // 100))
        w(os.path.join(st, "tx_bytes"), e.get("tx_bytes", p.pma["port_xmit_data"] * 4 // 100))
        w(os.path.join(st, "rx_packets"), e.get("rx_packets", p.pma["port_rcv_packets"] // 100))
        w(os.path.join(st, "tx_packets"), e.get("tx_packets", p.pma["port_xmit_packets"] // 100))
        w(os.path.join(st, "rx_errors"), e.get("rx_crc_errors_phy", 0))
        w(os.path.join(st, "tx_errors"), 0)
        w(os.path.join(st, "rx_dropped"), e.get("rx_out_of_buffer", 0))
        w(os.path.join(st, "tx_dropped"), 0)
        w(os.path.join(st, "rx_crc_errors"), e.get("rx_crc_errors_phy", 0))
        w(os.path.join(st, "rx_missed_errors"), e.get("rx_discards_phy", 0))
        if eth:
            # mlx5 ECN enablement per priority, notification point (np) and reaction point (rp)
            for side in ("roce_np", "roce_rp"):
                for prio in range(8):
                    w(os.path.join(nd, "ecn", side, "enable", str(prio)), 1 if prio == 3 and not drift else 0)
            edir = os.path.join(root, "ethtool")
            w(os.path.join(edir, d["ifname"] + ".txt"),
              "\n".join(["NIC statistics:"] + [f"     {k}: {v}" for k, v in e.items()]))
            enabled = ["1" if prio == 3 and not drift else "0" for prio in range(8)]
            w(os.path.join(edir, d["ifname"] + ".pfc.txt"), "\n".join([
                "DCBX mode: OS controlled",
                f"Priority trust state: {'dscp' if d['role'] == 'compute' else 'pcp'}",
                "PFC configuration:",
                "\tpriority    0   1   2   3   4   5   6   7",
                "\tenabled     " + "   ".join(enabled),
                "\tbuffer      0   0   0   1   0   0   0   0"]))

    # ---- manifest ------------------------------------------------------------
    def expected(self) -> list:
        a, d, f = self.args, self.dev, self.args.fault
        if f == "none":
            return []
        s, e = a.fault_start, a.fault_end
        last = (a.snapshots if e is None else e) - 1
        when = f"t{s}..t{last}" + (f" (normal again from t{e})" if e is not None else "")
        then = f"from t{s + 1}" if s < last else "only after the last snapshot"  # the fault's second snapshot
        if f == "counter_reset":
            return ["not a fault: nothing must be raised",
                    f"t{s}: every counter of every mlx5 device (PMA counters, hw_counters, ethtool -S, netdev "
                    "statistics, carrier counts) restarts near zero, then grows normally",
                    "links stay ACTIVE; node_guid, names, config and NVML unchanged"]
        if FAULTS[f] == "gpu":
            g = f"nvml.json gpu {a.fault_gpu}"
            return {
                "nvlink_errors": [f"{g} link {a.fault_link} {when}: replay, recovery, crc_flit, crc_data rising",
                                  "the link stays up (state 1) and keeps its throughput; no NIC evidence"],
                "nvlink_down": [f"{g} link {a.fault_link} {when}: state 0, tx_kib/rx_kib flat",
                                "the other 17 links stay up; no NIC evidence"],
                "slow_gpu": [f"{g} {when}: throttle_reasons 0x60 (HwThermalSlowdown 0x40 | SwThermalSlowdown 0x20)",
                             "utilization stays high; no fabric or NVLink error evidence anywhere"],
            }[f]
        d = self.fault_device
        port, ifn = f"{d['name']} port 1", d["ifname"]
        if f == "link_degraded":
            deg = rate_str(*self.degraded)
            return [f"{port} {when}: state stays 4: ACTIVE, rate {deg} instead of {rate_str(d['lanes'], d['speed'])}",
                    f"netdev {ifn} speed {LANE_DGBPS[self.degraded[1]] * self.degraded[0] * 100}; traffic capped "
                    "at ~97% of the degraded rate when the offered load exceeds it", "no error counter rises"]
        return {
            "flaky_cable": [f"{port} {when}: symbol_error and port_rcv_errors rising (16-bit, saturating), "
                            "link_error_recovery rising (0.1/s); state stays ACTIVE at full rate",
                            "Ethernet: rx_corrected_bits_phy, rx_pcs_symbol_err_phy, rx_err_lane_2_phy, "
                            "rx_crc_errors_phy rising"],
            "link_down": [f"{port} {when}: state 1: DOWN, phys_state 2: Polling (IB) / 3: Disabled (Ethernet); "
                          f"{ifn} carrier 0, operstate down, speed -1",
                          "rate shows the down-port fallback (10 Gb/sec (4X SDR) IB, 40 Gb/sec (4X QDR) "
                          "Ethernet), not a degradation",
                          f"t{s}: link_downed +1, carrier_down_count +1 (link_down_events_phy +1 on Ethernet) "
                          "once; traffic counters flat while down"]
            + ([f"t{e}: ACTIVE again, carrier_up_count +1"] if e is not None else []),
            "link_flap": [f"{port} {when}: DOWN in " + ", ".join(f"t{t}" for t in range(s, last + 1, 2))
                          + ", ACTIVE in between",
                          "each down: link_downed +1, link_error_recovery +3, carrier_down_count +1; "
                          "each recovery: carrier_up_count +1"],
            "pfc_storm": [f"{ifn} ({d['name']}) {when}: the slow receiver emits pauses: tx_prio3_pause and "
                          "tx_prio3_pause_duration climb (~85% of each interval)",
                          f"tx_pause_storm_warning_events rising, tx_pause_storm_error_events {then}",
                          "rx_prio3_pause stays at its background rate (it receives no storm); rx bytes ~15%",
                          "host-side cause: outbound_pci_stalled_wr (gauge, %) high, outbound_pci_stalled_wr_events,"
                          " rx_out_of_buffer, dev_internal_queue_oob rising", "PFC/ECN config unchanged (no drift)"],
            "ecn_congestion": ([f"{port} {when}: np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled, "
                                "rx_prio3_marked and port_xmit_wait rising",
                                "rp_cnp_ignored flat (congestion control is on): congestion, not a config fault"]
                               if d["link_layer"] == "Ethernet" else
                               [f"{port} {when}: only port_xmit_wait rising (IB ports have no ECN/CNP hw_counters)"]),
            "rdma_retransmits": [f"{port} {when}: local_ack_timeout_err, packet_seq_err, out_of_sequence, "
                                 "implied_nak_seq_err, duplicate_request rising (32-bit hw_counters, wrapping)"
                                 + ("; roce_adp_retrans rising" if d["link_layer"] == "Ethernet" else ""),
                                 f"req_transport_retries_exceeded and req_cqe_error {then}"],
            "config_drift": [f"{ifn} ({d['name']}) {when}: PFC disabled on priority 3 in ethtool/{ifn}.pfc.txt "
                             "(profile: PFC on priority 3 only)",
                             "ecn/roce_np/enable/3 and ecn/roce_rp/enable/3 = 0", "counters unaffected"],
            "hot_unplug": [f"{d['name']} (PCI {d['bdf']}, {ifn}) absent {when}: PCI function, class/infiniband, "
                           "class/net and ethtool files gone"]
            + ([f"t{e}: back (driver re-probed), its counters restarted near zero"] if e is not None else []),
            "counter_saturation": [f"{port} {when}: symbol_error, port_rcv_errors, link_error_recovery pinned at "
                                   "2^n-1 (65535, 65535, 255)",
                                   f"hw_counters/out_of_sequence = 2^32-6 at t{s}, wrapped past 2^32 {then}"],
        }[f]

    def manifest(self) -> dict:
        a, d = self.args, self.dev
        ctype = None if FAULTS[a.fault] is None else COMPONENT_TYPE.get(a.fault, "link")
        comp = {None: None, "nic": f"{a.node_name}/{a.fault_dev}", "config": f"{a.node_name}/{a.fault_dev}",
                "link": f"{a.node_name}/{a.fault_dev}/1", "gpu": f"{a.node_name}/gpu{a.fault_gpu}",
                "nvlink": f"{a.node_name}/gpu{a.fault_gpu}/nvlink{a.fault_link}"}[ctype]
        return {
            "layout": a.layout, "node": a.node_name, "fault": a.fault,
            "fault_device": d["name"] if d else None, "fault_gpu": a.fault_gpu, "fault_link": a.fault_link,
            "fault_component": comp, "component_type": ctype,
            "fault_start": a.fault_start, "fault_end": a.fault_end,
            "degrade": a.degrade, "seed": a.seed, "snapshots": a.snapshots, "interval_s": a.interval,
            "legacy_ext": a.legacy_ext, "wrap": a.wrap,
            **({"extra_ports": [{"device": x["name"], "port": x["port_num"], "ifname": x["ifname"]}
                                for x in self.extra_ports]} if self.extra_ports else {}),
            "expected": self.expected(),
            "devices": [dict({k: x[k] for k in ("name", "bdf", "numa", "rail", "gpu", "role", "ifname",
                                                "link_layer", "node_guid")},
                             gbps=int(x["port"].gbps(x["port"].nominal)), rate=rate_str(x["lanes"], x["speed"]))
                        for x in self.devs],
            "gpus": [{"index": g.nvml["index"], "uuid": g.nvml["uuid"], "pci_bus_id": g.nvml["pci_bus_id"],
                      "nic": f"mlx5_{g.nvml['index']}"} for g in self.gpus],
        }


def resolve(ap: argparse.ArgumentParser, a) -> None:
    """Fill defaults that depend on the fault, and reject combinations that would fault nothing."""
    a.fault = ALIASES.get(a.fault, a.fault)
    target = FAULTS[a.fault]
    if a.snapshots < 1:
        ap.error("--snapshots must be >= 1")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.node_name):
        ap.error(f"--node-name {a.node_name!r}: use a host name (letters, digits, '.', '_', '-')")
    for opt, val, applies in (("--fault-dev", a.fault_dev, target == "nic"),
                              ("--fault-gpu", a.fault_gpu, target == "gpu"),
                              ("--fault-link", a.fault_link, a.fault in ("nvlink_errors", "nvlink_down")),
                              ("--degrade", a.degrade, a.fault == "link_degraded"),
                              ("--fault-start", a.fault_start, a.fault != "none"),
                              ("--fault-end", a.fault_end, a.fault not in ("none", "counter_reset"))):
        if val is not None and not applies:
            ap.error(f"{opt} does not apply to --fault {a.fault}")
    if target == "nic":
        a.fault_dev = a.fault_dev or ("mlx5_8" if a.fault == "pfc_storm" and a.layout == "ib" else "mlx5_3")
        devs = {d["name"]: d for d in device_specs(a.layout)}
        d = devs.get(a.fault_dev)
        if d is None:
            ap.error(f"--fault-dev {a.fault_dev}: no such device (this node has {', '.join(devs)})")
        if a.fault in ("pfc_storm", "config_drift") and d["link_layer"] != "Ethernet":
            ap.error(f"--fault {a.fault} needs an Ethernet (RoCE) device, and {a.fault_dev} is InfiniBand on "
                     "--layout ib" + (" (its only Ethernet NIC is the frontend mlx5_8)" if a.fault == "pfc_storm"
                                      else " (use --layout roce)"))
        if a.fault == "config_drift" and d["role"] != "compute":
            ap.error(f"--fault config_drift needs a rail NIC (mlx5_0..mlx5_7); the frontend {a.fault_dev} "
                     "is outside the rail profile, so its drift would be checked by nothing")
    if target == "gpu":
        a.fault_gpu = 2 if a.fault_gpu is None else a.fault_gpu
        if not 0 <= a.fault_gpu < NGPU:
            ap.error(f"--fault-gpu {a.fault_gpu}: GPUs are 0..{NGPU - 1}")
        if a.fault != "slow_gpu":
            a.fault_link = 5 if a.fault_link is None else a.fault_link
            if not 0 <= a.fault_link < NVLINKS:
                ap.error(f"--fault-link {a.fault_link}: NVLinks are 0..{NVLINKS - 1}")
    if a.fault == "link_degraded":
        a.degrade = a.degrade or "width"
    if a.fault != "none":
        a.fault_start = (1 if a.snapshots > 1 else 0) if a.fault_start is None else a.fault_start
        if not 0 <= a.fault_start < a.snapshots:
            ap.error(f"--fault-start {a.fault_start}: must be a snapshot index 0..{a.snapshots - 1}")
        if a.fault_end is not None and not a.fault_start < a.fault_end < a.snapshots:
            ap.error(f"--fault-end {a.fault_end}: must be after --fault-start {a.fault_start} and at most "
                     f"{a.snapshots - 1}, the last snapshot, or the recovery is never seen")


class FixtureError(ValueError):
    """Options that would fault nothing, or an unusable --root."""


class _Parser(argparse.ArgumentParser):
    # In-process callers (tests) get an exception instead of a usage message and SystemExit.
    raising = False

    def error(self, message):
        if self.raising:
            raise FixtureError(message)
        super().error(message)


def _parser() -> _Parser:
    ap = _Parser(prog="python -m fabricmon.sim.fixture", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="output directory (created)")
    ap.add_argument("--layout", choices=["ib", "roce"], default="ib",
                    help="rail NICs InfiniBand (ib) or RoCE (roce); the frontend mlx5_8 is always Ethernet")
    ap.add_argument("--fault", choices=list(FAULTS) + list(ALIASES), default="none",
                    help="fault kind (see above); symbol_errors and rdma_retries are old names")
    ap.add_argument("--fault-dev", default=None,
                    help="NIC for the NIC kinds: default mlx5_3, or mlx5_8 for pfc_storm on --layout ib "
                         "(its only Ethernet NIC)")
    ap.add_argument("--fault-gpu", type=int, default=None,
                    help="GPU 0..7 for nvlink_errors, nvlink_down, slow_gpu (default 2)")
    ap.add_argument("--fault-link", type=int, default=None,
                    help="NVLink 0..17 of that GPU for nvlink_errors, nvlink_down (default 5)")
    ap.add_argument("--fault-start", type=int, default=None,
                    help="snapshot index where the fault begins (default 1 with --snapshots > 1, else 0)")
    ap.add_argument("--fault-end", type=int, default=None,
                    help="snapshot index from which the fault has cleared (default: never)")
    ap.add_argument("--degrade", choices=["width", "speed"], default=None,
                    help="link_degraded: half the lanes (4X NDR -> 2X NDR, default) or one speed down "
                         "(4X NDR -> 4X HDR)")
    ap.add_argument("--node-name", default="node-000", help="host name written to hostname (default node-000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--snapshots", type=int, default=1,
                    help="write N time-ordered trees ROOT/t0..t{N-1} (1 = write ROOT directly)")
    ap.add_argument("--interval", type=float, default=15.0, help="simulated seconds between snapshots")
    ap.add_argument("--legacy-ext", action="store_true",
                    help="emulate kernel <4.5: 32-bit saturating counters/ plus counters_ext/")
    ap.add_argument("--wrap", action="store_true",
                    help="start the 32-bit mlx5 hw_counters (Q and RoCE accel; always written masked to "
                         "32 bits) a little below 2^32, so those that move wrap during the snapshots")
    ap.add_argument("--dual-port", action="store_true",
                    help="give the frontend HCA mlx5_8 a second port (ports/2, netdev enp170s0f1np1 under the "
                         "same PCI function, told apart by dev_port), as dual-port VPI HCAs show them")
    ap.add_argument("--force", action="store_true", help="remove ROOT first if it exists")
    return ap


def options_argv(root, options: dict) -> list[str]:
    """Keyword options as flags: ``fault_dev="mlx5_3"`` -> ``--fault-dev mlx5_3``, ``legacy_ext=True`` ->
    ``--legacy-ext``; False and None leave a flag out."""
    argv = ["--root", str(root)]
    for k, v in sorted(options.items()):
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif v is not False and v is not None:
            argv += [flag, str(v)]
    return argv


def write_fixture(root, **options) -> dict:
    """Write a fixture node at ``root`` in-process; returns its manifest.  Raises FixtureError on options
    the command line would reject."""
    return write_fixture_argv(options_argv(root, options))


def fixture_node(**options) -> Node:
    """The fixture's node for ``write_fixture``'s keyword options (no root, nothing written), before its
    first snapshot: ``node.step(t)`` advances it, its ports and GPUs hold the state a snapshot shows."""
    ap = _parser()
    ap.raising = True
    a = ap.parse_args(options_argv("-", options))
    resolve(ap, a)
    return Node(a)


def write_fixture_argv(argv: list[str]) -> dict:
    """``write_fixture`` by the command line's flags (``["--root", ROOT, "--layout", "roce", ...]``)."""
    ap = _parser()
    ap.raising = True
    return _write(ap, ap.parse_args(argv))


def _write(ap: _Parser, a) -> dict:
    resolve(ap, a)

    if os.path.exists(a.root):
        if not a.force and os.listdir(a.root):
            ap.error(f"{a.root} exists and is not empty (use --force)")
        shutil.rmtree(a.root)
    os.makedirs(a.root)

    node = Node(a)
    for t in range(a.snapshots):
        node.step(t)
        node.write(a.root if a.snapshots == 1 else os.path.join(a.root, f"t{t}"), t)
    if a.snapshots > 1:
        w(os.path.join(a.root, "hostname"), a.node_name)
    manifest = node.manifest()
    w(os.path.join(a.root, "fixture.json"), json.dumps(manifest, indent=2))
    return manifest


def main(argv=None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    _write(ap, a)
    print(f"wrote {a.snapshots} snapshot(s) to {a.root} (layout={a.layout}, fault={a.fault}, node={a.node_name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
