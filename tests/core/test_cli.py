"""The command line as the systemd units run it, and its one-line start errors (exit 2)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fabricmon.cli import build_parser, main
from support.procrig import REPO, Proc, agent_config, busy_port, free_port, metrics, render_node, short_dir, wait_until

SYSTEMD = REPO / "systemd"


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabricmon", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    # Log lines of parts started before the failure may precede it; the error is the one last line.
    errors = [ln for ln in lines if "error" in ln.lower()]
    assert errors == [lines[-1]] and lines[-1].startswith("fabricmon: error: "), res.stderr
    for n in needles:
        assert n in lines[-1], lines[-1]


def _unit_argv(role: str, fabricmon_args: str, config: Path) -> list[str]:
    """ExecStart of the unit with $FABRICMON_ARGS split as systemd splits an unquoted $VAR."""
    unit = (SYSTEMD / f"fabricmon-{role}.service").read_text()
    exec_start = next(ln.partition("=")[2] for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(exec_start.replace("$FABRICMON_ARGS", fabricmon_args))
    assert argv[0] == "/usr/local/bin/fabricmon" and argv[1] == role
    return [a if a != f"/etc/fabricmon/{role}.yaml" else str(config) for a in argv[1:]]


@pytest.mark.parametrize("argv", [
    ["--log-level", "debug", "agent"],
    ["agent", "--log-level", "debug"],
    ["agent", "--config", "x.yaml", "--log-level", "debug", "--log-format", "json"],
])
def test_global_flags_anywhere(argv) -> None:
    args = build_parser().parse_args(argv)
    assert args.log_level == "debug"


def test_flag_before_subcommand_not_overwritten_by_default() -> None:
    args = build_parser().parse_args(["--log-format", "console", "aggregator", "--config", "a.yaml"])
    assert args.log_format == "console" and args.log_level is None


@pytest.mark.parametrize("fabricmon_args,expect_json,expect_info", [
    ("", False, True),                        # the config: console format, info level
    ("--log-format json", True, True),        # flag after the subcommand wins over the config
    ("--log-level warning", False, False),
])
def test_unit_command_line_with_log_flags_after_subcommand(tmp_path, fabricmon_args, expect_json,
                                                           expect_info) -> None:
    """The agent unit's ExecStart, $FABRICMON_ARGS after the subcommand, on a config saying console/info."""
    import shutil

    tree = render_node(tmp_path / "node")
    sockdir = short_dir()
    port = free_port()
    cfg = agent_config(tree, listen=f"127.0.0.1:{port}", aggregator=None, spool=tmp_path / "spool",
                       sock=f"{sockdir}/ranks.sock")
    cfg["log"] = {"format": "console", "level": "info"}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = Proc(_unit_argv("agent", fabricmon_args, path), tmp_path / "agent.log")
    try:
        assert wait_until(lambda: "fabricmon_collector_up" in metrics(port), 30), proc.text()
    finally:
        assert proc.stop() == 0
        shutil.rmtree(sockdir, ignore_errors=True)
    text = proc.text()
    assert ("agent_stopping" in text) == expect_info, text
    if expect_info:
        assert ('"event": "agent_stopping"' in text) == expect_json, text


def test_busy_port_is_one_line_exit_2(tmp_path) -> None:
    tree = render_node(tmp_path / "node")
    sock, port = busy_port()
    sockdir = short_dir()
    try:
        cfg = agent_config(tree, listen=f"127.0.0.1:{port}", aggregator=None, spool=tmp_path / "spool",
                           sock=f"{sockdir}/ranks.sock")
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(cfg))
        _one_line_error(_run("agent", "--config", str(path)), f"127.0.0.1:{port}", "address already in use")
    finally:
        sock.close()
        import shutil

        shutil.rmtree(sockdir, ignore_errors=True)


def test_aggregator_busy_port_is_one_line_exit_2(tmp_path) -> None:
    from support.procrig import topology_yaml

    sock, port = busy_port()
    try:
        cfg = {"topology": str(topology_yaml(tmp_path / "t.yaml")), "grpc_listen": f"127.0.0.1:{free_port()}",
               "http_listen": f"127.0.0.1:{port}", "auth": {"insecure": True}}
        path = tmp_path / "aggregator.yaml"
        path.write_text(yaml.safe_dump(cfg))
        _one_line_error(_run("aggregator", "--config", str(path)), "address already in use")
    finally:
        sock.close()


def test_missing_config_is_one_line_exit_2(tmp_path) -> None:
    _one_line_error(_run("agent", "--config", str(tmp_path / "nope.yaml")), "nope.yaml")
    _one_line_error(_run("aggregator", "--config", str(tmp_path / "nope.yaml")), "nope.yaml")
    _one_line_error(_run("agent", "--web.config.file", str(tmp_path / "web.yml")), "web.yml")


