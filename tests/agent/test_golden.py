"""Golden expositions: the agent's whole /metrics output for each fixture kind, held to tests/golden/*.prom.

A change to any metric name, label, value or help text shows up here as a unified diff.  After an
intended change, regenerate and review: ``FABRICMON_UPDATE_GOLDEN=1 pytest tests/agent/test_golden.py``.
Cases are in tests/support/golden_cases.py (one line per fixture kind).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.golden_cases import CASES, GOLDEN, TS, agent_exposition, normalize
from support.goldenfile import match_golden


def assert_matches_golden(name: str, got: str) -> None:
    match_golden(GOLDEN / f"{name}.prom", got, produced_by="agent output",
                 regenerate="pytest tests/agent/test_golden.py")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_exposition_matches_golden(tmp_path: Path, case) -> None:
    node = case.build(tmp_path)
    got = agent_exposition(node, tmp_path)
    assert 'node="node-000"' in got and "fabricmon_collector_up" in got
    assert_matches_golden(case.name, got)


def test_every_golden_file_has_a_case() -> None:
    names = {c.name for c in CASES}
    assert len(names) == len(CASES)
    assert sorted(p.stem for p in GOLDEN.glob("*.prom")) == sorted(names)


def test_golden_output_is_deterministic(tmp_path: Path) -> None:
    """Two fresh agents on two fresh trees give the same bytes (nothing host- or run-dependent slipped in)."""
    case = next(c for c in CASES if c.name == "roce")
    a = agent_exposition(case.build(tmp_path / "a"), tmp_path / "a")
    b = agent_exposition(case.build(tmp_path / "b"), tmp_path / "b")
    assert a == b


def test_cli_once_prints_the_golden_exposition(tmp_path: Path) -> None:
    """``fabricmon agent --once`` prints what the in-process path above produces (up to time)."""
    case = next(c for c in CASES if c.name == "ib")
    node = case.build(tmp_path)
    ov = node.overrides()
    proc = subprocess.run(
        [sys.executable, "-m", "fabricmon", "--log-level", "error", "agent", "--once",
         "--sysfs-root", ov["sysfs_root"], "--ethtool-dir", ov["ethtool_dir"], "--nvml", ov["nvml"],
         "--node-name", ov["node_name"]],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def fix_time(text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            if line.startswith(("fabricmon_snapshot_timestamp_seconds{", "fabricmon_snapshot_age_seconds{")):
                line = line.rsplit(" ", 1)[0] + " X\n"
            out.append(line)
        return "".join(out)

    assert fix_time(normalize(proc.stdout)) == fix_time((GOLDEN / "ib.prom").read_text())


def test_golden_files_pass_promtool() -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    for path in sorted(GOLDEN.glob("*.prom")):
        proc = subprocess.run(["promtool", "check", "metrics"], input=path.read_bytes(), capture_output=True,
                              timeout=60)
        assert proc.returncode == 0, (path.name, proc.stdout[-2000:], proc.stderr[-2000:])


def test_golden_time_lines_are_the_fixed_clock() -> None:
    for path in GOLDEN.glob("*.prom"):
        lines = dict(ln.rsplit(" ", 1) for ln in path.read_text().splitlines() if not ln.startswith("#"))
        assert float(lines['fabricmon_snapshot_timestamp_seconds{node="node-000"}']) == TS, path.name
        assert float(lines['fabricmon_snapshot_age_seconds{node="node-000"}']) == 0.0, path.name


def test_dual_port_golden_has_both_ports_with_their_netdevs() -> None:
    text = (GOLDEN / "ib-dual-port.prom").read_text()
    for port, ifname in (("1", "enp170s0f0np0"), ("2", "enp170s0f1np1")):
        assert f'device="mlx5_8",fw_ver="32.39.2048",hca_type="MT41692",interface="{ifname}",' in text
        assert f'fabricmon_ib_port_state{{device="mlx5_8",node="node-000",port="{port}"}} 4.0' in text
