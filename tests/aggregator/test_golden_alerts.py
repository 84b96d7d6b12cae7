"""Golden Alertmanager payloads: what the webhook receives for each demo scenario.

Routes, inhibitions and dashboards depend on the alerts' label names and values; nothing else holds
them.  Each demo scenario (the default one and examples/scenarios/*.yaml) runs in memory mode
through the real aggregator runtime, ``AlertmanagerClient`` and a real Alertmanager to a local
webhook; every alert's labels and annotations as the webhook receives them are held to
tests/golden/alerts/<scenario>.json.  Normalized: times, incident ids and generatorURL (not sent
here), and the digits of the description (counts of errors, ranks and seconds change with when
Alertmanager's group fires); the evidence list after "Evidence:" and the measured ``impact`` and
``impact_json`` are dropped for the same reason (the cost test below checks them).
After an intended change: ``FABRICMON_UPDATE_GOLDEN=1 pytest tests/aggregator/test_golden_alerts.py``, review the diff.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.runtime import AggregatorRuntime
from fabricmon.demo.local_alertmanager import WebhookReceiver
from fabricmon.sim.drive import Drive
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import default_scenario, load_scenario
from support import paths
from support.goldenfile import match_golden
from support.promtools import REPO, start_alertmanager
from support.waiting import wait_until

pytestmark = pytest.mark.integration
GOLDEN = paths.GOLDEN / "alerts"
SCENARIOS = {
    "default": lambda: default_scenario(nodes=32, duration=100, nodes_per_unit=16, seed=7),
    "cable-then-leaf": lambda: load_scenario(REPO / "examples/scenarios/cable-then-leaf.yaml"),
    "cable_degrading": lambda: load_scenario(REPO / "examples/scenarios/cable_degrading.yaml"),
    # a compute straggler beside a cable ticket on its leaf: StragglerRank's lateness and rank labels
    "compute-straggler-under-cable":
        lambda: load_scenario(REPO / "examples/scenarios/compute-straggler-under-cable.yaml"),
    # an imported fat tree: the leaf by its name, no rail label
    "fat-tree-leaf": lambda: load_scenario(REPO / "examples/scenarios/fat-tree-leaf.yaml"),
}
AM_CONFIG = {
    "route": {"receiver": "hook", "group_by": ["cluster", "alertname", "component"], "group_wait": "0s",
              "group_interval": "1s", "repeat_interval": "1h"},
    "receivers": [{"name": "hook", "webhook_configs": [{"url": "", "send_resolved": True}]}],
}


def _normalize(status: str, alert: dict) -> dict:
    ann = dict(alert.get("annotations") or {})
    if "incident_id" in ann:
        ann["incident_id"] = "<id>"
    if "description" in ann:
        ann["description"] = re.sub(r"\d+(\.\d+)?", "N", ann["description"].split(". Evidence:")[0])
    # measured cost moves with every step and is absent until the first step after first_seen: which
    # version a notification carries is timing; test_a_fault_on_a_jobs_path... checks it end to end
    ann.pop("impact", None)
    ann.pop("impact_json", None)
    return {"status": status, "labels": dict(sorted(alert["labels"].items())), "annotations": dict(sorted(ann.items()))}


def _run(name: str, tmp_path: Path) -> list[dict]:
    seen: dict[str, dict] = {}
    for status, a in _webhook_alerts(SCENARIOS[name](), tmp_path, with_status=True):
        n = _normalize(status, a)
        seen.setdefault(json.dumps([n["status"], n["labels"]], sort_keys=True), n)
    return sorted(seen.values(), key=lambda n: (n["labels"].get("alertname", ""),
                                                 n["labels"].get("component", ""), n["status"]))


def _webhook_alerts(scn, tmp_path: Path, with_status: bool = False) -> list:
    """Every alert the webhook received running ``scn`` (with its status when ``with_status``)."""
    receiver = WebhookReceiver()
    receiver.start()
    cfg = json.loads(json.dumps(AM_CONFIG))
    cfg["receivers"][0]["webhook_configs"][0]["url"] = receiver.url
    am = start_alertmanager(cfg, tmp_path / "am")
    # sample times in the wall clock's past, as the demo does: Alertmanager takes endsAt as past
    epoch = float(int(time.time() - scn.duration - 60))
    sim = SimulatedCluster(scn, mode="memory", epoch=epoch)
    engine = Engine(sim.topology, cluster="golden")
    sender = AlertmanagerClient([am.url], cluster="golden", resend_seconds=300.0)
    rt = AggregatorRuntime(engine, sender=sender).start()
    try:
        drive = Drive(sim, rt)
        drive.connect()
        drive.run()
        sender.flush(5.0)
        want = {(i.alertname, i.component, "firing" if i.open else "resolved") for i in engine.incidents()}

        def heard() -> set:
            last = {}
            for _, status, a in receiver.alerts():
                lab = a.get("labels", {})
                last[(lab.get("alertname"), lab.get("component"))] = status
            return {(a, c, s) for (a, c), s in last.items()}
        assert wait_until(lambda: want <= heard(), 20), (want, heard())
        return [((status, a) if with_status else a) for _, status, a in receiver.alerts()]
    finally:
        rt.stop(grace=0, flush=1.0, final_tick=False)
        sim.close()
        am.stop()
        receiver.stop()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_webhook_payload_matches_golden(name: str, tmp_path: Path) -> None:
    got = json.dumps(_run(name, tmp_path), indent=1, sort_keys=True) + "\n"
    match_golden(GOLDEN / f"{name}.json", got, produced_by="webhook payload",
                 regenerate=f"pytest {Path(__file__).resolve().relative_to(REPO)}")


def test_a_fault_on_a_jobs_path_reaches_alertmanager_with_its_job_and_cost(tmp_path: Path) -> None:
    """DESIGN "Jobs, decoys and cost": the flaky cable of the default scenario sits under llm-70b's ranks;
    the webhook receives its alert with hpc_job, the impact sentence and impact_json (measured, not the
    normalized golden)."""
    scn = SCENARIOS["default"]()
    got = [a for a in _webhook_alerts(scn, tmp_path) if a["labels"].get("alertname") == "FabricLinkErrors"]
    assert got, "no FabricLinkErrors at the webhook"
    firing = [a for a in got if a["annotations"].get("impact")]
    assert firing, got
    a = firing[-1]
    assert a["labels"]["hpc_job"] == "llm-70b"
    assert re.fullmatch(r"llm-70b \d+% slower \(\d+ GPU-hours/hour\)", a["annotations"]["impact"]), a["annotations"]
    imp = json.loads(a["annotations"]["impact_json"])
    assert [i["job"] for i in imp] == ["llm-70b"] and 0.02 < imp[0]["step_slowdown"] < 0.3
    assert imp[0]["gpu_hours_per_hour"] > 0 and imp[0]["stopped"] is False


def test_every_golden_payload_has_a_scenario() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(SCENARIOS)
