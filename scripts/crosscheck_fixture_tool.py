#!/usr/bin/env python3
"""Cross-check the repository's fixture writer against the stand-alone make-sysfs-fixture it was ported from.

Not part of the test suite (the tests use only ``fabricmon.sim.fixture``): run it where a checkout of the
stand-alone tool exists, e.g. ``python scripts/crosscheck_fixture_tool.py --tool PATH/make-sysfs-fixture``.
Where the tool still writes what real inbox drivers do not (``rx_bits_phy``) or an old name
(``dev_out_of_buffer``), the in-repo writer follows the driver (tests/fixtures/realformat/README.md), and the
comparison maps those names. Exit 0: byte-identical trees; 1: differences (listed); 2: no tool.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fabricmon.sim.fixture import write_fixture_argv

CASES = [
    ["--layout", "roce", "--fault", "pfc_storm", "--snapshots", "3"],
    ["--layout", "ib", "--fault", "hot_unplug", "--snapshots", "3", "--fault-end", "2"],
    ["--layout", "roce", "--legacy-ext", "--wrap", "--snapshots", "3", "--fault", "counter_saturation"],
    ["--layout", "ib", "--fault", "link_degraded", "--degrade", "speed", "--seed", "4"],
    ["--fault", "nvlink_errors", "--snapshots", "2", "--fault-gpu", "3"],
]


def tree_bytes(root: Path) -> dict[str, bytes | str]:
    """Every file's content and every symlink's target under root, by relative path."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                out[rel] = Path(path).read_bytes()
    return out


def driver_names(text: bytes) -> bytes:
    out = []
    for line in text.decode().splitlines(keepends=True):
        if line.split(":")[0].strip() == "rx_bits_phy":
            continue
        out.append(line.replace("dev_out_of_buffer:", "dev_internal_queue_oob:"))
    return "".join(out).encode()


def compare(tool: Path, args: list[str], work: Path) -> list[str]:
    subprocess.run([sys.executable, str(tool), "--root", str(work / "ext"), *args],
                   check=True, capture_output=True, timeout=120)
    write_fixture_argv(["--root", str(work / "own"), *args])
    ext, own = tree_bytes(work / "ext"), tree_bytes(work / "own")
    for rel in ext:
        if "ethtool/" in rel and rel.endswith(".txt") and not rel.endswith(".pfc.txt"):
            ext[rel] = driver_names(ext[rel])
        elif rel.endswith("fixture.json"):
            ext[rel] = ext[rel].replace(b"dev_out_of_buffer", b"dev_internal_queue_oob")
    problems = [f"only in the tool's tree: {r}" for r in sorted(set(ext) - set(own))]
    problems += [f"only in ours: {r}" for r in sorted(set(own) - set(ext))]
    problems += [f"differs: {r}" for r in sorted(set(ext) & set(own)) if ext[r] != own[r]]
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", type=Path, required=True, help="path of the stand-alone make-sysfs-fixture")
    a = ap.parse_args()
    if not a.tool.is_file():
        print(f"crosscheck: {a.tool}: no such tool", file=sys.stderr)
        return 2
    bad = 0
    for args in CASES:
        with tempfile.TemporaryDirectory() as d:
            problems = compare(a.tool, args, Path(d))
        print(f"{'OK  ' if not problems else 'DIFF'} {' '.join(args)}")
        for p in problems[:20]:
            print(f"     {p}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
