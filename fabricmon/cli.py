"""Command line: ``fabricmon agent | aggregator | demo | check-config | collect | topology | remediation``."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import signal
import sys
import threading

import structlog

from . import __version__
from .configload import ConfigError
from .secretfiles import check_plain_file, check_token_file, refuse_placeholder_secret

EXIT_CONFIG = 2

LOG_FORMATS = ["auto", "json", "console"]
LOG_LEVELS = ["debug", "info", "warning", "error"]


def _global_flags(parser: argparse.ArgumentParser, default) -> None:
    """--log-format/--log-level on the top parser (default None) and again on every subcommand
    (default SUPPRESS, so a flag before the subcommand is not overwritten): the systemd units put
    $FABRICMON_ARGS after the subcommand, node_exporter style."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=default)
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=default)


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    _global_flags(p, argparse.SUPPRESS)
    return p


def _web_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                   help="TLS and basic auth for the HTTP listener (Prometheus exporter-toolkit web config)")


def _agent_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run the per-node agent", parents=[_common()])
    p.add_argument("--config", help="agent YAML config")
    p.add_argument("--sysfs-root", dest="sysfs_root", help="sysfs mount (default /sys)")
    p.add_argument("--host-root", dest="host_root",
                   help="where the host's / is mounted, for its /proc (default /; in a container e.g. /host)")
    p.add_argument("--ethtool-dir", dest="ethtool_dir",
                   help="directory of <if>.txt ethtool -S dumps (fixtures and simulation)")
    p.add_argument("--node-name", dest="node_name", help="node label (default: hostname)")
    p.add_argument("--listen", help="HOST:PORT for /metrics, /healthz, /readyz (default 0.0.0.0:9720)")
    p.add_argument("--interval", type=float, help="poll interval in seconds (default 1)")
    p.add_argument("--nvml", help="auto, off or fake:FILE")
    p.add_argument("--aggregator", help="HOST:PORT of the aggregator stream")
    p.add_argument("--unit", type=int, help="this node's scalable unit, for shard: (default: $FABRICMON_UNIT, "
                   "then shard.unit, shard.topology, shard.node_label)")
    p.add_argument("--nccl-inspector-dir", dest="nccl_inspector_dir", help="tail NCCL Inspector logs in this directory")
    p.add_argument("--ib-switches", dest="ib_switches", action="store_true", default=None,
                   help="sweep every InfiniBand switch port from this node (sources.ib_switches.enabled; "
                        "one node per subnet or plane)")
    p.add_argument("--once", action="store_true", help="poll once, print the Prometheus exposition, exit")
    p.add_argument("--capture", help="with --once: read the node from a 'fabricmon collect' archive")
    _web_flag(p)


def _collect_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="capture this node's RDMA sysfs, ethtool and NVML readings into an archive",
                       parents=[_common()])
    p.add_argument("--sysfs-root", dest="sysfs_root", default="/sys", help="sysfs mount (default /sys)")
    p.add_argument("--ethtool-dir", dest="ethtool_dir", help="take <if>.txt dumps from here instead of the ioctl")
    p.add_argument("--nvml", default="auto", help="auto, off or fake:FILE (default auto)")
    p.add_argument("--node-name", dest="node_name", help="node name to record (default: hostname)")
    p.add_argument("--out", required=True, help="archive to write (.tar.gz)")
    p.add_argument("--max-files", type=int, default=50_000)
    p.add_argument("--max-file-bytes", type=int, default=1 << 20)
    p.add_argument("--max-total-bytes", type=int, default=64 << 20)


def _check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-config", help="validate a config file and exit", parents=[_common()])
    p.add_argument("file")
    p.add_argument("--kind", choices=["agent", "aggregator", "topology", "scenario", "shardmap"], default=None,
                   help="what the file is (default: the kind whose keys the file's top-level keys are)")
    p.add_argument("--topology", help="shardmap: the topology whose units must each be owned once")
    p.add_argument("--skip-secrets", dest="skip_secrets", action="store_true",
                   help="do not check the token, key and certificate files the config names (for linting "
                        "configs in CI where the secrets are absent)")


