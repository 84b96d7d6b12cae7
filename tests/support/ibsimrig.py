"""A simulated InfiniBand fabric the real infiniband-diags can sweep: Debian's ``ibsim`` (ibsim-utils) with
its console on a pipe, ``opensm`` assigning LIDs, and every tool run under ibsim's ``umad2sim`` preload
(what ``ibsim-run`` does), so ``perfquery``, ``smpquery``, ``ibnetdiscover`` and the agent itself talk to the
simulator instead of ``/dev/infiniband``.  No RDMA hardware, kernel module or privilege is needed.

Everything lives in a temporary directory (the net file, ibsim's console log, opensm's log and cache via
``OSM_CACHE_DIR``/``OSM_TMP_DIR``); the simulator's socket is an abstract Unix name unique to the rig
(``IBSIM_SOCKNAME``), so parallel tests do not meet.  Every wait is bounded; ``stop`` ends opensm and ibsim
by their own process ids.

Console commands (ibsim 0.10 ``sim_cmd.c`` ``do_cmd()``): ``PerformanceSet "S-<guid>"[port]
PortCounters.SymbolErrorCounter=1234`` sets a PMA counter (clamped to its IBTA width), ``Unlink`` /
``ReLink`` pull and restore a cable, ``Error "S-<guid>"[port] <0..100>`` drops that share of the MADs
delivered to the port.  ibsim prints its ``sim> `` prompt after each command it has run: waiting for one
more prompt is how a test knows the command took effect before it queries.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from fabricmon.topology_import.ibnetgen import GenFabric
from support.waiting import wait_until

TOOLS = ("ibsim", "ibsim-run", "opensm", "ibstat", "perfquery", "smpquery", "ibnetdiscover")
PROMPT = "sim> "


def missing_tools() -> list[str]:
    """The binaries this rig needs that are not installed (scripts/test.sh installs them)."""
    return [t for t in TOOLS if shutil.which(t) is None]


def umad2sim_library() -> str:
    """The preload ``ibsim-run`` uses, read from the script itself (its path is per architecture)."""
    script = Path(shutil.which("ibsim-run") or "ibsim-run").read_text()
    m = re.search(r"^sim_so=(\S+)", script, re.M)
    if m is None or not Path(m.group(1)).exists():
        raise RuntimeError("ibsim-run does not name an existing libumad2sim.so")
    return m.group(1)


def two_tier(leaves: int, hosts_per_leaf: int, spines: int, *, ports: int = 8,
             spine_ports: int | None = None) -> GenFabric:
    """Leaves of ``hosts_per_leaf`` hosts (ports 1..hosts_per_leaf, node order), uplink k of each leaf on
    port ``hosts_per_leaf + 1 + k`` to spine k (the simulator's generated layout), spines' port u+1 to
    leaf u.  Hosts ``node-000``...  with one CA ``mlx5_0``; the first host is where the tools run."""
    spine_ports = spine_ports or ports
    if hosts_per_leaf + spines > ports or leaves > spine_ports:
        raise ValueError("not enough switch ports for that fabric")
    f = GenFabric()
    hosts = [f.add("ca", 0x0c42_a100_0000 + (i << 4), 1, f"node-{i:03d} mlx5_0").guid
             for i in range(leaves * hosts_per_leaf)]
    leaf_guids = [f.add("switch", 0x0c42_b000_0000 + u, ports, f"MF0;leaf-{u:02d}:MQM9700/U1").guid
                  for u in range(leaves)]
    spine_guids = [f.add("switch", 0x0c42_c000_0000 + s, spine_ports, f"MF0;spine-{s:02d}:MQM9790/U1").guid
                   for s in range(spines)]
    for i, g in enumerate(hosts):
        f.link(g, 1, leaf_guids[i // hosts_per_leaf], 1 + i % hosts_per_leaf)
    for u, lg in enumerate(leaf_guids):
        for s, sg in enumerate(spine_guids):
            f.link(lg, hosts_per_leaf + 1 + s, sg, 1 + u)
    return f


def node_id(fabric: GenFabric, guid: int) -> str:
    """ibsim's console id of a node: ``S-<guid>`` for a switch, ``H-<guid>`` for a CA (the net file's)."""
    return f"{'S' if fabric.nodes[guid].kind == 'switch' else 'H'}-{guid:016x}"


@dataclass
class ToolResult:
    rc: int
    stdout: str
    stderr: str


class IbSim:
    """ibsim + opensm on a generated fabric.  Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, fabric: GenFabric, workdir: Path, *, sm_sweep_s: int = 1) -> None:
        self.fabric = fabric
        self.dir = Path(workdir).resolve()  # ibsim runs in it and is given paths inside it
        self.sm_sweep_s = sm_sweep_s
        self.sockname = f"fmib-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.net = self.dir / "fabric.net"
        self.console_log = self.dir / "ibsim.log"
        self.sm_log = self.dir / "opensm.log"
        self._sim: subprocess.Popen[str] | None = None
        self._sm: subprocess.Popen[bytes] | None = None
        self._log_fh = None

    # ------------------------------------------------------------------ environment
    @property
    def env(self) -> dict[str, str]:
        """The environment a process needs to reach this fabric instead of /dev/infiniband."""
        cache = self.dir / "osm-cache"
        cache.mkdir(exist_ok=True)
        return dict(os.environ, IBSIM_SOCKNAME=self.sockname, LD_PRELOAD=umad2sim_library(),
                    OSM_CACHE_DIR=str(cache), OSM_TMP_DIR=str(cache))

    def run(self, *argv: str, timeout: float = 10.0) -> ToolResult:
        """One infiniband-diags command against the simulator (bounded)."""
        r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        return ToolResult(r.returncode, r.stdout, r.stderr)

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout: float = 20.0) -> IbSim:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # a start that fails leaves nothing running
            raise

    def _start(self, timeout: float) -> IbSim:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.net.write_text(self.fabric.net_file())
        self._log_fh = open(self.console_log, "w")  # noqa: SIM115 - closed in stop()
        sim_env = dict(os.environ, IBSIM_SOCKNAME=self.sockname)
        self._sim = subprocess.Popen(["ibsim", "-s", str(self.net)], stdin=subprocess.PIPE,
                                     stdout=self._log_fh, stderr=subprocess.STDOUT, env=sim_env, text=True,
                                     cwd=self.dir)
        wait_until(lambda: self._alive() and PROMPT in self.console_log.read_text(errors="replace"),
                   timeout, "ibsim's console prompt")
        self._sm = subprocess.Popen(["opensm", "-f", str(self.sm_log), "-s", str(self.sm_sweep_s)],
                                    env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    cwd=self.dir)
        wait_until(self._subnet_up, timeout, "opensm: the subnet up and the local port ACTIVE", interval=0.05)
        return self

    def _alive(self) -> bool:
        if self._sim is None or self._sim.poll() is not None:
            raise RuntimeError(f"ibsim exited: {self.console_log.read_text(errors='replace')[-2000:]}")
        return True

    def _subnet_up(self) -> bool:
        self._alive()
        if self._sm is None or self._sm.poll() is not None:
            raise RuntimeError("opensm exited")
        # opensm dumps the subnet list into its cache directory once its first heavy sweep brought the
        # subnet up (at the default log level it does not log "SUBNET UP"); the local port is then ACTIVE.
        return ((self.dir / "osm-cache" / "opensm-subnet.lst").exists()
                and "State: Active" in self.run("ibstat").stdout)

    def stop(self, timeout: float = 10.0) -> None:
        for proc in (self._sm, self._sim):
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._sim is not None and self._sim.stdin is not None:
            try:
                self._sim.stdin.close()
            except OSError:
                pass
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        self._sm = self._sim = None

    def __enter__(self) -> IbSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the console
    def console(self, command: str, timeout: float = 10.0) -> str:
        """Run one console command and wait until ibsim has run it (one more prompt); its output."""
        assert self._sim is not None and self._sim.stdin is not None
        before = self.console_log.read_text(errors="replace")
        self._sim.stdin.write(command.rstrip("\n") + "\n")
        self._sim.stdin.flush()
        text = wait_until(lambda: (t := self.console_log.read_text(errors="replace")).count(PROMPT)
                          > before.count(PROMPT) and t, timeout, f"ibsim to run {command!r}")
        return str(text)[len(before):]

    def performance_set(self, guid: int, port: int, field: str, value: int) -> str:
        """``field`` as ibsim spells it: ``PortCounters.SymbolErrorCounter``, ``PortCountersExtended.PortXmitData``."""
        return self.console(f'PerformanceSet "{node_id(self.fabric, guid)}"[{port}] {field}={value}')

    def unlink(self, guid: int, port: int) -> str:
        return self.console(f'Unlink "{node_id(self.fabric, guid)}"[{port}]')

    def relink(self, guid: int, port: int) -> str:
        return self.console(f'ReLink "{node_id(self.fabric, guid)}"[{port}]')

    def error(self, guid: int, port: int, rate: int) -> str:
        return self.console(f'Error "{node_id(self.fabric, guid)}"[{port}] {rate}')

    def port_state(self, lid: int, port: int) -> str:
        """``LinkState`` of a port as PortInfo says now (smpquery, LID-routed)."""
        out = self.run("smpquery", "portinfo", str(lid), str(port)).stdout
        m = re.search(r"^LinkState:\.*(\w+)", out, re.M)
        return m.group(1) if m else ""


