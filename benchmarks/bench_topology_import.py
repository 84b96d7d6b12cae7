"""Import a 2,048-node ibnetdiscover output with `fabricmon topology import`, against a 10 s target.

The output comes from fabricmon.topology_import.ibnetgen, whose text for small fabrics is what Debian's
ibnetdiscover prints against ibsim byte for byte: checked here first against the committed real output
tests/fixtures/topology_import/ibsim/rail-optimized.out (and live against ibsim with --live, when
ibsim-utils and infiniband-diags are installed).  The fabric: 2,048 nodes with 8 rail NICs, 32 nodes per
leaf (512 leaves), 4 spines per rail, 4 cores: 16,384 CAs, 548 switches, about 139,000 lines.

    .venv/bin/python benchmarks/bench_topology_import.py [--nodes 2048] [--target 10] [--live]

Prints one verdict line (PASS/FAIL) and exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fabricmon.topology import load_topology
from fabricmon.topology_import.ibnetgen import rail_optimized

# tests/support/topology_fabrics.py rail_optimized_small
SMALL = {"rails": 4, "nodes_per_leaf": 8, "spines_per_rail": 2, "cores": 2}
REAL = REPO / "tests" / "fixtures" / "topology_import" / "ibsim" / "rail-optimized.out"


def generator_matches_ibsim(live: bool) -> str | None:
    small = rail_optimized(32, **SMALL)
    real = REAL.read_text()
    date = re.search(r"generated on (.*)\n", real).group(1)
    if small.ibnetdiscover(date) != real:
        return f"generator differs from the committed ibsim output {REAL.name}"
    if not live:
        return None
    if not (shutil.which("ibsim") and shutil.which("ibsim-run") and shutil.which("ibnetdiscover")):
        return "--live needs ibsim-utils and infiniband-diags"
    with tempfile.TemporaryDirectory() as tmp:
        net = Path(tmp) / "net"
        net.write_text(small.net_file())
        sim = subprocess.Popen(["ibsim", "-n", "-s", str(net)], cwd=tmp, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                run = subprocess.run(["ibsim-run", "ibnetdiscover"], check=False, cwd=tmp, capture_output=True,
                                     text=True, timeout=20)
                if run.returncode == 0:
                    break
                time.sleep(0.1)
        finally:
            sim.terminate()
            sim.wait(timeout=5)
    date = re.search(r"generated on (.*)\n", run.stdout).group(1)
    return None if small.ibnetdiscover(date) == run.stdout else "generator differs from live ibsim output"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--target", type=float, default=10.0, help="seconds the import may take")
    ap.add_argument("--live", action="store_true", help="also compare the generator with ibsim run here")
    args = ap.parse_args()

    problem = generator_matches_ibsim(args.live)
    if problem:
        print(f"FAIL: {problem}")
        return 1
    fabric = rail_optimized(args.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fabric.ibnetdiscover"
        out = Path(tmp) / "topology.yaml"
        src.write_text(fabric.ibnetdiscover("Thu Nov 26 04:00:00 2026"))
        lines = src.read_text().count("\n")
        fabricmon = Path(sys.executable).parent / "fabricmon"
        started = time.monotonic()
        run = subprocess.run([str(fabricmon), "topology", "import", "--ibnetdiscover", str(src), "--cluster", "bench",
                              "-o", str(out), "--log-level", "warning"], check=False, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if run.returncode != 0:
            print(f"FAIL: fabricmon topology import exited {run.returncode}: {run.stderr.strip()[-300:]}")
            return 1
        load_started = time.monotonic()
        topo = load_topology(out)
        load_seconds = time.monotonic() - load_started
    wrong = [f"{name}/{nic.device}" for i, name in enumerate(sorted(topo.nodes)) for nic in topo.nodes[name].nics
             if nic.leaf != f"leaf-su{i // 32:02d}-r{nic.rail}" or nic.device != f"mlx5_{nic.rail}"]
    nics = sum(len(n.nics) for n in topo.nodes.values())
    shape = (len(topo.nodes), nics, len(topo.shape.leaves()), topo.shape.rails())
    want = (args.nodes, args.nodes * 8, (args.nodes // 32) * 8, list(range(8)))
    ok = shape == want and not wrong and seconds < args.target
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}: imported {len(topo.nodes):,} nodes ({nics:,} NICs, {len(topo.shape.leaves())} leaves, "
          f"rails {len(topo.shape.rails())}) from {lines:,} ibnetdiscover lines in {seconds:.2f} s wall "
          f"(target < {args.target:g} s; the aggregator then loads the file in {load_seconds:.2f} s); "
          f"generator = ibsim byte for byte on {REAL.name}; misplaced NICs: {len(wrong)}"
          + ("" if shape == want else f"; shape {shape} != {want}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