def _topology_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topology", help="import the topology from the fabric, compare two topologies",
                       parents=[_common()])
    tsub = p.add_subparsers(dest="topology_command", required=True)
    imp = tsub.add_parser("import", parents=[_common()],
                          help="write a version-2 topology from ibnetdiscover output or lldpctl JSON")
    src = imp.add_mutually_exclusive_group(required=True)
    src.add_argument("--ibnetdiscover", action="extend", nargs="+", metavar="FILE",
                     help="ibnetdiscover output; repeat for several subnets or planes (merged by host and GUID)")
    src.add_argument("--lldp", metavar="DIR", help="directory of <node>.json, each `lldpctl -f json` (or json0)")
    imp.add_argument("--node-name-map", dest="node_name_map", metavar="FILE",
                     help="OpenSM node-name-map (GUID \"name\" per line) naming switches or CAs")
    imp.add_argument("--cluster", default="default", help="cluster name written into the topology")
    imp.add_argument("--keep-domain", dest="keep_domain", action="store_true",
                     help="keep host names' domains (default: gpu-a17-03.example.com is gpu-a17-03)")
    imp.add_argument("-o", "--output", required=True, metavar="OUT.yaml", help="topology file to write")
    d = tsub.add_parser("diff", parents=[_common()], help="what changed between two topology files "
                        "(exit 1 when anything did)")
    d.add_argument("old")
    d.add_argument("new")


def _aggregator_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("aggregator", help="run the central aggregator", parents=[_common()])
    p.add_argument("--config", required=True, help="aggregator YAML config")
    _web_flag(p)


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a simulated cluster with injected faults and show what fabricmon finds",
                       parents=[_common()])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--duration", type=float, default=120.0, help="simulated seconds")
    p.add_argument("--speed", type=float, default=10.0, help="simulated seconds per wall second")
    p.add_argument("--interval", type=float, default=1.0, help="agent interval in simulated seconds")
    p.add_argument("--scenario", help="scenario YAML (default: quiet, flaky cable, leaf degradation, recovery)")
    p.add_argument("--layout", choices=["ib", "roce"], default="ib")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--report-json", dest="report_json", help="write the report (faults, incidents, scores) here")
    p.add_argument("--workdir", help="where to write node trees (default: a temporary directory)")
    p.add_argument("--no-alertmanager", action="store_true", help="do not start Alertmanager even if installed")
    p.add_argument("--workers", type=int, default=None,
                   help="processes that render and poll the simulated nodes (default: CPU count, at most 4); "
                        "memory mode with more than 1: the agents' side of the wire in a worker process")
    p.add_argument("--mode", choices=["tree", "memory"], default="tree",
                   help="tree: real agents poll rendered node trees (small clusters); memory: in-memory batches "
                        "through the stream codec into the aggregator runtime (thousands of nodes)")
    p.add_argument("--no-wire", action="store_true",
                   help="hand the batches to the aggregator as values: skip the stream codec and the rank intake "
                        "(both are on by default, as in production)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabricmon",
                                     description="Fabric telemetry and fault localization for GPU clusters.")
    parser.add_argument("--version", action="version", version=f"fabricmon {__version__}")
    _global_flags(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)
    _agent_parser(sub)
    _aggregator_parser(sub)
    _demo_parser(sub)
    _check_parser(sub)
    _collect_parser(sub)
    _topology_parser(sub)
    _slurm_parsers(sub)
    _remediation_parser(sub)
    return parser


