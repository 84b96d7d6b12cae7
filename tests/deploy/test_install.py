"""scripts/install.sh: install into a temporary prefix, verify the units it writes, run them, uninstall.

The install is the real script, as root, with this machine's python3 (Debian 12's), given a wheel
built from this checkout.  The units it writes must pass `systemd-analyze verify` (which fails a unit
whose ExecStart does not exist: the shipped templates name /usr/local/bin, so they are written for the
prefix).  Then each unit's ExecStart line, with $FABRICMON_ARGS from its EnvironmentFile, runs as the
unit's user would: the units use DynamicUser= (a uid allocated at start, with no supplementary
groups), which no test can create outside systemd, so the nobody uid 65534 with its groups cleared
stands in.  What systemd provides the unit (StateDirectory=, RuntimeDirectory=, LoadCredential=) is
made in a private mount namespace, read from the unit file, and the two daemons run in a private
network namespace on their default ports: the agent streams to the aggregator with the installed
token, and both /metrics are scraped.  Not emulated: the sandbox options (ProtectSystem= and the
like; `systemd-analyze security` scores them), because no systemd runs here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.netns import need_netns
from support.promtools import REPO

INSTALL = REPO / "scripts" / "install.sh"
NOBODY = 65534
ROLES = ("agent", "aggregator")


def _unit(path: Path) -> dict[str, list[str]]:
    """A unit file as {'Key': [values]} (sections flattened; keys may repeat)."""
    out: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _exec_start(unit: dict[str, list[str]]) -> list[str]:
    """ExecStart with $FABRICMON_ARGS expanded from the EnvironmentFile as systemd splits an unquoted $VAR."""
    env: dict[str, str] = {}
    for ef in unit.get("EnvironmentFile", []):
        path = Path(ef.lstrip("-"))
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    k, _, v = line.partition("=")
                    env[k.strip()] = shlex.split(v)[0] if v.strip() else ""
    (line,) = unit["ExecStart"]
    words = shlex.split(line)
    argv: list[str] = []
    for w in words:
        if w.startswith("$") and w[1:] in env:
            argv += env[w[1:]].split()
        else:
            argv.append(w)
    return argv


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = out.glob("fabricmon-*.whl")
    return whl


@pytest.fixture
def root() -> Iterator[Path]:
    """A world-traversable temporary root (pytest's tmp_path is 0700: nobody could not reach the venv)."""
    if os.geteuid() != 0:
        pytest.skip("install.sh installs as root")
    d = Path(tempfile.mkdtemp(prefix="fabricmon-install-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _install(root: Path, *args: str) -> subprocess.CompletedProcess:
    # PIP_NO_COMPILE: pip skips byte-compiling the venv (about a third of the install's time here);
    # what is installed is the same.
    return subprocess.run(
        ["bash", str(INSTALL), "--prefix", str(root / "opt" / "fabricmon"), "--sysconfdir", str(root / "etc"),
         "--unitdir", str(root / "etc" / "systemd" / "system"), "--statedir", str(root / "var" / "lib"),
         "--no-apt", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_NO_COMPILE": "1"})


def _verify(unit: Path) -> list[str]:
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # Unknown keys and bad values are warnings on stderr with exit 0: both count.
    problems = [ln for ln in res.stderr.splitlines()
                if unit.name in ln or "Unknown" in ln or "Invalid" in ln or "Failed" in ln or "not executable" in ln]
    return problems + ([f"exit {res.returncode}"] if res.returncode else [])


RUN_SCRIPT = r"""
set -eu
ip link set lo up
# What systemd makes for the units, in this mount namespace only.
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /var/lib
{setup}
{aggregator} > {out}/aggregator.log 2>&1 &
agg=$!
{agent} > {out}/agent.log 2>&1 &
agent=$!
rc=0
{python} {out}/scrape.py {out} || rc=$?
kill -TERM $agent $agg 2>/dev/null || true
wait $agent || true
wait $agg || true
exit $rc
"""

SCRAPE = r"""
import sys, time, urllib.request
out = sys.argv[1]
want = {"agent": ("http://127.0.0.1:9720/metrics", "fabricmon_host_memory_total_bytes"),  # after a poll
        "aggregator": ("http://127.0.0.1:9722/metrics", "fabricmon_agents_connected 1.0")}
deadline = time.monotonic() + 60
got = {}
while time.monotonic() < deadline and len(got) < len(want):
    for name, (url, needle) in want.items():
        if name in got:
            continue
        try:
            body = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            continue
        if needle in body:
            got[name] = body
            open(f"{out}/{name}.metrics", "w").write(body)
    time.sleep(0.2)
sys.exit(0 if len(got) == len(want) else 1)
"""


def _systemd_setup(unit_name: str, unit: dict[str, list[str]], uid: int) -> list[str]:
    """Shell lines making the unit's StateDirectory, RuntimeDirectory and LoadCredential as systemd would."""
    lines = []
    modes = {"StateDirectory": "StateDirectoryMode", "RuntimeDirectory": "RuntimeDirectoryMode"}
    bases = {"StateDirectory": "/var/lib", "RuntimeDirectory": "/run"}
    for key, base in bases.items():
        for name in unit.get(key, []):
            mode = unit.get(modes[key], ["0755"])[0]
            lines.append(f"install -d -o {uid} -g {uid} -m {mode} {base}/{name}")
    for cred in unit.get("LoadCredential", []):
        name, _, src = cred.partition(":")
        d = f"/run/credentials/{unit_name}"
        lines.append(f"install -d -m 0500 -o {uid} -g {uid} {d}")
        lines.append(f"install -m 0400 -o {uid} -g {uid} {shlex.quote(src)} {d}/{name}")
    return lines


@pytest.mark.integration
def test_install_verify_run_uninstall(wheel: Path, root: Path, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    need_netns("ip", "unshare", "setpriv")
    probe = subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make mount and network namespaces here: {probe.stderr.strip()}")
    prefix = root / "opt" / "fabricmon"
    etc = root / "etc"
    unitdir = etc / "systemd" / "system"

    # The operator's one edit, made before installing: the agent's aggregator address, in the
    # EnvironmentFile the unit reads.  The install keeps it and writes its example beside it.
    (etc / "default").mkdir(parents=True)
    (etc / "default" / "fabricmon-agent").write_text('FABRICMON_ARGS="--aggregator 127.0.0.1:9721"\n')
    res = _install(root, "--wheel", str(wheel))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"kept {etc}/default/fabricmon-agent" in res.stdout, res.stdout
    example = (REPO / "systemd" / "etc" / "default" / "fabricmon-agent").read_text()
    assert (etc / "default" / "fabricmon-agent.dist").read_text() == example.replace("/etc/", f"{etc}/")
    assert (prefix / "bin" / "fabricmon").is_file()
    for hook in ("prolog", "epilog"):  # slurmd's Prolog=/Epilog= (tests/aggregator/test_uninstrumented_jobs.py)
        assert os.access(prefix / "bin" / f"fabricmon-slurm-{hook}", os.X_OK), hook
    assert f"Prolog={prefix}/bin/fabricmon-slurm-prolog" in res.stdout, res.stdout
    for name in ("agent.yaml", "aggregator.yaml", "topology.yaml", "token"):
        assert (etc / "fabricmon" / name).is_file(), name
    assert (etc / "fabricmon" / "token").stat().st_mode & 0o777 == 0o600

    # --check-config after an edit: the token as the units get it; a bad value is refused by name.
    res = _install(root, "--check-config")
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
    agent_yaml = etc / "fabricmon" / "agent.yaml"
    good = agent_yaml.read_text()
    agent_yaml.write_text(good.replace("interval: 1.0", "interval: -1"))
    res = _install(root, "--check-config")
    assert res.returncode == 2 and "interval" in res.stderr and f"{agent_yaml} does not pass" in res.stderr, res.stderr
    agent_yaml.write_text(good)

    # The units name the prefix and this sysconfdir, and pass verify; the shipped template (its
    # ExecStart under /usr/local/bin, absent here) does not: verify can fail.
    for role in ROLES:
        path = unitdir / f"fabricmon-{role}.service"
        unit = _unit(path)
        argv = _exec_start(unit)
        assert argv[:4] == [str(prefix / "bin" / "fabricmon"), role, "--config",
                            str(etc / "fabricmon" / f"{role}.yaml")]
        assert unit["LoadCredential"] == [f"token:{etc}/fabricmon/token"]
        assert unit["EnvironmentFile"] == [f"-{etc}/default/fabricmon-{role}"]
        assert _verify(path) == [], path.read_text()
    if not Path("/usr/local/bin/fabricmon").exists():
        shipped = tmp_path / "fabricmon-agent.service"
        shipped.write_text((REPO / "systemd" / "fabricmon-agent.service").read_text())
        assert _verify(shipped), "systemd-analyze verify passed a unit whose ExecStart does not exist"

    # Run both ExecStart lines as the units would run them.
    setup: list[str] = []
    cmds = {}
    for role in ROLES:
        unit = _unit(unitdir / f"fabricmon-{role}.service")
        setup += _systemd_setup(f"fabricmon-{role}.service", unit, NOBODY)
        cmds[role] = shlex.join(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                 "--no-new-privs", "--", *_exec_start(unit)])
    out = tmp_path / "run"
    out.mkdir()
    (out / "scrape.py").write_text(SCRAPE)
    script = RUN_SCRIPT.format(setup="\n".join(setup), aggregator=cmds["aggregator"], agent=cmds["agent"],
                               out=shlex.quote(str(out)), python=shlex.quote(sys.executable))
    run = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "bash", "-c", script],
                         capture_output=True, text=True, timeout=120)
    logs = {r: (out / f"{r}.log").read_text() if (out / f"{r}.log").exists() else "" for r in ROLES}
    assert run.returncode == 0, (f"{run.stdout}{run.stderr}\nagent:\n{logs['agent'][-3000:]}"
                                 f"\naggregator:\n{logs['aggregator'][-3000:]}")
    agent_metrics = (out / "agent.metrics").read_text()
    assert 'fabricmon_build_info{' in agent_metrics and "fabricmon_collector_up" in agent_metrics
    # The revision the wheel was built from, written at build time (no git at run time).
    assert re.search(r'fabricmon_build_info\{[^}]*revision="[0-9a-f]{40}(-dirty)?"',
                     agent_metrics), agent_metrics[:2000]
    # The host source reads the host's /proc (host_root /), the unit's sysfs_root being /sys.
    assert "fabricmon_host_memory_total_bytes" in agent_metrics
    # The aggregator took the agent's stream: the installed token reached both through LoadCredential.
    assert "fabricmon_agents_connected 1.0" in (out / "aggregator.metrics").read_text()

    # What `systemctl enable` makes (it links even where systemd is not running).
    wants = unitdir / "multi-user.target.wants"
    wants.mkdir()
    (wants / "fabricmon-agent.service").symlink_to(unitdir / "fabricmon-agent.service")
    # Uninstall keeps configs and token; --purge removes them; nothing else of the root is left.
    res = _install(root, "--uninstall")
    assert res.returncode == 0, res.stderr
    assert not prefix.exists() and not list(unitdir.glob("fabricmon-*"))
    assert (etc / "fabricmon" / "token").exists() and (etc / "fabricmon" / "agent.yaml").exists()
    assert not (etc / "default" / "fabricmon-agent.dist").exists()  # the example it wrote, not the operator's file
    assert (etc / "default" / "fabricmon-agent").read_text().startswith('FABRICMON_ARGS="--aggregator')
    res = _install(root, "--uninstall", "--purge")
    assert res.returncode == 0, res.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == [], left


def test_install_refuses_bad_arguments(root: Path) -> None:
    res = _install(root, "--role", "spine")
    assert res.returncode == 2 and "--role: spine" in res.stderr, res.stderr
    res = _install(root, "--uninstall")
    assert res.returncode == 2 and "no fabricmon installed by this script" in res.stderr, res.stderr
    res = _install(root, "--purge")
    assert res.returncode == 2 and "--purge goes with --uninstall" in res.stderr, res.stderr
