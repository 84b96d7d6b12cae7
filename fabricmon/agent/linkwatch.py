"""Link state between polls: a change asks the poller for one off-cadence poll.

At a 5-10 s poll interval a link that goes down is in no batch until the next poll, yet its state
is the cheapest thing on the node to read and the most urgent.  Every ``link_watch_interval``
(default 1 s) this reads only the few files that change when a link changes state, the files the
sources already read with the sources' own parsers:

* per RDMA port (InfiniBand and RoCE): ``ports/<p>/state``, ``phys_state`` and ``rate`` (``parse_state``,
  ``parse_phys_state``, ``parse_rate``: a link retrained at half width stays ACTIVE) and
  ``counters/link_downed`` (``parse_counter`` at its PMA width): a down-and-up between two watch
  passes still moves ``link_downed``;
* per netdev (a RoCE port's, and ``sources.ethtool.interfaces``): ``class/net/<if>/operstate``,
  ``carrier_changes`` and ``carrier_down_count`` where the kernel has them (``carrier_down_count``
  since 4.16): the carrier counts catch a bounce between two passes.

On a change it calls ``request_poll``: the poller then runs one full poll off its cadence
(``poller.OffCadenceGate``: at most one between two regular polls), so every delta of every source
stays consistent and the regular cadence is kept.  Nothing here makes a batch of its own.

Reads run on a daemon worker per device or netdev (``guarded_io.KeyedWorkers``) waited for with a
deadline: a stuck device costs its own links, which are counted unwatched, never the watch.  A file
that vanished or reads junk is counted, never raised; a file that was never there on this kernel or
driver (``optional``) is simply not watched.  The set of links comes from the poller's last
discovery: no listing of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import structlog

from ..sources.errorlog import ErrorLog
from ..sources.guarded_io import KeyedWorkers, read_regular, run_all
from ..sources.infiniband import PMA_ERROR_WIDTHS, parse_counter, parse_phys_state, parse_rate, parse_state
from ..sources.inventory import Inventory

log = structlog.get_logger("fabricmon.linkwatch")

_READ_SIZE = 128  # the longest is rate ("400 Gb/sec (4X NDR)")


def _state(data: bytes) -> int:
    return parse_state(data.decode("ascii", "replace"))[0]


def _phys_state(data: bytes) -> int:
    return parse_phys_state(data.decode("ascii", "replace"))[0]


def _rate(data: bytes) -> tuple[float, int]:
    r = parse_rate(data.decode("ascii", "replace"))
    return r.gbps, r.width_lanes


def _link_downed(data: bytes) -> int:
    return parse_counter(data, PMA_ERROR_WIDTHS["link_downed"])


def _count(data: bytes) -> int:
    return parse_counter(data, 64)


def _operstate(data: bytes) -> str:
    # RFC 2863 words ("up", "down", "lowerlayerdown", ...): compared, never interpreted
    return data.decode("ascii", "replace").strip()


@dataclass(frozen=True, slots=True)
class Watched:
    """One file the watch reads: where it is relative to its link, how its value is parsed, and
    whether a link without it is still watched (the file is absent on some kernels or drivers)."""

    name: str
    parse: Callable[[bytes], object]
    optional: bool


# Relative to an RDMA port's directory (class/infiniband/<dev>/ports/<p>).
PORT_FILES: tuple[Watched, ...] = (
    Watched("state", _state, optional=False),
    Watched("phys_state", _phys_state, optional=False),
    Watched("rate", _rate, optional=False),  # a link that retrained at a lower width or speed stays ACTIVE
    Watched("counters/link_downed", _link_downed, optional=True),  # bnxt_re and irdma have no counters/
)
# Relative to class/net/<if>.
NETDEV_FILES: tuple[Watched, ...] = (
    Watched("operstate", _operstate, optional=False),
    Watched("carrier_changes", _count, optional=True),  # since Linux 3.15
    Watched("carrier_down_count", _count, optional=True),  # since Linux 4.16
)


@dataclass(frozen=True, slots=True)
class WatchedLink:
    """A link and the files that show its state: an RDMA port (with its netdev's files when it has
    one) or a configured netdev without an RDMA port."""

    key: str  # "mlx5_3/1" or the netdev name
    worker: str  # the device (or netdev) whose worker reads it: one stuck device costs its own links
    files: tuple[tuple[str, Watched], ...]  # (full path, what it is)


def watched_links(inventory: Inventory) -> list[WatchedLink]:
    """Every link of the inventory and the files the watch reads for it (pure: no I/O)."""
    root = inventory.sysfs_root
    net = f"{root}/class/net"
    out: list[WatchedLink] = []
    for p in inventory.ports:
        files = [(f"{p.path}/{w.name}", w) for w in PORT_FILES]
        if p.netdev:
            files += [(f"{net}/{p.netdev}/{w.name}", w) for w in NETDEV_FILES]
        out.append(WatchedLink(f"{p.device}/{p.port}", p.device, tuple(files)))
    ported = {p.netdev for p in inventory.ports if p.netdev}
    for ifname in inventory.extra_netdevs:
        if ifname not in ported:
            out.append(WatchedLink(ifname, ifname, tuple((f"{net}/{ifname}/{w.name}", w) for w in NETDEV_FILES)))
    return out


def read_link(link: WatchedLink) -> dict[str, object | Exception]:
    """Each file's parsed value, or the OSError/ValueError that reading or parsing it raised."""
    out: dict[str, object | Exception] = {}
    for path, w in link.files:
        try:
            out[path] = w.parse(read_regular(path, _READ_SIZE))
        except (OSError, ValueError) as exc:
            out[path] = exc
    return out