class Signals:
    """SIGTERM/SIGINT stop; SIGHUP asks for a config reload (the units' ExecReload).  Handlers only
    set events: the main thread does the work, between its supervision or tick rounds."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.wake = threading.Event()  # either of the above: ends the main thread's current wait

    def install(self) -> Signals:
        def _stop(signum, frame) -> None:
            self.stop.set()
            self.wake.set()

        def _hup(signum, frame) -> None:
            self.reload.set()
            self.wake.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, _hup)
        return self


def _agent_overrides(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in (
        "sysfs_root", "host_root", "ethtool_dir", "node_name", "listen", "interval", "nvml", "aggregator",
        "nccl_inspector_dir")}


def _load_agent(args: argparse.Namespace):
    import os

    from .config import load_agent_config, parse_unit, with_ib_switches, with_unit

    cfg = load_agent_config(args.config, _agent_overrides(args))
    if getattr(args, "ib_switches", None):
        cfg = with_ib_switches(cfg)
    if args.unit is not None:
        cfg = with_unit(cfg, args.unit, "--unit")
    elif os.environ.get("FABRICMON_UNIT", "").strip() and cfg.shard is not None:
        # Ambient (e.g. from a pod label by the downward API): only an agent with a shard section uses it.
        cfg = with_unit(cfg, parse_unit(os.environ["FABRICMON_UNIT"], "FABRICMON_UNIT"), "FABRICMON_UNIT")
    refuse_placeholder_secret(cfg.stream.token_file, "stream.token_file", args.config or "<defaults>")
    return cfg


def cmd_agent(args: argparse.Namespace) -> int:
    from .agent import memtune
    from .agent.exporter import exposition
    from .agent.runtime import build_agent, hand_over_gil_promptly
    from .agent.wiring import build_live_agent
    from .filewatch import FileWatch, watch_period
    from .logs import configure_logging
    from .webconfig import load_web_config

    if args.capture:
        if not args.once or args.sysfs_root or args.ethtool_dir or args.nvml:
            raise ConfigError("--capture: only with --once, and instead of --sysfs-root, --ethtool-dir, --nvml")
        import tempfile

        from .collect import extract_capture

        with tempfile.TemporaryDirectory(prefix="fabricmon-capture-") as tmp:
            found = extract_capture(args.capture, tmp)
            args.capture = None
            args.sysfs_root, args.ethtool_dir, args.nvml = found["sysfs_root"], found["ethtool_dir"], found["nvml"]
            return cmd_agent(args)
    cfg = _load_agent(args)
    web = load_web_config(getattr(args, "web_config_file", None))
    configure_logging(args.log_format or cfg.log.format, args.log_level or cfg.log.level)
    log = structlog.get_logger("fabricmon.agent")
    period = watch_period()  # checked before anything starts
    if args.once:
        agent = build_agent(cfg)
        snap = agent.poller.poll_once()
        sys.stdout.buffer.write(exposition(snap))
        sys.stdout.flush()
        agent.poller.close()
        return 0
    sig = Signals().install()
    hand_over_gil_promptly()
    memtune.limit_arenas()  # before the agent's first thread
    agent = build_live_agent(cfg, source=args.config or "<defaults>")
    agent.web = web
    try:
        port = agent.start_http()
    except OSError:
        agent.stop()
        raise
    agent.start_polling()
    memtune.release_free()  # what importing and building the agent freed
    log.info("agent_started", node=agent.node, listen=cfg.listen, port=port, interval=cfg.interval,
             sources=agent.poller.source_names, aggregator=cfg.aggregator, tls=bool(web and web.ssl_context))
    files_changed = threading.Event()

    def _files_changed(_changed: list[str]) -> None:
        files_changed.set()
        sig.wake.set()

    # a token or certificate rewritten on disk (a Kubernetes Secret update) runs the SIGHUP's reload
    FileWatch(agent.secret_files(), _files_changed, agent.reload_status, period).start(sig.stop)
    while not sig.stop.is_set():
        agent.supervise(sig.wake)  # the main thread restarts dead agent threads until a signal
        sig.wake.clear()
        if sig.reload.is_set() and not sig.stop.is_set():
            sig.reload.clear()
            files_changed.clear()  # the SIGHUP's reload re-reads the files too
            _reload_agent(agent, args, log)
        elif files_changed.is_set() and not sig.stop.is_set():
            files_changed.clear()
            _reload_agent(agent, args, log, files_only=True)
    log.info("agent_stopping")
    agent.stop()
    return 0


def _reload_agent(agent, args: argparse.Namespace, log, files_only: bool = False) -> None:
    """SIGHUP: the config and its files re-read and applied.  ``files_only`` (the file watch saw a
    token or TLS file change): the running config kept, its files re-read through the same reload."""
    from .logs import configure_logging
    from .webconfig import load_web_config

    trigger = "file change" if files_only else "SIGHUP"
    try:
        if files_only:
            new, web = agent.cfg, agent.web
            refuse_placeholder_secret(new.stream.token_file, "stream.token_file", args.config or "<defaults>")
        else:
            new = _load_agent(args)
            web = load_web_config(getattr(args, "web_config_file", None))
        changed = agent.reload(new)
    except ConfigError as exc:
        agent.reload_status.record(False)
        log.error("config_reload_failed", error=str(exc), trigger=trigger,
                  detail="still running on the previous config")
        return
    agent.web = web
    if agent.http is not None:
        agent.http.set_web(web)  # certificates and users re-read: rotation without a restart
    configure_logging(args.log_format or new.log.format, args.log_level or new.log.level)
    agent.reload_status.record(True)
    structlog.get_logger("fabricmon.agent").info("config_reloaded", changed=changed, trigger=trigger,
                                                 sources=agent.poller.source_names,
                                                 log_level=args.log_level or new.log.level)


def _load_aggregator(args: argparse.Namespace, parse_topology: bool = True):
    from .aggregator.config import check_files, load_aggregator_config

    cfg = load_aggregator_config(args.config)
    check_files(cfg, args.config, parse_topology=parse_topology)
    refuse_placeholder_secret(cfg.auth.token_file, "auth.token_file", args.config)
    refuse_placeholder_secret(cfg.auth.node_tokens_file, "auth.node_tokens_file", args.config)
    return cfg


def cmd_aggregator(args: argparse.Namespace) -> int:
    from .aggregator.service import run_aggregator
    from .logs import configure_logging
    from .webconfig import load_web_config

    cfg = _load_aggregator(args)
    web = load_web_config(getattr(args, "web_config_file", None))
    configure_logging(args.log_format or "auto", args.log_level or "info")
    sig = Signals().install()
    return run_aggregator(cfg, sig.stop, web=web, reload=sig.reload,
                          load=lambda: _load_aggregator(args, parse_topology=False),
                          load_web=lambda: load_web_config(getattr(args, "web_config_file", None)),
                          source=args.config) or 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo.run import run_demo
    from .logs import configure_logging

    configure_logging(args.log_format or "console", args.log_level or "warning")
    return run_demo(args)


def _config_fields() -> dict[str, set[str]]:
    import dataclasses

    from .aggregator.config import AggregatorConfig
    from .config import AgentConfig
    from .sim.scenario import Scenario
    from .topology import topology_file_fields

    fields = {kind: {f.name for f in dataclasses.fields(cls)} for kind, cls in
              (("agent", AgentConfig), ("aggregator", AggregatorConfig), ("scenario", Scenario))}
    fields["topology"] = topology_file_fields()  # generate:, version 1 and version 2 keys
    return fields


def detect_kind(data: dict, source: str) -> str:
    """Which config ``data`` is: the one kind whose keys hold all the file's top-level keys, else the
    kind sharing the most keys with it.  A tie (or nothing shared) is an error asking for ``--kind``:
    a guess would report the wrong kind's errors (a topology with a bad ``layout`` is no agent config)."""
    if "apiVersion" in data and "kind" in data:
        k8s = data.get("kind")
        if k8s == "ConfigMap" and isinstance(data.get("data"), dict):
            inside = ", ".join(f"data.{k}" for k in data["data"]) or "none"
            raise ConfigError(f"{source}: this is a Kubernetes ConfigMap, not a fabricmon config; pass the "
                              f"config inside it (keys: {inside}), e.g. kubectl get configmap "
                              f"{(data.get('metadata') or {}).get('name', 'NAME')} -o jsonpath='{{.data.KEY}}' > FILE")
        raise ConfigError(f"{source}: this is a Kubernetes {k8s}, not a fabricmon config")
    keys = set(data)
    if not keys:
        raise ConfigError(f"{source}: empty: pass --kind agent|aggregator|topology|scenario")
    fields = _config_fields()
    fits = [k for k, f in fields.items() if keys <= f]
    if len(fits) == 1:
        return fits[0]
    scores = sorted(((len(keys & f), k) for k, f in fields.items() if not fits or k in fits), reverse=True)
    if scores[0][0] == 0 or (len(scores) > 1 and scores[0][0] == scores[1][0]):
        raise ConfigError(f"{source}: cannot tell which kind of config this is from its keys "
                          f"({', '.join(sorted(keys))}); pass --kind agent|aggregator|topology|scenario")
    return scores[0][1]


