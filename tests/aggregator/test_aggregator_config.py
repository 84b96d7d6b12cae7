"""Aggregator config: every number finite and in range, auth explicit, referenced files checked by
``check-config`` as the aggregator would; one-line ``file: field: problem`` errors and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from fabricmon.aggregator.config import check_files, load_aggregator_config
from fabricmon.cli import main
from support.promtools import PROMTOOL, free_port, require_binary, wait_until

TOPOLOGY = {"cluster": "test", "layout": "roce", "nodes_per_unit": 4,
            "generate": {"nodes": 4, "gpus_per_node": 8, "rails": 8}}


def _write(tmp_path: Path, cfg: dict, name: str = "aggregator.yaml") -> Path:
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(TOPOLOGY))
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg) if isinstance(cfg, dict) else cfg)
    return p


def _check(path: Path, capsys) -> tuple[int, str]:
    code = main(["check-config", "--kind", "aggregator", str(path)])
    err = capsys.readouterr().err.strip()
    return code, err


BASE = {"topology": "topology.yaml", "auth": {"insecure": True}}


@pytest.mark.parametrize("text,field,problem", [
    ("tick_seconds: .nan", "tick_seconds", "finite"),
    ("tick_seconds: .inf", "tick_seconds", "finite"),
    ("tick_seconds: 600", "tick_seconds", "at most 60"),
    ("tick_seconds: -1", "tick_seconds", "must be > 0"),
    ("detection: {link_errors_min: .nan}", "detection.link_errors_min", "finite"),
    ("detection: {pfc_pause_ratio: -0.5}", "detection.pfc_pause_ratio", "must be > 0"),
    ("detection: {hold_s: -3}", "detection.hold_s", "must be > 0"),
    ("detection: {link_down_persist_s: -1}", "detection.link_down_persist_s", ">= 0"),
    ("detection: {degraded_rate_ratio: 1.5}", "detection.degraded_rate_ratio", "between 0 and 1"),
    ("detection: {xid_fatal: [48, -1]}", "detection.xid_fatal[1]", ">= 0"),
    ("alertmanager: {timeout: .nan}", "alertmanager.timeout", "finite"),
    ("alertmanager: {queue_max: 0}", "alertmanager.queue_max", "must be > 0"),
    ("clock: {max_skew_s: .nan}", "clock.max_skew_s", "finite"),
    ("clock: {mode: ntp}", "clock.mode", "wall or sample"),
    ("grpc_limits: {connection_gate: 'yes'}", "grpc_limits.connection_gate", "true or false"),
    ("grpc_limits: {max_connections: -1}", "grpc_limits.max_connections", ">= 0"),
])
def test_bad_numbers_are_one_line_errors_and_exit_2(tmp_path, capsys, text, field, problem):
    path = _write(tmp_path, "topology: topology.yaml\nauth: {insecure: true}\n" + text + "\n")
    code, err = _check(path, capsys)
    assert code == 2
    assert err.count("\n") == 0 and f"{path}: {field}: " in err and problem in err, err


def test_no_auth_and_not_insecure_is_refused(tmp_path, capsys):
    code, err = _check(_write(tmp_path, {"topology": "topology.yaml"}), capsys)
    assert code == 2 and ": auth: no agent authentication" in err and "insecure: true" in err
    assert err.count("\n") == 0


@pytest.mark.parametrize("auth,field", [
    ({"token_file": "missing-token"}, "auth.token_file"),
    ({"node_tokens_file": "missing-tokens.yaml"}, "auth.node_tokens_file"),
    ({"tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_ca": "ca.pem"}, "auth.tls_cert"),
])
def test_check_config_finds_missing_files_the_aggregator_would_refuse(tmp_path, capsys, auth, field):
    path = _write(tmp_path, {"topology": "topology.yaml",
                             "auth": {k: str(tmp_path / v) for k, v in auth.items()}})
    load_aggregator_config(path)  # the YAML itself is fine ...
    code, err = _check(path, capsys)
    assert code == 2 and f"{path}: {field}: no such file" in err, err  # ... check-config still refuses


def test_check_config_missing_topology_and_bad_token_files(tmp_path, capsys):
    path = _write(tmp_path, {"topology": "nowhere.yaml", "auth": {"insecure": True}})
    code, err = _check(path, capsys)
    assert code == 2 and f"{path}: topology: no such file" in err
    (tmp_path / "empty").write_text("\n")
    path = _write(tmp_path, {"topology": "topology.yaml", "auth": {"token_file": str(tmp_path / "empty")}})
    assert _check(path, capsys) == (2, f"fabricmon: error: {path}: auth.token_file: {tmp_path / 'empty'} is empty")
    (tmp_path / "tokens.yaml").write_text("node-000: same\nnode-001: same\n")
    path = _write(tmp_path, {"topology": "topology.yaml", "auth": {"node_tokens_file": str(tmp_path / "tokens.yaml")}})
    code, err = _check(path, capsys)
    assert code == 2 and "node-001: token also used by another node" in err


def test_good_configs_pass(tmp_path, capsys):
    (tmp_path / "tokens.yaml").write_text("node-000: t0\nnode-001: t1\n")
    (tmp_path / "token").write_text("shared\n")
    for auth in ({"insecure": True}, {"node_tokens_file": str(tmp_path / "tokens.yaml")},
                 {"token_file": str(tmp_path / "token")}):
        path = _write(tmp_path, {"topology": "topology.yaml", "auth": auth, "clock": {"mode": "sample"}})
        assert _check(path, capsys) == (0, "")
        check_files(load_aggregator_config(path), str(path))


def test_aggregator_process_warns_when_insecure_exports_its_counters_and_stops_on_sigterm(tmp_path):
    grpc_port, http_port = free_port(), free_port()
    path = _write(tmp_path, {"topology": "topology.yaml", "auth": {"insecure": True},
                             "grpc_listen": f"127.0.0.1:{grpc_port}", "http_listen": f"127.0.0.1:{http_port}"})
    proc = subprocess.Popen([sys.executable, "-m", "fabricmon", "--log-format", "json", "aggregator", "--config",
                             str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def scrape():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=2) as r:
                    return r.read()
            except OSError:
                return None

        text = wait_until(scrape, 20.0, "aggregator /metrics")
        body = text.decode()
        for line in ('fabricmon_ingest_batches_dropped_total{reason="ts_ahead"} 0.0',
                     'fabricmon_ingest_batches_dropped_total{reason="seq_ahead"} 0.0',
                     'fabricmon_grpc_streams_refused_total{reason="identity"} 0.0',
                     'fabricmon_grpc_streams_refused_total{reason="unauthenticated"} 0.0',
                     'fabricmon_engine_errors_total{stage="intake"} 0.0',
                     'fabricmon_engine_errors_total{stage="tick"} 0.0',
                     'fabricmon_alerts_sent_total{result="rejected"} 0.0'):
            assert line in body, line
        lint = subprocess.run([require_binary(PROMTOOL), "check", "metrics"], input=text, capture_output=True,
                              timeout=60)
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "aggregator_insecure" in err and "grpc_insecure" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
