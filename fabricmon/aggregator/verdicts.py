"""What the correlator and the cross-shard explanation share: how strongly each evidence alert explains
slow ranks, and the verdicts for a straggler group no remote incident explains.  Its own module so that
remote_evidence.py needs nothing from correlator.py, which takes remote evidence in (no import cycle)."""

from __future__ import annotations

FIRE, WAIT = "fire", "wait"  # CrossShard.judge's verdicts when no remote incident explains a group

ALERT_LLR = {
    "FabricLinkDown": 6.0,
    "GPUXidFatal": 6.0,
    "NVLinkDown": 5.0,
    "FabricLeafDegraded": 4.0,
    "FabricSpineDegraded": 4.0,
    "FabricLinkErrors": 3.0,
    "FabricLinkFlapping": 3.0,
    "FabricLinkDegraded": 3.0,
    "RDMARetransmits": 3.0,
    "FabricPFCStorm": 3.0,
    "NVLinkErrors": 3.0,
    "FabricConfigDrift": 2.0,
    "FabricCongestion": 1.5,
}
