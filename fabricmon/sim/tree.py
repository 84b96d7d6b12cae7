"""Render one simulated node into a tree identical in layout and format to ``sim.fixture``'s.

```
<root>/hostname
<root>/sys/class/infiniband/<dev> -> ../../devices/<pci>/infiniband/<dev>
<root>/sys/devices/<pci>/{numa_node,vendor,device,...,infiniband/<dev>/,net/<if>/}
<pci>: pci<dom>:<bus>/<root port>/.../<bdf>, rail NIC i and GPU i under one PCIe switch (sim.hw.pci_device_path)
<root>/sys/class/net/<if> -> ../../devices/<pci>/net/<if>
<root>/ethtool/<if>.txt, <if>.pfc.txt      (Ethernet netdevs)
<root>/ethtool/<if>.module.bin             (rail NICs: module EEPROM, SFF-8636 lower + upper page 00h)
<root>/nvml.json                           (fake NVML, one GPU per line)
```

Rendering is incremental: every file's last content is cached, and a render
writes only the files whose content changed (traffic counters, ``nvml.json``,
``ethtool/<if>.txt``, state files on a transition), each atomically.  The
temporary file is made in ``<root>/.sim-tmp/`` and renamed into place (same
file system), so a reader that lists a counter directory never sees a
temporary name in it (``sim.fixture`` puts its ``.<name>.<pid>.tmp`` beside
the target, where a concurrent ``listdir`` can catch it).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .cluster import ClusterState
from .hw import (
    DOWN_RATE,
    ETH_Q32,
    ETH_STATS,
    GPU_NAME,
    HW_CONG64,
    HW_LIFESPAN_MS,
    HW_PPCNT64,
    HW_Q32,
    HW_ROCE_ACCL32,
    LANE_DGBPS,
    NGPU,
    NVLINKS,
    PMA_ERR_WIDTH,
    PMA_TRAFFIC,
    SPEEDS,
    K,
    gpu_pci_bus_id,
    mac_from_guid,
    pci_device_path,
    rate_str,
)

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_O_W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def default_base_dir(prefix: str = "fabricmon-sim-") -> str:
    """A fresh directory for simulated trees, on /dev/shm (tmpfs) when it exists."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


