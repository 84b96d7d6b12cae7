"""``fabricmon remediation reset``: close the circuit breaker again once an operator checked the nodes.

The running aggregator owns its state file, so the command does not edit it: it leaves a marker beside it
(``<state_file>.remediation-reset``, written atomically) that the aggregator takes at its next tick (or at
start, when it is not running), logs (``remediation_breaker_reset``) and saves.  Sharded, each shard has its
own state file: reset each (``kubectl exec`` into every replica).
"""

from __future__ import annotations

import argparse
import sys
import time

from ...atomic import atomic_write_bytes
from ...configload import ConfigError
from .marker import reset_marker


def add_arguments(p: argparse.ArgumentParser) -> None:
    rsub = p.add_subparsers(dest="remediation_command", required=True)
    r = rsub.add_parser("reset", help="reset the circuit breaker: the running aggregator takes it at its next tick")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the aggregator's config file (its state_file is used)")
    where.add_argument("--state-file", dest="state_file", help="the aggregator's state_file")


def run(args: argparse.Namespace) -> int:
    path = args.state_file
    if args.config:
        from ..config import load_aggregator_config

        cfg = load_aggregator_config(args.config)
        if cfg.remediation is None:
            raise ConfigError(f"{args.config}: remediation: not configured (nothing to reset)")
        path = cfg.state_file
    marker = reset_marker(path)
    atomic_write_bytes(marker, f"{time.time():.3f}\n".encode())
    print(f"fabricmon: breaker reset requested ({marker}): the aggregator logs remediation_breaker_reset when it "
          "takes it", file=sys.stderr)
    return 0
