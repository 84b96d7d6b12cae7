#!/usr/bin/env python3
"""Generate fabricmon's Grafana dashboards (classic JSON model) as plain dicts.

    python dashboards/generate.py            # writes dashboards/json/*.json
    python dashboards/generate.py --out DIR  # somewhere else (the test regenerates and diffs)

Plain dicts rather than grafana-foundation-sdk: the SDK is a public preview whose PyPI
versions carry epochs (an unpinned install picks an old Grafana schema), and the classic
model is what Grafana 10-13 provision from files.  tests/deploy/test_dashboards.py checks the
structure, that regeneration changes nothing, and that every metric queried exists
(fabricmon/metrics.py, deploy/prometheus recording rules, aggregator metrics).

Conventions: a ``${datasource}`` variable (no hard-coded uid); variables cluster, hpc_job, job_id,
rail, leaf, node (multi-value regexes, "All" = ``.*`` so an absent label still matches);
``rate(...[$__rate_interval])`` around every ``_total``; a unit on every panel.
Per-rail and per-leaf views use the recording rules (cheap across thousands of nodes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39

# Selectors.  `cluster` is an external label (absent in a single Prometheus): "All" is `.*`.
C = 'cluster=~"$cluster"'
N = f'{C}, node=~"$node"'
PORT_INFO = f'fabricmon:ib_port:info{{{C}, rail=~"$rail", leaf=~"$leaf", node=~"$node"}}'
RATE = "$__rate_interval"
# The job: hpc_job and its job_id (the scheduler's id; a job that sends none has no job_id label, which
# "All" (.*) matches).  Rank gauges, lateness and cost carry the job's job_id whenever it has one: JOB.
# Incidents carry job_id only where the finding knows it (JobHung, a fabric incident's job): JOB_INCIDENT
# also matches an empty one, so a job's software findings stay visible with its job_id selected.
JOB = 'hpc_job=~"$hpc_job", job_id=~"$job_id"'
JOB_INCIDENT = 'hpc_job=~"$hpc_job", job_id=~"$job_id|"'
JOB_LEGEND = "{{hpc_job}} {{job_id}}"
# NCCL Inspector series carry no job: kept to the nodes where a selected job's ranks report (a set
# operation, so a node shared by two jobs is no many-to-many error).
ON_JOB_NODES = f"and on (cluster, node) group by (cluster, node) (fabricmon_rank_step_seconds{{{N}, {JOB}}})"


def _by_port(expr: str, labels: str = "") -> str:
    """Restrict a per-port expression to the selected rails/leaves via the port info join."""
    extra = f" ({labels})" if labels else ""
    return f"{expr} * on (cluster, node, device, port) group_left{extra} {PORT_INFO}"


def _by_iface(expr: str, labels: str = "") -> str:
    extra = f"({labels}) " if labels else ""
    return (f"{expr} * on (cluster, node, interface) group_left {extra}"
            f'fabricmon:ib_port:info{{{C}, rail=~"$rail", leaf=~"$leaf", node=~"$node", interface!=""}}')


# Incidents: the aggregator's one-series-per-open-incident gauge.  Severity ranks 3/2/1 so that
# max() over a leaf/node/switch is its worst open incident; 0 (the `base` series) = nothing open,
# said only while every aggregator target is up; -1 = no data: with an aggregator down or
# unscraped, no open incident is not health, and the cell must not read a green "OK".
INCIDENT = "fabricmon_incident_open"
SEVERITY_RANK = (("critical", 3), ("warning", 2), ("info", 1))
NO_DATA = -1
NO_DATA_TEXT = "no data / aggregator down"
NO_DATA_COLOR = "#8e8e8e"  # grey: neither health nor a fault
AGGREGATORS_UP = f'min by (cluster) (up{{{C}, job=~".*fabricmon-aggregator.*"}}) == 1'
WORST_MAPPINGS = [{"type": "value", "options": {
    str(NO_DATA): {"text": NO_DATA_TEXT, "color": NO_DATA_COLOR, "index": 4},
    "0": {"text": "OK", "color": "green", "index": 0},
    "1": {"text": "info", "color": "blue", "index": 1},
    "2": {"text": "warning", "color": "orange", "index": 2},
    "3": {"text": "critical", "color": "red", "index": 3}}}]
WORST_THRESHOLDS = [(None, NO_DATA_COLOR), (0, "green"), (1, "blue"), (2, "orange"), (3, "red")]


STARTED = f"{INCIDENT.replace('_open', '_started_timestamp_seconds')}"
JOB_PAGES = ("StragglerRank", "SlowRanksSharedComponent", "JobHung")
SOFTWARE_FINDINGS = ("StageImbalance", "SoftwareStraggler")


def _incident_table() -> list[dict]:
    """Open incidents of a job as rows: the job first, newest first."""
    return [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True, "rail": True, "leaf": True},
        "indexByName": {"hpc_job": 0, "job_id": 1, "alertname": 2, "severity": 3, "component_type": 4,
                        "component": 5, "node": 6, "Value": 7},
        "renameByName": {"Value": "open since"}}},
        {"id": "sortBy", "options": {"sort": [{"field": "open since", "desc": True}]}}]


def _worst(by: str, incident_sel: str, base: str = "") -> str:
    """max by (`by`) of the severity rank of open incidents matching `incident_sel`; for every `base`
    series 0 while every aggregator target is up, else NO_DATA."""
    parts = [f'{rank} * {INCIDENT}{{{C}, severity="{sev}", {incident_sel}}}' for sev, rank in SEVERITY_RANK]
    if base:
        parts.append(f"(0 * {base} and on (cluster) ({AGGREGATORS_UP}))")
        parts.append(f"{NO_DATA} + 0 * {base}")
    return f"max by ({by}) ({' or '.join(parts)})"


def _link(title: str, uid: str, params: str) -> dict:
    """A data link into another fabricmon dashboard, keeping the time range and data source."""
    return {"title": title, "targetBlank": False,
            "url": f"/d/{uid}/?{params}&var-datasource=${{datasource}}&${{__url_time_range}}"}


NODE_LINK = _link("Node drill-down: ${__field.labels.node}", "fabricmon-node", "var-node=${__field.labels.node}")
NODE_CELL_LINK = {"matcher": {"id": "byName", "options": "node"},
                  "properties": [{"id": "links", "value": [_link("Node drill-down: ${__value.raw}", "fabricmon-node",
                                                                 "var-node=${__value.raw}")]}]}
LEAF_LINKS = [
    _link("Nodes on ${__field.labels.leaf}", "fabricmon-node",
          "var-rail=${__field.labels.rail}&var-leaf=${__field.labels.leaf}&var-node=$__all"),
    _link("Overview, ${__field.labels.leaf}", "fabricmon-overview",
          "var-rail=${__field.labels.rail}&var-leaf=${__field.labels.leaf}"),
]
FABRIC_LEAF_LINK = _link("Fabric view, ${__field.labels.leaf}", "fabricmon-fabric",
                         "var-rail=${__field.labels.rail}&var-leaf=${__field.labels.leaf}")
FABRIC_RAIL_LINK = _link("Fabric view, rail ${__field.labels.rail}", "fabricmon-fabric",
                         "var-rail=${__field.labels.rail}")

# ------------------------------------------------------------------ builders

class Board:
    def __init__(self, uid: str, title: str, description: str, tags: list[str], *, one_node: bool = False) -> None:
        self.uid, self.title, self.description, self.tags = uid, title, description, tags
        # one_node: the node variable starts on one node, not All (the node view's per-GPU and per-NVLink
        # panels are 2,304 series for 4 nodes: All would be ~74k at 128 nodes); links may still pass All.
        self.one_node = one_node
        self.panels: list[dict] = []
        self._x = 0
        self._y = 0
        self._row_h = 0

    def _place(self, w: int, h: int) -> dict:
        if self._x + w > 24:
            self._x = 0
            self._y += self._row_h
            self._row_h = 0
        pos = {"x": self._x, "y": self._y, "w": w, "h": h}
        self._x += w
        self._row_h = max(self._row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self._x:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        self.panels.append({"type": "row", "title": title, "id": len(self.panels) + 1, "collapsed": False,
                            "gridPos": {"x": 0, "y": self._y, "w": 24, "h": 1}, "panels": []})
        self._y += 1

    def panel(self, kind: str, title: str, targets: list[tuple[str, str]], unit: str, *, w: int = 12, h: int = 8,
              description: str = "", min_val: float | None = None, max_val: float | None = None,
              thresholds: list[tuple[float | None, str]] | None = None, legend: bool = True,
              links: list[dict] | None = None, mappings: list[dict] | None = None, instant: bool = False,
              table: bool = False, transformations: list[dict] | None = None,
              overrides: list[dict] | None = None) -> None:
        defaults: dict = {"unit": unit, "links": links or [], "mappings": mappings or []}
        if min_val is not None:
            defaults["min"] = min_val
        if max_val is not None:
            defaults["max"] = max_val
        steps = thresholds or [(None, "green")]
        defaults["thresholds"] = {"mode": "absolute",
                                  "steps": [{"color": color, "value": value} for value, color in steps]}
        if kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                                  "spanNulls": False}
            options = {"legend": {"displayMode": "table" if legend else "hidden", "placement": "bottom",
                                  "showLegend": legend, "calcs": ["lastNotNull", "max"] if legend else []},
                       "tooltip": {"mode": "multi", "sort": "desc"}}
        elif kind == "status-history":
            defaults["custom"] = {"lineWidth": 0, "fillOpacity": 80}
            options = {"showValue": "never", "rowHeight": 0.9, "colWidth": 0.9,
                       "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
                       "tooltip": {"mode": "single", "sort": "none"}}
        elif kind == "table":
            defaults["custom"] = {"align": "auto", "cellOptions": {"type": "color-background", "mode": "basic"},
                                  "inspect": False}
            options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
        else:  # stat
            options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "colorMode": "background", "graphMode": "none", "textMode": "auto", "justifyMode": "auto",
                       "orientation": "auto"}
        self.panels.append({
            "type": kind,
            "title": title,
            "description": description,
            "id": len(self.panels) + 1,
            "datasource": DS,
            "gridPos": self._place(w, h),
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": options,
            "transformations": transformations or [],
            "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend_fmt,
                         "range": not instant, "instant": instant, "editorMode": "code",
                         "format": "table" if table else "time_series"}
                        for i, (expr, legend_fmt) in enumerate(targets)],
        })

    def ts(self, title: str, targets: list[tuple[str, str]], unit: str, **kw) -> None:
        self.panel("timeseries", title, targets, unit, **kw)

    def stat(self, title: str, expr: str, unit: str, **kw) -> None:
        kw.setdefault("w", 6)
        kw.setdefault("h", 4)
        self.panel("stat", title, [(expr, "")], unit, **kw)

    def to_json(self) -> dict:
        return {
            "id": None,
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["fabricmon", *self.tags],
            "timezone": "utc",
            "editable": True,
            "graphTooltip": 1,
            "refresh": "30s",
            "time": {"from": "now-3h", "to": "now"},
            "timepicker": {},
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "weekStart": "",
            "links": [{"type": "dashboards", "tags": ["fabricmon"], "asDropdown": True, "title": "fabricmon",
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                       "tooltip": "", "url": ""}],
            "annotations": {"list": [{
                "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
            }, INCIDENT_ANNOTATION]},
            "templating": {"list": variables(one_node=self.one_node)},
            "panels": self.panels,
        }


# Every open incident as a region on every time panel: the aggregator's per-incident gauge is
# present exactly while the incident is open.
INCIDENT_ANNOTATION = {
    "name": "Open incidents", "datasource": DS, "enable": True, "hide": False, "iconColor": "red",
    "expr": f'max by (alertname, severity, component_type, component, node, rail, leaf) '
                       f'({INCIDENT}{{{C}, rail=~"$rail|", '
            f'leaf=~"$leaf|", node=~"$node|"}})',
    "step": "15s", "refId": "Incidents", "useValueForTime": False,
    "titleFormat": "{{alertname}} {{component}}",
    "textFormat": "{{severity}}: {{component_type}} {{component}} (node {{node}}, rail {{rail}}, leaf {{leaf}})",
    "tagKeys": "alertname,severity,component_type",
}


def _query_var(name: str, label: str, query: str, *, multi: bool = True, start_all: bool = True,
               extract: str = "") -> dict:
    """A query variable.  ``start_all=False``: no saved selection, so Grafana starts on the first value.
    ``extract``: a regex taking the value out of a ``query_result`` row."""
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "sort": 1,
        "regex": extract,
        "multi": multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if start_all else {},
        "options": [],
        "hide": 0,
    }


def variables(*, one_node: bool = False) -> list[dict]:
    return [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
         "current": {}, "options": [], "refresh": 1, "regex": "", "hide": 0, "multi": False, "includeAll": False},
        _query_var("cluster", "Cluster", "label_values(fabricmon_ib_port_info, cluster)"),
        _query_var("hpc_job", "Training job", f"label_values(fabricmon_rank_step_seconds{{{C}}}, hpc_job)"),
        _query_var("job_id", "Job id",
                   f'label_values(fabricmon_rank_step_seconds{{{C}, hpc_job=~"$hpc_job"}}, job_id)'),
        _query_var("rail", "Rail", f"label_values(fabricmon_ib_port_info{{{C}}}, rail)"),
        # Leaves as of now (query_result is one instant), not label_values over the time range: a Prometheus
        # that scraped an agent before the aggregator's topology recorded a generated leaf-u<U>-r<R> name for
        # a moment, and a range lookup would list it for as long as it stays in the range.
        _query_var("leaf", "Leaf", f'query_result(count by (leaf) (fabricmon:ib_port:info{{{C}, rail=~"$rail"}}))',
                   extract='/leaf="([^"]+)"/'),
        _query_var("node", "Node", f'label_values(fabricmon:ib_port:info{{{C}, rail=~"$rail", leaf=~"$leaf"}}, node)',
                   start_all=not one_node),
    ]


# ------------------------------------------------------------------ dashboards

def overview() -> Board:
    b = Board("fabricmon-overview", "fabricmon / Fabric overview",
              "Cluster fabric health: rails, leaves, links, lossless Ethernet, open incidents.", ["fabric"])
    b.row("Health")
    b.stat("Rail links not ACTIVE",
           f"count((fabricmon_ib_port_state{{{N}}} != 4) * on (cluster, node, device, port) group_left "
           f'fabricmon:ib_port:info{{{C}, rail!="", rail=~"$rail", leaf=~"$leaf", node=~"$node"}}) or vector(0)',
           "none", thresholds=[(None, "green"), (1, "red")],
           description="Rail ports whose logical state is not ACTIVE (4).")
    b.stat("Open incidents", f"sum(fabricmon_incidents_open{{{C}}}) or vector(0)", "none",
           thresholds=[(None, "green"), (1, "orange")], description="Incidents open in the aggregator.")
    b.stat("Agents connected", f"sum(fabricmon_agents_connected{{{C}}})", "none",
           description="Agent streams connected to the aggregator(s).")
    b.stat("NICs with config drift",
           f"count(count by (cluster, node, device) (fabricmon_fabric_config_ok{{{N}}} == 0)) or vector(0)",
           "none", thresholds=[(None, "green"), (1, "orange")],
           description="RoCE rail NICs failing at least one lossless-profile check.")
    b.row("Rails and leaves")
    b.ts("Transmit throughput per rail",
         [(f'fabricmon:rail_transmit_bytes:rate1m{{{C}, rail=~"$rail"}}', "rail {{rail}}")],
         "Bps", min_val=0, links=[FABRIC_RAIL_LINK])
    b.ts("Transmit utilization per rail",
         [(f'fabricmon:rail_transmit_utilization:ratio1m{{{C}, rail=~"$rail"}}', "rail {{rail}}")],
         "percentunit", min_val=0, max_val=1, description="Sum of port transmit rate over sum of link signalling rate.")
    b.ts("Transmit throughput per leaf",
         [(f'fabricmon:leaf_transmit_bytes:rate1m{{{C}, rail=~"$rail", leaf=~"$leaf"}}', "{{leaf}}")], "Bps", min_val=0,
         links=[FABRIC_LEAF_LINK, LEAF_LINKS[0]],
         description="Leaves by their topology names (the aggregator's fabricmon_topology_port_info, else the `unit` "
                     "target label, deploy/README.md).")
    b.ts("Transmit utilization per leaf",
         [(f'fabricmon:leaf_transmit_utilization:ratio1m{{{C}, rail=~"$rail", leaf=~"$leaf"}}', "{{leaf}}")],
         "percentunit", min_val=0, max_val=1, links=[FABRIC_LEAF_LINK, LEAF_LINKS[0]])
    b.row("Links")
    b.ts("Top 10 ports by link errors",
         [(f"topk(10, sum by (node, device, port) "
           f"({_by_port(f'rate(fabricmon_ib_port_errors_total{{{N}}}[{RATE}])')}))",
           "{{node}}/{{device}}/{{port}}")], "cps", min_val=0, links=[NODE_LINK])
    b.ts("Top 10 ports by RDMA transport retries",
         [(f"topk(10, sum by (node, device, port) "
           f"({_by_port(f'rate(fabricmon_rdma_transport_retries_total{{{N}}}[{RATE}])')}))",
           "{{node}}/{{device}}/{{port}}")], "cps", min_val=0, links=[NODE_LINK])
    b.ts("Lowest link rate per rail",
         [(f"min by (rail) ({_by_port(f'fabricmon_ib_port_rate_bytes_per_second{{{N}}}', 'rail')})", "rail {{rail}}")],
         "Bps", min_val=0, description="A rail whose minimum drops below its peers has a degraded link.")
    b.ts("Top 10 ports by transmit wait (IB congestion)",
         [(f"topk(10, sum by (node, device, port) "
           f"({_by_port(f'rate(fabricmon_ib_port_transmit_wait_total{{{N}}}[{RATE}])')}))",
           "{{node}}/{{device}}/{{port}}")], "cps", min_val=0, links=[NODE_LINK])
    b.row("Lossless Ethernet (RoCE)")
    b.ts("Top 10 PFC pause ratio (time paused)",
         [(f"topk(10, max by (node, interface, direction) "
           f"({_by_iface(f'rate(fabricmon_pfc_pause_seconds_total{{{N}}}[{RATE}])')}))",
           "{{node}} {{interface}} {{direction}}")], "percentunit", min_val=0, links=[NODE_LINK],
         description="tx: this port is pausing its peer (slow receiver); rx: this port is being paused (victim).")
    b.ts("CNP and ECN per rail",
         [(f"sum by (rail) ({_by_port(f'rate(fabricmon_roce_cnp_sent_total{{{N}}}[{RATE}])', 'rail')})",
           "CNP sent rail {{rail}}"),
          (f"sum by (rail) ({_by_port(f'rate(fabricmon_roce_ecn_marked_packets_total{{{N}}}[{RATE}])', 'rail')})",
           "ECN marked rail {{rail}}")],
         "pps", min_val=0)
    b.row("Aggregator")
    b.ts("Most suspected components",
         [(f"topk(15, fabricmon_component_suspicion{{{C}}})", "{{component_type}} {{component}}")], "percentunit",
         min_val=0, description="Aggregator's fused evidence per component.")
    b.ts("Open incidents by alert", [(f"sum by (alertname) (fabricmon_incidents_open{{{C}}})", "{{alertname}}")],
         "none", min_val=0)
    return b


# The switch side (the ib_switches sweep, DESIGN "The switch side of the fabric"): a cabled switch port and
# its cable's far end (fabricmon_switch_port_info).  A leaf is a switch with a host on one of its ports.
SW_INFO = "fabricmon_switch_port_info"
HAS_HOSTS = f'count by (cluster, switch) ({SW_INFO}{{{C}, peer_type="host"}})'
LEAF_END = f'({SW_INFO}{{{C}, peer_type="switch", switch=~"$leaf"}} and on (cluster, switch) {HAS_HOSTS})'
SPINE_END = f'({SW_INFO}{{{C}, peer_type="switch", peer=~"$leaf"}} unless on (cluster, switch) {HAS_HOSTS})'


def _peer(expr: str, info: str, labels: str = "peer") -> str:
    """A per-port switch series with its cable's far end (``info``'s ``labels``) joined on."""
    return f"({expr}) * on (cluster, switch, port) group_left({labels}) {info}"


def _as(expr: str, here: str, there: str) -> str:
    """``expr`` with its ``switch`` label copied to ``here`` and its ``peer`` to ``there`` (label_join of one
    label: a copy, with no ``$1`` for a dashboard variable to be mistaken for)."""
    return f'label_join(label_join({expr}, "{here}", "", "switch"), "{there}", "", "peer")'


def _leaf_spine(expr: str) -> str:
    """A per-port switch series, both ends of each uplink, as (leaf, spine) pairs."""
    def named(end: str, here: str, there: str) -> str:
        return _as(_peer(expr, end), here, there)
    return f"({named(LEAF_END, 'leaf', 'spine')} or {named(SPINE_END, 'spine', 'leaf')})"


def node() -> Board:
    b = Board("fabricmon-node", "fabricmon / Node drill-down",
              "One node (the first, unless a link or the picker chooses): RDMA ports, lossless Ethernet, NVLink "
              "and GPUs, host.", ["node"], one_node=True)
    b.row("RDMA ports")
    b.ts("Receive throughput",
         [(f"sum by (node, device, port) ({_by_port(f'rate(fabricmon_ib_port_receive_bytes_total{{{N}}}[{RATE}])')})",
                                 "{{node}} {{device}}/{{port}}")], "Bps", min_val=0)
    b.ts("Transmit throughput",
         [(f"sum by (node, device, port) ({_by_port(f'rate(fabricmon_ib_port_transmit_bytes_total{{{N}}}[{RATE}])')})",
                                  "{{node}} {{device}}/{{port}}")], "Bps", min_val=0)
    b.ts("Transmit utilization (of link data rate)",
         [(f"sum by (node, device, port) ({_by_port(f'rate(fabricmon_ib_port_transmit_bytes_total{{{N}}}[{RATE}])')})"
           f" / on (node, device, port) max by (node, device, port) "
           f"(fabricmon_ib_port_data_rate_bytes_per_second{{{N}}} > 0)",
           "{{node}} {{device}}/{{port}}")], "percentunit", min_val=0, max_val=1)
    b.ts("Port state / physical state",
         [(f"fabricmon_ib_port_state{{{N}}}", "{{node}} {{device}}/{{port}} state"),
          (f"fabricmon_ib_port_physical_state{{{N}}}", "{{node}} {{device}}/{{port}} phys")], "none",
         description="state 4 = ACTIVE; physical state 5 = LinkUp.")
    b.ts("Link rate and width", [(f"fabricmon_ib_port_rate_bytes_per_second{{{N}}}", "{{node}} {{device}}/{{port}}")],
         "Bps", min_val=0)
    b.ts("Link width", [(f"fabricmon_ib_port_width_lanes{{{N}}}", "{{node}} {{device}}/{{port}}")], "none", min_val=0)
    b.ts("PMA error counters",
         [(f"sum by (node, device, port, counter) (rate(fabricmon_ib_port_errors_total{{{N}}}[{RATE}]))",
                                 "{{node}} {{device}}/{{port}} {{counter}}")], "cps", min_val=0)
    b.ts("Saturated counters (rate unknown)", [(f"fabricmon_ib_port_error_saturated{{{N}}} == 1",
                                                 "{{node}} {{device}}/{{port}} {{counter}}")], "none",
         description="A narrow PMA counter pinned at its maximum: clear it (perfquery -x -R).")
    b.ts("RDMA transport retries",
         [(f"sum by (node, device, counter) (rate(fabricmon_rdma_transport_retries_total{{{N}}}[{RATE}]))",
                                     "{{node}} {{device}} {{counter}}")], "cps", min_val=0)
    b.ts("Transmit wait", [(f"sum by (node, device, port) (rate(fabricmon_ib_port_transmit_wait_total{{{N}}}[{RATE}]))",
                            "{{node}} {{device}}/{{port}}")], "cps", min_val=0)
    b.row("Switch end of the node's cables")
    host_end = f'{SW_INFO}{{{C}, peer_type="host", peer=~"$node"}}'
    b.ts("Leaf port errors (switch end)",
         [(_peer(f"sum by (cluster, switch, port, counter) (rate(fabricmon_switch_port_errors_total{{{C}}}[{RATE}]))",
                 host_end, "peer, peer_port"), "{{peer}} <-> {{switch}} port {{port}} {{counter}}")], "cps", min_val=0,
         description="PMA errors the leaf counts on the node's cables (the ib_switches sweep): the same cable's "
                     "other end.  Evidence on the node's link even when the node's agent is not running.")
    b.ts("Leaf port transmit wait (switch end)",
         [(_peer(f"rate(fabricmon_switch_port_transmit_wait_total{{{C}}}[{RATE}])", host_end, "peer, peer_port"),
           "{{peer}} <-> {{switch}} port {{port}}")], "cps", min_val=0,
         description="The leaf port waiting to send to this node: the node receives slower than it is sent to.")
    b.ts("Leaf port state (switch end)",
         [(_peer(f"fabricmon_switch_port_up{{{C}}}", host_end, "peer, peer_port"),
           "{{peer}} <-> {{switch}} port {{port}}")], "none", min_val=0, max_val=1,
         description="1 while the leaf's end of the cable is ACTIVE.")
    b.row("RoCE congestion and PFC")
    b.ts("CNP / ECN", [
        (f"sum by (node, device) (rate(fabricmon_roce_cnp_sent_total{{{N}}}[{RATE}]))", "{{node}} {{device}} CNP sent"),
        (f"sum by (node, device) (rate(fabricmon_roce_cnp_handled_total{{{N}}}[{RATE}]))",
         "{{node}} {{device}} CNP handled"),
        (f"sum by (node, device) (rate(fabricmon_roce_cnp_ignored_total{{{N}}}[{RATE}]))",
         "{{node}} {{device}} CNP ignored"),
        (f"sum by (node, device) (rate(fabricmon_roce_ecn_marked_packets_total{{{N}}}[{RATE}]))",
         "{{node}} {{device}} ECN marked"),
    ], "pps", min_val=0)
    b.ts("PFC pause ratio",
         [(f"sum by (node, interface, priority, direction) (rate(fabricmon_pfc_pause_seconds_total{{{N}}}[{RATE}]))",
                              "{{node}} {{interface}} prio {{priority}} {{direction}}")], "percentunit", min_val=0)
    b.ts("PFC pause frames",
         [(f"sum by (node, interface, priority, direction) (rate(fabricmon_pfc_pause_frames_total{{{N}}}[{RATE}]))",
                               "{{node}} {{interface}} prio {{priority}} {{direction}}")], "pps", min_val=0)
    b.ts("PHY errors and discards",
         [(f"sum by (node, interface, counter) (rate(fabricmon_netdev_phy_errors_total{{{N}}}[{RATE}]))",
                                      "{{node}} {{interface}} {{counter}}")], "cps", min_val=0)
    b.ts("Lossless config checks failing", [(f"fabricmon_fabric_config_ok{{{N}}} == 0",
                                             "{{node}} {{device}}/{{port}} {{interface}} {{check}}")],
         "none", links=[NODE_LINK],
         description="Present only while a check fails. A check the host cannot answer (a VF's empty "
                             "DCB APP table) is fabricmon_fabric_config_unknown, not a failure.")
    b.row("GPUs and NVLink")
    b.ts("NVLink transmit per GPU",
         [(f"sum by (node, gpu) (rate(fabricmon_nvlink_transmit_bytes_total{{{N}}}[{RATE}]))",
                                      "{{node}} gpu{{gpu}}")], "Bps", min_val=0)
    b.ts("NVLink receive per GPU", [(f"sum by (node, gpu) (rate(fabricmon_nvlink_receive_bytes_total{{{N}}}[{RATE}]))",
                                     "{{node}} gpu{{gpu}}")], "Bps", min_val=0)
    b.ts("NVLink errors", [(f"sum by (node, gpu, link, type) (rate(fabricmon_nvlink_errors_total{{{N}}}[{RATE}]))",
                            "{{node}} gpu{{gpu}} nvlink{{link}} {{type}}")], "cps", min_val=0)
    b.ts("NVLinks down", [(f"count by (node, gpu) (fabricmon_nvlink_up{{{N}}} == 0)", "{{node}} gpu{{gpu}}")], "none",
         min_val=0)
    b.ts("XID errors", [(f"sum by (node, gpu, xid) (increase(fabricmon_gpu_xid_errors_total{{{N}}}[{RATE}]))",
                         "{{node}} gpu{{gpu}} xid {{xid}}")], "none", min_val=0)
    b.ts("GPU utilization", [(f"fabricmon_gpu_utilization_ratio{{{N}}}", "{{node}} gpu{{gpu}}")], "percentunit",
         min_val=0, max_val=1)
    b.ts("Clock throttle reasons active",
         [(f"fabricmon_gpu_throttle_reason{{{N}}} == 1", "{{node}} gpu{{gpu}} {{reason}}")],
         "none", description="Thermal or power throttling explains a compute straggler.")
    b.ts("PCIe replays",
         [(f"sum by (node, gpu) (rate(fabricmon_gpu_pcie_replay_total{{{N}}}[{RATE}]))", "{{node}} gpu{{gpu}}")],
         "cps", min_val=0)
    b.row("Host")
    b.ts("CPU utilization", [(f"fabricmon_host_cpu_utilization_ratio{{{N}}}", "{{node}}")], "percentunit", min_val=0,
         max_val=1)
    b.ts("Memory available", [(f"fabricmon_host_memory_available_bytes{{{N}}}", "{{node}}")], "bytes", min_val=0)
    return b


def job() -> Board:
    b = Board("fabricmon-job", "fabricmon / Job view",
              "Training jobs kept apart: step time per job and per rank, stragglers, hangs, the software findings "
              "that never page (decoys), what open incidents cost each job, NCCL collectives on the job's nodes.",
              ["job"])
    b.row("Jobs")
    b.ts("Step time per job (median over its ranks)",
         [(f"quantile by (hpc_job, job_id) (0.5, fabricmon_rank_step_seconds{{{N}, {JOB}}})", JOB_LEGEND)], "s",
         min_val=0, description="Each job's median last step time over its ranks (agent rank gauges).")
    b.ts("GPU-hours per hour lost per job",
         [(f"sum by (hpc_job, job_id) (fabricmon_incident_gpu_hours_per_hour{{{C}, {JOB}}})", JOB_LEGEND)], "none",
         min_val=0, description="Summed over the open incidents whose components the job's ranks use (aggregator).")
    b.panel("table", "What open incidents cost each job (GPU-hours per hour)",
            [(f"sort_desc(fabricmon_incident_gpu_hours_per_hour{{{C}, {JOB}}})", "")], "none",
            w=24, h=8, instant=True, table=True,
            description="Per open incident and job whose ranks use its component: the job's GPUs x (1 - 1/(1 + "
                        "step slowdown)), the slowdown measured against the job's last 20 clean steps (aggregator). "
                        "Costliest first; the alert's impact annotation says the same in words.",
            transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True},
                "indexByName": {"hpc_job": 0, "job_id": 1, "alertname": 2, "component": 3, "Value": 4},
                "renameByName": {"Value": "GPU-hours per hour"}}},
                {"id": "sortBy", "options": {"sort": [{"field": "GPU-hours per hour", "desc": True}]}}])
    b.row("Stragglers, hangs and software findings")
    b.panel("table", "Stragglers and hangs (pages)",
            [(f'{STARTED}{{{C}, {JOB_INCIDENT}, alertname=~"{"|".join(JOB_PAGES)}"}} * 1000', "")], "dateTimeAsIso",
            w=12, h=8, instant=True, table=True, transformations=_incident_table(), overrides=[NODE_CELL_LINK],
            description="Open StragglerRank, SlowRanksSharedComponent and JobHung incidents naming the job "
                        "(hpc_job, fixed when the incident first fires).")
    b.panel("table", "Software findings (info, never paged)",
            [(f'{STARTED}{{{C}, {JOB_INCIDENT}, severity="info", alertname=~"{"|".join(SOFTWARE_FINDINGS)}"}} '
              f"* 1000", "")], "dateTimeAsIso",
            w=12, h=8, instant=True, table=True, transformations=_incident_table(), overrides=[NODE_CELL_LINK],
            description="StageImbalance (a whole pipeline stage or many ranks late together) and SoftwareStraggler "
                        "(a host's ranks late while every component they use is clean: a dataloader, CPU or GC). "
                        "Decoys show here, not in the pager.")
    b.ts("Late ranks per job (top 10 by lateness score)",
         [(f"topk by (hpc_job, job_id) (10, fabricmon_rank_lateness_score{{{C}, {JOB}}})",
           "{{hpc_job}} {{job_id}} rank {{rank}}")], "none",
         description="Robust z-score of lateness against the rank's peers in its own job (aggregator).")
    b.ts("Open incidents naming the job, by severity",
         [(f'count by (hpc_job, severity) (fabricmon_incident_open{{{C}, {JOB_INCIDENT}, hpc_job!=""}})',
           "{{hpc_job}} {{severity}}")], "none", min_val=0)
    b.row("Ranks")
    b.ts("Step time per rank", [(f"fabricmon_rank_step_seconds{{{N}, {JOB}}}", "{{hpc_job}} rank {{rank}}")], "s",
         min_val=0, legend=False, links=[NODE_LINK])
    b.ts("Communication time per rank", [(f"fabricmon_rank_comm_seconds{{{N}, {JOB}}}", "{{hpc_job}} rank {{rank}}")],
         "s", min_val=0, legend=False)
    b.ts("Step time spread", [
        (f"max by (hpc_job, job_id) (fabricmon_rank_step_seconds{{{N}, {JOB}}})", JOB_LEGEND + " max"),
        (f"quantile by (hpc_job, job_id) (0.5, fabricmon_rank_step_seconds{{{N}, {JOB}}})", JOB_LEGEND + " median"),
        (f"min by (hpc_job, job_id) (fabricmon_rank_step_seconds{{{N}, {JOB}}})", JOB_LEGEND + " min"),
    ], "s", min_val=0, w=24)
    b.row("NCCL collectives on the job's nodes (NCCL Inspector)")
    b.ts("Bus bandwidth per rank", [(f"fabricmon_nccl_bus_bandwidth_bytes_per_second{{{N}}} {ON_JOB_NODES}",
                                      "{{node}} rank {{rank}} {{collective}}")], "Bps", min_val=0, legend=False,
         links=[NODE_LINK])
    b.ts("Time in collectives (share of wall time)",
         [(f"sum by (node, rank) (rate(fabricmon_nccl_collective_seconds_total{{{N}}}[{RATE}]) {ON_JOB_NODES})",
           "{{node}} rank {{rank}}")], "percentunit", min_val=0, legend=False)
    b.ts("Collectives per second",
         [(f"sum by (collective) (rate(fabricmon_nccl_collectives_total{{{N}}}[{RATE}]) {ON_JOB_NODES})",
           "{{collective}}")], "ops", min_val=0)
    b.ts("Collective bytes per second",
         [(f"sum by (collective) (rate(fabricmon_nccl_collective_bytes_total{{{N}}}[{RATE}]) {ON_JOB_NODES})",
           "{{collective}}")], "Bps", min_val=0)
    return b


def self_monitoring() -> Board:
    b = Board("fabricmon-self", "fabricmon / Self-monitoring",
              "The monitor itself: agent collectors, scrape health, aggregator ingest and alert delivery.", ["self"])
    b.row("Agents")
    b.stat("Agents scraped", f'sum(up{{{C}, job=~".*fabricmon-agent.*"}})', "none")
    b.stat("Agents not scraped", f'count(up{{{C}, job=~".*fabricmon-agent.*"}} == 0) or vector(0)', "none",
           thresholds=[(None, "green"), (1, "red")])
    b.stat("Agents down, last snapshot (FabricmonAgentDown)",
           f"(time() - min(max by (cluster, instance) "
           f"(last_over_time(fabricmon_snapshot_timestamp_seconds{{{N}}}[1h])) "
           f'and on (cluster, instance) (up{{{C}, job=~".*fabricmon-agent.*"}} == 0))) or vector(0)', "s",
           thresholds=[(None, "green"), (30, "red")],
           description="Age of the oldest last snapshot among agents that are not scraped now.")
    b.stat("Collectors failing", f"count(fabricmon_collector_up{{{N}}} == 0) or vector(0)", "none",
           thresholds=[(None, "green"), (1, "orange")])
    b.stat("Oldest snapshot served", f"max(fabricmon_snapshot_age_seconds{{{N}}})", "s",
           thresholds=[(None, "green"), (5, "orange"), (30, "red")])
    b.ts("Collectors up (nodes failing per collector)",
         [(f"count by (collector) (fabricmon_collector_up{{{N}}} == 0)", "{{collector}}")], "none", min_val=0)
    b.ts("Collector duration (max over nodes)",
         [(f"max by (collector) (fabricmon_collector_duration_seconds{{{N}}})", "{{collector}}")], "s", min_val=0)
    b.ts("Collector errors",
         [(f"sum by (collector) (rate(fabricmon_collector_errors_total{{{N}}}[{RATE}]))", "{{collector}}")],
         "cps", min_val=0)
    b.ts("Snapshot age (max over nodes)", [(f"max(fabricmon_snapshot_age_seconds{{{N}}})", "max age")], "s", min_val=0)
    b.row("Aggregator")
    b.ts("Agents connected", [(f"sum by (cluster) (fabricmon_agents_connected{{{C}}})", "connected")], "none",
         min_val=0)
    b.ts("Ingest rate", [(f"sum(rate(fabricmon_ingest_samples_total{{{C}}}[{RATE}]))", "samples/s")], "cps", min_val=0)
    b.ts("Alerts sent to Alertmanager",
         [(f"sum by (result) (rate(fabricmon_alerts_sent_total{{{C}}}[{RATE}]))", "{{result}}")],
         "cps", min_val=0)
    b.ts("Open incidents", [(f"sum by (alertname) (fabricmon_incidents_open{{{C}}})", "{{alertname}}")], "none",
         min_val=0)
    _blind_spots(b)
    return b


RED_FROM_1 = [(None, "green"), (1, "red")]
ORANGE_FROM_1 = [(None, "green"), (1, "orange")]


def _blind_spots(b: Board) -> None:
    """One panel (or more) per blind-spot self alert, reading what its rule reads, so the on-call sees what
    is not monitored before and after the alert fires (tests/deploy/test_dashboards.py checks the mapping).
    A healthy cluster reads 0 here, not "no data" (which would look like a scrape that is missing)."""
    b.row("Blind spots: what is not monitored")
    b.stat("Agent streams down (FabricmonAgentStreamDown)",
           f"count(fabricmon_stream_disconnected_seconds{{{N}}} > 300) or vector(0)", "none",
           thresholds=ORANGE_FROM_1)
    b.stat("Unknown nodes streaming (FabricmonUnknownNodes)", f"sum(fabricmon_agents_unknown{{{C}}}) or vector(0)",
           "none", thresholds=ORANGE_FROM_1)
    b.stat("Topology nodes never connected (FabricmonNodesNeverConnected)",
           f"sum(fabricmon_agents_never_connected{{{C}}}) or vector(0)", "none", thresholds=ORANGE_FROM_1)
    b.stat("Failed config reloads (FabricmonReloadFailed)",
           f"count(fabricmon_config_last_reload_successful{{{C}}} == 0) or vector(0)", "none",
           thresholds=ORANGE_FROM_1)
    b.ts("Stream disconnected for (worst 10 nodes)",
         [(f"topk(10, fabricmon_stream_disconnected_seconds{{{N}}}) or vector(0)", "{{node}}"),
          (f"max(fabricmon_stream_interval_seconds{{{N}}}) * 3", "3 intervals")], "s", min_val=0, links=[NODE_LINK])
    b.ts("Streams refused by the aggregator (FabricmonAgentRefused)",
         [(f"(sum by (node, reason) (rate(fabricmon_stream_refused_total{{{N}}}[{RATE}])) > 0) or vector(0)",
           "{{node}} {{reason}}")],
         "cps", min_val=0, links=[NODE_LINK])
    b.ts("Spool fill (worst 10 nodes)",
         [(f"topk(10, fabricmon_stream_spool_bytes{{{N}}} / fabricmon_stream_spool_max_bytes{{{N}}} > 0) "
           f"or vector(0)", "{{node}}")], "percentunit", min_val=0, max_val=1, links=[NODE_LINK])
    b.ts("Batches lost on the node (FabricmonSpoolDropping)",
         [(f"sum by (reason) (rate(fabricmon_stream_batches_dropped_total{{{N}}}[{RATE}])) or vector(0)",
           "{{reason}}")],
         "cps", min_val=0)
    b.ts("Batches dropped for clock or sequence (FabricmonBatchesDropped)",
         [(f"sum by (reason) (rate(fabricmon_ingest_batches_dropped_total{{{C}}}[{RATE}]))", "aggregator {{reason}}"),
          (f"sum by (reason) (rate(fabricmon_stream_batches_dropped_by_aggregator_total{{{N}}}[{RATE}]))",
           "agents {{reason}}")], "cps", min_val=0)
    b.ts("Devices missing or unmonitored (FabricmonDevicesMissing, FabricmonGPUsUnmonitored)",
         [(f'sum by (node) (fabricmon_devices_expected{{{N}, kind="rdma_port"}}) - on (node) '
           f'sum by (node) (fabricmon_devices_discovered{{{N}, kind=~"ib_port|roce_port"}}) > 0', "{{node}} ports"),
          (f"sum by (node) (fabricmon_pci_nvidia_gpus{{{N}}}) - on (node) "
           f'(sum by (node) (fabricmon_devices_discovered{{{N}, kind="gpu"}}) or sum by (node) '
           f"(fabricmon_pci_nvidia_gpus{{{N}}}) * 0) > 0 or vector(0)", "{{node}} GPUs")], "none", min_val=0,
         links=[NODE_LINK])
    b.ts("Heartbeats dropped at the aggregator (FabricmonHeartbeatsDropped)",
         [(f"sum by (reason) (rate(fabricmon_heartbeats_dropped_total{{{C}}}[{RATE}]))", "{{reason}}")],
         "cps", min_val=0)
    b.ts("Rank lines refused at the nodes' intake (FabricmonIntakeRefusing)",
         [(f'(sum by (node, reason) (rate(fabricmon_intake_lines_total{{{N}, result="rejected"}}[{RATE}])) > 0) '
           f"or vector(0)", "{{node}} {{reason}}")], "cps", min_val=0, links=[NODE_LINK])
    b.ts("Incident state saves failing (FabricmonStateSaveFailing)",
         [(f"sum by (instance) (rate(fabricmon_state_save_failures_total{{{C}}}[{RATE}]))", "{{instance}}")],
         "cps", min_val=0)
    b.ts("Remediation: actions by result, breaker tripped (FabricmonRemediationHalted)",
         [(f"sum by (action, result) (rate(fabricmon_remediation_actions_total{{{C}}}[{RATE}])) or vector(0)",
           "{{action}} {{result}}"),
          (f'max by (instance, mode) (fabricmon_remediation_breaker_tripped{{{C}}}) or vector(0)',
           "breaker tripped {{instance}} {{mode}}"),
          (f"sum by (instance) (fabricmon_remediation_nodes_out{{{C}}}) or vector(0)", "nodes out {{instance}}")],
         "none", min_val=0)
    b.ts("Switch sweep age and unreachable switches (FabricmonSwitchSweepFailing)",
         [(f"max by (node) (fabricmon_switch_sweep_age_seconds{{{N}}}) or vector(0)", "{{node}} sweep age"),
          (f"sum by (node) (fabricmon_switches_unreachable{{{N}}})", "{{node}} unreachable"),
          (f"sum by (node) (fabricmon_switches_swept{{{N}}})", "{{node}} swept"),
          (f"sum by (node) (fabricmon_switches_gnmi_unreachable{{{N}}})", "{{node}} gNMI unreachable")],
         "none", min_val=0)
    b.ts("gNMI switch sessions ended and updates refused, by reason (sources.gnmi_switches)",
         [(f"(sum by (switch, reason) (rate(fabricmon_switch_gnmi_failures_total{{{N}}}[{RATE}])) > 0) "
           f"or vector(0)", "{{switch}} {{reason}}")], "cps", min_val=0)
    b.ts("Versions running (skew during an upgrade)",
         [(f"count by (version) (fabricmon_build_info{{{C}}})", "{{version}}")], "none", min_val=0)


LEAF_X_SPINE = {"id": "groupingToMatrix", "options": {"rowField": "leaf", "columnField": "spine",
                                                     "valueField": "Value", "emptyValue": "null"}}


def _uplinks(b: Board) -> None:
    """The leaf x spine map of uplink health and the switch ports that count errors, wait or went down."""
    port_errors = f"sum by (cluster, switch, port) (rate(fabricmon_switch_port_errors_total{{{C}}}[{RATE}]))"
    port_wait = f"rate(fabricmon_switch_port_transmit_wait_total{{{C}}}[{RATE}])"
    ends = "{{switch}} port {{port}} <-> {{peer}} port {{peer_port}}"
    node_link = [_link("Node drill-down: ${__value.raw}", "fabricmon-node", "var-node=${__value.raw}")]
    b.row("Uplinks: leaf x spine")
    base = _as(LEAF_END, "leaf", "spine")
    b.panel("table", "Uplinks: worst open incident, leaf x spine",
            [(_worst("leaf, spine", 'component_type="uplink", leaf=~"$leaf"', base), "")], "none", w=12, h=10,
            instant=True, table=True, mappings=WORST_MAPPINGS, thresholds=WORST_THRESHOLDS,
            transformations=[LEAF_X_SPINE],
            description="One row per leaf, one column per spine: the worst open incident on the leaf's uplinks to "
                        "that spine (FabricLinkDown/Errors/Flapping/Degraded/Congestion with component_type "
                        "uplink).  Cells come from the switch sweep's cables (fabricmon_switch_port_info); empty "
                        "where the leaf has no uplink to the spine.  A spine with many red cells: "
                        "FabricSpineDegraded.")
    b.panel("table", "Uplinks: error rate, leaf x spine",
            [(f"sum by (leaf, spine) ({_leaf_spine(port_errors)})", "")],
            "cps", w=12, h=10, instant=True, table=True, transformations=[LEAF_X_SPINE],
            thresholds=[(None, "green"), (0.01, "orange"), (1, "red")],
            description="PMA errors per second counted at either end of the uplinks between each leaf and spine "
                        "(the switch sweep, both ends of each cable summed).")
    b.panel("table", "Switch ports down",
            [(_peer(f"fabricmon_switch_port_up{{{C}}} == 0", f"{SW_INFO}{{{C}}}", "peer, peer_port, peer_type"), "")],
            "none", w=12, h=8, instant=True, table=True,
            transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value": True, "__name__": True, "instance": True, "job": True},
                "indexByName": {"switch": 0, "port": 1, "peer": 2, "peer_port": 3, "peer_type": 4}}}],
            overrides=[{"matcher": {"id": "byName", "options": "peer"},
                        "properties": [{"id": "links", "value": node_link}]}],
            description="Cabled switch ports whose PortInfo is not ACTIVE (kept at 0 once down, never dropped), "
                        "with the far end of the cable: a host (click to its drill-down) or a switch (an uplink).")
    b.panel("status-history", "Switch ports: most errors",
            [(f"topk(20, {_peer(port_errors, f'{SW_INFO}{{{C}}}', 'peer, peer_port')})", ends)], "cps", w=12, h=8,
            min_val=0,
            thresholds=[(None, "green"), (0.01, "orange"), (1, "red")],
            description="The switch ports (host cables' leaf ends and both ends of uplinks) counting the most PMA "
                        "errors, each named with its cable's two ends.")
    b.panel("status-history", "Switch ports: most transmit wait",
            [(f"topk(20, {_peer(port_wait, f'{SW_INFO}{{{C}}}', 'peer, peer_port')})", ends)], "cps", w=12, h=8,
            min_val=0,
            thresholds=[(None, "green"), (1e4, "orange"), (5e4, "red")],
            description="Ticks per second the switch port had data to send and no credit (PortXmitWait): the port "
                        "FabricCongestion names.  A leaf port facing a host waits for a slow receiver; an uplink "
                        "port for a congested spine.")


def fabric() -> Board:
    b = Board("fabricmon-fabric", "fabricmon / Fabric map",
              "Rail x leaf and node grids coloured by the worst open incident and by error and pause rates; "
              "open incidents from the aggregator. Click a leaf or node to drill down.", ["fabric", "incidents"])
    info = f'fabricmon:ib_port:info{{{C}, rail=~"$rail", leaf=~"$leaf", node=~"$node", leaf!=""}}'
    leaf_sel = 'rail=~"$rail", leaf=~"$leaf", leaf!=""'
    worst_leaf = _worst("rail, leaf", leaf_sel, info)
    b.row("Rail x leaf")
    b.panel("table", "Worst open incident per leaf", [(worst_leaf, "")], "none", w=12, h=8,
            instant=True, table=True, mappings=WORST_MAPPINGS, thresholds=WORST_THRESHOLDS,
            transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                            "renameByName": {"Value": "worst incident"}}},
                             {"id": "sortBy", "options": {"sort": [{"field": "leaf"}]}}],
            links=[_link("Nodes on ${__data.fields.leaf}", "fabricmon-node",
                         "var-rail=${__data.fields.rail}&var-leaf=${__data.fields.leaf}&var-node=$__all"),
                   _link("Overview, ${__data.fields.leaf}", "fabricmon-overview",
                         "var-rail=${__data.fields.rail}&var-leaf=${__data.fields.leaf}")],
            description="One row per leaf, by the name the topology gives it (an imported fabric's leaf-a3, "
                        "a generated leaf-u<unit>-r<rail>; no rail on a fat tree): its worst open incident (links "
                        "on it, the leaf itself).  Leaf names come from the aggregator's "
                        "fabricmon_topology_port_info, else from a `unit` target label (deploy/README.md).")
    b.panel("status-history", "Leaves: worst open incident", [(worst_leaf, "{{leaf}}")], "none", w=12, h=8,
            mappings=WORST_MAPPINGS, thresholds=WORST_THRESHOLDS, links=LEAF_LINKS,
            description="Rows are leaves, sorted by unit then rail.")
    b.panel("status-history", "Leaves: link error rate",
            [(f"sum by (rail, leaf) ({_by_port(f'rate(fabricmon_ib_port_errors_total{{{N}}}[{RATE}])', 'rail, leaf')})",
              "{{leaf}}")], "cps", w=12, h=8, min_val=0, links=LEAF_LINKS,
            thresholds=[(None, "green"), (0.01, "orange"), (1, "red")],
            description="PMA error counters of the leaf's node ports, per second.")
    b.panel("status-history", "Leaves: worst PFC pause ratio",
            [(f"max by (rail, leaf) "
              f"({_by_iface(f'rate(fabricmon_pfc_pause_seconds_total{{{N}}}[{RATE}])', 'rail, leaf')})",
              "{{leaf}}")], "percentunit", w=12, h=8, min_val=0, links=LEAF_LINKS,
            thresholds=[(None, "green"), (0.01, "orange"), (0.1, "red")],
            description="Share of time the worst host port on the leaf was paused or pausing (RoCE).")
    _uplinks(b)
    b.row("Nodes, spines and rails")
    b.panel("status-history", "Nodes: worst open incident",
            [(_worst("node", 'node=~"$node", node!=""',
                     f'fabricmon:ib_port:info{{{C}, rail=~"$rail", leaf=~"$leaf", node=~"$node"}}'),
              "{{node}}")], "none", w=12, h=8, mappings=WORST_MAPPINGS, thresholds=WORST_THRESHOLDS,
            links=[NODE_LINK], description="Incidents on the node or on its NICs, links, GPUs and NVLinks.")
    b.panel("status-history", "Spines and rails: worst open incident",
            [(_worst("component_type, component", 'component_type=~"spine|rail"'), "{{component}}")], "none",
            w=12, h=8, mappings=WORST_MAPPINGS, thresholds=WORST_THRESHOLDS,
            links=[_link("Overview", "fabricmon-overview", "var-rail=${__field.labels.rail}")],
            description="Present only while a spine or a whole rail has an open incident.")
    b.row("Open incidents")
    b.panel("table", "Open incidents",
            [(f'{INCIDENT.replace("_open", "_started_timestamp_seconds")}{{{C}, rail=~"$rail|", leaf=~"$leaf|", '
              f'node=~"$node|"}} * 1000', "")], "dateTimeAsIso", w=24, h=8, instant=True, table=True,
            transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True, "cluster": False},
                "indexByName": {"severity": 0, "alertname": 1, "component_type": 2, "component": 3, "node": 4,
                                "rail": 5, "leaf": 6, "Value": 7},
                "renameByName": {"Value": "open since"}}},
                {"id": "sortBy", "options": {"sort": [{"field": "open since", "desc": True}]}}],
            overrides=[
                {"matcher": {"id": "byName", "options": "node"},
                 "properties": [{"id": "links", "value": [_link("Node drill-down: ${__value.raw}", "fabricmon-node",
                                                                "var-node=${__value.raw}")]}]},
                {"matcher": {"id": "byName", "options": "leaf"},
                 "properties": [{"id": "links", "value": [
                     _link("Nodes on ${__value.raw}", "fabricmon-node", "var-leaf=${__value.raw}&var-node=$__all"),
                     _link("Overview, ${__value.raw}", "fabricmon-overview", "var-leaf=${__value.raw}")]}]},
                {"matcher": {"id": "byName", "options": "severity"},
                 "properties": [{"id": "mappings", "value": [{"type": "value", "options": {
                     "critical": {"color": "red", "index": 0}, "warning": {"color": "orange", "index": 1},
                     "info": {"color": "blue", "index": 2}}}]}]},
            ],
            description="From the aggregator (fabricmon_incident_started_timestamp_seconds): one row per open "
                        "incident; node and leaf cells link to the drill-downs.")
    b.ts("Open incidents by severity",
         [(f"sum by (severity) ({INCIDENT}{{{C}}})", "{{severity}}")], "none", min_val=0)
    b.ts("Most suspected components",
         [(f"topk(15, fabricmon_component_suspicion{{{C}}})", "{{component_type}} {{component}}")], "percentunit",
         min_val=0, max_val=1)
    return b


DASHBOARDS = {"fabricmon-overview.json": overview, "fabricmon-node.json": node, "fabricmon-job.json": job,
              "fabricmon-self.json": self_monitoring,
              "fabricmon-fabric.json": fabric}


def render() -> dict[str, str]:
    return {name: json.dumps(fn().to_json(), indent=2, sort_keys=True) + "\n" for name, fn in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "json"), help="output directory (default dashboards/json)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (out / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
