"""Skips for tests that build network namespaces: they need CAP_NET_ADMIN and the tools."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CAP_NET_ADMIN = 12


def has_cap_net_admin() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << CAP_NET_ADMIN))
    except OSError:
        pass
    return False


def need_netns(*binaries: str) -> None:
    """Skip, saying why, unless ``binaries`` are installed and a namespace can be created."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        pytest.skip(f"needs the {' and '.join(missing)} binary (apt-get install iproute2 ethtool)")
    if not has_cap_net_admin():
        pytest.skip("needs CAP_NET_ADMIN to create a network namespace")
