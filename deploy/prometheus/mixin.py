#!/usr/bin/env python3
"""fabricmon's Prometheus rules as a mixin: one source, configured in one place.

    python deploy/prometheus/mixin.py            # writes deploy/prometheus/*.rules.yml
    python deploy/prometheus/mixin.py --check    # exit 1 if a written file differs (CI)
    python deploy/prometheus/mixin.py --out DIR  # write somewhere else

The rule files are generated: edit this file, not them.  To adapt the rules to a site
(scrape job names, runbook location, how long a condition must hold before it pages),
change ``CONFIG`` below, or import this module and call ``render(Config(...))``:

    agent_selector       label matchers selecting the agents' scrape targets in `up`
    aggregator_selector  label matchers selecting the aggregator's targets and series
    runbook_url          runbook link; ``{alert}`` is the alert name, ``{anchor}`` its lower case
    for_windows          the named ``for:`` windows every alert picks one of
    agents_disconnected_ratio
                         share of scraped agents allowed to have no stream to the aggregator

Inside an expression ``${name}`` is replaced by the Config field of that name (PromQL itself
never writes ``${``); an unknown name is an error.  tests/deploy/test_prometheus_rules.py checks that
regeneration changes nothing, runs promtool on the output and every alert's unit tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    agent_selector: str = 'job=~".*fabricmon-agent.*"'
    aggregator_selector: str = 'job=~".*fabricmon-aggregator.*"'
    runbook_url: str = "https://github.com/gpu-fabricmon/gpu-fabricmon/blob/main/deploy/prometheus/runbooks.md#{anchor}"
    # `for:` choice.  The aggregator is the fast path (about 2 s from fault to Alertmanager);
    # the fabric rules are the backstop and the record, so they favour few false pages at
    # modest delay, assuming 15 s scrape and evaluation.  Worst case fault -> Alertmanager is
    # about scrape + window + for + evaluation (15 s + 15 s + 15 s for a link down), against
    # 114 s for the usual 1m/1m settings.
    for_windows: dict[str, str] = field(default_factory=lambda: {
        "hard": "15s",       # link down, NVLink down: one confirming evaluation
        "window": "0s",      # fatal XID, flapping: the range window is the persistence
        "sustained": "30s",  # PFC storm, agent down
        "rate": "1m",        # error / retransmit / degraded / drift rates ([1m]-[2m] windows already smooth)
        "bursty": "2m",      # congestion, collector failing: bursty by nature
        "aggregator": "1m",  # aggregator down: the fast path is gone, the rules still work
        "delivery": "5m",    # Alertmanager delivery failing: outlasts retries with backoff
        "stream": "5m",      # agents scraped but not streaming: outlasts a rolling restart
    })
    agents_disconnected_ratio: float = 0.2
    # Error rates in errors per second over the rule's window, not counts per window: a healthy
    # link with a steady trickle (0.3 symbol errors/s is 36 in 2 minutes) never fires.
    link_errors_per_second: float = 1.0
    nvlink_errors_per_second: float = 1.0
    # An agent's stream is down (FabricmonAgentStreamDown) after this long and this many of its intervals.
    stream_down_seconds: float = 300.0
    stream_down_intervals: float = 3.0
    # FabricmonSwitchSweepFailing: the switch sweep's last complete sweep is older than this (three full
    # intervals at sources.ib_switches.full_interval 60 s), or more than this share of its switches is unreachable
    # (in-band, or gNMI subscriptions not delivering).
    switch_sweep_max_age_seconds: float = 180.0
    switch_unreachable_ratio: float = 0.1
    # A node's link state pages nothing this long after it boots (its ports sit in INIT until the subnet
    # manager sweeps them): the aggregator's start-up hold (detection.restart_grace_s, default 60 s).
    startup_hold_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name, value in self.for_windows.items():
            if not re.fullmatch(r"\d+[smh]", value):
                raise ValueError(f"Config.for_windows[{name!r}]: {value!r} is not a Prometheus duration like 30s")
        if "{anchor}" not in self.runbook_url and "{alert}" not in self.runbook_url:
            raise ValueError("Config.runbook_url: names neither {anchor} nor {alert}")
        if not 0 < self.agents_disconnected_ratio < 1:
            raise ValueError(f"Config.agents_disconnected_ratio: {self.agents_disconnected_ratio} not in (0, 1)")
        for name in ("link_errors_per_second", "nvlink_errors_per_second", "stream_down_seconds",
                     "stream_down_intervals"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Config.{name}: {getattr(self, name)} must be > 0")
        if not 0 <= self.startup_hold_seconds <= 3600:  # a PromQL literal: also not NaN or inf
            raise ValueError(f"Config.startup_hold_seconds: {self.startup_hold_seconds} not in [0, 3600]")


CONFIG = Config()


@dataclass(frozen=True)
class Record:
    record: str
    expr: str
    comment: str = ""


@dataclass(frozen=True)
class Alert:
    alert: str
    for_: str  # a key of Config.for_windows
    severity: str
    component_type: str
    summary: str
    description: str
    expr: str
    comment: str = ""
    # The aggregator sends this alert too: the rule is its fallback, silent while every
    # aggregator target is up (one sender per fault; see FALLBACK below).
    fallback: bool = False


@dataclass(frozen=True)
class Group:
    name: str
    rules: list
    fallback: bool = False  # every alert of the group is a fallback (Alert.fallback)


# The fallback arm: a fault the aggregator also sees is the aggregator's to send while it is up
# (one sender, one firing and one resolved notification per fault: two senders resolve at
# different times and Alertmanager notifies firing, resolved, firing, resolved).  `min`: with
# sharded aggregators one replica down brings the rules back for the whole cluster (the
# replicas that are up then send the same alerts too, deduplicated while both fire), never blind.
#
# Hand-back (issue 36): a restarted aggregator first re-evaluates (fabricmon_aggregator_resuming is 1
# until its restored incidents are settled and its nodes' fresh batches evaluated, at most its restart
# grace): the rules stay on meanwhile.  An alert the fallback already fires keeps firing while its
# fault is present (the ALERTS arm) and resolves only when the fault clears, so no "resolved" goes out
# for a fault still there.  Its `sender` label keeps it a separate alert in Alertmanager, grouped with
# the aggregator's (group_by has no `sender`): two senders of one alert would each overwrite the other's
# end time (a resolve from one and a resend from the other re-fire it); two alerts of one group resolve
# the group only when both have.
FALLBACK = """
(
(
{expr}
)
unless on (cluster)
(
  (min by (cluster) (up{{${{aggregator_selector}}}}) == 1)
  unless on (cluster)
  (max by (cluster) (fabricmon_aggregator_resuming{{${{aggregator_selector}}}}) == 1)
)
)
or
(
(
{expr}
)
and on (cluster, component)
ALERTS{{alertname="{alert}", alertstate="firing", sender="prometheus"}}
)
"""
FALLBACK_SENDER = "prometheus"  # the `sender` label of the fallback alerts

# The start-up hold of the link-state alerts (aggregator/startup_hold.py): a node booted within
# startup_hold_seconds (the agent's fabricmon_host_boot_time_seconds) is left out; an agent without its
# host source exports no boot time and is never held.
STARTUP_HOLD = """
unless on (cluster, node)
(time() - fabricmon_host_boot_time_seconds < ${startup_hold_seconds})
"""


@dataclass(frozen=True)
class RuleFile:
    name: str
    header: str
    groups: list


def _substitute(expr: str, cfg: Config, where: str) -> str:
    def one(m: re.Match) -> str:
        key = m.group(1)
        if key not in {f.name for f in dataclasses.fields(cfg)} or key == "for_windows":
            raise KeyError(f"{where}: unknown ${{{key}}} in expr")
        return str(getattr(cfg, key))

    text = re.sub(r"\$\{(\w+)\}", one, expr.strip("\n"))
    # One-line expressions stay plain scalars (no trailing newline), as YAML loads them back.
    return text.strip() if _plain(text) else text + "\n"


def _plain(text: str) -> bool:
    return ("\n" not in text.strip() and ": " not in text and " #" not in text
            and text.strip()[:1] not in "{[&*!|>'\"%@`#-?:,")


def rule_dict(rule: Record | Alert, cfg: Config, fallback: bool = False) -> dict:
    """One rule as Prometheus' rule-file structure (what the YAML and the PrometheusRule hold).
    ``fallback``: the group's setting (an Alert's own ``fallback`` also counts)."""
    if isinstance(rule, Record):
        return {"record": rule.record, "expr": _substitute(rule.expr, cfg, rule.record)}
    expr = rule.expr
    if fallback or rule.fallback:
        body = "\n".join(f"  {ln}".rstrip() for ln in rule.expr.strip("\n").splitlines())
        expr = FALLBACK.format(expr=body, alert=rule.alert)
    labels = {"severity": rule.severity, "component_type": rule.component_type}
    if fallback or rule.fallback:
        labels["sender"] = FALLBACK_SENDER
    return {
        "alert": rule.alert,
        "expr": _substitute(expr, cfg, rule.alert),
        "for": _window(cfg, rule),
        "labels": labels,
        "annotations": {
            "summary": rule.summary,
            "description": rule.description,
            "runbook_url": cfg.runbook_url.format(alert=rule.alert, anchor=rule.alert.lower()),
        },
    }


def _window(cfg: Config, rule: Alert) -> str:
    try:
        return cfg.for_windows[rule.for_]
    except KeyError:
        raise KeyError(f"{rule.alert}: Config.for_windows has no window {rule.for_!r}") from None


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid YAML double-quoted scalar


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {ln}".rstrip() for ln in text.strip("\n").splitlines()]


def render_file(rf: RuleFile, cfg: Config) -> str:
    lines = _comment(rf.header, "")
    lines.append("# GENERATED by deploy/prometheus/mixin.py: edit the source there, then run it.")
    lines.append("groups:")
    for g in rf.groups:
        lines += [f"  - name: {g.name}", "    rules:"]
        for i, rule in enumerate(g.rules):
            d = rule_dict(rule, cfg, g.fallback)
            if i and isinstance(rule, Alert):
                lines.append("")
            if rule.comment:
                lines += _comment(rule.comment, "      ")
            key = "alert" if isinstance(rule, Alert) else "record"
            lines.append(f"      - {key}: {d[key]}")
            if d["expr"].endswith("\n"):
                lines.append("        expr: |")
                lines += [f"          {ln}".rstrip() for ln in d["expr"].rstrip("\n").splitlines()]
            else:
                lines.append(f"        expr: {d['expr']}")
            if isinstance(rule, Alert):
                lines.append(f"        for: {d['for']}")
                lines.append("        labels:")
                lines += [f"          {k}: {v}" for k, v in d["labels"].items()]
                lines.append("        annotations:")
                lines += [f"          {k}: {_q(v)}" for k, v in d["annotations"].items()]
        if g is not rf.groups[-1]:
            lines.append("")
    return "\n".join(lines) + "\n"


def render(cfg: Config = CONFIG) -> dict[str, str]:
    """File name -> content of every rule file."""
    return {rf.name: render_file(rf, cfg) for rf in FILES}


RECORDING = [
    Group('fabricmon-topology', [
        Record('fabricmon:topology_port:info',
        comment='The topology the aggregator runs on, one series per port (its fabricmon_topology_port_info):\n'
                'value = when it last showed the port so.  While an aggregator target is down (the fallback\n'
                'alerts fire then) the last copy recorded here holds, so those alerts keep the leaf names the\n'
                'aggregator would give; topk keeps one copy per port (the newest) across a re-import.  The copy\n'
                'renews itself at every evaluation, so it holds for as long as the aggregator is down; [1h] lets\n'
                'it survive a Prometheus restart or evaluation gap of up to an hour.  Only ports the aggregator\n'
                'showed within 2m of its last showing are held, so a port removed before the outage stays gone.',
        expr='''
topk by (cluster, node, device, port) (1,
  max by (cluster, node, device, port, rail, leaf) (timestamp(fabricmon_topology_port_info{${aggregator_selector}}))
)
or on (cluster, node, device, port)
(
  (
    topk by (cluster, node, device, port) (1, last_over_time(fabricmon:topology_port:info[1h]))
      >= on (cluster) group_left ()
    (max by (cluster) (last_over_time(fabricmon:topology_port:info[1h])) - 120)
  )
  unless on (cluster)
  (min by (cluster) (up{${aggregator_selector}}) == 1)
)
'''),
        Record('fabricmon:ib_port:info',
        comment='Port identity with the rail and leaf of the topology (named leaves, no rail on a fat tree);\n'
                'without a topology series, leaf-u<unit>-r<rail> from a `unit` target label; else the rail alone.',
        expr='''
max by (cluster, node, device, port, interface) (fabricmon_ib_port_info)
  * on (cluster, node, device, port) group_left (rail, leaf)
group by (cluster, node, device, port, rail, leaf) (fabricmon:topology_port:info)
or on (cluster, node, device, port)
max by (cluster, node, device, port, rail, interface, leaf) (
  label_replace(
    label_join(fabricmon_ib_port_info{rail!="", unit!=""}, "leaf", "-r", "unit", "rail"),
    "leaf", "leaf-u$1", "leaf", "(.+)"
  )
)
or on (cluster, node, device, port)
max by (cluster, node, device, port, rail, interface) (fabricmon_ib_port_info)
'''),
        Record('fabricmon:fabric_port:info',
        comment='The fabric ports: on a rail, or on a leaf of the topology (a fat tree has no rails).  A\n'
                'frontend NIC is neither.',
        expr='''
group by (cluster, node, device, port, rail, leaf) (
  fabricmon:ib_port:info{rail!=""} or fabricmon:ib_port:info{leaf!=""}
)
'''),
        Record('fabricmon:ib_rail_port_rate_bytes_per_second:median',
        comment='Expected link rate and width: the median over ACTIVE fabric ports (no per-cluster constant needed).',
        expr='''
quantile by (cluster) (0.5,
  fabricmon_ib_port_rate_bytes_per_second
    and on (cluster, node, device, port) (fabricmon_ib_port_state == 4)
    and on (cluster, node, device, port) fabricmon:fabric_port:info
)
'''),
        Record('fabricmon:ib_rail_port_width_lanes:median',
        expr='''
quantile by (cluster) (0.5,
  fabricmon_ib_port_width_lanes
    and on (cluster, node, device, port) (fabricmon_ib_port_state == 4)
    and on (cluster, node, device, port) fabricmon:fabric_port:info
)
'''),
    ]),
    Group('fabricmon-ports', [
        Record('fabricmon:ib_port_transmit_bytes:rate1m',
        comment='Per port, with rail/leaf/interface joined from fabricmon:ib_port:info: feeds the rail and leaf\n'
                'throughput the Fabric map and overview panels read.  (Every recording rule feeds a shipped\n'
                'panel or alert: tests/deploy/test_prometheus_rules.py checks it.)',
        expr='''
rate(fabricmon_ib_port_transmit_bytes_total[1m])
  * on (cluster, node, device, port) group_left (rail, leaf, interface) fabricmon:ib_port:info
'''),
    ]),
    Group('fabricmon-rails-leaves', [
        Record('fabricmon:rail_transmit_bytes:rate1m',
        expr='''
sum by (cluster, rail) (fabricmon:ib_port_transmit_bytes:rate1m{rail!=""})
'''),
        Record('fabricmon:rail_transmit_utilization:ratio1m',
        expr='''
sum by (cluster, rail) (fabricmon:ib_port_transmit_bytes:rate1m{rail!=""})
  /
sum by (cluster, rail) (
  (fabricmon_ib_port_data_rate_bytes_per_second > 0)
    * on (cluster, node, device, port) group_left (rail) fabricmon:ib_port:info{rail!=""}
)
'''),
        Record('fabricmon:leaf_transmit_bytes:rate1m',
        expr='''
sum by (cluster, leaf, rail) (fabricmon:ib_port_transmit_bytes:rate1m{leaf!=""})
'''),
        Record('fabricmon:leaf_transmit_utilization:ratio1m',
        expr='''
sum by (cluster, leaf, rail) (fabricmon:ib_port_transmit_bytes:rate1m{leaf!=""})
  /
sum by (cluster, leaf, rail) (
  (fabricmon_ib_port_data_rate_bytes_per_second > 0)
    * on (cluster, node, device, port) group_left (leaf, rail) fabricmon:ib_port:info{leaf!=""}
)
'''),
    ]),
]

ALERT_GROUPS = [
    Group('fabricmon-links', fallback=True, rules=[
        Alert(
            'FabricLinkDown', for_='hard', severity='critical', component_type='link',
            summary='Fabric link {{ $labels.component }} is not ACTIVE',
            description='Port {{ $labels.component }} ({{ with $labels.rail }}rail {{ . }}, {{ end }}leaf '
                        '{{ $labels.leaf }}) reports an IB state other than ACTIVE. Jobs using this link on '
                        '{{ $labels.node }} lose bandwidth or hang in collectives.',
            expr='''
max without (device, port) (
  label_join(
    max by (cluster, node, device, port) (fabricmon_ib_port_state != 4)
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:fabric_port:info,
    "component", "/", "node", "device", "port"
  )
)
''' + STARTUP_HOLD),
        Alert(
            'FabricLinkFlapping', for_='window', severity='warning', component_type='link',
            summary='Fabric link {{ $labels.component }} is flapping (down repeatedly)',
            description='Port {{ $labels.component }} went down at least twice (link_downed) or changed state four '
                        'times in 10 minutes: usually a marginal cable or transceiver.',
            expr='''
max without (device, port) (
  label_join(
    (
      max by (cluster, node, device, port) (
        increase({__name__=~"fabricmon_ib_port_(errors|counter)_total", counter="link_downed"}[10m]) >= 2
      )
      or on (cluster, node, device, port)
      max by (cluster, node, device, port) (changes(fabricmon_ib_port_state[10m]) >= 4)
    )
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:ib_port:info,
    "component", "/", "node", "device", "port"
  )
)
''' + STARTUP_HOLD),
        Alert(
            'FabricLinkErrors', for_='rate', severity='warning', component_type='link',
            summary='Fabric link {{ $labels.component }} is taking physical/link errors',
            description='Port {{ $labels.component }} takes {{ $value | humanize }} physical/link errors per second '
                        '(symbol, link-error recovery, receive, integrity, overrun) over 2 minutes; rising symbol '
                        'errors precede link-down.',
            comment='Errors per second over [2m], not a count per window: a steady trickle below the threshold never '
                    'fires.',
            expr='''
max without (device, port) (
  label_join(
    (
      sum by (cluster, node, device, port) (
        rate(fabricmon_ib_port_errors_total{counter=~"symbol_error|link_error_recovery|port_rcv_errors|port_rcv_remote_physical_errors|local_link_integrity_errors|excessive_buffer_overrun_errors"}[2m])
      ) > ${link_errors_per_second}
    )
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:ib_port:info,
    "component", "/", "node", "device", "port"
  )
)
'''),
        Alert(
            'FabricCableDegrading', for_='bursty', severity='warning', component_type='link',
            summary='Cable or optics of fabric link {{ $labels.component }} predicted to fail',
            description='A lane of {{ $labels.component }} lost more than 20% (~1 dB) of its received optical power '
                        'over 15 minutes on a steady trend: plan a cable or transceiver swap before the link flaps.',
            comment="The aggregator's FabricCableDegrading also follows the BER trend and the lanes "
                    "(cable_health.py);\nthis is the part Prometheus can judge alone: a least-squares trend "
                    "losing 20% over 15 minutes, 20%\nreally lost within them (two samples make no trend), "
                    "the lane still lit (> -30 dBm).",
            expr='''
max without (device, port) (
  label_join(
    min by (cluster, node, device, port) (
      (deriv(fabricmon_transceiver_rx_power_watts[15m]) * 900 < -0.2 * fabricmon_transceiver_rx_power_watts)
        and (max_over_time(fabricmon_transceiver_rx_power_watts[15m]) - fabricmon_transceiver_rx_power_watts
             > 0.2 * max_over_time(fabricmon_transceiver_rx_power_watts[15m]))
        and fabricmon_transceiver_rx_power_watts > 1e-6
    )
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:ib_port:info,
    "component", "/", "node", "device", "port"
  )
)
'''),
        Alert(
            'FabricLinkDegraded', for_='rate', severity='warning', component_type='link',
            summary='Fabric link {{ $labels.component }} runs below its expected rate or width',
            description="ACTIVE port {{ $labels.component }} runs below the median rate or width of the cluster's rail "
                        "ports (e.g. 4X -> 2X, NDR -> HDR): every job on {{ $labels.node }} using rail "
                        "{{ $labels.rail }} is slowed.",
            expr='''
max without (device, port) (
  label_join(
    (
      max by (cluster, node, device, port) (
        (fabricmon_ib_port_rate_bytes_per_second
           < on (cluster) group_left () fabricmon:ib_rail_port_rate_bytes_per_second:median)
        or
        (fabricmon_ib_port_width_lanes
           < on (cluster) group_left () fabricmon:ib_rail_port_width_lanes:median)
      )
      and on (cluster, node, device, port) (fabricmon_ib_port_state == 4)
    )
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:fabric_port:info,
    "component", "/", "node", "device", "port"
  )
)
''' + STARTUP_HOLD),
        Alert(
            'RDMARetransmits', for_='rate', severity='warning', component_type='link',
            summary='RDMA transport retries on {{ $labels.component }} (timeouts, out-of-sequence)',
            description='RDMA transport retries (ACK timeouts, out-of-sequence, sequence errors) on '
                        '{{ $labels.component }} at {{ $value | humanize }}/s: packets are lost between this NIC and '
                        'its peers.',
            expr='''
max without (device, port) (
  label_join(
    (
      sum by (cluster, node, device, port) (rate(fabricmon_rdma_transport_retries_total[2m])) > 1
    )
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:ib_port:info,
    "component", "/", "node", "device", "port"
  )
)
'''),
    ]),
    Group('fabricmon-lossless', fallback=True, rules=[
        Alert(
            'FabricPFCStorm', for_='sustained', severity='critical', component_type='link',
            summary='PFC pause storm from {{ $labels.component }}',
            description='{{ $labels.component }} sends PFC/global pause more than half the time or reported a pause '
                        'storm: its receiver is stuck or slow and back-pressures the fabric.',
            comment='The port that emits pauses (tx) most of the time is the slow receiver: blame it, not its '
                    'victims.\nPFC or, on ports configured for it, global (802.3x) pause; pause time, or XOFF frames '
                    'where the driver\ncounts no time (ice).',
            expr='''
max without (device, port, interface) (
  label_join(
    (
      max by (cluster, node, interface) (rate(fabricmon_pfc_pause_seconds_total{direction="tx"}[1m]) > 0.5)
      or on (cluster, node, interface)
      # a port running 802.3x (global) pause has no per-priority counters moving at all
      max by (cluster, node, interface) (rate(fabricmon_global_pause_seconds_total{direction="tx"}[1m]) > 0.5)
      or on (cluster, node, interface)
      # a driver that counts XOFF frames and no pause time (ice, per traffic class): the frames sent over
      # those of a port paused throughout (the agent's per-driver gauge) are the share of time paused
      max by (cluster, node, interface) (
        sum by (cluster, node, interface, traffic_class) (
          rate(fabricmon_pfc_frames_by_traffic_class_total{direction="tx",type="xoff"}[1m])
        )
          / on (cluster, node, interface) group_left
        max by (cluster, node, interface) (fabricmon_pfc_xoff_refresh_frames_per_second > 0)
        > 0.5
      )
      or on (cluster, node, interface)
      max by (cluster, node, interface) (increase(fabricmon_pfc_pause_storm_events_total[5m]) > 0)
    )
      * on (cluster, node, interface) group_left (device, port, rail, leaf) fabricmon:ib_port:info{interface!=""},
    "component", "/", "node", "device", "port"
  )
)
'''),
        Alert(
            'FabricCongestion', for_='bursty', severity='warning', component_type='link',
            summary='Sustained congestion on {{ $labels.component }}',
            description='Sustained congestion on {{ $labels.component }}: ECN marks on more than 10% of received '
                        'packets, paused more than 10% of the time, or (IB) more transmit-wait ticks than packets '
                        'sent.',
            comment='Sustained congestion: ECN marks on >10% of received packets, being paused >10% of\n'
                    'the time, or (IB) more transmit-wait ticks than packets sent.',
            expr='''
max without (device, port) (
  label_join(
    (
      max by (cluster, node, device, port) (
        rate(fabricmon_roce_ecn_marked_packets_total[1m])
          / (rate(fabricmon_ib_port_receive_packets_total[1m]) > 0) > 0.1
      )
      or on (cluster, node, device, port)
      max by (cluster, node, device, port) (
        rate(fabricmon_ib_port_transmit_wait_total[1m])
          / (rate(fabricmon_ib_port_transmit_packets_total[1m]) > 0) > 1
      )
      or on (cluster, node, device, port)
      max by (cluster, node, device, port) (
        (max by (cluster, node, interface) (rate(fabricmon_pfc_pause_seconds_total{direction="rx"}[1m])) > 0.1)
          * on (cluster, node, interface) group_left (device, port) fabricmon:ib_port:info{interface!=""}
      )
      or on (cluster, node, device, port)
      # paused by XOFF frames where the driver counts no pause time (ice): over the full-pause frame rate
      max by (cluster, node, device, port) (
        (
          max by (cluster, node, interface) (
            sum by (cluster, node, interface, traffic_class) (
              rate(fabricmon_pfc_frames_by_traffic_class_total{direction="rx",type="xoff"}[1m])
            )
              / on (cluster, node, interface) group_left
            max by (cluster, node, interface) (fabricmon_pfc_xoff_refresh_frames_per_second > 0)
          ) > 0.1
        )
          * on (cluster, node, interface) group_left (device, port) fabricmon:ib_port:info{interface!=""}
      )
    )
      * on (cluster, node, device, port) group_left (rail, leaf) fabricmon:ib_port:info,
    "component", "/", "node", "device", "port"
  )
)
'''),
        Alert(
            'FabricConfigDrift', for_='rate', severity='warning', component_type='config',
            summary='Lossless fabric config of {{ $labels.component }} differs from the expected profile',
            description='{{ $value }} lossless-fabric checks (PFC, trust, ECN, MTU, rate) fail on '
                        '{{ $labels.component }} against the expected profile: RoCE traffic through it may drop '
                        'instead of pause.',
            comment='Value: number of failing checks on the NIC (PFC, trust, ECN, MTU, rate...).\n'
                    'rail and leaf from the port info (as the aggregator labels the same incident, so both\n'
                    'land in one Alertmanager group); a NIC without port info still alerts, without them.',
            expr='''
max without (device) (
  label_join(
    (
      count by (cluster, node, device) (fabricmon_fabric_config_ok == 0)
        * on (cluster, node, device) group_left (rail, leaf)
      max by (cluster, node, device, rail, leaf) (fabricmon:ib_port:info)
    )
    or on (cluster, node, device)
    count by (cluster, node, device) (fabricmon_fabric_config_ok == 0),
    "component", "/", "node", "device"
  )
)
'''),
    ]),
    Group('fabricmon-gpus', fallback=True, rules=[
        Alert(
            'NVLinkDown', for_='hard', severity='critical', component_type='nvlink',
            summary='NVLink {{ $labels.component }} is down',
            description='NVLink {{ $labels.component }} is down while its GPU is up: collectives inside '
                        '{{ $labels.node }} fall back to slower paths or fail.',
            expr='''
max without (link) (
  label_join(
    label_join(
      max by (cluster, node, gpu, link) (fabricmon_nvlink_up == 0)
        unless on (cluster, node, gpu) (fabricmon_gpu_up == 0),
      "component", "/gpu", "node", "gpu"
    ),
    "component", "/nvlink", "component", "link"
  )
)
'''),
        Alert(
            'NVLinkErrors', for_='rate', severity='warning', component_type='nvlink',
            summary='NVLink {{ $labels.component }} is taking replay/recovery/CRC errors',
            description='NVLink {{ $labels.component }} takes {{ $value | humanize }} replay/recovery/CRC errors per '
                        'second over 2 minutes.',
            expr='''
max without (link) (
  label_join(
    label_join(
      sum by (cluster, node, gpu, link) (
        rate(fabricmon_nvlink_errors_total{type=~"replay|recovery|crc_flit|crc_data"}[2m])
      ) > ${nvlink_errors_per_second},
      "component", "/gpu", "node", "gpu"
    ),
    "component", "/nvlink", "component", "link"
  )
)
'''),
        Alert(
            'GPUXidFatal', for_='window', severity='critical', component_type='gpu',
            summary='GPU {{ $labels.component }} reported a fatal XID',
            description='GPU {{ $labels.component }} reported {{ $value | humanize }} fatal XID(s) in 5 minutes '
                        '(fabricmon_gpu_xid_errors_total{gpu} names the code): it needs a GPU reset or node drain; '
                        'jobs on it have likely failed.',
            comment='Fatal XIDs (fabricmon/sources/nvml/xid.py, the aggregator\'s detection.xid_fatal): 48 DBE ECC,\n'
                    '61/62 internal micro-controller, 64 row-remap failure, 74 NVLink, 79 fallen off the bus,\n'
                    '94/95 (un)contained ECC, 119/120 GSP, 140 unrecovered ECC.  The agent creates one counter per\n'
                    'GPU at 0, so increase() alone sees the first XID, and after a Prometheus restart nothing\n'
                    'that happened before it pages again.',
            expr='''
max by (cluster, node, gpu, component) (
  label_join(
    increase(fabricmon_gpu_xid_fatal_errors_total[5m]) > 0,
    "component", "/gpu", "node", "gpu"
  )
)
'''),
    ]),
    Group('fabricmon-self', [
        Alert(
            'FabricmonAgentDown', for_='sustained', severity='warning', component_type='node', fallback=True,
            summary='fabricmon agent on {{ $labels.component }} stopped reporting',
            description="Prometheus cannot scrape the fabricmon agent on {{ $labels.component }}: that node's fabric, "
                        "NVLink and GPU alerts are blind (and inhibited) until it is back.",
            comment="`up` has no `node` unless the scrape config attaches one; recover it from the\n"
                    "agent's last exposition (latest node name per instance within 1 h).",
            expr='''
label_replace(
  label_replace(
    max by (cluster, node, instance) (
      (up{${agent_selector}} == 0)
        * on (cluster, instance) group_left (node)
      topk by (cluster, instance) (1,
        max by (cluster, instance, node) (last_over_time(fabricmon_snapshot_timestamp_seconds[1h]))
      )
      or on (cluster, instance)
      (up{${agent_selector}} == 0)
    ),
    "component", "$1", "instance", "(.*)"
  ),
  "component", "$1", "node", "(.+)"
)
'''),
        Alert(
            'FabricmonCollectorFailing', for_='bursty', severity='warning', component_type='node',
            summary='fabricmon collector {{ $labels.collector }} failing on {{ $labels.component }}',
            description='Collector {{ $labels.collector }} of the agent on {{ $labels.component }} has failed for 2 '
                        'minutes: its readings are missing from the exposition and the stream.',
            expr='''
label_replace(
  max by (cluster, node, collector) (fabricmon_collector_up == 0),
  "component", "$1", "node", "(.+)"
)
'''),
        Alert(
            'FabricmonAggregatorDown', for_='aggregator', severity='critical', component_type='service',
            summary="fabricmon aggregator {{ $labels.component }} is down",
            description="Prometheus cannot scrape the fabricmon aggregator {{ $labels.component }} (or no aggregator "
                        "target is up at all): the fast alert path, fault localization and straggler scores are gone; "
                        "only these Prometheus rules still alert.",
            comment="Per target, and `absent` for when no aggregator target is up at all (deleted, or its\n"
                    "ServiceMonitor not selected): both mean the fast path is gone.",
            expr='''
label_replace(
  max by (cluster, instance) (up{${aggregator_selector}} == 0),
  "component", "$1", "instance", "(.*)"
)
or on (cluster)
label_replace(
  absent(up{${aggregator_selector}} == 1),
  "component", "fabricmon-aggregator", "__name__", ".*"
)
'''),
        Alert(
            'FabricmonAlertDeliveryFailing', for_='delivery', severity='critical', component_type='service',
            summary="fabricmon aggregator {{ $labels.component }} cannot deliver alerts to Alertmanager",
            description="The aggregator {{ $labels.component }} is dropping or having alerts rejected by Alertmanager "
                        "({{ $value | humanize }}/s), or every delivery attempt fails: incidents it finds reach "
                        "nobody.",
            comment="fabricmon_alerts_sent_total{result}: success, error (a transient failure, retried),\n"
                    "rejected (Alertmanager answered 4xx: lost) and dropped (queue full: lost).  Any loss pages;\n"
                    "retries page only when nothing gets through (one Alertmanager of an HA pair down is\n"
                    "Alertmanager's own alert, not this one).",
            expr='''
label_replace(
  (
    sum by (cluster, instance) (
      rate(fabricmon_alerts_sent_total{${aggregator_selector}, result=~"dropped|rejected"}[5m])
    ) > 0
  )
  or on (cluster, instance)
  (
    (
      sum by (cluster, instance) (rate(fabricmon_alerts_sent_total{${aggregator_selector}, result="error"}[5m])) > 0
    )
    unless on (cluster, instance)
    (
      sum by (cluster, instance) (rate(fabricmon_alerts_sent_total{${aggregator_selector}, result="success"}[5m])) > 0
    )
  ),
  "component", "$1", "instance", "(.*)"
)
'''),
        Alert(
            'FabricmonAgentsDisconnected', for_='stream', severity='warning', component_type='service',
            summary="{{ $value | humanizePercentage }} of the scraped fabricmon agents have no stream to the "
                    "aggregator",
            description="Prometheus scrapes more agents than the aggregator has streams from "
                        "({{ $value | humanizePercentage }} missing): the aggregator cannot localize faults on those "
                        "nodes.  Check the agents' stream errors (token, network policy, aggregator address) and "
                        "fabricmon_grpc_streams_refused_total.",
            comment="Agents Prometheus scrapes (up == 1) against the streams the aggregators hold\n"
                    "(fabricmon_agents_connected, summed over shards).  Value: the share missing.",
            expr='''
label_replace(
  (
    count by (cluster) (up{${agent_selector}} == 1)
      - on (cluster)
    sum by (cluster) (fabricmon_agents_connected{${aggregator_selector}})
  )
    / on (cluster)
  count by (cluster) (up{${agent_selector}} == 1)
  > ${agents_disconnected_ratio},
  "component", "fabricmon-aggregator", "__name__", ".*"
)
'''),
    ]),
    # Kept in a group of its own (issue 26): batches the aggregator acks but does not believe.
    Group('fabricmon-batches-dropped', [
        Alert(
            'FabricmonBatchesDropped', for_='sustained', severity='warning', component_type='node',
            summary='fabricmon aggregator drops the batches of {{ $labels.component }} ({{ $labels.reason }})',
            description="The aggregator acknowledges but does not believe the batches of {{ $labels.component }} "
                        "({{ $labels.reason }}, {{ $value | humanize }} in 5 minutes): ts_ahead, ts_behind or ts_stale "
                        "mean the node's clock is off, seq_ahead that its batches are numbered ahead of the "
                        "aggregator's clock. Its faults raise nothing at the aggregator meanwhile.",
            comment="Named by the agent (fabricmon_stream_batches_dropped_by_aggregator_total{node}: the reason\n"
                    "its acks gave); where no agent series says so, the aggregator's own counter\n"
                    "(fabricmon_ingest_batches_dropped_total, no node label) names the aggregator instance.\n"
                    "More than 10 in 5 minutes: a clock step (NTP) drops a few batches, a wrong clock all of them.",
            expr='''
label_replace(
  sum by (cluster, node, reason) (
    increase(fabricmon_stream_batches_dropped_by_aggregator_total{${agent_selector}}[5m])
  ) > 10,
  "component", "$1", "node", "(.+)"
)
or on (cluster)
label_replace(
  sum by (cluster, instance, reason) (
    increase(fabricmon_ingest_batches_dropped_total{
      ${aggregator_selector}, reason=~"ts_ahead|ts_behind|ts_stale|seq_ahead"
    }[5m])
  ) > 10,
  "component", "$1", "instance", "(.*)"
)
'''),
    ]),
]


BLIND_SPOTS = Group('fabricmon-blind-spots', [
    Alert(
        'FabricmonAgentStreamDown', for_='window', severity='warning', component_type='service',
        summary='fabricmon agent on {{ $labels.component }} has not streamed to the aggregator for '
                '{{ $value | humanizeDuration }}',
        description="The agent on {{ $labels.component }} is scraped but its stream to the aggregator has been down "
                    "for {{ $value | humanizeDuration }}: the aggregator cannot alert on or localize faults of that "
                    "node.  Its log names the error (stream_connect_failed: token, NetworkPolicy, DNS, aggregator "
                    "address).",
        comment="The agent's own gauge (seconds since the stream was lost, or since start): no `for:` to restart\n"
                "after a Prometheus restart, and 'at least 3 intervals' holds for slow pollers too.",
        expr='''
label_replace(
  max by (cluster, node) (
    fabricmon_stream_disconnected_seconds > ${stream_down_seconds}
      and fabricmon_stream_disconnected_seconds > ${stream_down_intervals} * fabricmon_stream_interval_seconds
  ),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonAgentRefused', for_='window', severity='warning', component_type='service',
        summary='The aggregator refuses the stream of the agent on {{ $labels.component }} ({{ $labels.reason }})',
        description="The aggregator refused {{ $value | humanize }} connection(s) of the agent on "
                    "{{ $labels.component }} in 10 minutes: {{ $labels.reason }} (unauthenticated: no or wrong token "
                    "or client certificate; permission_denied: a credential naming another node).  That node is blind "
                    "to the aggregator until its credential is fixed.",
        expr='''
label_replace(
  max by (cluster, node, reason) (increase(fabricmon_stream_refused_total[10m]) > 0),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonHeartbeatsDropped', for_='window', severity='warning', component_type='service',
        summary='fabricmon aggregator {{ $labels.component }} drops rank heartbeats ({{ $labels.reason }})',
        description="The aggregator {{ $labels.component }} dropped {{ $value | humanize }} rank heartbeats in 10 "
                    "minutes ({{ $labels.reason }}): a node over its budget (node_budget, node_jobs), a job over its "
                    "own (job_budget), the table full, or two nodes speaking for one (job, rank) (conflict).  "
                    "Dropped ranks are not watched for hangs.",
        expr='''
label_replace(
  max by (cluster, instance, reason) (
    increase(fabricmon_heartbeats_dropped_total[10m]) > 0
  ),
  "component", "$1", "instance", "(.*)"
)
'''),
    Alert(
        'FabricmonIntakeRefusing', for_='window', severity='warning', component_type='service',
        summary='fabricmon agent on {{ $labels.component }} refuses rank lines ({{ $labels.reason }})',
        description="The rank intake on {{ $labels.component }} refused {{ $value | humanize }} lines in 10 minutes "
                    "({{ $labels.reason }}): job_limit (a local source holds its share of the job slots while "
                    "every slot is taken: made-up job names), series_limit, or conflict (another local source "
                    "posts for a job's ranks).  The refused lines are not seen by straggler or hang detection.",
        expr='''
label_replace(
  max by (cluster, node, reason) (
    increase(fabricmon_intake_lines_total{result="rejected", reason=~"job_limit|series_limit|conflict"}[10m]) > 0
  ),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonSpoolDropping', for_='window', severity='warning', component_type='service',
        summary='fabricmon agent on {{ $labels.component }} is losing batches ({{ $labels.reason }})',
        description="The agent on {{ $labels.component }} lost {{ $value | humanize }} batches in 10 minutes "
                    "({{ $labels.reason }}): its spool is full or failing (disk full, I/O errors) or its queue "
                    "overflows, so the aggregator will never see that stretch of the node's counters.",
        expr='''
label_replace(
  max by (cluster, node, reason) (
    increase(fabricmon_stream_batches_dropped_total{
      reason=~"spool_full|spool_write_failed|corrupt|queue_full"
    }[10m]) > 0
  ),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonGPUsUnmonitored', for_='bursty', severity='warning', component_type='service',
        summary='{{ $labels.component }} has NVIDIA GPUs on its PCI bus that NVML does not report',
        description="The PCI bus of {{ $labels.component }} shows {{ $value }} NVIDIA GPU(s) but NVML reports fewer or "
                    "none (driver library not mounted into the container, nvml: off, or GPUs lost): their XIDs, ECC "
                    "and NVLink are not monitored.",
        comment="fabricmon_pci_nvidia_gpus counts GPUs by vendor and class on the PCI bus, NVML or not;\n"
                "fabricmon_devices_discovered{kind=\"gpu\"} is what NVML reports (absent when NVML is).",
        expr='''
label_replace(
  max by (cluster, node) (
    (fabricmon_pci_nvidia_gpus > 0 unless on (cluster, node) fabricmon_devices_discovered{kind="gpu"})
    or on (cluster, node)
    (fabricmon_pci_nvidia_gpus > on (cluster, node) group_left ()
       max by (cluster, node) (fabricmon_devices_discovered{kind="gpu"}))
  ),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonDevicesMissing', for_='bursty', severity='warning', component_type='service',
        summary='{{ $labels.component }} has fewer RDMA ports than its config expects',
        description="The agent on {{ $labels.component }} finds fewer RDMA ports than "
                    "sources.infiniband.expected_ports says ({{ $value }} missing): a wrong --sysfs-root, a NIC lost "
                    "from the bus or its driver not loaded.  Those ports are not monitored.",
        expr='''
label_replace(
  max by (cluster, node) (
    max by (cluster, node) (fabricmon_devices_expected{kind="rdma_port"})
      - on (cluster, node)
    sum by (cluster, node) (fabricmon_devices_discovered{kind=~"ib_port|roce_port"})
    > 0
  ),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonSwitchSweepFailing', for_='bursty', severity='warning', component_type='service',
        summary='the switch sweep on {{ $labels.component }} is failing',
        description="The switch sweep (sources.ib_switches in-band, or sources.gnmi_switches over gNMI) on "
                    "{{ $labels.component }} has no recent complete sweep, or too many of its switches do not "
                    "answer: the switch side of the fabric (uplinks, the switch end of host cables) is not "
                    "monitored there.",
        comment="fabricmon_switches_swept counts every switch of the map the sweep covered, answering or not; "
                "gNMI: fabricmon_switches_gnmi_unreachable over the configured switches (fabricmon_switch_gnmi_up).",
        expr='''
label_replace(
  max by (cluster, node) (
    fabricmon_switch_sweep_age_seconds > ${switch_sweep_max_age_seconds}
    or
    fabricmon_switches_unreachable / (fabricmon_switches_swept > 0) > ${switch_unreachable_ratio}
    or
    max by (cluster, node) (fabricmon_switches_gnmi_unreachable)
      / (count by (cluster, node) (fabricmon_switch_gnmi_up) > 0) > ${switch_unreachable_ratio}
  ),
  "component", "$1", "node", "(.+)"
)
'''),
    Alert(
        'FabricmonReloadFailed', for_='window', severity='warning', component_type='service',
        summary='fabricmon on {{ $labels.component }} failed to reload its configuration',
        description="The last configuration reload (SIGHUP) of the fabricmon process at {{ $labels.component }} "
                    "failed: it still runs on the previous configuration (its log says which file and field).",
        expr='''
label_replace(
  max by (cluster, instance) (fabricmon_config_last_reload_successful == 0),
  "component", "$1", "instance", "(.*)"
)
'''),
    # fabricmon_agent_never_connected{node}: one series per topology node whose agent never connected
    # since the aggregator started, once its start-up grace (max(60 s, 5 intervals)) is over.  One alert
    # per cluster, listing them (a Prometheus template query: at most 20 names, /api/nodes has all).
    Alert(
        'FabricmonNodesNeverConnected', for_='stream', severity='warning', component_type='config',
        summary='{{ $value }} topology node(s) never connected an agent to the fabricmon aggregator',
        description='{{ $value }} node(s) of the topology have never streamed to the fabricmon aggregator since it '
                    'started: their links, GPUs and ranks are not monitored: '
                    '{{ range query (printf "bottomk(20, fabricmon_agent_never_connected{cluster=`%s`})" '
                    '$labels.cluster) | sortByLabel "node" }}{{ .Labels.node }} {{ end }}'
                    "(at most 20 listed; the aggregator's /api/nodes lists all). Check that the agent runs on them "
                    'and reaches the aggregator, or remove them from the topology.',
        expr='''
label_replace(
  count by (cluster) (fabricmon_agent_never_connected{${aggregator_selector}} == 1),
  "component", "topology", "__name__", ".*"
)
'''),
    Alert(
        'FabricmonStateSaveFailing', for_='window', severity='warning', component_type='service',
        summary='fabricmon aggregator {{ $labels.component }} cannot save its open incidents',
        description="The aggregator {{ $labels.component }} failed to write its state_file in the last 10 "
                    "minutes (disk full, a directory or a read-only path there): it still alerts, but a restart "
                    "now forgets its open incidents (a fault still there pages again, one that cleared is never "
                    "resolved by it).",
        comment="Any failed save in 10 minutes; it clears 10 minutes after saves succeed again.",
        expr='''
label_replace(
  sum by (cluster, instance) (increase(fabricmon_state_save_failures_total{${aggregator_selector}}[10m])) > 0,
  "component", "$1", "instance", "(.*)"
)
'''),
])

ALERT_GROUPS.append(BLIND_SPOTS)

# Acting on faults (issue 42): the breaker that stops fabricmon draining nodes in a burst.  Only when it acts
# (mode="act"): a dry run's breaker says what would have happened, on the dashboard, and pages nobody.
REMEDIATION = Group('fabricmon-remediation', [
    Alert(
        'FabricmonRemediationHalted', for_='window', severity='critical', component_type='service',
        summary='fabricmon remediation halted on {{ $labels.component }}: its circuit breaker tripped',
        description="The remediation circuit breaker of the aggregator {{ $labels.component }} tripped: one more "
                    "drain or taint would have exceeded remediation.max_nodes / max_nodes_percent within the "
                    "window. Every further action is refused (faults still page) until an operator checks the "
                    "nodes fabricmon took out and runs `fabricmon remediation reset`.",
        comment="At once: the trip is itself the decision (the aggregator counts over its window).",
        expr='''
label_replace(
  max by (cluster, instance) (fabricmon_remediation_breaker_tripped{${aggregator_selector}, mode="act"}) == 1,
  "component", "$1", "instance", "(.*)"
)
'''),
])

ALERT_GROUPS.append(REMEDIATION)


RECORDING_HEADER = """
fabricmon recording rules.

