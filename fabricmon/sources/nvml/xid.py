"""Which XID codes are fatal: the GPU needs a reset or the node a drain.

From NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors, "XID Error Listing"):
48 double-bit ECC error, 61/62 internal micro-controller breakpoint/halt, 64 ECC page
retirement or row-remap failure, 74 NVLink error, 79 GPU has fallen off the bus,
94/95 contained/uncontained ECC error, 119/120 GSP RPC timeout/error, 140 unrecovered
ECC error.  The aggregator's ``detection.xid_fatal`` default and the GPUXidFatal rule
use the same list (tests hold them equal).
"""

from __future__ import annotations

FATAL_XIDS: frozenset[int] = frozenset({48, 61, 62, 64, 74, 79, 94, 95, 119, 120, 140})


def fatal_count(xid_counts: dict[int, int]) -> int:
    """Fatal XIDs among a GPU's cumulative per-code counts."""
    return sum(n for code, n in xid_counts.items() if code in FATAL_XIDS)
