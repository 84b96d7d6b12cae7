"""check-config on an installed box: what a /run/credentials path is, and example hostnames left in."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricmon.cli import main
from fabricmon.example_hosts import example_hosts
from support.paths import REPO

SHIPPED = REPO / "systemd" / "etc" / "fabricmon"


def test_example_hosts_names_each_field() -> None:
    data = {"aggregator": "fabricmon-aggregator.example.internal:9721",
            "alertmanager": {"urls": ["http://am-0.example.internal:9093", "http://am.prod.corp:9093"],
                             "generator_url": "https://fabricmon.example.com/x"},
            "other": ["node.example", 3, None],
            "fine": ["examples.com", "myexample.com", "example.internal.corp.net", "an example, no host"]}
    assert sorted(example_hosts(data)) == [
        ("aggregator", "fabricmon-aggregator.example.internal"),
        ("alertmanager.generator_url", "fabricmon.example.com"),
        ("alertmanager.urls[0]", "am-0.example.internal"),
        ("other[0]", "node.example"),
    ]


def test_example_hosts_is_bounded_in_depth() -> None:
    deep: object = "x.example.internal"
    for _ in range(10_000):
        deep = [deep]
    assert list(example_hosts(deep)) == []  # nothing past the depth limit, and no RecursionError


def test_check_config_warns_on_example_hostnames(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text((SHIPPED / "agent.yaml").read_text())
    assert main(["check-config", "--skip-secrets", str(cfg)]) == 0  # a warning, not a failure
    err = capsys.readouterr().err
    assert f"{cfg}: warning: aggregator: fabricmon-aggregator.example.internal is an example hostname" in err, err
    cfg.write_text(cfg.read_text().replace("fabricmon-aggregator.example.internal", "agg-1.prod.corp"))
    assert main(["check-config", "--skip-secrets", str(cfg)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_check_config_explains_a_credentials_path(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # A config kept from before 0.2.0 names the token where LoadCredential= put it; by hand that path does
    # not exist (the shipped configs now name /etc/fabricmon/token, which the units re-read).
    old = tmp_path / "agent.yaml"
    old.write_text((SHIPPED / "agent.yaml").read_text().replace(
        "/etc/fabricmon/token", "/run/credentials/fabricmon-agent.service/token"))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert main(["check-config", str(old)]) == 2
    err = capsys.readouterr().err
    assert "stream.token_file: /run/credentials/fabricmon-agent.service/token: no such file" in err, err
    assert "exists only inside the running unit" in err and "LoadCredential=" in err, err
    assert len(err.strip().splitlines()) == 1, err
    # Inside a unit (systemd sets $CREDENTIALS_DIRECTORY) a missing credential is just missing.
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", "/run/credentials/fabricmon-agent.service")
    assert main(["check-config", str(old)]) == 2
    assert "only inside" not in capsys.readouterr().err
