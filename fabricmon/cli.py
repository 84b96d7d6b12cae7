"""Command line: ``fabricmon agent | aggregator | demo | check-config``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import structlog

from . import __version__
from .configload import ConfigError

EXIT_CONFIG = 2


def _agent_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run the per-node agent")
    p.add_argument("--config", help="agent YAML config")
    p.add_argument("--sysfs-root", dest="sysfs_root", help="sysfs mount (default /sys)")
    p.add_argument("--ethtool-dir", dest="ethtool_dir", help="directory of <if>.txt ethtool -S dumps (fixtures and simulation)")
    p.add_argument("--node-name", dest="node_name", help="node label (default: hostname)")
    p.add_argument("--listen", help="HOST:PORT for /metrics, /healthz, /readyz (default 0.0.0.0:9720)")
    p.add_argument("--interval", type=float, help="poll interval in seconds (default 1)")
    p.add_argument("--nvml", help="auto, off or fake:FILE")
    p.add_argument("--aggregator", help="HOST:PORT of the aggregator stream")
    p.add_argument("--nccl-inspector-dir", dest="nccl_inspector_dir", help="tail NCCL Inspector logs in this directory")
    p.add_argument("--once", action="store_true", help="poll once, print the Prometheus exposition, exit")
    p.add_argument("--capture", help="with --once: read the node from a 'fabricmon collect' archive")


def _collect_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="capture this node's RDMA sysfs, ethtool and NVML readings into an archive")
    p.add_argument("--sysfs-root", dest="sysfs_root", default="/sys", help="sysfs mount (default /sys)")
    p.add_argument("--ethtool-dir", dest="ethtool_dir", help="take <if>.txt dumps from here instead of the ioctl")
    p.add_argument("--nvml", default="auto", help="auto, off or fake:FILE (default auto)")
    p.add_argument("--node-name", dest="node_name", help="node name to record (default: hostname)")
    p.add_argument("--out", required=True, help="archive to write (.tar.gz)")
    p.add_argument("--max-files", type=int, default=50_000)
    p.add_argument("--max-file-bytes", type=int, default=1 << 20)
    p.add_argument("--max-total-bytes", type=int, default=64 << 20)


def _check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-config", help="validate a config file and exit")
    p.add_argument("file")
    p.add_argument("--kind", choices=["agent", "aggregator", "topology", "scenario"], default=None,
                   help="what the file is (default: guessed from its keys)")


def _aggregator_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("aggregator", help="run the central aggregator")
    p.add_argument("--config", required=True, help="aggregator YAML config")


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a simulated cluster with injected faults and show what fabricmon finds")
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
                   help="processes that render and poll the simulated nodes (default: CPU count, at most 4)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabricmon", description="Fabric telemetry and fault localization for GPU clusters.")
    parser.add_argument("--version", action="version", version=f"fabricmon {__version__}")
    parser.add_argument("--log-format", choices=["auto", "json", "console"], default=None)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    sub = parser.add_subparsers(dest="command", required=True)
    _agent_parser(sub)
    _aggregator_parser(sub)
    _demo_parser(sub)
    _check_parser(sub)
    _collect_parser(sub)
    return parser


def _install_signals(stop: threading.Event, reload: threading.Event | None = None) -> None:
    def _stop(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if reload is not None and hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda s, f: reload.set())


def cmd_agent(args: argparse.Namespace) -> int:
    from .agent.exporter import exposition
    from .agent.runtime import build_agent
    from .agent.wiring import build_live_agent
    from .config import load_agent_config
    from .logs import configure_logging

    overrides = {k: getattr(args, k) for k in (
        "sysfs_root", "ethtool_dir", "node_name", "listen", "interval", "nvml", "aggregator", "nccl_inspector_dir")}
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
    cfg = load_agent_config(args.config, overrides)
    configure_logging(args.log_format or cfg.log.format, args.log_level or cfg.log.level)
    log = structlog.get_logger("fabricmon.agent")
    if args.once:
        agent = build_agent(cfg)
        snap = agent.poller.poll_once()
        sys.stdout.buffer.write(exposition(snap))
        sys.stdout.flush()
        agent.poller.close()
        return 0
    stop = threading.Event()
    _install_signals(stop)
    agent = build_live_agent(cfg)
    port = agent.start_http()
    agent.start_polling()
    log.info("agent_started", node=agent.node, listen=cfg.listen, port=port, interval=cfg.interval,
             sources=agent.poller.source_names, aggregator=cfg.aggregator)
    agent.supervise(stop)  # the main thread restarts dead agent threads until a signal
    log.info("agent_stopping")
    agent.stop()
    return 0


def cmd_aggregator(args: argparse.Namespace) -> int:
    from .aggregator.config import check_files, load_aggregator_config
    from .aggregator.service import run_aggregator
    from .logs import configure_logging

    cfg = load_aggregator_config(args.config)
    check_files(cfg, args.config)
    configure_logging(args.log_format or "auto", args.log_level or "info")
    stop = threading.Event()
    _install_signals(stop)
    return run_aggregator(cfg, stop) or 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .logs import configure_logging
    from .demo.run import run_demo

    configure_logging(args.log_format or "console", args.log_level or "warning")
    return run_demo(args)


def cmd_check_config(args: argparse.Namespace) -> int:
    from .configload import load_yaml_file

    data = load_yaml_file(args.file)
    kind = args.kind
    if kind is None:
        if "faults" in data or "duration" in data:
            kind = "scenario"
        elif "nodes" in data or "generate" in data:
            kind = "topology"
        elif "topology" in data or "alertmanager" in data:
            kind = "aggregator"
        else:
            kind = "agent"
    if kind == "agent":
        from .config import load_agent_config

        load_agent_config(args.file)
    elif kind == "aggregator":
        from .aggregator.config import check_files, load_aggregator_config

        check_files(load_aggregator_config(args.file), args.file)
    elif kind == "topology":
        from .topology import load_topology

        load_topology(args.file)
    else:
        from .sim.scenario import load_scenario

        load_scenario(args.file)
    print(f"{args.file}: ok ({kind} config)")
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


if __name__ == "__main__":
    sys.exit(main())
