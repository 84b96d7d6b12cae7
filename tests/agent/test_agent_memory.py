"""The agent's memory (issue 39: RSS under 50 MB with the shipped sources): only the modules its
configuration uses are imported, and glibc's heap is kept to two arenas and trimmed after startup
(agent/memtune.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fabricmon.agent import memtune
from support.paths import REPO

# Modules an agent built from the shipped agent.yaml on a fixture node (fake NVML, no Kubernetes, no
# Slurm job directory of its own, no NCCL Inspector directory) has no use for.
UNUSED_HERE = ("fabricmon.sources.nvml.backend_pynvml", "pynvml", "fabricmon.jobmap.podresources",
               "fabricmon.kubeapi", "fabricmon.agent.kube_node", "fabricmon.agent.nccl_inspector",
               "fabricmon.sources.transceiver", "fabricmon.sources.ib_switches", "fabricmon.sources.gnmi_switches",
               "fabricmon.aggregator.engine", "fabricmon.sim", "fabricmon.demo",
               "grpc",  # the stream speaks HTTP/2 with h2 (agent/h2_grpc.py), not grpcio (asyncio: structlog needs it)
               "psutil")  # the host source is off on a fixture node (its /proc is not the fixture's)


def test_the_shipped_config_imports_only_the_modules_it_uses(make_fixture):
    root = make_fixture(layout="ib")
    code = textwrap.dedent(f"""
        import sys
        from fabricmon.agent.runtime import build_agent
        from fabricmon.config import load_agent_config
        cfg = load_agent_config({str(REPO / "systemd/etc/fabricmon/agent.yaml")!r}, {{
            "sysfs_root": {str(root / "sys")!r}, "ethtool_dir": {str(root / "ethtool")!r},
            "nvml": "fake:" + {str(root / "nvml.json")!r}, "listen": "127.0.0.1:0"}})
        agent = build_agent(cfg, inline_sources=True)
        agent.poller.poll_once()
        print(sorted(agent.poller.source_names))
        agent.stop()
        import fabricmon.agent.stream  # the stream (streaming agents) needs none of them either
        print(sorted(m for m in sys.modules if m.startswith({UNUSED_HERE!r})))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    sources, loaded = out.stdout.splitlines()[-2:]
    assert "'nvml'" in sources and "'infiniband'" in sources  # the fake NVML backend did the polling
    assert loaded == "[]"


def test_the_arena_cap_and_the_trim_apply_on_glibc(monkeypatch):
    if not os.confstr("CS_GNU_LIBC_VERSION"):
        pytest.skip("not glibc")
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert memtune.limit_arenas(memtune.AGENT_ARENAS) is True
    assert memtune.release_free() is True


@pytest.mark.parametrize("var, value", [("MALLOC_ARENA_MAX", "4"),
                                        ("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=8")])
def test_an_operators_arena_setting_stands(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert memtune.limit_arenas() is False


def test_elsewhere_the_allocator_keeps_its_defaults_and_nothing_fails(monkeypatch):
    """musl (an Alpine image) has neither mallopt's M_ARENA_MAX nor malloc_trim: both do nothing."""
    monkeypatch.setattr(memtune, "_libc", None)
    monkeypatch.setattr(memtune.os, "confstr", lambda name: None)
    assert memtune.limit_arenas() is False
    assert memtune.release_free() is False

    def no_confstr(name):
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(memtune, "_libc", None)
    monkeypatch.setattr(memtune.os, "confstr", no_confstr)
    assert memtune.limit_arenas() is False and memtune.release_free() is False


def test_the_agent_process_caps_its_arenas_before_its_threads_start():
    """``fabricmon agent`` calls ``limit_arenas`` before building the agent and ``release_free`` once it runs
    (read from the command's source: glibc has no call that reads M_ARENA_MAX back)."""
    import inspect

    from fabricmon import cli

    src = inspect.getsource(cli.cmd_agent)
    assert src.index("memtune.limit_arenas()") < src.index("build_live_agent(")
    assert src.index("agent.start_polling()") < src.index("memtune.release_free()")
