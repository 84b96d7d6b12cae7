"""Build the remediation stage from the config and hang it on the engine (called by service.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from .. import incident_store
from . import breaker
from .actions import build_actions
from .config import RemediationSettings
from .executor import Executor
from .remediator import Remediator

if TYPE_CHECKING:
    from ..engine import Engine

log = structlog.get_logger("fabricmon.aggregator.remediation")


def build_remediator(s: RemediationSettings, engine: Engine, state_file: str, *, shard: str = "",
                     remote: Callable[[], tuple[tuple[float, str], ...]] | None = None) -> Remediator:
    topo = engine.topology
    limit = s.limit(len(topo.nodes))
    state = breaker.load(incident_store.read_section(state_file, "remediation"), limit, s.window, state_file,
                         s.mode)
    used = {a for acts in s.alert_actions().values() for a in acts}
    executor = Executor(build_actions(used, s.slurm, s.kubernetes, s.webhook), retries=s.retries,
                        backoff_s=s.retry_backoff_s)
    units = engine.shard_units

    def owns(node: str) -> bool:
        """Only the shard that owns a node's unit acts on it (one shard per node, never two)."""
        spec = topo.nodes.get(node)
        return spec is not None and (units is None or spec.unit in units)

    r = Remediator(s, state, executor, owns=owns, shard=shard, state_file=state_file, remote=remote)
    engine.detection.remediation = r
    log.info("remediation_configured", mode=s.mode, alerts=sorted(s.alert_actions()), actions=sorted(used),
             breaker_limit=limit, window_s=s.window, cooldown_s=s.cooldown, undo_after_s=s.undo_after,
             exclude=list(s.exclude), tripped=state.breaker.tripped or None,
             nodes_out=sum(1 for rec in state.nodes.values() if rec.undone_at is None and not rec.dry_run))
    return r
