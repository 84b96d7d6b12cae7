"""Runs the shared fixture generator (``../shared/tools/make-sysfs-fixture`` beside the repository)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE_TOOL = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "make-sysfs-fixture"


def gen_fixture(root: Path, *args: str) -> Path:
    """Write a fresh tree at ``root`` with the tool's own flags (``--layout roce --fault pfc_storm ...``)."""
    if not FIXTURE_TOOL.exists():
        pytest.skip("fixture generator not found at ../shared/tools/make-sysfs-fixture")
    subprocess.run([sys.executable, str(FIXTURE_TOOL), "--root", str(root), "--force", *args],
                   check=True, capture_output=True, text=True, timeout=120)
    return root
