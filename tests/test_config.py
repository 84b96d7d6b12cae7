"""Config loading: typed, validated, one-line errors naming file and field, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabricmon.config import ConfigError, load_agent_config


def _write(tmp_path, text, name="agent.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    p = _write(tmp_path, "interval: 2\nsources:\n  ethtool:\n    allow: ['^rx_prio']\nrails: {mlx5_0: 0}\n")
    cfg = load_agent_config(p, {"interval": 0.5, "listen": None})
    assert cfg.interval == 0.5  # flags win
    assert cfg.sources.ethtool.allow == ("^rx_prio",)
    assert cfg.rails == {"mlx5_0": 0}
    assert cfg.listen == "0.0.0.0:9720"


def test_hyphenated_keys_as_on_the_command_line(tmp_path):
    p = _write(tmp_path, "sysfs-root: /tmp/x\nnode-name: node-001\n")
    cfg = load_agent_config(p)
    assert cfg.sysfs_root == "/tmp/x" and cfg.node_name == "node-001"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("sources:\n  ethtool:\n    allow: ['ok', '(bad']\n", "agent.yaml: sources.ethtool.allow[1]: not a valid regex"),
        ("interval: fast\n", "agent.yaml: interval: expected a number, got 'fast'"),
        ("interval: -1\n", "agent.yaml: interval: must be > 0"),
        ("listen: nowhere\n", "agent.yaml: listen: expected HOST:PORT"),
        ("bogus: 1\n", "agent.yaml: bogus: unknown key"),
        ("profile:\n  roce_priority: 9\n", "agent.yaml: profile.roce_priority: must be 0..7"),
        ("nvml: maybe\n", "agent.yaml: nvml: must be auto, off or fake:FILE"),
        ("intake:\n  listen: 0.0.0.0:9723\n", "agent.yaml: intake.listen: rank intake must listen on loopback"),
        ("rails: [1, 2]\n", "agent.yaml: rails: expected a mapping"),
        ("a: [unclosed\n", "agent.yaml: line 2: invalid YAML"),
        ("- just a list\n", "agent.yaml: <top>: expected a mapping"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path, text, expected):
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_agent_config(p)
    msg = str(exc.value)
    assert msg.startswith(str(tmp_path)), msg
    assert expected in msg, msg
    assert "\n" not in msg


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    p = _write(tmp_path, "sources:\n  infiniband:\n    timeout: zero\n")
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "agent", "--config", str(p), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "agent.yaml: sources.infiniband.timeout: expected a number" in lines[0]


def test_cli_missing_config_file_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "check-config", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "nope.yaml: cannot read" in proc.stderr


def test_check_config_ok(tmp_path):
    p = _write(tmp_path, "interval: 1\n")
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "check-config", str(p), "--kind", "agent"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout
