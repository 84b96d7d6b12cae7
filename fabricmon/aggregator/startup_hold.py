"""The start-up hold: a node that just booted pages nothing for the link state of its boot.

After every reboot an InfiniBand port sits in INIT (or ARMED) with its physical link up until the
subnet manager's sweep activates it, seconds to a minute later; the agent starts before that.  Without
a hold the aggregator opened a critical FabricLinkDown on the rebooting node within a second.  So a
node's link-state findings (down, flapping, degraded) open no incident for ``max(restart_grace_s,
5 intervals)`` of sample time after its boot (the hello's ``boot_time``; for older agents, which send
none, after the hello that says it rebooted); a whole node's links down at once within that hold is its
reboot, not a page.  An incident already open (restored after a restart) is not held: its evidence still counts.

After the hold, a port in INIT/ARMED whose physical link is up is "waiting for the subnet manager": a
FabricLinkDown of severity warning, not critical (the cable is fine, the SM has not swept it).

This amends DESIGN's "alert directly within seconds" for link state of nodes in their hold.
"""

from __future__ import annotations

from collections.abc import Callable

from .agents_down import restart_grace
from .config import DetectionSettings
from .incidents import Finding
from .state import LINK_UP_PHYS, LinkState

LINK_STATE = frozenset({"FabricLinkDown", "FabricLinkFlapping", "FabricLinkDegraded"})
WAITING_FOR_SM = frozenset({2, 3})  # INIT, ARMED: the port trained, the subnet manager has not activated it


def waiting_for_sm(link: LinkState) -> bool:
    return link.state in WAITING_FOR_SM and link.phys == LINK_UP_PHYS


class StartupHold:
    def __init__(self) -> None:
        self._since: dict[str, float | None] = {}  # node -> sample time its hold runs from (None: next tick's)
        self._boot: dict[str, float] = {}

    def hello(self, node: str, clock_now: float, boot_time: float, rebooted: bool) -> None:
        """A hello.  With a boot time (agents from 0.2.0) the hold runs from the boot: a node booted
        long ago has none, so an aggregator restart holds nobody.  Without one (an older agent) it runs
        from the hello that says the node rebooted (its boot id changed: ``rebooted``)."""
        boot = max(0.0, boot_time)
        if boot > 0:
            if boot > self._boot.get(node, 0.0):
                self._boot[node], self._since[node] = boot, boot
        elif rebooted:
            self._since[node] = clock_now if clock_now > 0 else None

    def until(self, node: str, now: float, interval: float, s: DetectionSettings) -> float | None:
        """The sample time ``node``'s hold ends; None when it has none."""
        if node not in self._since:
            return None
        since = self._since[node]
        if since is None:  # the hello came before any sample time: it runs from now
            since = self._since[node] = now
        if since > now:
            # a boot after the node's own sample time: its boot time and its samples come from two clocks
            # (a simulated node's agent reads the real host's btime), not a boot: no hold
            return None
        return since + restart_grace(s, interval)

    def held(self, node: str, now: float, interval: float, s: DetectionSettings) -> bool:
        end = self.until(node, now, interval, s)
        return end is not None and now < end

    def apply(self, link: LinkState, findings: list[Finding], now: float, interval: float, s: DetectionSettings,
              is_open: Callable[[Finding], bool]) -> list[Finding]:
        """``findings`` of ``link`` with its link-state findings held (dropped unless already open), and
        a port waiting for the subnet manager past the hold said as a warning."""
        if not findings:
            return findings
        held = self.held(link.node, now, interval, s)
        out = []
        for f in findings:
            if f.alertname in LINK_STATE and held and not is_open(f):
                continue
            if f.alertname == "FabricLinkDown" and waiting_for_sm(link):
                f.severity = "warning"
                f.description = ("The port trained (physical LinkUp) but stays INIT/ARMED: it is waiting for the "
                                 "subnet manager to activate it, past the node's start-up hold. Check that the "
                                 "subnet manager runs and sweeps (sminfo, the SM's log).")
            out.append(f)
        return out
