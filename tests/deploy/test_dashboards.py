"""dashboards/: regeneration is stable, the JSON is structurally a Grafana dashboard,
every query is valid PromQL over metrics that exist."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from support.dashboards import AGGREGATOR_METRICS, _panels, metric_names
from support.promtools import REPO, promtool

DASH = REPO / "dashboards"
JSON_DIR = DASH / "json"
RECORDING_RULES = REPO / "deploy" / "prometheus" / "fabricmon-recording.rules.yml"
PROMETHEUS_BUILTIN = {"up"}  # per-target scrape health, written by Prometheus itself
REQUIRED_VARS = ["datasource", "cluster", "hpc_job", "job_id", "rail", "leaf", "node"]


def _load_generator():
    spec = importlib.util.spec_from_file_location("fabricmon_dashboards_generate", DASH / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


def _annotation_exprs(dash: dict) -> list[str]:
    return [a["expr"] for a in dash["annotations"]["list"] if a.get("expr")]


def _exprs(dash: dict) -> list[str]:
    out = [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]
    out += _annotation_exprs(dash)
    out += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def _exported_self_families() -> set[str]:
    """The family names the agent's own stream/thread collector and the build-info and reload collectors
    really export (rendered, not listed by hand)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from fabricmon.agent.selfmetrics import AgentSelfCollector
    from fabricmon.buildinfo import ReloadStatus, add_runtime_collectors

    reg = add_runtime_collectors(CollectorRegistry(auto_describe=False), ReloadStatus())
    reg.register(AgentSelfCollector("node-000", lambda: {}, lambda: {}))
    text = generate_latest(reg).decode()
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(?:\{| )", text, re.M)}


def known_metrics() -> set[str]:
    from fabricmon.metrics import SELF_SPECS, SPECS

    names = _exported_self_families()
    for spec in [*SPECS.values(), *SELF_SPECS.values()]:
        names.add(spec.name)
        if spec.kind == "counter" and not spec.name.endswith("_total"):
            names.add(spec.name + "_total")
    for group in yaml.safe_load(RECORDING_RULES.read_text())["groups"]:
        names |= {r["record"] for r in group["rules"] if "record" in r}
    return names | AGGREGATOR_METRICS | PROMETHEUS_BUILTIN


def test_metric_name_parser() -> None:
    e = ('topk(10, sum by (node, device) (rate(fabricmon_a_total{cluster=~"$cluster", x="rate(y)"}[$__rate_interval]))'
         ' * on (node) group_left (rail) fabricmon:ib_port:info{rail!=""}) or vector(0) > bool 2')
    assert metric_names(e) == {"fabricmon_a_total", "fabricmon:ib_port:info"}
    # label_values' label argument looks like a name: the caller drops it.
    assert metric_names('label_values(fabricmon_ib_port_info{cluster=~"$cluster"}, rail)') \
        == {"fabricmon_ib_port_info", "rail"}
    assert metric_names("rate(fabricmon_bogus_total[5m])") == {"fabricmon_bogus_total"}
    assert "fabricmon_bogus_total" not in known_metrics()
    assert metric_names("up == 0") == {"up"}


def test_regeneration_is_identical(tmp_path: Path) -> None:
    gen = _load_generator()
    assert gen.main(["--out", str(tmp_path)]) == 0
    generated = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_text() for p in JSON_DIR.glob("*.json")}
    assert generated.keys() == committed.keys()
    for name in generated:
        assert generated[name] == committed[name], f"{name} is stale: run python dashboards/generate.py"


def test_five_dashboards() -> None:
    titles = {d["title"] for d in _dashboards().values()}
    assert titles == {"fabricmon / Fabric overview", "fabricmon / Node drill-down", "fabricmon / Job view",
                      "fabricmon / Self-monitoring", "fabricmon / Fabric map"}


def _links(dash: dict):
    for p in _panels(dash):
        fc = p.get("fieldConfig", {})
        for link in fc.get("defaults", {}).get("links", []):
            yield p["title"], link
        for o in fc.get("overrides", []):
            for prop in o["properties"]:
                if prop["id"] == "links":
                    for link in prop["value"]:
                        yield p["title"], link


