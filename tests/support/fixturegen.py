"""Fixture nodes from the repository's own writer (``fabricmon.sim.fixture``), by its command-line flags."""

from __future__ import annotations

from pathlib import Path

from fabricmon.sim.fixture import write_fixture_argv


def gen_fixture(root: Path, *args: str) -> Path:
    """Write a fresh tree at ``root`` with the writer's own flags (``--layout roce --fault pfc_storm ...``)."""
    write_fixture_argv(["--root", str(root), "--force", *args])
    return root
