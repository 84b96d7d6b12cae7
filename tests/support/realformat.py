"""Paths of the real-format corpus (tests/fixtures/realformat, sources cited in its README)."""

from __future__ import annotations

from pathlib import Path

from support.paths import FIXTURES

ROOT = FIXTURES / "realformat"


def fixture(*parts: str) -> Path:
    return ROOT.joinpath(*parts)


def text(*parts: str) -> str:
    return fixture(*parts).read_text()