@dataclass
class WatchPass:
    """What one pass found."""

    changed: list[str]  # keys of links whose state changed since the previous pass
    watched: int  # links whose state files were read
    unwatched: list[str]  # links it could not watch (required file unreadable, device stuck): "key: why"


class LinkWatch:
    """Reads link state files every ``interval`` seconds; a change calls ``request_poll``.

    ``inventory`` returns the poller's latest discovery (None before the first poll).  ``tick`` is one
    pass (the simulator calls it on its own clock); ``run`` repeats it on a fixed cadence."""

    def __init__(self, inventory: Callable[[], Inventory | None], request_poll: Callable[[], None],
                 interval: float, deadline: float | None = None, inline: bool = False) -> None:
        self._inventory = inventory
        self._request_poll = request_poll
        self.interval = interval
        # a pass must end well before the next one: a stuck device is left behind after this long
        self.deadline = deadline if deadline is not None else max(0.05, 0.5 * interval)
        # inline: read in the calling thread, without deadlines.  Only for trees that cannot block (the
        # simulator's files on tmpfs, read by hundreds of simulated agents in one process).
        self._inline = inline
        self._workers = KeyedWorkers("linkwatch")
        self._last: dict[str, object] = {}  # path -> last parsed value (files read fine last pass)
        self._absent: set[str] = set()  # optional files never seen on this link: not watched
        self._seen: set[str] = set()  # files read fine at least once (absent after that is a loss)
        self._errlog = ErrorLog("linkwatch", event="link_watch_unreadable")
        self._lock = threading.Lock()
        self.passes_total = 0
        self.reads_total = 0  # files read (successfully or not)
        self.read_errors_total = 0
        self.changes_total = 0  # link state changes seen between polls
        self.requests_total = 0  # polls requested (the poller counts the ones it ran)
        self.links_watched = 0
        self.links_unwatched = 0

    def tick(self) -> WatchPass:
        """One pass over every link of the latest inventory; requests a poll when a link changed."""
        inv = self._inventory()
        links = watched_links(inv) if inv is not None else []
        calls: dict[Hashable, tuple[Callable[..., object], tuple]] = {}
        by_worker: dict[str, list[WatchedLink]] = {}
        for link in links:
            by_worker.setdefault(link.worker, []).append(link)
        for worker, group in by_worker.items():
            calls[worker] = (_read_group, (group,))
        if self._inline:
            done: dict[Hashable, object] = {k: fn(*args) for k, (fn, args) in calls.items()}
            blocked: dict[Hashable, str] = {}
        elif calls:
            done, blocked = run_all(self._workers, calls, self.deadline)
        else:
            done, blocked = {}, {}
        changed: list[str] = []
        unwatched: list[str] = []
        messages: list[str] = []
        reads = errors = 0
        live: set[str] = set()
        for worker, group in by_worker.items():
            result = done.get(worker)
            if worker in blocked or not isinstance(result, dict):
                why = blocked.get(worker) or f"unexpected {type(result).__name__}: {result}"
                unwatched.extend(f"{link.key}: {why}" for link in group)
                messages.extend(f"{link.key}: {why}" for link in group)
                continue
            for link in group:
                values = result[link.key]
                reads += len(values)
                blind = ""
                moved = False
                for path, w in link.files:
                    live.add(path)
                    v = values[path]
                    if isinstance(v, Exception):
                        if w.optional and path not in self._seen and isinstance(v, FileNotFoundError):
                            self._absent.add(path)  # not on this kernel or driver: nothing lost
                            continue
                        errors += 1
                        self._last.pop(path, None)  # a value after the gap is a new baseline, not a change
                        messages.append(f"{link.key}: {path}: {_why(v)}")
                        if not w.optional or path in self._seen:
                            blind = blind or f"{path}: {_why(v)}"
                        continue
                    self._seen.add(path)
                    self._absent.discard(path)
                    old = self._last.get(path, _NONE)
                    if old is not _NONE and old != v:
                        moved = True
                    self._last[path] = v
                if moved:
                    changed.append(link.key)
                if blind:
                    unwatched.append(f"{link.key}: {blind}")
        # forget files of links that left the inventory (unplugged): bounded by what is present
        for stale in [p for p in self._last if p not in live]:
            del self._last[stale]
        self._seen &= live
        self._absent &= live
        self._workers.retire(by_worker)
        if messages:
            self._errlog.report(messages)
        with self._lock:
            self.passes_total += 1
            self.reads_total += reads
            self.read_errors_total += errors
            self.changes_total += len(changed)
            self.links_unwatched = len(unwatched)
            self.links_watched = len(links) - len(unwatched)
            if changed:
                self.requests_total += 1
        if changed:
            log.info("link_state_changed", links=changed[:16], action="off-cadence poll requested")
            self._request_poll()
        return WatchPass(changed, len(links) - len(unwatched), unwatched)

    def run(self, stop: threading.Event) -> None:
        """A pass every ``interval`` seconds until ``stop``, on a fixed cadence (skips, never bursts)."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # never let the watch die: the regular polls still run
                log.error("link_watch_failed", error=f"{type(exc).__name__}: {exc}")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0.0
            stop.wait(delay)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"passes_total": self.passes_total, "reads_total": self.reads_total,
                    "read_errors_total": self.read_errors_total, "changes_total": self.changes_total,
                    "requests_total": self.requests_total, "links_watched": self.links_watched,
                    "links_unwatched": self.links_unwatched}

    def close(self) -> None:
        self._workers.close()  # never waits for a worker blocked in a read


_NONE = object()


def _read_group(group: list[WatchedLink]) -> dict[str, dict[str, object | Exception]]:
    return {link.key: read_link(link) for link in group}


def _why(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return str(exc)