Windows are [1m]: they assume a scrape interval of 15 s or less (4+ samples per window).
`cluster` is listed in every `by`/`on` so the rules work unchanged on a global view
(Thanos/Mimir ruler) where `cluster` is a series label; in a single Prometheus it is
an external label, absent at evaluation, and matching on it is a no-op.

Leaf: not an agent label.  The aggregator exports the topology it runs on as
fabricmon_topology_port_info{node,device,port,rail,leaf} (named leaves of an imported
topology, no rail on a fat tree) and fabricmon_topology_leaf_info{leaf,spine};
`fabricmon:ib_port:info` takes rail and leaf from it.  While an aggregator is down the
last copy holds (fabricmon:topology_port:info), so the fallback alerts name the same
leaves.  Without the aggregator's series: give each agent target a `unit` target label
(file_sd / relabeling, see deploy/README.md) and the leaf is `leaf-u<U>-r<R>` (the
generated layout); without `unit`, ports still get `rail` and leaf is empty.
"""

ALERTS_HEADER = """
fabricmon alert rules: the Prometheus path beside the aggregator's direct alerts.

Alert names, labels and component ids are the DESIGN contract and obey the same
inhibitions as the aggregator's.  One sender per fault: the fault rules (links, lossless,
GPUs, agent down) are the aggregator's fallback, silent while every aggregator target is
up, and carry no job or cost labels (only the aggregator knows the hurt jobs).
Every alert carries severity, component_type, component and (where known) node, rail,
leaf, gpu; scrape labels (job, instance, device, port) are aggregated away so they do
not collide with the contract's training-job label.  Self alerts (fabricmon-self) watch
fabricmon itself: agents and aggregator scraped, agents streaming, alerts delivered; the
blind-spot alerts (fabricmon-blind-spots) say what an agent cannot see.

`for:` windows, selectors and runbook links come from Config in deploy/prometheus/mixin.py.
"""

FILES = [
    RuleFile("fabricmon-recording.rules.yml", RECORDING_HEADER, RECORDING),
    RuleFile("fabricmon-alerts.rules.yml", ALERTS_HEADER, ALERT_GROUPS),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="directory for the rule files (default: beside this file)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs from the output")
    args = ap.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    if stale:
        print(f"mixin.py: out of date (run python deploy/prometheus/mixin.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
