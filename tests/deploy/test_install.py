"""scripts/install.sh: install into a temporary prefix, verify the units it writes, run them, uninstall.

The install is the real script, as root, with this machine's python3 (Debian 12's), given a wheel
built from this checkout.  The units it writes must pass `systemd-analyze verify` (which fails a unit
whose ExecStart does not exist: the shipped templates name /usr/local/bin, so they are written for the
prefix).  Then each unit's ExecStart line, with $FABRICMON_ARGS from its EnvironmentFile, runs as the
unit's user would: the units use DynamicUser= (a uid allocated at start, with no supplementary
groups), which no test can create outside systemd, so the nobody uid 65534 with its groups cleared
stands in, with the unit's SupplementaryGroups= (the fabricmon group that reads the token in place,
install.sh makes it).  What systemd provides the unit (StateDirectory=, RuntimeDirectory=) is
made in a private mount namespace, read from the unit file, and the two daemons run in a private
network namespace on their default ports: the agent streams to the aggregator with the installed
token, and both /metrics are scraped.  Not emulated: the sandbox options (ProtectSystem= and the
like; `systemd-analyze security` scores them), because no systemd runs here.
"""

from __future__ import annotations

import grp
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
from support.pythons import find_python

# builds from the checkout (setuptools writes build/ and fabricmon.egg-info there): one xdist worker for both
pytestmark = pytest.mark.xdist_group("builds-from-checkout")

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


def _install(root: Path, *args: str, prefix: Path | None = None) -> subprocess.CompletedProcess:
    # PIP_NO_COMPILE: pip skips byte-compiling the venv (about a third of the install's time here);
    # what is installed is the same.
    return subprocess.run(
        ["bash", str(INSTALL), "--prefix", str(prefix or root / "opt" / "fabricmon"), "--sysconfdir",
         str(root / "etc"), "--unitdir", str(root / "etc" / "systemd" / "system"), "--statedir",
         str(root / "var" / "lib"), "--no-apt", *args],
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
# ExecStartPre= (check-config) as the unit runs it: with the credential in place.
{pre}
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
    """Shell lines making the unit's StateDirectory and RuntimeDirectory as systemd would."""
    lines = []
    modes = {"StateDirectory": "StateDirectoryMode", "RuntimeDirectory": "RuntimeDirectoryMode"}
    bases = {"StateDirectory": "/var/lib", "RuntimeDirectory": "/run"}
    for key, base in bases.items():
        for name in unit.get(key, []):
            mode = unit.get(modes[key], ["0755"])[0]
            lines.append(f"install -d -o {uid} -g {uid} -m {mode} {base}/{name}")
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
    # the token read in place by the units' group (LoadCredential='s copy was never refreshed on rotation)
    token_st = (etc / "fabricmon" / "token").stat()
    assert token_st.st_mode & 0o777 == 0o640 and token_st.st_gid == grp.getgrnam("fabricmon").gr_gid

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
        assert "LoadCredential" not in unit and unit["SupplementaryGroups"] == ["fabricmon"]
        assert unit["EnvironmentFile"] == [f"-{etc}/default/fabricmon-{role}"]
        assert _verify(path) == [], path.read_text()
    if not Path("/usr/local/bin/fabricmon").exists():
        shipped = tmp_path / "fabricmon-agent.service"
        shipped.write_text((REPO / "systemd" / "fabricmon-agent.service").read_text())
        assert _verify(shipped), "systemd-analyze verify passed a unit whose ExecStart does not exist"

    # Run both ExecStart lines as the units would run them.
    setup: list[str] = []
    pre: list[str] = []
    cmds = {}
    as_unit = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", "--"]
    for role in ROLES:
        unit = _unit(unitdir / f"fabricmon-{role}.service")
        setup += _systemd_setup(f"fabricmon-{role}.service", unit, NOBODY)
        groups = ",".join(str(grp.getgrnam(g).gr_gid) for g in unit.get("SupplementaryGroups", []))
        as_unit = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                   f"--groups={groups}" if groups else "--clear-groups", "--no-new-privs", "--"]
        (check,) = unit["ExecStartPre"]
        assert shlex.split(check) == [str(prefix / "bin" / "fabricmon"), "check-config", "--kind", role,
                                      str(etc / "fabricmon" / f"{role}.yaml")]
        pre.append(shlex.join([*as_unit, *shlex.split(check)]) + f" >> {shlex.quote(str(tmp_path))}/pre.log 2>&1")
        cmds[role] = shlex.join([*as_unit, *_exec_start(unit)])
    out = tmp_path / "run"
    out.mkdir()
    (out / "scrape.py").write_text(SCRAPE)
    script = RUN_SCRIPT.format(setup="\n".join(setup), pre="\n".join(pre), aggregator=cmds["aggregator"],
                               agent=cmds["agent"], out=shlex.quote(str(out)), python=shlex.quote(sys.executable))
    run = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "bash", "-c", script],
                         capture_output=True, text=True, timeout=120)
    logs = {r: (out / f"{r}.log").read_text() if (out / f"{r}.log").exists() else "" for r in ROLES}
    pre_log = (tmp_path / "pre.log").read_text() if (tmp_path / "pre.log").exists() else ""
    assert pre_log.count(": ok (") == 2, pre_log  # both ExecStartPre checks passed inside the "unit"
    assert run.returncode == 0, (f"{run.stdout}{run.stderr}\nagent:\n{logs['agent'][-3000:]}"
                                 f"\naggregator:\n{logs['aggregator'][-3000:]}")
    agent_metrics = (out / "agent.metrics").read_text()
    assert 'fabricmon_build_info{' in agent_metrics and "fabricmon_collector_up" in agent_metrics
    # The revision the wheel was built from, written at build time (no git at run time).
    assert re.search(r'fabricmon_build_info\{[^}]*revision="[0-9a-f]{40}(-dirty)?"',
                     agent_metrics), agent_metrics[:2000]
    # The host source reads the host's /proc (host_root /), the unit's sysfs_root being /sys.
    assert "fabricmon_host_memory_total_bytes" in agent_metrics
    # The aggregator took the agent's stream: both read the installed token through their group.
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