def test_placeholder_token_refused(tmp_path) -> None:
    """The Kubernetes example Secret ships CHANGE-ME: a token file holding it is refused."""
    secret = yaml.safe_load((REPO / "deploy/kubernetes/base/token-secret.yaml").read_text())
    placeholder = next(iter((secret.get("stringData") or secret.get("data")).values()))
    token = tmp_path / "token"
    token.write_text(placeholder + "\n")
    from support.procrig import topology_yaml

    agg = tmp_path / "aggregator.yaml"
    agg.write_text(yaml.safe_dump({"topology": str(topology_yaml(tmp_path / "t.yaml")),
                                   "auth": {"token_file": str(token)}}))
    assert main(["aggregator", "--config", str(agg)]) == 2
    agent = tmp_path / "agent.yaml"
    agent.write_text(yaml.safe_dump({"stream": {"token_file": str(token)}}))
    _one_line_error(_run("agent", "--config", str(agent)), "stream.token_file", "placeholder")


# ------------------------------------------------------------------ check-config kinds


def test_check_config_topology_with_bad_layout_is_judged_as_topology(tmp_path, capsys) -> None:
    p = tmp_path / "topo.yaml"
    p.write_text("cluster: x\nlayout: infiniband\nnodes_per_unit: 4\ngenerate: {nodes: 4}\n")
    assert main(["check-config", str(p)]) == 2
    err = capsys.readouterr().err
    assert "layout: must be ib or roce" in err, err


def test_check_config_configmap_is_named(capsys) -> None:
    cm = REPO / "deploy/kubernetes/base/agent-configmap.yaml"
    assert main(["check-config", str(cm)]) == 2
    err = capsys.readouterr().err
    assert "Kubernetes ConfigMap" in err and "data.agent.yaml" in err and "apiVersion" not in err, err


def test_check_config_ambiguous_asks_for_kind(tmp_path, capsys) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("what: ever\n")
    assert main(["check-config", str(p)]) == 2
    assert "--kind" in capsys.readouterr().err


@pytest.mark.parametrize("name,kind", [("agent.yaml", "agent"), ("topology.yaml", "topology")])
def test_check_config_example_kinds(name, kind, capsys) -> None:
    # the examples name the installed token, /etc/fabricmon/token: absent in a checkout
    assert main(["check-config", "--skip-secrets", str(SYSTEMD / "etc" / "fabricmon" / name)]) == 0
    assert f"({kind} config)" in capsys.readouterr().out


@pytest.mark.parametrize("value,ok", [("0660", True), ("0666", True), ('"0666"', False), ("01777", False)])
def test_intake_socket_mode_validated(tmp_path, capsys, value, ok) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(f"intake:\n  socket_mode: {value}\n")
    assert main(["check-config", "--kind", "agent", str(p)]) == (0 if ok else 2)
    if not ok:
        assert "intake.socket_mode" in capsys.readouterr().err


# ------------------------------------------------------------------ check-config: secrets


def _secret_configs(tmp_path: Path, token: Path) -> tuple[Path, Path]:
    from support.procrig import topology_yaml

    agg = tmp_path / "aggregator.yaml"
    agg.write_text(yaml.safe_dump({"topology": str(topology_yaml(tmp_path / "t.yaml")),
                                   "auth": {"token_file": str(token)}}))
    agent = tmp_path / "agent.yaml"
    agent.write_text(yaml.safe_dump({"aggregator": "127.0.0.1:9721", "stream": {"token_file": str(token)}}))
    return agg, agent


@pytest.mark.parametrize("content, problem", [(None, "no such file"), ("CHANGE-ME\n", "placeholder"),
                                              ("\n", "is empty")])
def test_check_config_refuses_token_files_that_cannot_stream(tmp_path, capsys, content, problem) -> None:
    """A missing token file, an empty one and the deploy examples' CHANGE-ME passed check-config and then
    stopped streaming at start: now one line naming the file, the field and the problem, exit 2."""
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    agg, agent = _secret_configs(tmp_path, token)
    for path, field in ((agg, "auth.token_file"), (agent, "stream.token_file")):
        assert main(["check-config", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{path}: {field}: " in err[0] and str(token) in err[0] and problem in err[0], err
        # CI lints configs without their secrets: everything else is still checked
        assert main(["check-config", "--skip-secrets", str(path)]) == 0, capsys.readouterr().err
        assert "ok (" in capsys.readouterr().out


def test_check_config_passes_a_real_token_and_skip_secrets_still_checks_the_rest(tmp_path, capsys) -> None:
    token = tmp_path / "token"
    token.write_text("9f2c4e51a7d3b8e6\n")
    agg, agent = _secret_configs(tmp_path, token)
    assert main(["check-config", str(agg)]) == 0 and main(["check-config", str(agent)]) == 0
    capsys.readouterr()
    (tmp_path / "t.yaml").unlink()
    assert main(["check-config", "--skip-secrets", str(agg)]) == 2
    assert "topology: no such file" in capsys.readouterr().err