@pytest.mark.parametrize("name", sorted(p.name for p in JSON_DIR.glob("*.json")))
def test_data_links_reach_existing_dashboards(name: str) -> None:
    """Every data link opens a shipped dashboard by uid, names only its variables, keeps time and data source."""
    boards = {d["uid"]: d for d in _dashboards().values()}
    for title, link in _links(_dashboards()[name]):
        m = re.fullmatch(r"/d/([\w-]+)/\?(.*)", link["url"])
        assert m and m.group(1) in boards, f"{title}: {link['url']}"
        target_vars = {v["name"] for v in boards[m.group(1)]["templating"]["list"]}
        params = dict(kv.split("=", 1) for kv in m.group(2).split("&") if "=" in kv)
        assert {k.removeprefix("var-") for k in params if k.startswith("var-")} <= target_vars, link
        assert "${__url_time_range}" in link["url"] and params.get("var-datasource") == "${datasource}", link


def test_fabric_map_points_at_the_fault() -> None:
    """The fabric map colours leaves and nodes by the worst open incident and links them to the drill-downs;
    every dashboard overlays open incidents as annotations; the existing views link nodes to the node view."""
    d = _dashboards()["fabricmon-fabric.json"]
    panels = {p["title"]: p for p in _panels(d)}
    grid = panels["Worst open incident per leaf"]  # keyed by the leaf's own name, not a leaf-u<U>-r<R> pattern
    assert grid["type"] == "table" and grid["transformations"][0]["id"] == "organize"
    assert "fabricmon_incident_open" in grid["targets"][0]["expr"] and grid["targets"][0]["instant"]
    assert "leaf-u" not in json.dumps([grid["targets"], grid["transformations"]])
    assert any("var-leaf=${__data.fields.leaf}" in link["url"] for link in grid["fieldConfig"]["defaults"]["links"])
    leaves = panels["Leaves: worst open incident"]
    assert leaves["type"] == "status-history"
    urls = [link["url"] for link in leaves["fieldConfig"]["defaults"]["links"]]
    assert any(u.startswith("/d/fabricmon-node/") and "var-leaf=${__field.labels.leaf}" in u for u in urls)
    assert any(u.startswith("/d/fabricmon-overview/") for u in urls)
    nodes = panels["Nodes: worst open incident"]["fieldConfig"]["defaults"]["links"]
    assert any(link["url"].startswith("/d/fabricmon-node/?var-node=${__field.labels.node}") for link in nodes)
    table = panels["Open incidents"]
    assert "fabricmon_incident_started_timestamp_seconds" in table["targets"][0]["expr"]
    for name, dash in _dashboards().items():
        assert any("fabricmon_incident_open" in e for e in _annotation_exprs(dash)), f"{name}: no incident annotations"
    for name in ("fabricmon-overview.json", "fabricmon-job.json"):
        assert any(link["url"].startswith("/d/fabricmon-node/?var-node=") for _,
                   link in _links(_dashboards()[name])), name


@pytest.mark.parametrize("name", sorted(p.name for p in JSON_DIR.glob("*.json")))
def test_dashboard_structure(name: str) -> None:
    d = _dashboards()[name]
    for key in ("uid", "title", "panels", "templating", "schemaVersion", "time", "annotations", "tags"):
        assert key in d, key
    assert d["id"] is None and isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", d["uid"])
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert list(variables)[: len(REQUIRED_VARS)] == REQUIRED_VARS
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    occupied: set[tuple[int, int]] = set()
    for p in _panels(d):
        g = p["gridPos"]
        assert set(g) == {"x", "y", "w", "h"} and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["fieldConfig"]["defaults"].get("unit"), f"panel {p['title']!r} has no unit"
        assert p["targets"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].strip()
            assert t["datasource"]["uid"] == "${datasource}"