class NodeTree:
    """The tree of one node of a ClusterState, rendered under ``root``."""

    def __init__(self, cluster: ClusterState, node: int, root: str | Path) -> None:
        self.cluster = cluster
        self.node = node
        self.name = cluster.names[node]
        self.root = str(root)
        self.sys = os.path.join(self.root, "sys")
        self.ethtool_dir = os.path.join(self.root, "ethtool")
        self.nvml_file = os.path.join(self.root, "nvml.json")
        self._tmpdir = os.path.join(self.root, ".sim-tmp")
        self._paths: list[str] = []
        self._cache: list[bytes | None] = []
        self._static_done = False
        self.files_written = 0  # total over all renders (benchmarks, tests)
        self.last_written = 0
        self._dirs: dict[str, str] = {}

    # ------------------------------------------------------------------ paths
    def _pci(self, d) -> str:
        return os.path.join(self.sys, "devices", pci_device_path(d.bdf))

    def _ibdev(self, d) -> str:
        return os.path.join(self._pci(d), "infiniband", d.name)

    def _netdev(self, d) -> str:
        return os.path.join(self._pci(d), "net", d.ifname)

    # ------------------------------------------------------------------ writing
    def _write(self, path: str, data: bytes) -> None:
        tmp = os.path.join(self._tmpdir, path[len(self.root) + 1:].replace("/", "%"))
        fd = os.open(tmp, _O_W, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _symlink(self, target: str, link: str) -> None:
        os.makedirs(os.path.dirname(link), exist_ok=True)
        tmp = os.path.join(self._tmpdir, "link%" + os.path.basename(link))
        if os.path.lexists(tmp):
            os.remove(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, link)

    def _render_static(self) -> None:
        c, n = self.cluster, self.node
        os.makedirs(self._tmpdir, exist_ok=True)
        files: list[tuple[str, str]] = [(os.path.join(self.root, "hostname"), self.name)]
        for d in c.devs:
            pci, ibdev, nd = self._pci(d), self._ibdev(d), self._netdev(d)
            guid = c.node_guid(n, d.index)
            files += [(os.path.join(pci, "numa_node"), str(d.numa)), (os.path.join(pci, "vendor"), "0x15b3"),
                      (os.path.join(pci, "device"), "0x1021" if d.role == "compute" else "0xa2dc"),
                      (os.path.join(pci, "current_link_speed"), "32.0 GT/s PCIe"),
                      (os.path.join(pci, "current_link_width"), "16"),
                      (os.path.join(pci, "max_link_speed"), "32.0 GT/s PCIe"),
                      (os.path.join(pci, "max_link_width"), "16")]
            for sub in ("ports/1/counters", "ports/1/hw_counters"):
                os.makedirs(os.path.join(ibdev, sub), exist_ok=True)
            os.makedirs(os.path.join(nd, "statistics"), exist_ok=True)
            self._symlink(os.path.relpath(ibdev, os.path.join(self.sys, "class", "infiniband")),
                          os.path.join(self.sys, "class", "infiniband", d.name))
            self._symlink(os.path.relpath(pci, ibdev), os.path.join(ibdev, "device"))
            self._symlink(os.path.relpath(nd, os.path.join(self.sys, "class", "net")),
                          os.path.join(self.sys, "class", "net", d.ifname))
            self._symlink(os.path.relpath(pci, nd), os.path.join(nd, "device"))
            files += [(os.path.join(ibdev, "node_guid"), guid), (os.path.join(ibdev, "sys_image_guid"), guid),
                      (os.path.join(ibdev, "fw_ver"), d.fw_ver), (os.path.join(ibdev, "hca_type"), d.hca_type),
                      (os.path.join(ibdev, "board_id"), d.board_id), (os.path.join(ibdev, "hw_rev"), "0x0"),
                      (os.path.join(ibdev, "node_type"), "1: CA"),
                      (os.path.join(ibdev, "node_desc"), f"{self.name} {d.name}")]
            port = os.path.join(ibdev, "ports", "1")
            ib = d.link_layer == "InfiniBand"
            files += [(os.path.join(port, "link_layer"), d.link_layer),
                      (os.path.join(port, "lid_mask_count"), "0"), (os.path.join(port, "sm_sl"), "0"),
                      (os.path.join(port, "cap_mask"), "0xa751e848" if ib else "0x04010000"),
                      (os.path.join(port, "hw_counters", "lifespan"), str(HW_LIFESPAN_MS))]
            if d.ethernet:
                mac = mac_from_guid(guid).split(":")
                gid = "fe80:0000:0000:0000:" + ":".join([mac[0] + mac[1], mac[2] + "ff", "fe" + mac[3],
                                                         mac[4] + mac[5]])
                for idx, typ in ((0, "IB/RoCE v1"), (1, "RoCE v2")):
                    files += [(os.path.join(port, "gids", str(idx)), gid),
                              (os.path.join(port, "gid_attrs", "types", str(idx)), typ),
                              (os.path.join(port, "gid_attrs", "ndevs", str(idx)), d.ifname)]
                files.append((os.path.join(nd, "address"), mac_from_guid(guid)))
                for side in ("roce_np", "roce_rp"):
                    os.makedirs(os.path.join(nd, "ecn", side, "enable"), exist_ok=True)
            else:
                files.append((os.path.join(nd, "address"), "00:00:10:29:fe:80:00:00:00:00:00:00:" + ":".join(
                    guid.replace(":", "")[i:i + 2] for i in range(0, 16, 2))))
            files += [(os.path.join(nd, "mtu"), str(int(c.links.mtu[d.index]))),
                      (os.path.join(nd, "type"), "1" if d.ethernet else "32")]  # ARPHRD_ETHER / _INFINIBAND
        # The node's GPUs on the PCI bus (H100 SXM5: 10de:2330, 3D controller 0x030200), linked from
        # /sys/bus/pci/devices as the kernel does: what the agent's "pci" source counts beside NVML.
        bus = os.path.join(self.sys, "bus", "pci", "devices")
        for g in range(NGPU):
            bdf = gpu_pci_bus_id(g)[4:].lower()  # NVML's 8-digit domain -> sysfs' 4
            fn = os.path.join(self.sys, "devices", pci_device_path(bdf))
            files += [(os.path.join(fn, "vendor"), "0x10de"), (os.path.join(fn, "device"), "0x2330"),
                      (os.path.join(fn, "class"), "0x030200")]
            self._symlink(os.path.relpath(fn, bus), os.path.join(bus, bdf))
        os.makedirs(self.ethtool_dir, exist_ok=True)
        for path, content in files:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._write(path, (content + "\n").encode())
        self._static_done = True

    # ------------------------------------------------------------------ dynamic content
    def dynamic_files(self) -> tuple[list[str], list[bytes]]:
        """Every file that can change, as (paths, contents) in a fixed order."""
        c, n = self.cluster, self.node
        build_paths = not self._paths
        paths: list[str] = self._paths if not build_paths else []
        out: list[str] = []
        vals = c.counters.node_counters(n)
        links = c.links
        up_row = links.up[n].tolist()
        lanes_row = links.lanes[n].tolist()
        speed_row = links.speed[n].tolist()
        downs_row = links.downs[n].tolist()
        lid_row = c.lid[n].tolist()
        pfc3 = links.pfc[n, :, :].tolist()
        np3 = links.ecn_np[n].tolist()
        rp3 = links.ecn_rp[n].tolist()
        ap = paths.append if build_paths else None
        kx = K
        for d in c.devs:
            i = d.index
            v = vals[i]
            up = up_row[i]
            ll = d.link_layer
            lanes, speed = lanes_row[i], SPEEDS[speed_row[i]]
            port = os.path.join(self._ibdev(d), "ports", "1") if build_paths else ""  # read only with ap
            out += ["4: ACTIVE" if up else "1: DOWN",
                    "5: LinkUp" if up else ("2: Polling" if ll == "InfiniBand" else "3: Disabled"),
                    rate_str(lanes, speed) if up else rate_str(*DOWN_RATE[ll]),
                    hex(lid_row[i] if up else 0),
                    "0x1" if ll == "InfiniBand" and up else "0x0"]
            if ap:
                for f in ("state", "phys_state", "rate", "lid", "sm_lid"):
                    ap(os.path.join(port, f))
            for name in PMA_TRAFFIC:
                out.append(str(v[kx["pma:" + name]] & _M64))
            for name, bits in PMA_ERR_WIDTH.items():
                x = v[kx["pma:" + name]]
                lim = (1 << bits) - 1
                out.append(str(x if x < lim else lim))
            if ap:
                for name in PMA_TRAFFIC + tuple(PMA_ERR_WIDTH):
                    ap(os.path.join(port, "counters", name))
            hw32 = HW_Q32 + (HW_ROCE_ACCL32 if d.ethernet else ())
            for name in hw32:
                out.append(str(v[kx["hw:" + name]] & _M32))
            hw64 = HW_CONG64 + HW_PPCNT64 if d.ethernet else ()
            for name in hw64:
                out.append(str(v[kx["hw:" + name]] & _M64))
            if ap:
                for name in hw32 + hw64:
                    ap(os.path.join(port, "hw_counters", name))
            # netdev
            dn = downs_row[i]
            nd = self._netdev(d) if build_paths else ""  # read only with ap
            out += ["up" if up else "down", "1" if up else "0", str(2 + 2 * dn - (0 if up else 1)), str(1 + dn),
                    str(1 + dn - (0 if up else 1)), str(LANE_DGBPS[speed] * lanes * 100 if up else -1)]
            if ap:
                for f in ("operstate", "carrier", "carrier_changes", "carrier_down_count", "carrier_up_count",
                          "speed"):
                    ap(os.path.join(nd, f))
            if d.ethernet:
                rxb, txb = v[kx["eth:rx_bytes"]], v[kx["eth:tx_bytes"]]
                rxp, txp = v[kx["eth:rx_packets"]], v[kx["eth:tx_packets"]]
                crc, oob = v[kx["eth:rx_crc_errors_phy"]], v[kx["eth:rx_out_of_buffer"]]
                disc = v[kx["eth:rx_discards_phy"]]
            else:
                rxb, txb = v[kx["pma:port_rcv_data"]] * 4 // 100, v[kx["pma:port_xmit_data"]] * 4 // 100
                rxp, txp = v[kx["pma:port_rcv_packets"]] // 100, v[kx["pma:port_xmit_packets"]] // 100
                crc = oob = disc = 0
            out += [str(rxb), str(txb), str(rxp), str(txp), str(crc), "0", str(oob), "0", str(crc), str(disc)]
            if ap:
                for f in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
                          "tx_dropped", "rx_crc_errors", "rx_missed_errors"):
                    ap(os.path.join(nd, "statistics", f))
            if d.ethernet:
                for side, arr in (("roce_np", np3), ("roce_rp", rp3)):
                    row = arr[i]
                    for prio in range(8):
                        out.append("1" if row[prio] else "0")
                        if ap:
                            ap(os.path.join(nd, "ecn", side, "enable", str(prio)))
                # Q counters (rx_out_of_buffer) are 32-bit in firmware and wrap (see sources/ethtool.py).
                out.append("\n".join(["NIC statistics:"] + [
                    f"     {k}: {v[kx['eth:' + k]] & (_M32 if k in ETH_Q32 else _M64)}" for k in ETH_STATS]))
                enabled = ["1" if pfc3[i][prio] else "0" for prio in range(8)]
                out.append("\n".join([
                    "DCBX mode: OS controlled",
                    f"Priority trust state: {'dscp' if d.role == 'compute' else 'pcp'}",
                    "PFC configuration:",
                    "\tpriority    0   1   2   3   4   5   6   7",
                    "\tenabled     " + "   ".join(enabled),
                    "\tbuffer      0   0   0   1   0   0   0   0"]))
                if ap:
                    ap(os.path.join(self.ethtool_dir, d.ifname + ".txt"))
                    ap(os.path.join(self.ethtool_dir, d.ifname + ".pfc.txt"))
        out.append(self.nvml_text())
        if ap:
            ap(self.nvml_file)
            self._paths = paths
            self._cache = [None] * len(paths)
        return self._paths, [(s + "\n").encode() for s in out]

    def nvml_document(self) -> dict:
        c, n = self.cluster, self.node
        gpu_state = c.gpus
        nvl = gpu_state.nvl[:, n].tolist()  # [field][gpu][link]
        ups = gpu_state.nvl_up[n].tolist()
        util = gpu_state.util[n].tolist()
        thr = gpu_state.throttle[n].tolist()
        gpus = []
        for g in range(NGPU):
            links = [{"state": 1 if ups[g][j] else 0, "tx_kib": nvl[0][g][j], "rx_kib": nvl[1][g][j],
                      "replay": nvl[2][g][j], "recovery": nvl[3][g][j], "crc_flit": nvl[4][g][j],
                      "crc_data": nvl[5][g][j]} for j in range(NVLINKS)]
            gpus.append({"index": g, "uuid": gpu_state.uuid(n, g), "name": GPU_NAME, "pci_bus_id": gpu_pci_bus_id(g),
                         "utilization": util[g], "throttle_reasons": thr[g], "xid": list(gpu_state.xid.get((n, g), [])),
                         "links": links})
        return {"gpus": gpus}

    def nvml_text(self) -> str:
        # one GPU per line, as sim.fixture writes it
        return '{"gpus": [\n' + ",\n".join(json.dumps(g) for g in self.nvml_document()["gpus"]) + "\n]}"

    # ------------------------------------------------------------------ render
    def render(self) -> int:
        """Write every file that changed since the last render; return how many were written."""
        if not self._static_done:
            self._render_static()
        paths, contents = self.dynamic_files()
        cache = self._cache
        written = 0
        for i, data in enumerate(contents):
            if cache[i] != data:
                self._write(paths[i], data)
                cache[i] = data
                written += 1
        written += self._render_modules()
        self.files_written += written
        self.last_written = written
        return written

    def _render_modules(self) -> int:
        """``ethtool/<if>.module.bin`` of every rail NIC (the module EEPROM image the agent's
        transceiver source parses), rewritten when the simulated module readings refresh."""
        c, n = self.cluster, self.node
        if getattr(self, "_module_at", None) == c.optics.module_taken_at:
            return 0
        self._module_at = c.optics.module_taken_at
        for d in c.devs:
            if d.rail is not None:
                self._write(os.path.join(self.ethtool_dir, d.ifname + ".module.bin"), c.optics.module_image(n, d.index))
        return sum(1 for d in c.devs if d.rail is not None)


def render_node(cluster: ClusterState, node: int, root: str | Path) -> NodeTree:
    """One-shot: render node ``node`` of ``cluster`` under ``root``; returns the NodeTree (reuse it)."""
    tree = NodeTree(cluster, node, root)
    tree.render()
    return tree
