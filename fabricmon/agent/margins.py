"""Link margins computed on the node from one snapshot: pre-FEC bit error ratio and per-lane error
shares, for /metrics (the aggregator computes its own from the streamed deltas).

Pre-FEC BER = FEC-corrected bits (``rx_corrected_bits_phy``) over the bits the link carried in the
interval.  The inbox mlx5 driver has no ``rx_bits_phy``, so the denominator is the port's data rate
(``fabricmon_ib_port_data_rate_bytes_per_second``) times the interval: FEC works on the line
whether or not there is traffic.  Where the driver counts the bits it received (bnxt_en ``rx_bits``,
``fabricmon_netdev_phy_received_bit_total``), that count is the denominator instead: the driver's own
numerator over its own denominator.  Lane shares come from ``rx_err_lane_N_phy`` (raw errors before FEC
per lane): one lane carrying most of them points at one fibre, one laser, one connector.
"""

from __future__ import annotations

from ..model import Sample, Snapshot

BER = "fabricmon_netdev_phy_pre_fec_bit_error_ratio"
LANE_SHARE = "fabricmon_netdev_phy_lane_error_share_ratio"
_CORRECTED = "fabricmon_netdev_phy_corrected_bit_total"
_RECEIVED = "fabricmon_netdev_phy_received_bit_total"
_PHY_ERRORS = "fabricmon_netdev_phy_errors_total"
_DATA_RATE = "fabricmon_ib_port_data_rate_bytes_per_second"
_LANE_PREFIX, _LANE_SUFFIX = "rx_err_lane_", "_phy"


def link_margins(snap: Snapshot) -> list[Sample]:
    iv = snap.interval_seconds
    if iv <= 0:
        return []
    inventory = snap.facts.get("inventory")
    if inventory is None:
        return []
    rate: dict[tuple[str, str], float] = {}
    for s in snap.samples:
        if s.family == _DATA_RATE:
            rate[(s.labels[0][1], s.labels[1][1])] = s.value
    data_of = {p.netdev: rate.get((p.device, p.port)) for p in inventory.ports if p.netdev}
    corrected: dict[str, float] = {}
    received: dict[str, float] = {}
    lanes: dict[str, dict[str, float]] = {}
    for d in snap.deltas:
        if d.reset:
            continue
        if d.family == _CORRECTED:
            corrected[d.labels[0][1]] = d.delta
        elif d.family == _RECEIVED:
            received[d.labels[0][1]] = d.delta
        elif d.family == _PHY_ERRORS:
            counter = d.labels[1][1]
            if counter.startswith(_LANE_PREFIX) and counter.endswith(_LANE_SUFFIX):
                lane = counter[len(_LANE_PREFIX):-len(_LANE_SUFFIX)]
                lanes.setdefault(d.labels[0][1], {})[lane] = d.delta
    out: list[Sample] = []
    for ifname, bits in corrected.items():
        seen = received.get(ifname)
        if seen:
            out.append(Sample(BER, (("interface", ifname),), bits / seen))
            continue
        data = data_of.get(ifname)
        if data and data > 0:
            out.append(Sample(BER, (("interface", ifname),), bits / (data * 8 * iv)))
    for ifname, per in lanes.items():
        total = sum(per.values())
        if total > 0:
            for lane, v in sorted(per.items()):
                out.append(Sample(LANE_SHARE, (("interface", ifname), ("lane", lane)), v / total))
    return out
