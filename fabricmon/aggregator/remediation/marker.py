"""Where ``fabricmon remediation reset`` leaves its marker: a module of its own, so the command loads nothing
of the aggregator (and no numpy) to write it."""

from __future__ import annotations

from pathlib import Path

RESET_SUFFIX = ".remediation-reset"  # the marker `fabricmon remediation reset` leaves beside the state file


def reset_marker(state_file: str) -> Path:
    return Path(state_file + RESET_SUFFIX)
