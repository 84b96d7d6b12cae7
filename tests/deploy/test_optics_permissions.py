"""The capabilities the manifests grant, tried on this kernel with setpriv.

Each case runs a process with the uid and capability set a container gets from a securityContext
(`capabilities: {drop: [ALL], add: [...]}` is the bounding set; runtimes set no ambient
capabilities, so a non-root process's effective set stays empty) and issues the real call:
- the transceiver source's module EEPROM ioctl (ETHTOOL_GMODULEINFO/GMODULEEEPROM on `lo`, which
  has no module: with CAP_NET_ADMIN the kernel gets past its permission check and answers
  EOPNOTSUPP; without it, EPERM): a non-root agent with NET_ADMIN "added" is refused, and the
  source says so (collector down, the reason, the unreadable gauge); uid 0 with only NET_ADMIN,
  the optics overlay's agent, is let through;
- the agent init container's command with the capabilities it is given in the rendered
  DaemonSet, on a spool directory another uid owns (0700).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.k8s import K8S, kubectl, render

PROBE = r"""
import json, time
from fabricmon.sources.inventory import Inventory, PortInfo
from fabricmon.sources.transceiver import TransceiverSource
src = TransceiverSource()
inv = Inventory("", (), (PortInfo("mlx5_0", "1", "", "Ethernet", "lo", "0"),))
src.poll(inv)  # starts the module reader thread
deadline = time.monotonic() + 10
while src._reader.snapshot().taken_at == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
res = src.poll(inv)
src.close()
print(json.dumps({"up": res.up, "messages": res.messages,
                  "readings": [[r.family, dict(r.labels), r.value] for r in res.readings]}))
"""


def _need_root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to set a process's uid and capabilities")


def _probe(*setpriv_args: str) -> dict:
    res = subprocess.run(["setpriv", *setpriv_args, "--", sys.executable, "-c", PROBE],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.splitlines()[-1])


def _unreadable(out: dict) -> float | None:
    return next((v for fam, lab, v in out["readings"]
                 if fam == "fabricmon_transceiver_modules_unreadable" and lab == {"reason": "permission"}), None)


def test_non_root_with_net_admin_added_is_refused_and_says_why() -> None:
    _need_root()
    out = _probe("--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+net_admin",
                 "--bounding-set=-all,+net_admin")
    assert out["up"] is False, out
    assert any("CAP_NET_ADMIN" in m and "EPERM" in m for m in out["messages"]), out
    assert _unreadable(out) == 1.0


def test_root_without_net_admin_is_refused() -> None:
    _need_root()
    out = _probe("--inh-caps=-all", "--bounding-set=-net_admin")
    assert out["up"] is False and _unreadable(out) == 1.0, out


def test_the_optics_agent_gets_past_the_permission_check() -> None:
    """uid 0, drop ALL, add NET_ADMIN: `lo` has no module (EOPNOTSUPP), which is not a refusal."""
    _need_root()
    out = _probe("--inh-caps=-all", "--bounding-set=-all,+net_admin")
    assert out["up"] is True and _unreadable(out) is None, out
    assert not any("EPERM" in m for m in out["messages"]), out


def test_init_container_capabilities_suffice_for_its_command(tmp_path: Path) -> None:
    _need_root()
    if kubectl() is None:
        pytest.skip("kubectl not found")
    objs = render(K8S / "overlays" / "optics")
    ds = next(o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "fabricmon-agent")
    init = ds["spec"]["template"]["spec"]["initContainers"][0]
    caps = init["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"] and init["securityContext"]["runAsUser"] == 0
    run, state = tmp_path / "run", tmp_path / "state"
    (state / "spool").mkdir(parents=True)
    run.mkdir()
    (state / "spool" / "00000001.batch").write_bytes(b"x")
    for p in (run, state, state / "spool", state / "spool" / "00000001.batch"):
        os.chown(p, 65534, 65534)
    for p in (state, state / "spool"):
        p.chmod(0o700)  # as the non-root agent left them
    command = init["command"][-1].replace("/run/fabricmon", str(run)).replace("/var/lib/fabricmon", str(state))

    def attempt(cap_names: list[str]) -> subprocess.CompletedProcess:
        bounding = ",".join(["-all", *(f"+{c.lower()}" for c in cap_names)])
        return subprocess.run(["setpriv", "--inh-caps=-all", f"--bounding-set={bounding}", "--", "/bin/sh", "-c",
                               command],
                              capture_output=True, text=True, timeout=60)

    res = attempt(caps["add"])
    assert res.returncode == 0, res.stderr
    assert (state / "spool" / "00000001.batch").stat().st_uid == 0  # the optics agent's uid now
    # Without DAC_READ_SEARCH the 0700 spool cannot be descended: the capability is needed.
    for p in (state, state / "spool", state / "spool" / "00000001.batch"):
        os.chown(p, 65534, 65534)
    res = attempt([c for c in caps["add"] if c != "DAC_READ_SEARCH"])
    assert res.returncode != 0 and "Permission denied" in res.stderr, res.stderr
