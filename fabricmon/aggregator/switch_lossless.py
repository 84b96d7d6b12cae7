"""Both ends of a RoCE cable hold the same lossless settings: the host's RoCE priority is PFC-enabled and
ECN-marked on the switch port its cable ends on (DESIGN.md "The switch side of the fabric").

The switch end comes from ``gnmi_switches`` (sonic profile: CONFIG_DB PORT_QOS_MAP and the WRED/ECN profile
of each queue): ``fabricmon_switch_port_pfc_enabled_priorities{switch,port}`` and
``fabricmon_switch_port_ecn_marking_queues{switch,port}``, bitmasks (bit p: priority or queue p).  The
host end is the RoCE priority the hosts are held to (``detection.roce_priority``, the agents'
``profile.roce_priority``; each host's own settings are checked against it by its agent).  The topology's
``leaf_port`` (the LLDP import) says which switch port a host NIC is on.  A switch whose profile models no
PFC configuration (openconfig) reports ``fabricmon_switch_lossless_config_checked`` 0 and is not compared.

A mismatch is ``FabricConfigDrift`` with ``check`` ``pfc_mismatch`` or ``ecn_mismatch`` on a config
component naming both ends (``node-017/mlx5_3@leaf-01/Ethernet1_1``: a ``/`` in the switch's port name is
``_`` in the id), with the labels ``node``, ``device``, ``rail``, ``leaf``, ``switch_port``."""

from __future__ import annotations

from ..components import Component, Kind, port_part
from ..topology import Topology
from .config import DetectionSettings
from .incidents import Finding

PFC_ENABLED = "fabricmon_switch_port_pfc_enabled_priorities"
ECN_ENABLED = "fabricmon_switch_port_ecn_marking_queues"
FAMILIES = frozenset({PFC_ENABLED, ECN_ENABLED})
CHECKS = {PFC_ENABLED: ("pfc_mismatch", "priority"), ECN_ENABLED: ("ecn_mismatch", "queue")}


def mismatch_component(node: str, device: str, switch: str, port: str) -> Component:
    return Component(Kind.CONFIG, f"{node}/{device}@{switch}/{port_part(port)}", node=node, device=device,
                     leaf=switch)


class SwitchLossless:
    def __init__(self) -> None:
        # (switch, port) -> family -> {priority or queue: enabled}
        self._ports: dict[tuple[str, str], dict[str, dict[int, bool]]] = {}
        self._since: dict[tuple[str, str, str], float] = {}  # (switch, port, check) -> mismatch seen since

    def note(self, family: str, labels: dict[str, str], value: float) -> None:
        if not 0 <= value < 256 or value != int(value):
            return  # not an 8-bit mask: nothing to compare
        port = (labels.get("switch", ""), labels.get("port", ""))
        self._ports.setdefault(port, {})[family] = {k: bool(int(value) >> k & 1) for k in range(8)}

    def findings(self, topology: Topology, s: DetectionSettings, cluster: str, now: float) -> list[Finding]:
        out: list[Finding] = []
        p = s.roce_priority
        seen: set[tuple[str, str, str]] = set()
        for (switch, port), families in sorted(self._ports.items()):
            found = topology.nic_on_leaf_port(switch, port)
            if found is None:
                continue  # not a host cable the topology knows (an uplink, or no leaf_port imported)
            node, nic = found
            device = nic.device or nic.interface or ""
            for family, (check, what) in CHECKS.items():
                state = families.get(family, {})
                if state.get(p, True):  # enabled, or not read (yet)
                    continue
                key = (switch, port, check)
                seen.add(key)
                since = self._since.setdefault(key, now)
                if now - since < s.config_persist_s:
                    continue
                on = sorted(k for k, v in state.items() if v)
                comp = mismatch_component(node, device, switch, port)
                labels = {**comp.labels(cluster), "device": device, "check": check, "switch_port": port}
                if nic.rail is not None:
                    labels["rail"] = str(nic.rail)
                setting = "PFC" if check == "pfc_mismatch" else "ECN marking"
                out.append(Finding("FabricConfigDrift", comp, labels, [
                    f"host end {node}/{device}: RoCE priority {p} lossless and ECN-marked",
                    f"switch end {switch} {port}: {setting} off on {what} {p} "
                    f"({setting} on {what} {', '.join(map(str, on)) if on else 'none'})"], hold_s=s.state_hold_s))
        for key in list(self._since):
            if key not in seen:
                del self._since[key]
        return out
