"""A token is rotated or revoked with a SIGHUP, never a restart (issue 21, item 4).

The aggregator runs as the service runs it (``run_aggregator``: config file, the reload event a
SIGHUP sets, real gRPC and HTTP on 127.0.0.1); agents are real ``StreamClient``s reading their
own token files.  Rotation: add the new token, roll the agents, remove the old one; each step is
a reload that re-reads the file contents, and removing a token cuts the streams that used it.
"""

from __future__ import annotations

import pytest
import yaml

from fabricmon.configload import ConfigError
from support.aggrig import Agent, Aggregator, Rig
from support.waiting import wait_until


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def test_shared_token_rotation_add_roll_remove_cuts_only_the_old_token(tmp_path, rig):
    shared = tmp_path / "shared.token"
    shared.write_text("old-token-0123456789\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    a = rig(Agent, agg, "node-000", "old-token-0123456789")
    assert wait_until(lambda: a.client.connected, 10), a.client.last_error

    # 1. add the new token: both accepted, the live stream untouched
    shared.write_text("old-token-0123456789\nnew-token-9876543210\n")
    assert agg.hup()
    b = rig(Agent, agg, "node-001", "new-token-9876543210")
    assert wait_until(lambda: b.client.connected, 10), b.client.last_error
    assert a.client.connected and a.connects() == 1
    assert agg.value("fabricmon_agents_connected") == 2

    # 2. remove the old token: the stream that presented it is cut at once, the other stays
    shared.write_text("new-token-9876543210\n")
    assert agg.hup()
    assert wait_until(lambda: agg.revoked() == 1, 10), agg.metrics()
    assert wait_until(lambda: "UNAUTHENTICATED" in a.client.last_error, 10), a.client.last_error
    assert not a.client.connected and b.client.connected and b.connects() == 1
    # its reconnects with the removed token are refused
    refused = agg.value('fabricmon_grpc_streams_refused_total{reason="unauthenticated"}')
    assert wait_until(lambda: agg.value('fabricmon_grpc_streams_refused_total{reason="unauthenticated"}')
                      > refused, 10)
    assert agg.value("fabricmon_agents_connected") == 1

    # 3. the rolled agent (its file now holds the new token) reconnects on its own
    a.token_file.write_text("new-token-9876543210\n")
    assert wait_until(lambda: a.client.connected, 10), a.client.last_error
    assert agg.value("fabricmon_agents_connected") == 2 and agg.revoked() == 1


def test_revoked_per_node_token_is_cut_and_the_others_stay(tmp_path, rig):
    tokens = tmp_path / "node-tokens.yaml"
    tokens.write_text(yaml.safe_dump({"node-000": "tok-zero-aaaaaaaa", "node-001": "tok-one-bbbbbbbb"}))
    agg = rig(Aggregator, {"node_tokens_file": str(tokens)})
    a = rig(Agent, agg, "node-000", "tok-zero-aaaaaaaa")
    b = rig(Agent, agg, "node-001", "tok-one-bbbbbbbb")
    assert wait_until(lambda: a.client.connected and b.client.connected, 10)

    # node-001's token leaked: a new one is issued (a list during the roll), then the old one removed
    tokens.write_text(yaml.safe_dump({"node-000": "tok-zero-aaaaaaaa",
                                      "node-001": ["tok-one-bbbbbbbb", "tok-one-cccccccc"]}))
    assert agg.hup()
    assert agg.revoked() == 0 and b.connects() == 1
    tokens.write_text(yaml.safe_dump({"node-000": "tok-zero-aaaaaaaa", "node-001": "tok-one-cccccccc"}))
    assert agg.hup()
    assert wait_until(lambda: agg.revoked() == 1 and not b.client.connected, 10), agg.metrics()
    assert a.client.connected and a.connects() == 1
    b.token_file.write_text("tok-one-cccccccc\n")
    assert wait_until(lambda: b.client.connected, 10), b.client.last_error

    # a token file that cannot be used is refused with one line, nothing applied, gauge 0
    tokens.write_text(yaml.safe_dump({"node-000": "same-token-xxxxxx", "node-001": "same-token-xxxxxx"}))
    assert not agg.hup()
    assert a.client.connected and b.client.connected and agg.revoked() == 1


def test_a_reload_that_cannot_read_the_token_file_changes_nothing(tmp_path, rig):
    shared = tmp_path / "shared.token"
    shared.write_text("only-token-0123456789\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    a = rig(Agent, agg, "node-000", "only-token-0123456789")
    assert wait_until(lambda: a.client.connected, 10)
    shared.write_text("\n")
    assert not agg.hup()
    shared.unlink()
    assert not agg.hup()
    assert a.client.connected and agg.revoked() == 0


def test_agent_presents_the_last_line_and_reconnects_when_its_file_changes_on_reload(tmp_path, rig):
    shared = tmp_path / "shared.token"
    shared.write_text("first-token-aaaaaaaa\nsecond-token-bbbbbbbb\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    a = rig(Agent, agg, "node-000", "first-token-aaaaaaaa")
    assert wait_until(lambda: a.client.connected, 10)
    assert a.client.refresh_credentials() is False  # unchanged: the stream stays
    # the agent's Secret gets the new token appended (the rotation's second step) and the agent a SIGHUP
    a.token_file.write_text("first-token-aaaaaaaa\nsecond-token-bbbbbbbb\n")
    assert a.client.refresh_credentials() is True
    assert wait_until(lambda: a.connects() == 2 and a.client.connected, 10), a.client.last_error
    # it now presents the second token: removing the first cuts nothing
    shared.write_text("second-token-bbbbbbbb\n")
    assert agg.hup()
    assert agg.revoked() == 0 and a.client.connected and a.connects() == 2


def test_token_files_are_read_for_contents(tmp_path):
    from fabricmon.aggregator.config import AuthSettings
    from fabricmon.aggregator.credentials import load_credentials

    f = tmp_path / "t"
    f.write_text("a-token\n\n  b-token  \n")
    creds = load_credentials(AuthSettings(token_file=str(f)), "agg.yaml")
    assert creds.shared == {b"a-token", b"b-token"}
    f.write_text("two words\n")
    with pytest.raises(ConfigError, match=r"^agg.yaml: auth.token_file: .*line 1 holds whitespace"):
        load_credentials(AuthSettings(token_file=str(f)), "agg.yaml")
    n = tmp_path / "n.yaml"
    n.write_text("node-000: [x1, x2]\nnode-001: x2\n")
    with pytest.raises(ConfigError, match=r"auth.node_tokens_file: .*node-001: token also used by another node"):
        load_credentials(AuthSettings(node_tokens_file=str(n)), "agg.yaml")


def test_agent_sighup_rereads_its_token_file_and_reconnects_with_the_new_token(tmp_path, rig):
    """``Agent.reload`` (what the agent's SIGHUP runs) on a live agent polling a simulated node."""
    import dataclasses

    from fabricmon.agent.wiring import build_live_agent
    from fabricmon.config import IntakeConfig, StreamConfig
    from support.agentrig import SimNode, sim_agent_config

    shared = tmp_path / "shared.token"
    shared.write_text("first-token-aaaaaaaa\nsecond-token-bbbbbbbb\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    node = SimNode(tmp_path / "node")
    mine = tmp_path / "agent.token"
    mine.write_text("first-token-aaaaaaaa\n")
    cfg = dataclasses.replace(sim_agent_config(node.tree, 0.5), aggregator=f"127.0.0.1:{agg.grpc}",
                              stream=StreamConfig(spool_dir=str(tmp_path / "spool"), token_file=str(mine)),
                              intake=IntakeConfig(listen=None, socket=None))
    agent = build_live_agent(cfg, stream_backoff=(0.05, 0.5))
    agent.start_polling()
    try:
        assert wait_until(lambda: agent.stream.connected, 15), agent.stream.last_error
        assert agent.reload(cfg) == []  # nothing changed: the stream stays
        mine.write_text("first-token-aaaaaaaa\nsecond-token-bbbbbbbb\n")
        assert agent.reload(cfg) == ["stream.token_file (contents: reconnecting with the new token)"]
        assert wait_until(lambda: agent.stream.connected and agent.stream.stats()["connects_total"] == 2, 15)
        shared.write_text("second-token-bbbbbbbb\n")
        assert agg.hup() and agg.revoked() == 0 and agent.stream.connected
        # a token file the agent cannot read fails the reload and leaves the stream as it is
        mine.unlink()
        with pytest.raises(ConfigError, match=r"^stream.token_file: cannot read .*agent.token"):
            agent.reload(cfg)
        assert agent.stream.connected and agent.stream.stats()["connects_total"] == 2
    finally:
        agent.stop()
        node.stop()