class SweeperAgent:
    """The real ``fabricmon agent --ib-switches`` on the rig's fabric (the tools it runs inherit the preload),
    no host sysfs, no NVML, its rank intake on a socket in ``workdir``; /metrics on a free port."""

    def __init__(self, sim: IbSim, workdir: Path, *, health: float = 1.0, full: float = 2.0,
                 rediscover: float = 5.0, node: str = "sweeper-0", aggregator: str | None = None,
                 timeout_ms: int = 1000, extra: dict | None = None) -> None:
        import yaml

        from support.net import free_port

        self.dir = Path(workdir)
        (self.dir / "sys").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cfg: dict = {"sysfs_root": str(self.dir / "sys"), "nvml": "off", "node_name": node,
                     "listen": f"127.0.0.1:{self.port}", "interval": 0.5, "aggregator": aggregator,
                     "sources": {"infiniband": {"expected_ports": 0},
                                 "ib_switches": {"health_interval": health, "full_interval": full,
                                                 "rediscover_interval": rediscover, "timeout_ms": timeout_ms}},
                     "intake": {"listen": None, "socket": str(self.dir / "ranks.sock")},
                     "stream": {"spool_dir": str(self.dir / "spool")},
                     "log": {"format": "json"}}
        for key, value in (extra or {}).items():
            cfg[key] = value
        self.config = self.dir / "agent.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.log = self.dir / "agent.log"
        self._env = sim.env
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SweeperAgent:
        import sys

        self._log_fh = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen([sys.executable, "-m", "fabricmon", "agent", "--config", str(self.config),
                                       "--ib-switches"], env=self._env, stdout=subprocess.DEVNULL,
                                      stderr=self._log_fh, cwd=self.dir)
        return self

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        from support.agentrig import http_get, parse_metrics

        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"agent exited: {self.log.read_text(errors='replace')[-2000:]}")
        status, body = http_get(f"http://127.0.0.1:{self.port}/metrics")
        return parse_metrics(body) if status == 200 else {}

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._proc = None
        if getattr(self, "_log_fh", None) is not None:
            self._log_fh.close()

    def __enter__(self) -> SweeperAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