def _counter_contexts(expr: str) -> list[tuple[str, str | None]]:
    """(metric, innermost enclosing function) for every *_total identifier."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    out: list[tuple[str, str | None]] = []
    stack: list[str | None] = []
    i = 0
    while i < len(s):
        m = re.match(r"[A-Za-z_:][\w:]*", s[i:])
        if m:
            word = m.group(0)
            j = i + len(word)
            rest = s[j:].lstrip()
            if rest.startswith("("):
                stack.append(word)
                i = j + (len(s[j:]) - len(rest)) + 1
                continue
            if word.endswith("_total"):
                out.append((word, next((f for f in reversed(stack) if f is not None), None)))
            i = j
            continue
        if s[i] == "(":
            stack.append(None)
        elif s[i] == ")":
            stack.pop()
        i += 1
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in JSON_DIR.glob("*.json")))
def test_queries_use_rate_interval_and_known_metrics(name: str) -> None:
    d = _dashboards()[name]
    known = known_metrics()
    for expr in _exprs(d):
        names = metric_names(expr)
        if expr.startswith("label_values("):
            names -= {expr.rstrip(")").rsplit(",", 1)[1].strip()}
        assert names <= known, f"unknown metric(s) {names - known} in {expr!r}"
        for metric, fn in _counter_contexts(expr):
            assert fn in ("rate", "irate", "increase"), f"{metric} not inside rate() in {expr!r}"
        for m in re.finditer(r"\b(rate|irate|increase)\s*\(", expr):
            depth, j = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(expr[j], 0)
                j += 1
            assert "[$__rate_interval]" in expr[m.end():j], f"{m.group(1)} without $__rate_interval in {expr!r}"


ALERT_RULES = REPO / "deploy" / "prometheus" / "fabricmon-alerts.rules.yml"
SELF_ALERT_GROUPS = ("fabricmon-self", "fabricmon-blind-spots", "fabricmon-batches-dropped")
# per-node series that exist only while something is wrong -> the count the aggregator always exports (what the
# panel reads, so it shows 0 rather than no data)
ONLY_WHILE_WRONG = {"fabricmon_agent_never_connected": "fabricmon_agents_never_connected"}


def test_self_monitoring_shows_every_blind_spot_alert() -> None:
    """Every self alert of the shipped rules reads metrics that some Self-monitoring panel reads too (beyond
    the scrape's own `up`), so what a blind-spot alert fires on is on the dashboard before and after it fires."""
    board = _dashboards()["fabricmon-self.json"]
    shown: set[str] = set()
    for p in _panels(board):
        for t in p.get("targets", []):
            shown |= metric_names(t["expr"])
    shown |= {per_node for per_node, count in ONLY_WHILE_WRONG.items() if count in shown}
    missing = {}
    for group in yaml.safe_load(ALERT_RULES.read_text())["groups"]:
        if group["name"] not in SELF_ALERT_GROUPS:
            continue
        for rule in group["rules"]:
            read = metric_names(rule["expr"]) - PROMETHEUS_BUILTIN
            if read and not read & shown:
                missing[rule["alert"]] = sorted(read)
    assert not missing, f"self alerts with no Self-monitoring panel: {missing}"
    # the aggregator's own blind-spot counts, which it alerts on directly
    assert {"fabricmon_agents_unknown", "fabricmon_agents_never_connected", "fabricmon_build_info"} <= shown


def test_node_view_starts_on_one_node() -> None:
    """The node view's per-GPU and per-NVLink panels would be tens of thousands of series on All nodes: it starts
    on one node (no saved selection), the other views on All; links to it by leaf ask for that leaf's nodes."""
    for name, d in _dashboards().items():
        node_var = next(v for v in d["templating"]["list"] if v["name"] == "node")
        if name == "fabricmon-node.json":
            assert node_var["current"] == {}, node_var["current"]
        else:
            assert node_var["current"]["value"] == ["$__all"], name
        for title, link in _links(d):
            if link["url"].startswith("/d/fabricmon-node/") and "var-leaf=" in link["url"]:
                assert "var-node=$__all" in link["url"], (name, title)


def test_leaf_variable_reads_the_current_topology() -> None:
    """Leaves as of now: an instant query_result, not label_values over the dashboard's range, which would
    keep a generated leaf name recorded before Prometheus first scraped the aggregator's topology."""
    for d in _dashboards().values():
        leaf = next(v for v in d["templating"]["list"] if v["name"] == "leaf")
        assert leaf["definition"].startswith("query_result(") and leaf["regex"] == '/leaf="([^"]+)"/'


def test_queries_parse_with_promtool(tmp_path: Path) -> None:
    """Every query, with Grafana variables substituted, is valid PromQL (promtool check rules)."""
    rules = []
    for name, d in _dashboards().items():
        exprs = [(f"p{i}{t['refId']}", t["expr"]) for i, p in enumerate(_panels(d)) for t in p.get("targets", [])]
        exprs += [(f"a{i}", e) for i, e in enumerate(_annotation_exprs(d))]
        for key, expr in exprs:
            expr = expr.replace("$__rate_interval", "1m")
            expr = re.sub(r"\$\{?(\w+)\}?", ".*", expr)
            rules.append({"record": f"dashboard:{name.split('.')[0].replace('-', '_')}:{key}", "expr": expr})
    f = tmp_path / "dashboard-queries.rules.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = promtool("check", "rules", f)
    assert res.returncode == 0, res.stdout + res.stderr


def test_provisioning() -> None:
    dash = yaml.safe_load((DASH / "provisioning" / "dashboards.yaml").read_text())
    assert dash["apiVersion"] == 1 and dash["providers"][0]["type"] == "file"
    ds = yaml.safe_load((DASH / "provisioning" / "datasources.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"


# ------------------------------------------------------------------ grafana-foundation-sdk decoder

def _sdk_load(data: dict):
    """Decode a dashboard with grafana-foundation-sdk (pinned in the test extra): typed panels, plugin
    options and field configs, and a round trip back to JSON through its encoder."""
    sdk = pytest.importorskip("grafana_foundation_sdk", reason="pip install -e .[test]")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    assert sdk
    register_default_plugins()
    model = Dashboard.from_json(data)
    return model, json.loads(json.dumps(model, cls=JSONEncoder))


@pytest.mark.parametrize("name", sorted(p.name for p in JSON_DIR.glob("*.json")))
def test_dashboard_loads_with_grafana_foundation_sdk(name: str) -> None:
    import importlib

    d = _dashboards()[name]
    model, back = _sdk_load(d)
    assert model.uid == d["uid"] and model.title == d["title"] and model.schema_version == d["schemaVersion"]
    assert back["templating"]["list"][0]["name"] == "datasource"
    panels = [p for p in model.panels if p.type_val != "row"]
    assert len(panels) == sum(1 for p in d["panels"] if p["type"] != "row")
    for p in panels:
        # the SDK decoded the panel's options with its plugin's own model (not a raw dict)
        module = importlib.import_module("grafana_foundation_sdk.models." + p.type_val.replace("-", ""))
        assert isinstance(p.options, module.Options), (name, p.title, type(p.options))
    exprs = [t["expr"] for p in back["panels"] for t in p.get("targets", [])]
    assert exprs == [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    assert [a.get("expr") for a in back["annotations"]["list"]] == [a.get("expr") for a in d["annotations"]["list"]]


@pytest.mark.parametrize("breakage", ["panel without type", "value mapping not an object", "panels not a list"])
def test_broken_dashboard_fails_to_load_with_grafana_foundation_sdk(breakage: str) -> None:
    d = _dashboards()["fabricmon-fabric.json"]
    ts = next(p for p in d["panels"] if p["type"] == "timeseries")
    if breakage == "panel without type":
        del ts["type"]
    elif breakage == "value mapping not an object":
        ts["fieldConfig"]["defaults"]["mappings"] = [{"type": "value", "options": "OK"}]
    else:
        d["panels"] = "not a list"
    with pytest.raises((KeyError, ValueError, TypeError, AttributeError)):
        _sdk_load(d)
