"""``fabricmon topology import|diff``: the file reading, progress and writing around the pure parts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import structlog

from ..atomic import atomic_write_text
from ..configload import ConfigError
from .build import Imported, import_ibnetdiscover, import_lldp
from .ibnetdiscover import IbnetParseError, parse_ibnetdiscover
from .lldp import LldpParseError, parse_lldpctl_json
from .nodemap import NodeMapError, parse_node_name_map
from .render import render

log = structlog.get_logger("fabricmon.topology")

MAX_INPUT_BYTES = 512 << 20  # an ibnetdiscover of 100,000 HCAs is about 40 MB


def read_text(path: str | Path) -> str:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise ConfigError(f"{p}: {size} bytes, more than the {MAX_INPUT_BYTES >> 20} MiB an import reads")
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if b"\0" in data[:4096]:
        raise ConfigError(f"{p}: line 1: binary data, not text output")
    # NodeDescriptions are 64 raw bytes: a stray non-UTF-8 byte is replaced, not fatal.
    return data.decode("utf-8-sig", errors="replace")


def load_ibnetdiscover_files(paths: list[str]) -> list:
    fabrics = []
    for path in paths:
        started = time.monotonic()
        text = read_text(path)

        def progress(done: int, _path: str = path) -> None:
            log.info("topology_import_progress", file=_path, lines=done)

        try:
            fabric = parse_ibnetdiscover(text, progress=progress if len(text) > 4 << 20 else None)
        except IbnetParseError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        kinds = [n.kind for n in fabric.nodes.values()]
        log.info("topology_import_parsed", file=path, lines=fabric.lines, switches=kinds.count("switch"),
                 cas=kinds.count("ca"), routers=kinds.count("router"), seconds=round(time.monotonic() - started, 3))
        fabrics.append((Path(path).name, fabric))
    return fabrics


def load_lldp_dir(directory: str) -> dict:
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory of <node>.json lldpctl outputs")
    files = sorted(d.glob("*.json"))
    if not files:
        raise ConfigError(f"{d}: no <node>.json files (lldpctl -f json > {d}/$(hostname).json on each node)")
    per_node = {}
    for f in files:
        text = read_text(f)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{f}: line {exc.lineno}: invalid JSON ({exc.msg})") from None
        except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
            raise ConfigError(f"{f}: JSON nested too deep to be lldpctl output") from None
        try:
            per_node[f.stem] = parse_lldpctl_json(doc)
        except LldpParseError as exc:
            raise ConfigError(f"{f}: {exc}") from None
        except RecursionError:  # a value nested past the stack where lldpctl writes a scalar
            raise ConfigError(f"{f}: a value nested too deep to be lldpctl output") from None
    log.info("topology_import_parsed", dir=str(d), files=len(files),
             neighbors=sum(len(v) for v in per_node.values()))
    return per_node


def import_topology(*, ibnetdiscover: list[str] | None = None, lldp: str | None = None,
                    node_name_map: str | None = None, keep_domain: bool = False) -> tuple[Imported, list[str]]:
    if ibnetdiscover:
        names: dict[int, str] = {}
        if node_name_map:
            try:
                names = parse_node_name_map(read_text(node_name_map))
            except NodeMapError as exc:
                raise ConfigError(f"{node_name_map}: {exc}") from None
        imp = import_ibnetdiscover(load_ibnetdiscover_files(ibnetdiscover), node_names=names, keep_domain=keep_domain)
        sources = [Path(p).name for p in ibnetdiscover] + ([f"node-name-map {Path(node_name_map).name}"]
                                                           if node_name_map else [])
    elif lldp:
        if node_name_map:
            raise ConfigError("--node-name-map: InfiniBand only (it maps GUIDs); LLDP names come from the files")
        imp = import_lldp(load_lldp_dir(lldp), keep_domain=keep_domain)
        sources = [f"lldp {Path(lldp).name}/"]
    else:
        raise ConfigError("topology import: give --ibnetdiscover FILE [...] or --lldp DIR")
    if not imp.nodes:
        why = imp.notes[0] if imp.skipped_firmware_default else "no host CA linked to a switch"
        raise ConfigError(f"{', '.join(sources)}: no host found, nothing to write: {why}")
    return imp, sources


def cmd_import(args) -> int:
    from ..configload import build
    from ..topology import TopologyFileV2, topology_from_v2
    from .report import summarize

    started = time.monotonic()
    imp, sources = import_topology(ibnetdiscover=args.ibnetdiscover, lldp=args.lldp,
                                   node_name_map=args.node_name_map, keep_domain=args.keep_domain)
    for note in imp.notes:
        log.warning("topology_import_note", note=note)
    text, doc = render(imp, args.cluster, sources)
    # The document passes the loader's own validation before it is written (the loader's YAML pass is
    # skipped: the dump of plain dicts and lists reads back the same, and costs seconds at 2,048 nodes).
    topo = topology_from_v2(build(TopologyFileV2, doc, "", args.output))
    atomic_write_text(args.output, text)
    print(f"{args.output}: written ({time.monotonic() - started:.2f} s)")
    for line in summarize(topo):
        print(f"  {line}")
    return 0


def cmd_diff(args) -> int:
    from ..topology import load_topology
    from .report import diff

    lines = diff(load_topology(args.old), load_topology(args.new))
    for line in lines:
        print(line)
    if not lines:
        print(f"{args.old} and {args.new}: same nodes, NICs, leaves, rails and spines")
    return 1 if lines else 0