def cmd_check_config(args: argparse.Namespace) -> int:
    from .configload import load_yaml_file

    data = load_yaml_file(args.file)
    summary: list[str] = []  # a topology's one-screen summary
    kind = args.kind or ("shardmap" if "replicas" in data else detect_kind(data, args.file))
    if kind == "agent":
        from .agent.runtime import resolve_node_name
        from .agent.shard_target import resolve_static
        from .config import load_agent_config

        cfg = load_agent_config(args.file)
        node = resolve_node_name(cfg)  # the name this host would stream under passes the aggregator's rule
        if cfg.shard is not None:  # the map parses, and the unit (when the config gives it) has an owner
            resolve_static(cfg.shard, node, args.file)
        if not args.skip_secrets:
            # what would stop the stream at start: a missing token, the example placeholder, no TLS file
            check_token_file(cfg.stream.token_file, "stream.token_file", args.file)
            for name in ("tls_ca", "tls_cert", "tls_key"):
                check_plain_file(getattr(cfg.stream, name), f"stream.{name}", args.file)
            if cfg.sources.gnmi_switches.enabled:  # a switch's credentials: its session fails (counted) without them
                for i, t in enumerate(cfg.sources.gnmi_switches.targets):
                    where = f"sources.gnmi_switches.targets[{i}]"
                    check_plain_file(t.tls_ca, f"{where}.tls_ca", args.file)
                    check_token_file(t.username_file, f"{where}.username_file", args.file)
                    check_token_file(t.password_file, f"{where}.password_file", args.file)
    elif kind == "aggregator":
        from .aggregator.config import check_files, load_aggregator_config

        agg = load_aggregator_config(args.file)
        if args.skip_secrets:
            agg = dataclasses.replace(agg, auth=dataclasses.replace(
                agg.auth, token_file=None, node_tokens_file=None, tls_cert=None, tls_key=None, tls_client_ca=None))
        check_files(agg, args.file)
        if not args.skip_secrets:
            check_token_file(agg.auth.token_file, "auth.token_file", args.file)
            check_token_file(agg.auth.node_tokens_file, "auth.node_tokens_file", args.file)
    elif kind == "topology":
        from .topology import load_topology
        from .topology_import.report import summarize

        summary = summarize(load_topology(args.file))
    elif kind == "shardmap":
        from .shardmap import check_ownership, load_shard_map

        summary = check_ownership(load_shard_map(args.file), args.file, getattr(args, "topology", None))
    else:
        from .sim.scenario import load_scenario

        load_scenario(args.file)
    from .example_hosts import example_hosts

    for fld, host in example_hosts(data):  # warnings only: the file is valid, but names no real host
        print(f"{args.file}: warning: {fld}: {host} is an example hostname; put the real one before starting",
              file=sys.stderr)
    print(f"{args.file}: ok ({kind} config)")
    for line in summary:
        print(f"  {line}")
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from .collect import Limits, collect
    from .logs import configure_logging

    configure_logging(args.log_format or "auto", args.log_level or "info")
    collect(args.sysfs_root, args.out, ethtool_dir=args.ethtool_dir, nvml=args.nvml, node_name=args.node_name,
            limits=Limits(args.max_files, args.max_file_bytes, args.max_total_bytes))
    return 0


