"""Golden files: compare a test's output with a committed file, or rewrite it under FABRICMON_UPDATE_GOLDEN=1.

Shared by the golden expositions (test_golden.py) and the golden Alertmanager payloads
(test_golden_alerts.py): one rule for writing (atomic) and one unified diff on mismatch.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

UPDATE = os.environ.get("FABRICMON_UPDATE_GOLDEN") == "1"


def match_golden(path: Path, got: str, *, produced_by: str, regenerate: str) -> None:
    """Fail with a unified diff when ``got`` differs from ``path``; with UPDATE, write ``got`` there instead."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(got)
        os.replace(tmp, path)
        return
    rel = f"{path.parent.name}/{path.name}"
    assert path.exists(), f"{rel} missing: run FABRICMON_UPDATE_GOLDEN=1 {regenerate}"
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                                            rel, produced_by, n=2))
        pytest.fail(f"{produced_by} differs from {rel} (FABRICMON_UPDATE_GOLDEN=1 {regenerate} rewrites it):\n"
                    f"{diff[:20000]}")
