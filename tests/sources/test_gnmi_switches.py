"""The gnmi_switches source against in-process gNMI targets (tests/support/gnmitarget.py) on loopback:
exact values in the agent's exposition for both profiles, counter ramps and resets, the lossless
settings of each switch port, TLS with username/password re-read at SIGHUP, and the failures a switch
can cost (stall, 10 MB updates, garbage, disconnects) staying its own."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.config import GnmiSwitchesConfig, GnmiTargetConfig
from fabricmon.configload import ConfigError, build
from fabricmon.sources.gnmi_switches.source import GnmiSwitchesSource
from fabricmon.sources.inventory import Inventory
from support.gnmitarget import ScriptedTarget, TargetServer
from support.waiting import wait_until

pytestmark = pytest.mark.integration

OC_COUNTERS = "/interfaces/interface[name=Ethernet1/1]/state/counters"
OC_QUEUE = "/qos/interfaces/interface[interface-id=Ethernet1/1]/output/queues/queue[name=3]/state"


def _cfg(*targets: GnmiTargetConfig, **kw) -> GnmiSwitchesConfig:
    # a stall deadline far above the 1 s samples: a loaded CI machine must not make a healthy switch look
    # stalled (its series would go and come back); the stall test sets its own
    base = {"enabled": True, "targets": targets, "interval": 1.0, "stall_intervals": 10.0, "connect_timeout": 2.0,
            "backoff_min": 0.05, "backoff_max": 0.2}
    base.update(kw)
    return GnmiSwitchesConfig(**base)


def _target(name: str, server: TargetServer, profile: str, **kw) -> GnmiTargetConfig:
    return GnmiTargetConfig(name=name, address=server.address, profile=profile, insecure=not kw.get("tls_ca"), **kw)


class Agent:
    """The agent's poll and exposition around one gnmi_switches source."""

    def __init__(self, cfg: GnmiSwitchesConfig) -> None:
        self.source = GnmiSwitchesSource(cfg)
        self.poller = Poller("switch-agent", [self.source], lambda: Inventory(sysfs_root="/nonexistent"))
        self.poller.poll_once()  # the first poll starts the subscriptions

    def scrape(self) -> str:
        return exposition(self.poller.poll_once()).decode()

    def value(self, family: str, **labels: str) -> float | None:
        text = self.scrape()
        for line in text.splitlines():
            if not line.startswith(family + "{"):
                continue
            lab = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}") + 1]))
            if all(lab.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    def wait_value(self, family: str, want: float, **labels: str) -> None:
        wait_until(lambda: self.value(family, **labels) == want, timeout=15,
                   what=f"{family}{labels} == {want} (last {self.value(family, **labels)})")

    def close(self) -> None:
        self.source.close()


@pytest.fixture
def servers():
    made: list[TargetServer] = []

    def make(profile: str, **kw) -> TargetServer:
        tls = kw.pop("tls", None)
        s = TargetServer(ScriptedTarget(profile, **kw), tls=tls)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def test_openconfig_exact_values_ramps_and_a_reset(servers):
    srv = servers("openconfig")
    agent = Agent(_cfg(_target("leaf-01", srv, "openconfig")))
    try:
        t = srv.target
        for leaf, v in (("in-errors", 7), ("in-discards", 3), ("out-discards", 2), ("in-fcs-errors", 5)):
            t.set(OC_COUNTERS, leaf, v)
        t.set(OC_QUEUE, "dropped-pkts", 11)
        t.set(OC_QUEUE, "ecn-marked-pkts", 13)
        sw = {"switch": "leaf-01", "port": "Ethernet1/1"}
        agent.wait_value("fabricmon_switch_port_errors_total", 7, counter="in_errors", **sw)
        agent.wait_value("fabricmon_switch_port_errors_total", 3, counter="in_discards", **sw)
        agent.wait_value("fabricmon_switch_port_errors_total", 2, counter="out_discards", **sw)
        agent.wait_value("fabricmon_switch_port_errors_total", 5, counter="fcs", **sw)
        agent.wait_value("fabricmon_switch_queue_dropped_packets_total", 11, queue="3", **sw)
        agent.wait_value("fabricmon_switch_ecn_marked_packets_total", 13, queue="3", **sw)
        # one sample is several notifications (and one stream per SONiC DB): each value is waited for
        agent.wait_value("fabricmon_switch_port_receive_bytes_total", 1000000, **sw)
        agent.wait_value("fabricmon_switch_port_up", 1, **sw)
        agent.wait_value("fabricmon_switch_transceiver_input_power_dbm", -2.31, lane="0", **sw)
        agent.wait_value("fabricmon_switch_transceiver_pre_fec_ber", 1.2e-07, **sw)
        # the far end of each cable from the switch's LLDP (openconfig-lldp): a host that sends its MAC as
        # port ID is named by its port description; a neighbour's domain is stripped as the import does
        agent.wait_value("fabricmon_switch_port_info", 1, peer="h7", peer_port="ens5f0np0", peer_type="unknown", **sw)
        agent.wait_value("fabricmon_switch_port_info", 1, switch="leaf-01", port="Ethernet1/2", peer="spine-01",
                         peer_port="Ethernet3/1")
        # openconfig models no PFC configuration: not checked, and a metric says so
        assert agent.value("fabricmon_switch_lossless_config_checked", switch="leaf-01", profile="openconfig") == 0
        assert agent.value("fabricmon_switch_port_pfc_enabled_priorities", **sw) is None
        # a ramp, then the switch's counters cleared (a reset, never a negative step)
        t.set(OC_COUNTERS, "in-errors", 40)
        agent.wait_value("fabricmon_switch_port_errors_total", 40, counter="in_errors", **sw)
        t.set(OC_COUNTERS, "in-errors", 4)
        agent.wait_value("fabricmon_switch_port_errors_total", 44, counter="in_errors", **sw)
        assert agent.value("fabricmon_switch_gnmi_up", switch="leaf-01") == 1
        # one connection: every path in one Subscribe, SAMPLE every interval, STREAM mode
        req = t.subscribes[0].subscribe
        assert t.streams_opened == 1 and req.mode == 0 and {s.mode for s in req.subscription} == {2}
        assert {s.sample_interval for s in req.subscription} == {1_000_000_000}
    finally:
        agent.close()


SONIC_PORT = "COUNTERS/Ethernet0"


def test_sonic_exact_values_per_priority_pfc_watchdog_and_lossless_settings(servers):
    srv = servers("sonic")
    agent = Agent(_cfg(_target("leaf-02", srv, "sonic")))
    try:
        t = srv.target
        t.set("", SONIC_PORT, "17", "SAI_PORT_STAT_IF_IN_ERRORS", target="COUNTERS_DB")
        t.set("", SONIC_PORT, "1234", "SAI_PORT_STAT_PFC_3_RX_PKTS", target="COUNTERS_DB")
        t.set("", SONIC_PORT, "99", "SAI_PORT_STAT_PFC_3_TX_PKTS", target="COUNTERS_DB")
        t.set("", SONIC_PORT, "5", "SAI_PORT_STAT_PFC_4_TX_PKTS", target="COUNTERS_DB")
        t.set("", "COUNTERS/Ethernet*/Queues", "21", "Ethernet0:3/SAI_QUEUE_STAT_DROPPED_PACKETS",
              target="COUNTERS_DB")
        t.set("", "COUNTERS/Ethernet*/Queues", "4321", "Ethernet0:3/SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS",
              target="COUNTERS_DB")
        t.set("", "COUNTERS/Ethernet*/Pfcwd", "2", "Ethernet0:3/PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED",
              target="COUNTERS_DB")
        sw = {"switch": "leaf-02", "port": "Ethernet0"}
        agent.wait_value("fabricmon_switch_port_errors_total", 17, counter="in_errors", **sw)
        agent.wait_value("fabricmon_switch_pfc_frames_total", 1234, priority="3", direction="rx", **sw)
        agent.wait_value("fabricmon_switch_pfc_frames_total", 99, priority="3", direction="tx", **sw)
        agent.wait_value("fabricmon_switch_pfc_frames_total", 5, priority="4", direction="tx", **sw)
        agent.wait_value("fabricmon_switch_pfc_frames_total", 0, priority="0", direction="rx", **sw)
        agent.wait_value("fabricmon_switch_queue_dropped_packets_total", 21, queue="3", **sw)
        agent.wait_value("fabricmon_switch_ecn_marked_packets_total", 4321, queue="3", **sw)
        agent.wait_value("fabricmon_switch_pfc_watchdog_storms_total", 2, priority="3", **sw)
        agent.wait_value("fabricmon_switch_port_up", 1, **sw)  # APPL_DB: a stream of its own
        agent.wait_value("fabricmon_switch_port_info", 1, peer="h7", peer_port="ens5f0np0", **sw)  # LLDP
        # CONFIG_DB: PFC on 3 and 4 (PORT_QOS_MAP), ECN on queues 3 and 4 (QUEUE -> WRED_PROFILE ecn_all)
        agent.wait_value("fabricmon_switch_lossless_config_checked", 1, switch="leaf-02", profile="sonic")
        assert agent.value("fabricmon_switch_port_pfc_enabled_priorities", **sw) == (1 << 3) | (1 << 4)
        assert agent.value("fabricmon_switch_port_ecn_marking_queues", **sw) == (1 << 3) | (1 << 4)  # not 0
        # "Ethernet4|3-4": a range of queues in one CONFIG_DB key
        assert agent.value("fabricmon_switch_port_ecn_marking_queues", switch="leaf-02", port="Ethernet4") == 24
        # the operator takes priority 3 out of PFC on Ethernet0: the switch port reads 0 for it
        t.set("", "PORT_QOS_MAP", "4", "Ethernet0/pfc_enable", target="CONFIG_DB")
        agent.wait_value("fabricmon_switch_port_pfc_enabled_priorities", 1 << 4, **sw)
        # the exposition of every switch family passes promtool's parser and linter
        from support.promtools import require_binary

        proc = subprocess.run([require_binary(["promtool"]), "check", "metrics"], input=agent.scrape().encode(),
                              capture_output=True, timeout=60)
        assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
        # one channel, one Subscribe per SONiC DB (the prefix target names the DB)
        assert sorted(r.subscribe.prefix.target for r in t.subscribes) == ["APPL_DB", "CONFIG_DB", "COUNTERS_DB"]
    finally:
        agent.close()


def test_tls_and_credentials_re_read_at_sighup(servers, tmp_path: Path):
    from support.certs import make_pki

    pki = make_pki(tmp_path, {})
    user, pw = tmp_path / "user", tmp_path / "password"
    user.write_text("fabricmon\n")
    pw.write_text("old-secret\n")
    srv = servers("openconfig", tls=pki["server"], credentials=("fabricmon", "new-secret"))
    tgt = GnmiTargetConfig(name="leaf-03", address=srv.address, profile="openconfig", tls_ca=str(pki["ca"]),
                           tls_server_name="aggregator.test", username_file=str(user), password_file=str(pw))
    agent = Agent(_cfg(tgt))
    try:
        wait_until(lambda: (agent.value("fabricmon_switch_gnmi_failures_total", switch="leaf-03", reason="auth")
                            or 0) >= 1, timeout=15, what="the switch refuses the old password")
        assert agent.value("fabricmon_switch_port_errors_total", switch="leaf-03") is None  # costs its series
        pw.write_text("new-secret\n")
        assert agent.source.refresh_credentials() == ["leaf-03"]  # what SIGHUP calls
        agent.wait_value("fabricmon_switch_gnmi_up", 1, switch="leaf-03")
        assert srv.target.metadata[-1]["password"] == "new-secret"
        agent.wait_value("fabricmon_switch_port_errors_total", 0, switch="leaf-03", port="Ethernet1/1",
                         counter="in_errors")
    finally:
        agent.close()


def test_a_stalled_a_huge_and_a_garbage_switch_cost_only_their_own_series(servers):
    good, stalled, huge, garbage = (servers("openconfig"), servers("sonic"), servers("openconfig"),
                                    servers("openconfig"))
    stalled.target.mode = "stall"
    huge.target.mode = "oversize"
    garbage.target.mode = "garbage"
    agent = Agent(_cfg(_target("good", good, "openconfig"), _target("stalled", stalled, "sonic"),
                       _target("huge", huge, "openconfig"), _target("garbage", garbage, "openconfig"),
                       stall_intervals=2.0))
    try:
        agent.wait_value("fabricmon_switch_port_errors_total", 0, switch="good", port="Ethernet1/1",
                         counter="in_errors")

        def failures(name: str, reason: str) -> float:
            return agent.value("fabricmon_switch_gnmi_failures_total", switch=name, reason=reason) or 0

        wait_until(lambda: failures("stalled", "stalled") >= 1, timeout=20, what="the stall is counted")
        wait_until(lambda: failures("huge", "oversize") >= 1, timeout=20, what="the 10 MB update is counted")
        wait_until(lambda: failures("garbage", "malformed") >= 2, timeout=20, what="malformed updates counted")
        # the good switch keeps streaming: a value set now arrives while the others misbehave
        good.target.set(OC_COUNTERS, "in-errors", 123)
        agent.wait_value("fabricmon_switch_port_errors_total", 123, switch="good", port="Ethernet1/1",
                         counter="in_errors")
        # the garbage switch's readable values still count; its malformed ones ("-12 errors") never replace them
        agent.wait_value("fabricmon_switch_port_errors_total", 0, switch="garbage", port="Ethernet1/1",
                         counter="in_errors")
        assert agent.value("fabricmon_switch_gnmi_updates_total", switch="garbage") > 0
        # the huge switch never delivers its oversized message, and its series go with the session
        assert failures("huge", "oversize") >= 1
        # the poll never waits on a switch: a stalled switch's handler is blocked right now
        t0 = time.monotonic()
        snap = agent.poller.poll_once()
        assert time.monotonic() - t0 < agent.source.timeout
        assert snap is not None
        assert agent.value("fabricmon_collector_up", collector="gnmi_switches") == 1
    finally:
        agent.close()


def test_a_switch_that_disconnects_is_reconnected_with_backoff(servers):
    srv = servers("openconfig")
    srv.target.disconnect_after = 2
    agent = Agent(_cfg(_target("leaf-04", srv, "openconfig")))
    try:
        wait_until(lambda: srv.target.streams_opened >= 3, timeout=20, what="three sessions")
        wait_until(lambda: (agent.value("fabricmon_switch_gnmi_failures_total", switch="leaf-04", reason="ended")
                            or 0) >= 2, timeout=10, what="each end counted")
        srv.target.disconnect_after = None
        srv.target.set(OC_COUNTERS, "in-errors", 9)
        agent.wait_value("fabricmon_switch_port_errors_total", 9, switch="leaf-04", port="Ethernet1/1",
                         counter="in_errors")
    finally:
        agent.close()


def test_an_unreachable_switch_is_counted_and_the_rest_serve(servers):
    from support.net import free_port

    srv = servers("openconfig")
    dead = GnmiTargetConfig(name="dead", address=f"127.0.0.1:{free_port()}", profile="openconfig", insecure=True)
    agent = Agent(_cfg(_target("alive", srv, "openconfig"), dead, connect_timeout=0.2))
    try:
        wait_until(lambda: (agent.value("fabricmon_switch_gnmi_failures_total", switch="dead",
                                        reason="unreachable") or 0) >= 1, timeout=15, what="unreachable counted")
        agent.wait_value("fabricmon_switch_gnmi_up", 1, switch="alive")
        assert agent.value("fabricmon_switches_gnmi_unreachable") == 1
        assert agent.value("fabricmon_switch_gnmi_up", switch="dead") == 0
    finally:
        agent.close()


@pytest.mark.parametrize("doc, problem", [
    ({"enabled": True}, "targets: enabled with no switch"),
    ({"targets": [{"name": "a", "address": "h:1", "profile": "eos", "insecure": True}]}, "profile: must be one of"),
    ({"targets": [{"name": "a", "address": "h:1"}]}, "tls_ca: required unless insecure"),
    ({"targets": [{"name": "a", "address": "h:1", "insecure": True, "username_file": "u"}]},
     "username_file and password_file go together"),
    ({"targets": [{"name": "a", "address": "h:1", "insecure": True},
                  {"name": "a", "address": "h:2", "insecure": True}]}, "targets[1].name: 'a' already names"),
    ({"targets": [{"name": "a", "address": "nohost", "insecure": True}]}, "address: expected HOST:PORT"),
])
def test_config_errors_name_the_field(doc, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        build(GnmiSwitchesConfig, doc, "sources.gnmi_switches", "agent.yaml")


def test_agent_sighup_re_reads_the_switch_credentials(servers, tmp_path: Path):
    """``Agent.reload`` (what the agent's SIGHUP runs) with an unchanged config: the switch whose password
    file changed reconnects with the new password."""
    import dataclasses

    from fabricmon.agent.wiring import build_live_agent
    from fabricmon.config import IntakeConfig
    from support.agentrig import SimNode, sim_agent_config

    user, pw = tmp_path / "user", tmp_path / "password"
    user.write_text("fabricmon\n")
    pw.write_text("old-secret\n")
    srv = servers("openconfig", credentials=("fabricmon", "new-secret"))
    node = SimNode(tmp_path / "node")
    base = sim_agent_config(node.tree, 0.5)
    gnmi = _cfg(GnmiTargetConfig(name="leaf-05", address=srv.address, profile="openconfig", insecure=True,
                                 username_file=str(user), password_file=str(pw)))
    cfg = dataclasses.replace(base, intake=IntakeConfig(listen=None, socket=None),
                              sources=dataclasses.replace(base.sources, gnmi_switches=gnmi))
    agent = build_live_agent(cfg)
    agent.start_polling()

    def up() -> float | None:
        snap = agent.poller.latest
        return next((s.value for s in (snap.samples if snap else ()) if s.family == "fabricmon_switch_gnmi_up"), None)

    try:
        wait_until(lambda: srv.target.streams_opened >= 1 and up() == 0, timeout=15, what="refused at first")
        assert str(pw) in agent.secret_files()  # a rotation on disk runs the same reload (filewatch.py)
        assert agent.reload(cfg) == []  # nothing changed
        pw.write_text("new-secret\n")
        assert agent.reload(cfg) == ["sources.gnmi_switches credential files (contents: reconnecting those switches)"]
        wait_until(lambda: up() == 1, timeout=15, what="the switch takes the new password")
        assert srv.target.metadata[-1]["password"] == "new-secret"
    finally:
        agent.stop()
        node.stop()


def test_check_config_names_a_missing_switch_credential_file(tmp_path: Path, capsys):
    from fabricmon.cli import main

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"""
sources:
  gnmi_switches:
    enabled: true
    targets:
      - {{name: leaf-01, address: "10.0.0.1:8080", profile: sonic, tls_ca: {ca},
         username_file: {tmp_path / 'user'}, password_file: {tmp_path / 'pw'}}}
""")
    assert main(["check-config", str(cfg)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"agent.yaml: sources.gnmi_switches.targets[0].username_file: "
                                             f"{tmp_path / 'user'}: no such file")