COMMANDS = {"agent": cmd_agent, "aggregator": cmd_aggregator, "demo": cmd_demo, "check-config": cmd_check_config}
COMMANDS["collect"] = cmd_collect


def cmd_topology(args: argparse.Namespace) -> int:
    from .logs import configure_logging
    from .topology_import.run import cmd_diff, cmd_import

    configure_logging(args.log_format or "console", args.log_level or "info")
    return {"import": cmd_import, "diff": cmd_diff}[args.topology_command](args)


COMMANDS["topology"] = cmd_topology


def _slurm_parsers(sub) -> None:
    from .jobmap import slurm_hooks

    for which in ("prolog", "epilog"):
        p = sub.add_parser(f"slurm-{which}", help=f"slurmd's {which.title()}=: tell this node's agent which job "
                           + ("holds which GPUs" if which == "prolog" else "ended"))
        slurm_hooks.add_arguments(p)


def cmd_slurm(args: argparse.Namespace) -> int:
    from .jobmap import slurm_hooks

    return slurm_hooks.run(args.command.removeprefix("slurm-"), args)


COMMANDS["slurm-prolog"] = COMMANDS["slurm-epilog"] = cmd_slurm


def _remediation_parser(sub) -> None:
    from .aggregator.remediation import cli as remediation_cli

    p = sub.add_parser("remediation", help="acting on faults: reset the circuit breaker", parents=[_common()])
    remediation_cli.add_arguments(p)


def cmd_remediation(args: argparse.Namespace) -> int:
    from .aggregator.remediation import cli as remediation_cli

    return remediation_cli.run(args)


COMMANDS["remediation"] = cmd_remediation


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"fabricmon: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ModuleNotFoundError as exc:
        # numpy is an extra: agent nodes install plain `fabricmon` (no numpy).
        if exc.name != "numpy":
            raise
        print(f"fabricmon: error: `fabricmon {args.command}` needs numpy: "
              "pip install 'fabricmon[aggregator]'", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:  # a busy port, a missing file: one line, not a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE and "in use" not in why:
            why += " (address already in use)"
        print(f"fabricmon: error: {where}{why}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
