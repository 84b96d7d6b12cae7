"""Connects the optional parts of a running agent: aggregator stream, rank intake, NCCL Inspector."""

from __future__ import annotations

import structlog

from .runtime import Agent

log = structlog.get_logger("fabricmon.agent")


def attach_stream_and_intake(agent: Agent) -> None:
    """Filled in once the stream client and intake exist."""
