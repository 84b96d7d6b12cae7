"""Config loading: typed, validated, one-line errors naming file and field, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabricmon.config import ConfigError, load_agent_config
from fabricmon.configload import parse_yaml


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
        ("sources:\n  ethtool:\n    allow: ['ok', '(bad']\n",
         "agent.yaml: sources.ethtool.allow[1]: not a valid regex"),
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


# --- issue #10 case 5: numbers that are not numbers, and keys written twice ---------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("interval: .nan\n", "agent.yaml: interval: must be a finite number"),
        ("interval: .inf\n", "agent.yaml: interval: must be a finite number"),
        ("interval: -.inf\n", "agent.yaml: interval: must be a finite number"),
        ("interval: 0.0001\n", "agent.yaml: interval: must be >= 0.01"),
        ("interval: 100000\n", "agent.yaml: interval: must be <= 3600"),
        ("interval: 1" + "0" * 400 + "\n", "agent.yaml: interval: number too large"),
        ("sources:\n  nvml:\n    timeout: .nan\n", "agent.yaml: sources.nvml.timeout: must be a finite number"),
        ("sources:\n  ethtool:\n    timeout: 1.0e+9\n", "agent.yaml: sources.ethtool.timeout: must be <= 600"),
        ("sources:\n  fabric_config:\n    timeout: 1.0e+400\n",
         "agent.yaml: sources.fabric_config.timeout: must be a finite"),
        ("sources:\n  host:\n    timeout: -0.5\n", "agent.yaml: sources.host.timeout: must be > 0"),
        ("sources:\n  infiniband:\n    expected_ports: -1\n",
         "agent.yaml: sources.infiniband.expected_ports: must be >= 0"),
        ("profile:\n  rate_gbps: .nan\n", "agent.yaml: profile.rate_gbps: must be a finite number"),
        ("profile:\n  rate_gbps: -400\n", "agent.yaml: profile.rate_gbps: must be > 0"),
        ("profile:\n  mtu: -9000\n", "agent.yaml: profile.mtu: must be >= 68"),
        ("profile:\n  mtu: 10000000\n", "agent.yaml: profile.mtu: must be <= 65535"),
        ("stream:\n  spool_max_bytes: -1\n", "agent.yaml: stream.spool_max_bytes: must be >= 4096"),
        ("rails: {mlx5_0: 99999}\n", "agent.yaml: rails.mlx5_0: must be <= 1023"),
        ("interval: 1\ninterval: 0.01\n", "agent.yaml: interval: duplicate key (lines 1 and 2)"),
        ("sources:\n  ethtool:\n    timeout: 1\n    timeout: 2\n",
         "agent.yaml: sources.ethtool.timeout: duplicate key (lines 3 and 4)"),
        ("rails: {mlx5_0: 0, mlx5_0: 1}\n", "agent.yaml: rails.mlx5_0: duplicate key"),
        ("sources:\n  ethtool:\n    interfaces: [eth0, ../../etc/x]\n",
         "agent.yaml: sources.ethtool.interfaces[1]: not a netdev name"),
    ],
)
def test_numeric_fields_are_finite_and_in_range_and_keys_unique(tmp_path, text, expected):
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_agent_config(p)
    msg = str(exc.value)
    assert msg.startswith(str(p)), msg
    assert expected in msg, msg
    assert "\n" not in msg


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    p = _write(tmp_path, "profile: &p {mtu: 9000}\nstream:\n  spool_max_bytes: 65536\n")
    assert load_agent_config(p).profile.mtu == 9000


def test_duplicate_key_check_is_shared_by_every_loader(tmp_path):
    from fabricmon.configload import load_yaml_file

    p = _write(tmp_path, "topology: a.yaml\ntopology: b.yaml\n", name="aggregator.yaml")
    with pytest.raises(ConfigError, match=r"aggregator\.yaml: topology: duplicate key \(lines 1 and 2\)"):
        load_yaml_file(p)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_command_line_interval_is_checked_too(value):
    with pytest.raises(ConfigError, match=r"^command line: interval: must be"):
        load_agent_config(None, {"interval": float(value)})


@pytest.mark.parametrize("cmd", ["agent", "check-config"])
@pytest.mark.parametrize("text, expected", [
    ("interval: .nan\n", "interval: must be a finite number"),
    ("interval: .inf\n", "interval: must be a finite number"),
    ("interval: 1\ninterval: 2\n", "interval: duplicate key"),
])
def test_cli_rejects_nan_inf_and_duplicates_with_exit_2(tmp_path, cmd, text, expected):
    p = _write(tmp_path, text)
    args = ["agent", "--config", str(p), "--once"] if cmd == "agent" else ["check-config", str(p), "--kind", "agent"]
    proc = subprocess.run([sys.executable, "-m", "fabricmon", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"{p}: {expected}" in lines[0]


def test_cli_interval_flag_nan_exits_2():
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "agent", "--interval", "nan", "--once", "--nvml", "off"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "command line: interval: must be a finite number" in proc.stderr


# --- any file: a config or one ConfigError line, never a traceback -------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
                    st.text(max_size=10))
_yaml_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
_KEYS = ["interval", "listen", "nvml", "rails", "sysfs_root", "profile", "stream", "sources", "log", "bogus"]
_SUB = {"sources": ["infiniband", "ethtool", "nvml", "host"], "profile": ["mtu", "rate_gbps", "roce_priority", "width"],
        "stream": ["spool_max_bytes", "spool_dir"]}


def _doc():
    sub = st.sampled_from(sorted(_SUB)).flatmap(lambda k: st.tuples(st.just(k), st.dictionaries(
        st.sampled_from(_SUB[k]), st.one_of(_yaml_value, st.dictionaries(
            st.sampled_from(["timeout", "expected_ports", "enabled", "interfaces"]), _yaml_value, max_size=2)),
        max_size=3)))
    return st.lists(st.one_of(st.tuples(st.sampled_from(_KEYS), _yaml_value), sub), max_size=5)


def _check_config_or_error(p) -> None:
    import math

    try:
        cfg = load_agent_config(p)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(p))
        return
    assert math.isfinite(cfg.interval) and 0.01 <= cfg.interval <= 3600
    for src in (cfg.sources.infiniband, cfg.sources.ethtool, cfg.sources.nvml, cfg.sources.host):
        assert math.isfinite(src.timeout) and 0 < src.timeout <= 600
    assert math.isfinite(cfg.profile.rate_gbps) and cfg.profile.rate_gbps > 0
    assert 68 <= cfg.profile.mtu <= 65535


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_doc())
def test_any_structured_config_is_valid_or_one_error_line(tmp_path_factory, items):
    import yaml

    p = tmp_path_factory.mktemp("cfg") / "agent.yaml"
    p.write_text("\n".join(yaml.safe_dump({k: v}, default_flow_style=True).strip() for k, v in items) + "\n")
    _check_config_or_error(p)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_any_text_is_a_config_or_one_error_line(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("cfg") / "agent.yaml"
    p.write_text(text)
    _check_config_or_error(p)


@pytest.mark.parametrize("text", [
    "rails: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n",
    "rails: " + "{a: " * 200000 + "1" + "}" * 200000 + "\n",
    "rails:\n  " + "- " * 100000 + "x\n",  # block nesting on one line
    "rails:\n  " + "? " * 100000 + "x\n",
], ids=["flow-20k", "flow-200k", "block-dash-100k", "block-key-100k"])
def test_deeply_nested_yaml_is_an_error_not_a_traceback(tmp_path, text):
    # past what libyaml's C composer survives (it overflows the stack, SIGSEGV): a subprocess, so a
    # crash fails this test instead of ending the run
    p = _write(tmp_path, text)
    r = subprocess.run([sys.executable, "-m", "fabricmon", "check-config", "--kind", "agent", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-300:])
    assert "nested too deeply" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_agent_config(p)


def test_large_yaml_is_read_with_line_numbers_in_its_errors(tmp_path):
    # the C loader's errors carry the same line numbers as the pure-Python loader's
    body = "".join(f"  - {{name: n{i}, value: {i}}}\n" for i in range(5000))
    p = _write(tmp_path, "items:\n" + body + "  - {name: broken, value: [1, 2}\n")
    with pytest.raises(ConfigError, match=r": line 5002: invalid YAML"):
        parse_yaml(p.read_text(), str(p))
    assert parse_yaml("items:\n" + body, "x.yaml")["items"][4999] == {"name": "n4999", "value": 4999}


def test_non_utf8_file_is_one_error_line(tmp_path):
    p = tmp_path / "agent.yaml"
    p.write_bytes(b"interval: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"agent\.yaml: <top>: not UTF-8 text"):
        load_agent_config(p)
