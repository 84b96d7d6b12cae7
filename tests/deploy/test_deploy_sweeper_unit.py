"""The switch sweeper's systemd drop-in (systemd/fabricmon-agent.service.d/ib-switches.conf.example): the
agent unit with it appended verifies cleanly with the real systemd-analyze, and it opens only the umad
devices (the unit's closed device policy and dynamic user stay), which the udev rule gives the fabricmon
group the unit already has."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from support.promtools import REPO

SYSTEMD = REPO / "systemd"
DROPIN = SYSTEMD / "fabricmon-agent.service.d" / "ib-switches.conf.example"


def _keys(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def test_the_dropin_adds_only_the_umad_devices_to_the_hardened_unit(tmp_path) -> None:
    unit = (SYSTEMD / "fabricmon-agent.service").read_text()
    merged = _keys(unit + "\n" + DROPIN.read_text())  # a drop-in's lines add to the unit's
    assert _keys(DROPIN.read_text()) == {"Service.DeviceAllow": ["char-infiniband_mad rw"]}
    assert merged["Service.DevicePolicy"] == ["closed"] and merged["Service.DynamicUser"] == ["yes"]
    assert "fabricmon" in merged["Service.SupplementaryGroups"]
    rule = (SYSTEMD / "90-fabricmon-umad.rules").read_text()
    assert 'KERNEL=="umad*", SUBSYSTEM=="infiniband_mad", GROUP="fabricmon", MODE="0660"' in rule
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed: unit syntax not verified")
    path = tmp_path / "fabricmon-agent.service"
    path.write_text((unit + "\n" + DROPIN.read_text()).replace("/usr/local/bin/fabricmon", sys.executable))
    res = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in res.stderr.splitlines()
                if path.name in ln or "Unknown" in ln or "Invalid" in ln or "Failed" in ln]
    assert res.returncode == 0 and not problems, res.stderr
