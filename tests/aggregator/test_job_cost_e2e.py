"""A job instrumented the way examples/pytorch_hook.py shows, seen end to end (DESIGN "Jobs, decoys and cost").

One process with ``SLURM_JOB_ID`` set (no job_id passed anywhere) reports the steps of an 8-rank job
through ``fabricmon.client.report_step`` and its heartbeats through the client's ``HeartbeatSender``, to
a real ``fabricmon agent`` that streams to a real ``fabricmon aggregator`` alerting a real Alertmanager.
The rank series carry the Slurm job id; one rank's compute grows so the job's steps go from 0.10 s to
0.15 s (+50%): StragglerRank states ``step_slowdown`` 0.5 (within 25%), not the 0.0 of a baseline taken
from steps already slow; then that rank stops before a collective its peers wait in: JobHung's firing
notification at Alertmanager says the job stopped, with its 8 GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from fabricmon.client import JOB_ID_ENV
from support.agentrig import http_get
from support.amrig import Webhook, _start_am
from support.procrig import Proc, agent_config, free_port, metrics, render_node, short_dir, topology_yaml, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")]
pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

JOB_ID = "81723"
# 8 ranks of one job on node-000; steps of 0.10 s (compute 0.09, collectives 0.01), then rank 3 computes
# 0.05 s longer and everyone waits for it (0.15 s); then rank 3 hangs outside the collective
SENDER = textwrap.dedent('''
    import os, sys, time
    from fabricmon.client import HeartbeatSender, report_step
    sock, clean, slow = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    beats = [HeartbeatSender("train", r, socket_path=sock, http=None, interval=0.5).start() for r in range(8)]
    step = 0
    for phase, n in (("clean", clean), ("slow", slow)):
        for _ in range(n):
            for r in range(8):
                compute = 0.09 + (0.05 if phase == "slow" and r == 3 else 0.0)
                step_s = 0.15 if phase == "slow" else 0.10
                beats[r].update(step=step, coll_sn=step, in_collective=False)
                report_step("train", r, step, step_s, step_s - compute, local_rank=r, socket_path=sock, http=None)
            step += 1
            time.sleep(0.15 if phase == "slow" else 0.10)
    for r in range(8):  # rank 3 never enters the collective the others wait in
        beats[r].update(step=step, coll_sn=step + (0 if r == 3 else 1), in_collective=r != 3)
    print("hung", flush=True)
    time.sleep(float(sys.argv[4]))
''')


def _incidents(port: int) -> list[dict]:
    code, body = http_get(f"http://127.0.0.1:{port}/api/incidents?state=open")
    return json.loads(body) if code == 200 else []


def test_slurm_job_id_straggler_cost_and_job_hung_stopped_at_alertmanager(tmp_path):
    hook = Webhook()
    am = _start_am(tmp_path / "am", hook.url)
    tree = render_node(tmp_path / "node")
    topology_yaml(tmp_path / "topology.yaml")
    g, h, a_port = free_port(), free_port(), free_port()
    (tmp_path / "aggregator.yaml").write_text(yaml.safe_dump({
        "topology": "topology.yaml", "grpc_listen": f"127.0.0.1:{g}", "http_listen": f"127.0.0.1:{h}",
        "tick_seconds": 0.2, "auth": {"insecure": True}, "detection": {"hang_stall_s": 5.0},
        "alertmanager": {"urls": [f"http://127.0.0.1:{am.port}"], "resend_seconds": 5.0}}))
    sock = f"{short_dir()}/ranks.sock"
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(agent_config(
        tree, listen=f"127.0.0.1:{a_port}", aggregator=f"127.0.0.1:{g}", spool=tmp_path / "spool", sock=sock)))
    procs: list[Proc] = []
    sender = None
    try:
        agg = Proc(["aggregator", "--config", str(tmp_path / "aggregator.yaml"), "--log-format", "json"],
                   tmp_path / "agg.log")
        procs.append(agg)
        assert agg.wait_log("aggregator_started"), agg.text()
        agent = Proc(["agent", "--config", str(tmp_path / "agent.yaml")], tmp_path / "agent.log")
        procs.append(agent)
        assert wait_until(lambda: "fabricmon_agents_connected 1" in metrics(h), 30), agent.text()[-2000:]
        (tmp_path / "sender.py").write_text(SENDER)
        env = {k: v for k, v in os.environ.items() if k not in JOB_ID_ENV} | {"SLURM_JOB_ID": JOB_ID}
        sender = subprocess.Popen([sys.executable, str(tmp_path / "sender.py"), sock, "60", "80", "60"],
                                  env=env, stdout=subprocess.PIPE, text=True)

        def straggler() -> dict | None:
            return next((i for i in _incidents(h) if i["alertname"] == "StragglerRank"), None)

        # the rank series carry the Slurm job id the process never passed
        assert wait_until(lambda: f'job_id="{JOB_ID}"' in metrics(a_port), 20), metrics(a_port)[-2000:]
        assert wait_until(lambda: straggler() is not None and straggler()["impact"] and
                          straggler()["impact"][0]["step_slowdown"], 60), (_incidents(h), agg.text()[-3000:])
        wait_until(lambda: False, 3)  # a few slow steps more to measure
        inc = straggler()
        assert inc["labels"]["job_id"] == JOB_ID and inc["component"] == "node-000/gpu3", inc
        (imp,) = inc["impact"]
        assert imp["job_id"] == JOB_ID and abs(imp["step_slowdown"] - 0.5) <= 0.25 * 0.5, inc
        assert sender.stdout.readline().strip() == "hung"

        def hung_firing() -> list[dict]:
            return [a for a in hook.alerts("firing") if a["labels"]["alertname"] == "JobHung"]

        assert wait_until(lambda: hung_firing(), 60), (_incidents(h), agg.text()[-3000:])
        first = hung_firing()[0]
        assert first["labels"]["job_id"] == JOB_ID and first["labels"]["rank"] == "3"
        assert first["annotations"]["impact"] == "train stopped (8 GPU-hours/hour)"
        assert [(x["job_id"], x["stopped"], x["gpu_hours_per_hour"]) for x in
                json.loads(first["annotations"]["impact_json"])] == [(JOB_ID, True, 8.0)]
    finally:
        if sender is not None:
            sender.kill()
            sender.wait(5)
        for p in procs:
            p.stop()
        am.stop()
        hook.close()
