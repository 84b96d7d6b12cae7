"""Regenerate the checked-in protobuf/gRPC stubs: ``python -m fabricmon.proto.generate``.

Three protos: fabricmon's own wire format, the part of gNMI the gnmi_switches source speaks, and the
kubelet's PodResources API (a verbatim copy, see its
header), whose client the agent's ``jobs`` source uses.

The stubs are generated with the pinned ``grpcio-tools`` (see GRPCIO_TOOLS_VERSION)
and committed, so an install needs no code generator.  The generated gRPC module
is rewritten to import its sibling relatively, so the package can live anywhere.
``--check`` regenerates into a temporary directory and fails if anything differs
(the test suite runs it).

Runtime floors: ``*_pb2_grpc.py`` refuses to import on a grpcio older than the
generator, and ``*_pb2.py`` refuses a protobuf runtime older than the gencode
version grpcio-tools bundles; the package's dependency floors must be at least
those two versions.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.85.1"
# fabricmon's own stream, the kubelet's PodResources API (the jobs source) and the part of gNMI the
# gnmi_switches source speaks (gnmi.proto says which): fabricmon/proto/<stem>.proto
STEMS = ("fabricmon", "podresources_v1", "gnmi")
PROTOS = tuple(f"fabricmon/proto/{stem}.proto" for stem in STEMS)
OUTPUTS = tuple(f"{stem}{suffix}" for stem in STEMS for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))


def _root() -> Path:
    return Path(__file__).resolve().parents[2]


def generate(out_dir: Path) -> dict[str, bytes]:
    """Run protoc into ``out_dir``; return {file name: content} of the outputs."""
    import grpc_tools
    from grpc_tools import protoc

    try:
        from importlib.metadata import version
        have = version("grpcio-tools")
    except Exception:  # pragma: no cover - metadata missing
        have = "unknown"
    if have != GRPCIO_TOOLS_VERSION:
        raise SystemExit(f"grpcio-tools {GRPCIO_TOOLS_VERSION} required (pinned), found {have}")
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc", f"-I{_root()}", f"-I{include}",
        f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
        *(str(_root() / proto) for proto in PROTOS),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit status {rc}")
    gen = out_dir / "fabricmon" / "proto"
    result: dict[str, bytes] = {}
    for name in OUTPUTS:
        text = (gen / name).read_text()
        if name.endswith("_grpc.py"):
            stem = name.removesuffix("_pb2_grpc.py")
            absolute, relative = f"from fabricmon.proto import {stem}_pb2 as", f"from . import {stem}_pb2 as"
            if absolute not in text:
                raise SystemExit(f"{name}: expected import line not found; update generate.py")
            text = text.replace(absolute, relative)
        result[name] = text.encode()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the checked-in stubs differ")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    if args.check:
        stale = [n for n, data in files.items() if not (here / n).exists() or (here / n).read_bytes() != data]
        if stale:
            print(f"stale generated stubs: {', '.join(stale)}; run python -m fabricmon.proto.generate", file=sys.stderr)
            return 1
        return 0
    for name, data in files.items():
        (here / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
