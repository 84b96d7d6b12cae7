"""Node and job names: one rule (textcheck.name_problem) at the agent, the aggregator's decode,
check-config and topology files: node <= 253 characters, job <= 128, printable, no bidi or
zero-width controls (issue 26: a 201-character node name passed the agent and was refused by the
aggregator on every reconnect; ``node-000`` + U+202E paged as ``node-000``)."""

from __future__ import annotations

import pytest

from fabricmon.cli import main
from fabricmon.config import AgentConfig
from fabricmon.configload import ConfigError
from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.textcheck import INVISIBLE_CONTROLS, job_name_problem, node_name_problem

INVISIBLE = [chr(c) for c in (0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
                              0x2066, 0x2067, 0x2068, 0x2069, 0x061C)]
K8S_LONGEST = "n" * 253  # a valid Kubernetes node name (DNS subdomain) at its maximum


def test_the_rule_itself():
    assert set(INVISIBLE) == INVISIBLE_CONTROLS
    assert node_name_problem(K8S_LONGEST) is None
    assert "at most 253" in node_name_problem("n" * 254)
    assert job_name_problem("j" * 128) is None and "at most 128" in job_name_problem("j" * 129)
    for c in INVISIBLE:
        assert f"U+{ord(c):04X}" in node_name_problem("node-000" + c), c
        assert job_name_problem("train" + c) is not None
    assert node_name_problem("node\t1") is not None and node_name_problem("") is not None


def _hello(node: str) -> pb.Hello:
    return pb.Hello(node=node, protocol_version=codec.PROTOCOL_VERSION, interval_seconds=1.0)


def test_aggregator_takes_a_kubernetes_length_node_name():
    assert codec.hello_from_pb(_hello(K8S_LONGEST)).node == K8S_LONGEST  # refused (> 200) on 270f287


@pytest.mark.parametrize("c", INVISIBLE)
def test_aggregator_refuses_invisible_controls_in_node_names(c):
    with pytest.raises(codec.MalformedBatch, match="hello.node: holds the invisible control"):
        codec.hello_from_pb(_hello("node-000" + c))


def test_aggregator_refuses_invisible_controls_in_job_names():
    dec = codec.SeriesDecoder()
    m = pb.Batch(seq=1, ts=1.0, ranks=[pb.RankTiming(job="llm-7b\u202e", rank=0, step=1, step_seconds=1.0, ts=1.0)])
    with pytest.raises(codec.MalformedBatch, match="ranks.job: holds the invisible control U\\+202E"):
        dec.decode(m, "node-000")
    m = pb.Batch(seq=1, ts=1.0, layouts=[pb.JobLayout(job="llm\u200b7b", layout=[pb.IntPair(key="tp", value=8)])])
    with pytest.raises(codec.MalformedBatch, match="layouts.job"):
        dec.decode(m, "node-000")


def test_agent_refuses_a_name_the_aggregator_would_refuse(tmp_path):
    from fabricmon.agent.runtime import resolve_node_name

    assert resolve_node_name(AgentConfig(node_name=K8S_LONGEST)) == K8S_LONGEST
    with pytest.raises(ConfigError, match="node_name: 254 characters, at most 253"):
        AgentConfig(node_name="n" * 254).validate("", "agent.yaml")
    # a fixture tree's hostname file is held to the same rule, with the file named
    (tmp_path / "sys").mkdir()
    (tmp_path / "hostname").write_text("node-000\u202e\n")
    with pytest.raises(ConfigError, match=r"hostname: node name .*U\+202E"):
        resolve_node_name(AgentConfig(sysfs_root=str(tmp_path / "sys")))


def test_check_config_names_the_bad_node_name(tmp_path, capsys):
    p = tmp_path / "agent.yaml"
    p.write_text(f"node_name: {'n' * 254}\ninterval: 1\n")
    assert main(["check-config", "--kind", "agent", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(p) in err and "node_name: 254 characters" in err, err


def test_topology_node_names_follow_the_rule(tmp_path, capsys):
    p = tmp_path / "topo.yaml"
    p.write_text('nodes:\n  - {name: "node-000\\u202e", unit: 0}\n')
    assert main(["check-config", "--kind", "topology", str(p)]) == 2
    err = capsys.readouterr().err
    assert "nodes[0].name: holds the invisible control U+202E" in err, err
