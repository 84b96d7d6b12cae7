"""What each gNMI profile subscribes to and what each value it sends means: knowledge as data.

``openconfig``: the public OpenConfig models (openconfig/public, release/models):
- interfaces/openconfig-interfaces.yang: ``/interfaces/interface[name]/state/counters/{in-errors,
  in-discards,out-discards,in-fcs-errors,in-octets,out-octets}`` and ``state/oper-status``;
- interfaces/openconfig-if-ethernet.yang: ``/interfaces/interface[name]/ethernet/state/counters/
  {in-mac-pause-frames,out-mac-pause-frames}``;
- qos/openconfig-qos-interfaces.yang: ``/qos/interfaces/interface[interface-id]/output/queues/queue[name]/
  state/{dropped-pkts,ecn-marked-pkts}``;
- platform/openconfig-platform-transceiver.yang: ``/components/component[name]/transceiver/state/
  {pre-fec-ber,post-fec-ber}/instant``, ``fec-uncorrectable-blocks`` and ``.../physical-channels/channel[index]/state/
  {input-power,output-power}/instant``.
- lldp/openconfig-lldp.yang: ``/lldp/interfaces/interface[name]/neighbors/neighbor[id]/state/{system-name,
  port-id,port-description}``: the far end of each port's cable (``fabricmon_switch_port_info``).
OpenConfig models no per-priority PFC, no PFC watchdog and no PFC configuration, so with it the lossless
settings are not checked (``fabricmon_switch_lossless_config_checked`` 0).

``sonic``: SONiC's telemetry service (sonic-net/sonic-gnmi) serves its Redis DBs as paths with the DB
as the prefix target (sonic-net/SONiC doc/system-telemetry/grpc_telemetry.md): ``COUNTERS_DB``
``COUNTERS/Ethernet*`` (SAI_PORT_STAT_* fields, among them SAI_PORT_STAT_PFC_<p>_RX_PKTS and _TX_PKTS),
``COUNTERS/Ethernet*/Queues`` and ``COUNTERS/Ethernet*/Pfcwd`` (rows ``<port>:<queue>``), ``APPL_DB``
``PORT_TABLE/Ethernet*`` (oper_status), ``LLDP_ENTRY_TABLE/Ethernet*`` (lldp_rem_sys_name,
lldp_rem_port_id, lldp_rem_port_desc: sonic-net/sonic-dbsyncd lldp_syncd) and ``CONFIG_DB``
``PORT_QOS_MAP`` (pfc_enable), ``QUEUE`` (``<ports>|<queues>`` -> wred_profile) and ``WRED_PROFILE`` (ecn)
(sonic-net/SONiC doc/Configuration.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ERRORS = "fabricmon_switch_port_errors_total"
RX_BYTES = "fabricmon_switch_port_receive_bytes_total"
TX_BYTES = "fabricmon_switch_port_transmit_bytes_total"
PORT_UP = "fabricmon_switch_port_up"
PAUSE = "fabricmon_switch_port_pause_frames_total"
PFC = "fabricmon_switch_pfc_frames_total"
QUEUE_DROPS = "fabricmon_switch_queue_dropped_packets_total"
ECN_MARKED = "fabricmon_switch_ecn_marked_packets_total"
PFCWD_STORMS = "fabricmon_switch_pfc_watchdog_storms_total"
RX_POWER = "fabricmon_switch_transceiver_input_power_dbm"
TX_POWER = "fabricmon_switch_transceiver_output_power_dbm"
PRE_FEC_BER = "fabricmon_switch_transceiver_pre_fec_ber"
POST_FEC_BER = "fabricmon_switch_transceiver_post_fec_ber"

COUNTER, GAUGE, STATE = "counter", "gauge", "state"  # STATE: an enum leaf, 1 when "up"


@dataclass(frozen=True)
class Group:
    """One Subscribe call: its prefix (origin, target) and paths (``/a/b[k=v]/c``, ``*`` allowed)."""

    origin: str
    target: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class LeafRule:
    family: str
    kind: str
    extra: tuple[tuple[str, str], ...] = ()  # fixed labels (counter="in_errors", direction="rx")


# ---------------------------------------------------------------- openconfig
OPENCONFIG_GROUPS = (Group("openconfig", "", (
    "/interfaces/interface/state/counters",
    "/interfaces/interface/state/oper-status",
    "/interfaces/interface/ethernet/state/counters",
    "/qos/interfaces/interface/output/queues/queue/state",
    "/components/component/transceiver/state",
    "/components/component/transceiver/physical-channels/channel/state",
    "/lldp/interfaces/interface/neighbors/neighbor/state",
)),)

# schema path of a leaf (element names, no keys, no module prefixes) -> what it is
OPENCONFIG_LEAVES: dict[str, LeafRule] = {
    "interfaces/interface/state/counters/in-errors": LeafRule(ERRORS, COUNTER, (("counter", "in_errors"),)),
    "interfaces/interface/state/counters/in-discards": LeafRule(ERRORS, COUNTER, (("counter", "in_discards"),)),
    "interfaces/interface/state/counters/out-discards": LeafRule(ERRORS, COUNTER, (("counter", "out_discards"),)),
    "interfaces/interface/state/counters/in-fcs-errors": LeafRule(ERRORS, COUNTER, (("counter", "fcs"),)),
    "interfaces/interface/state/counters/in-octets": LeafRule(RX_BYTES, COUNTER),
    "interfaces/interface/state/counters/out-octets": LeafRule(TX_BYTES, COUNTER),
    "interfaces/interface/state/oper-status": LeafRule(PORT_UP, STATE),
    "interfaces/interface/ethernet/state/counters/in-mac-pause-frames": LeafRule(PAUSE, COUNTER,
                                                                                 (("direction", "rx"),)),
    "interfaces/interface/ethernet/state/counters/out-mac-pause-frames": LeafRule(PAUSE, COUNTER,
                                                                                  (("direction", "tx"),)),
    "qos/interfaces/interface/output/queues/queue/state/dropped-pkts": LeafRule(QUEUE_DROPS, COUNTER),
    "qos/interfaces/interface/output/queues/queue/state/ecn-marked-pkts": LeafRule(ECN_MARKED, COUNTER),
    "components/component/transceiver/state/pre-fec-ber/instant": LeafRule(PRE_FEC_BER, GAUGE),
    "components/component/transceiver/state/post-fec-ber/instant": LeafRule(POST_FEC_BER, GAUGE),
    "components/component/transceiver/state/fec-uncorrectable-blocks": LeafRule(
        ERRORS, COUNTER, (("counter", "fec_uncorrectable"),)),
    "components/component/transceiver/physical-channels/channel/state/input-power/instant": LeafRule(
        RX_POWER, GAUGE),
    "components/component/transceiver/physical-channels/channel/state/output-power/instant": LeafRule(
        TX_POWER, GAUGE),
}
# which list key names the switch port, the queue, the lane (element.key)
OPENCONFIG_PORT_KEYS = ("interface.name", "interface.interface-id", "component.name")
OPENCONFIG_QUEUE_KEY = "queue.name"
# LLDP neighbour leaves (schema path -> which part of the far end)
OPENCONFIG_LLDP = {
    "lldp/interfaces/interface/neighbors/neighbor/state/system-name": "peer",
    "lldp/interfaces/interface/neighbors/neighbor/state/port-id": "peer_port",
    "lldp/interfaces/interface/neighbors/neighbor/state/port-description": "peer_port_descr",
}
OPENCONFIG_LANE_KEY = "channel.index"

# ---------------------------------------------------------------- sonic
SONIC_GROUPS = (
    Group("", "COUNTERS_DB", ("COUNTERS/Ethernet*", "COUNTERS/Ethernet*/Queues", "COUNTERS/Ethernet*/Pfcwd")),
    Group("", "APPL_DB", ("PORT_TABLE/Ethernet*", "LLDP_ENTRY_TABLE/Ethernet*")),
    Group("", "CONFIG_DB", ("PORT_QOS_MAP", "QUEUE", "WRED_PROFILE")),
)

# COUNTERS/<port> fields -> what they are (SAI names: sonic-net/sonic-sairedis, saiport.h)
SONIC_PORT_FIELDS: dict[str, LeafRule] = {
    "SAI_PORT_STAT_IF_IN_ERRORS": LeafRule(ERRORS, COUNTER, (("counter", "in_errors"),)),
    "SAI_PORT_STAT_IF_IN_DISCARDS": LeafRule(ERRORS, COUNTER, (("counter", "in_discards"),)),
    "SAI_PORT_STAT_IF_OUT_DISCARDS": LeafRule(ERRORS, COUNTER, (("counter", "out_discards"),)),
    "SAI_PORT_STAT_ETHER_STATS_CRC_ALIGN_ERRORS": LeafRule(ERRORS, COUNTER, (("counter", "fcs"),)),
    "SAI_PORT_STAT_IF_FEC_NOT_CORRECTABLE_FRAMES": LeafRule(ERRORS, COUNTER, (("counter", "fec_uncorrectable"),)),
    "SAI_PORT_STAT_IF_IN_OCTETS": LeafRule(RX_BYTES, COUNTER),
    "SAI_PORT_STAT_IF_OUT_OCTETS": LeafRule(TX_BYTES, COUNTER),
}
SONIC_PFC_FIELD = re.compile(r"SAI_PORT_STAT_PFC_([0-7])_(RX|TX)_PKTS")
# COUNTERS/<port>/Queues rows <port>:<queue>
SONIC_QUEUE_FIELDS: dict[str, LeafRule] = {
    "SAI_QUEUE_STAT_DROPPED_PACKETS": LeafRule(QUEUE_DROPS, COUNTER),
    "SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS": LeafRule(ECN_MARKED, COUNTER),
}
# COUNTERS/<port>/Pfcwd rows <port>:<queue> (the watchdog works per lossless queue = priority)
SONIC_PFCWD_FIELDS: dict[str, LeafRule] = {
    "PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED": LeafRule(PFCWD_STORMS, COUNTER),
}
SONIC_OPER_STATUS = "oper_status"  # APPL_DB PORT_TABLE:<port>
SONIC_LLDP = {"lldp_rem_sys_name": "peer", "lldp_rem_port_id": "peer_port", "lldp_rem_port_desc": "peer_port_descr"}
SONIC_ECN_OFF = frozenset({"", "ecn_none"})  # WRED_PROFILE ecn values that mark nothing

PROFILE_GROUPS: dict[str, tuple[Group, ...]] = {"openconfig": OPENCONFIG_GROUPS, "sonic": SONIC_GROUPS}
# whether the profile reads the lossless settings (PFC priorities, ECN per queue) of each port
CHECKS_LOSSLESS: dict[str, bool] = {"openconfig": False, "sonic": True}
MAX_PATHS = max(sum(len(g.paths) for g in groups) for groups in PROFILE_GROUPS.values())