@pytest.mark.parametrize("bad", ["opt/fabric mon", "opt/a&b", "opt/50%", "opt/$HOME", "opt/a#b", "opt/it's"])
def test_install_refuses_a_prefix_it_cannot_write_into_a_unit(root: Path, bad: str) -> None:
    # A space splits ExecStart=, % and $ are systemd's, & and # are sed's in the template rewrite: such a
    # prefix gave a "successful" install whose units could not start.  Refused before anything is written.
    res = _install(root, prefix=root / bad)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"--prefix '{root / bad}': only letters, digits" in res.stderr, res.stderr
    assert not list(root.rglob("*")), sorted(map(str, root.rglob("*")))
    res = _install(root, "--sysconfdir", str(root / "my etc"))
    assert res.returncode == 2 and "--sysconfdir" in res.stderr, res.stderr


def test_install_refuses_a_python_older_than_310(root: Path) -> None:
    res = _install(root, "--python", str(root / "no-such-python"))
    assert res.returncode == 2 and "--python: not found or not executable" in res.stderr, res.stderr
    py39 = find_python("3.9")
    if py39 is None:
        pytest.skip("no python3.9 here to be refused")
    res = _install(root, "--python", py39)
    assert res.returncode == 2 and "needs 3.10 or newer" in res.stderr, res.stderr
    assert not (root / "opt").exists()


@pytest.mark.integration
def test_install_on_python310_units_verify(wheel: Path, root: Path) -> None:
    """DGX OS 6 and Ubuntu 22.04: a venv on 3.10 (requirements/py3.10 locks) whose units verify; a unit
    that verify complains about (here a broken drop-in beside it) fails the install, exit 0 or not."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    py310 = find_python("3.10")
    assert py310, "no python3.10 (pyenv install 3.10, or FABRICMON_PYTHON310=PATH): 3.10 is supported and tested"
    prefix = root / "opt" / "fabricmon"
    unitdir = root / "etc" / "systemd" / "system"
    dropin = unitdir / "fabricmon-agent.service.d" / "site.conf"
    dropin.parent.mkdir(parents=True)
    dropin.write_text("[Service]\nProtectSystem=sometimes\n")  # verify: a warning on stderr, exit 0
    res = _install(root, "--wheel", str(wheel), "--python", py310)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "fabricmon-agent.service does not pass systemd-analyze verify" in res.stderr, res.stderr
    assert "sometimes" in res.stderr, res.stderr
    dropin.unlink()
    res = _install(root, "--wheel", str(wheel), "--python", py310)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"building the venv with {py310} (Python 3.10)" in res.stdout, res.stdout
    ver = subprocess.run([str(prefix / "bin" / "python"), "-c", "import sys, numpy; print(sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=60)
    assert ver.stdout.strip() == "(3, 10)", ver.stdout + ver.stderr
    for role in ROLES:
        path = unitdir / f"fabricmon-{role}.service"
        assert _verify(path) == [], path.read_text()
    # The installed example configs still name example hosts: check-config said so (with the file's name).
    assert f"{root}/etc/fabricmon/agent.yaml: warning: aggregator: fabricmon-aggregator.example.internal" \
        in res.stderr, res.stderr
