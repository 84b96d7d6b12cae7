"""The inputs of the golden expositions (tests/agent/test_golden.py), one ``Case`` per fixture kind.

To add a kind, add one ``Case`` to ``CASES`` (a tree written by ``fabricmon.sim.fixture``, a node directory
or a bare sysfs tree committed under ``tests/fixtures/``, e.g.
``Case("realformat-mlx4-counters-ext", committed_sysfs("realformat/sysfs/mlx4-ofed-counters-ext"))``) and run
``FABRICMON_UPDATE_GOLDEN=1 pytest tests/agent/test_golden.py`` to write ``tests/golden/<name>.prom``; review that
file like code.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from fabricmon.agent.exporter import exposition
from fabricmon.agent.nccl_inspector import NcclInspectorSource
from fabricmon.agent.runtime import build_agent, build_sources
from fabricmon.config import load_agent_config
from fabricmon.sim.fixture import write_fixture
from support.paths import FIXTURES, GOLDEN  # noqa: F401 (GOLDEN: re-exported for test_golden)

NODE = "node-000"
# Every golden snapshot is taken at this time, so the timestamp and age lines are fixed.
TS = 1764000000.0


@dataclass(frozen=True)
class NodeInput:
    """A node as the agent reads it: ``root/sys``, and optionally ``root/ethtool`` and ``root/nvml.json``."""

    root: Path
    nccl_dir: Path | None = None

    def overrides(self) -> dict:
        nvml = self.root / "nvml.json"
        ethtool = self.root / "ethtool"
        return {"sysfs_root": str(self.root / "sys"),
                "ethtool_dir": str(ethtool) if ethtool.is_dir() else None,
                "nvml": f"fake:{nvml}" if nvml.is_file() else "off",
                "node_name": NODE}


@dataclass(frozen=True)
class Case:
    name: str                              # tests/golden/<name>.prom
    build: Callable[[Path], NodeInput]     # writes (or copies) the node under the given empty directory


def generated(nvml: bool = True, **options) -> Callable[[Path], NodeInput]:
    """A tree from the repository's fixture writer (``make_fixture``'s options, one snapshot).

    ``nvml=False`` leaves out the fake GPUs: 8 GPUs x 18 NVLinks are half of every exposition, and the
    NVML series are the same in every case that is about the RDMA side."""
    def build(tmp: Path) -> NodeInput:
        write_fixture(tmp / "node", node_name=NODE, **options)
        if not nvml:
            (tmp / "node" / "nvml.json").unlink()
        return NodeInput(tmp / "node")
    return build


def committed(rel: str) -> Callable[[Path], NodeInput]:
    """A node directory committed under tests/fixtures/ (copied, so a test never writes into the checkout)."""
    def build(tmp: Path) -> NodeInput:
        shutil.copytree(FIXTURES / rel, tmp / "node", symlinks=True)
        return NodeInput(tmp / "node")
    return build


def committed_sysfs(rel: str) -> Callable[[Path], NodeInput]:
    """A bare sysfs tree committed under tests/fixtures/ (``<rel>/class/infiniband/...``, as the real-format
    corpus keeps them), used as the node's ``sys/``; no ethtool dumps, no GPUs."""
    def build(tmp: Path) -> NodeInput:
        shutil.copytree(FIXTURES / rel, tmp / "node" / "sys", symlinks=True)
        return NodeInput(tmp / "node")
    return build


def nccl_only(rel: str) -> Callable[[Path], NodeInput]:
    """No RDMA device and no GPU; NCCL Inspector dumps from tests/fixtures/<rel> appear after the agent starts."""
    def build(tmp: Path) -> NodeInput:
        (tmp / "node" / "sys").mkdir(parents=True)
        return NodeInput(tmp / "node", nccl_dir=FIXTURES / rel)
    return build


CASES: tuple[Case, ...] = (
    Case("ib", generated(layout="ib", fault="nvlink_errors", seed=1)),  # with NVML: 8 GPUs, one bad NVLink
    Case("roce", generated(layout="roce", seed=1)),  # ethtool -S and PFC dumps of every RoCE netdev; NVML
    Case("ib-legacy-counters-ext", generated(nvml=False, layout="ib", legacy_ext=True, seed=1)),
    Case("ib-dual-port", generated(nvml=False, layout="ib", dual_port=True, seed=1)),
    Case("ib-counter-saturation", generated(nvml=False, layout="ib", fault="counter_saturation", seed=1)),
    Case("roce-pfc-storm", generated(nvml=False, layout="roce", fault="pfc_storm", seed=1)),
    Case("roce-link-down", generated(nvml=False, layout="roce", fault="link_down", seed=1)),
    Case("nccl-inspector-v4.0", nccl_only("nccl/inspector-v4.0")),
)


def normalize(text: str) -> str:
    """Fix what varies from run to run: how long each collector took."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("fabricmon_collector_duration_seconds{"):
            line = line.rsplit(" ", 1)[0] + " 0.0\n"
        out.append(line)
    return "".join(out)


def agent_exposition(node: NodeInput, work: Path) -> str:
    """What ``fabricmon agent --once`` prints for the node, at time TS, normalized."""
    cfg = load_agent_config(None, node.overrides())
    # The device reads' deadline (0.35 s of the default 0.5) is not what these compare: a loaded CI
    # worker's pause (a full collection, the CPUs taken) once ate it and a healthy HCA went missing.
    src = cfg.sources
    cfg = replace(cfg, sources=replace(src, infiniband=replace(src.infiniband, timeout=10.0),
                                       ethtool=replace(src.ethtool, timeout=10.0)))
    sources = build_sources(cfg)
    if node.nccl_dir is not None:
        # The tail starts at the end of files already there (history before the agent is not counted),
        # so the dumps are copied in after it started, as a running job would write them.
        live = work / "nccl"
        live.mkdir()
        sources.append(NcclInspectorSource(str(live), timeout=5.0))
        for f in sorted(node.nccl_dir.iterdir()):
            shutil.copyfile(f, live / f.name)
    agent = build_agent(cfg, clock=lambda: TS, sources=sources, inline_sources=True)
    try:
        snap = agent.poller.poll_once()
    finally:
        agent.poller.close()
    return normalize(exposition(snap).decode())
