"""Localize slow ranks over the topology and fuse counter evidence per component.

Evidence fusion: every detector finding (raised or still kept) adds a
log-likelihood ratio to its component; link evidence also counts for the NIC,
NVLink evidence for its GPU, GPU clock-throttle reasons (thermal, power brake)
for the GPU.  ``suspicion = sigmoid(prior + sum LLR)`` is exported per
component.

Topology vote (rail-optimized rules of DESIGN.md) over the persistent
stragglers of each job:

* most ranks of one host late together -> the node;
* ranks on several hosts of one (unit, rail) -> their leaf;
* one (host, GPU) -> its GPU, NIC, link or NVLinks, whichever carries evidence.

A group whose best component carries at least medium evidence is blamed on
that component: when the component already has its own evidence alert (a
flaky link, a degraded leaf) the hurt jobs and ranks are attached to it (one
fault, one alert); otherwise it becomes ``SlowRanksSharedComponent``.  A group with clean
counters on every network component of its path becomes ``StragglerRank``
on the GPU (or node / leaf) with "no fabric evidence found" in the description:
a compute straggler, not a fabric fault.  Compute-late ranks are never blamed
on fabric evidence (a bad link slows communication, not compute): a slow GPU on
a node with a bad NIC is two faults.  A whole pipeline stage late becomes
``StageImbalance`` (info), never a fabric alert.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import components as comp
from ..components import NETWORK_KINDS, Component, Kind
from ..topology import Topology
from .config import DetectionSettings
from .incidents import Finding, Key
from .stragglers import Straggler, StragglerReport
from .uplink_paths import crossed
from .verdicts import ALERT_LLR, FIRE, WAIT

if TYPE_CHECKING:
    from .remote_evidence import CrossShard, RemoteIncident
THROTTLE_LLR = 3.0
EVIDENCE_ALERTS = frozenset(ALERT_LLR)
# the components a rank's path holds, in the order they are candidates
PATH_KINDS = (Kind.LINK, Kind.NIC, Kind.GPU, Kind.LEAF, Kind.NODE)


@dataclass
class CorrelationResult:
    findings: list[Finding]
    suspicion: dict[Component, float]  # component -> probability


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@dataclass
class Evidence:
    """Fused counter evidence of one tick: log-likelihood ratios per component, and why."""

    llr: dict[Component, float]  # fabric and GPU-throttle evidence
    fabric: dict[Component, float]  # fabric evidence only: what SlowRanksSharedComponent may blame
    why: dict[Component, list[str]]


@dataclass
class Shared:
    """Slow ranks of one or more jobs localized to one component with at least medium evidence."""

    ranks: set[int]
    jobs: set[str]
    why: list[str]
    v: float


def correlate(
    topo: Topology,
    settings: DetectionSettings,
    findings: list[Finding],
    report: StragglerReport,
    throttled: dict[Component, set[str]],
    fresh_nodes: set[str],
    cluster: str,
    open_keys: frozenset[Key] = frozenset(),
    cross: CrossShard | None = None,
) -> CorrelationResult:
    """``throttled``: GPU -> active slow-down reasons; ``fresh_nodes``: names of the nodes with recent
    counters; ``open_keys``: (alertname, component) of the open incidents (read-only); ``cross``: in a
    sharded deployment, the other shards' fabric incidents for comm-late groups with no local evidence
    (remote_evidence.CrossShard, begun for this tick by the caller)."""
    ev = fuse_evidence(findings, open_keys, throttled)
    attach_hurt_ranks(topo, findings, report)
    out, shared = localize_stragglers(topo, settings, report, throttled, ev, fresh_nodes, cluster, cross)
    ride_on_own_alerts(shared, findings, open_keys)
    out.extend(shared_component_findings(topo, settings, shared, cluster))
    out.extend(stage_findings(settings, report, cluster))
    return CorrelationResult(out, suspicion_of(settings, ev, shared))


def fuse_evidence(findings: list[Finding], open_keys: frozenset[Key],
                  throttled: dict[Component, set[str]]) -> Evidence:
    """Sum the LLR of this tick's evidence, and of open incidents still in their hold time (evidence
    fades with them); link evidence also counts for its NIC, NVLink evidence for its GPU."""
    llr: dict[Component, float] = defaultdict(float)
    why: dict[Component, list[str]] = defaultdict(list)
    seen: set[Key] = set()
    items = [(f.alertname, f.component) for f in findings if f.fire or f.keep]
    items += sorted(open_keys)
    for alertname, component in items:
        v = ALERT_LLR.get(alertname)
        if v is None or (alertname, component) in seen:
            continue
        seen.add((alertname, component))
        comps = [component]
        parent = component.parent()
        if parent is not None:
            comps.append(parent)
        for c in comps:
            llr[c] += v
            why[c].append(alertname)
    fabric = dict(llr)
    for gid, reasons in throttled.items():
        if reasons:
            llr[gid] += THROTTLE_LLR
            why[gid].append("GPU throttle " + "+".join(sorted(reasons)))
    return Evidence(llr, fabric, why)


def attach_hurt_ranks(topo: Topology, findings: list[Finding], report: StragglerReport) -> None:
    """Flagged (slowish) ranks ride on the evidence findings on their path."""
    by_comp = report.hurt_by_component
    if by_comp is None:
        by_comp = defaultdict(set)
        for (job, rank), (node, gpu) in report.slowish.items():
            if node not in topo.nodes:
                continue
            for c in _path(topo, node, gpu):
                by_comp[c].add((job, rank))
        report.hurt_by_component = by_comp = dict(by_comp)
    if not by_comp:
        return
    for f in findings:
        if f.alertname not in EVIDENCE_ALERTS:
            continue
        c = f.component
        if c.kind is Kind.NVLINK:  # NVLink evidence is its GPU's
            c = c.parent() or c
        hurt = by_comp.get(c)
        if hurt:
            f.ranks = tuple(sorted({r for _, r in hurt} | set(f.ranks)))
            f.jobs = tuple(sorted({j for j, _ in hurt} | set(f.jobs)))


def localize_stragglers(topo: Topology, s: DetectionSettings, report: StragglerReport,
                        throttled: dict[Component, set[str]], ev: Evidence, fresh_nodes: set[str],
                        cluster: str, cross: CrossShard | None = None) -> tuple[list[Finding], dict[Component, Shared]]:
    """Per job, group the persistent stragglers over the topology and blame each group: a component
    with medium evidence (``Shared``), else a compute straggler or a load imbalance (findings)."""
    out: list[Finding] = []
    shared: dict[Component, Shared] = {}
    # per job and its scheduler id: two jobs of one name are grouped apart
    by_job: dict[tuple[str, str], list[Straggler]] = defaultdict(list)
    for st in report.stragglers:
        by_job[st.job, st.job_id].append(st)
    persistent = {(st.job, st.job_id, st.rank) for st in report.stragglers}
    for st in report.early:  # a throttled GPU's rank needs less persistence: the clock reason is evidence
        if (st.job, st.job_id, st.rank) not in persistent and throttled.get(comp.gpu(st.node, st.gpu)):
            by_job[st.job, st.job_id].append(st)
    memo = _Localized.of(topo, report)
    for (job, job_id), lst in by_job.items():
        groups = memo.groups(lst)
        node_groups = [g for g in groups if g[0].kind is Kind.NODE]
        if len(node_groups) >= 2 and not any(
                ev.llr.get(c, 0.0) > 0 for g in node_groups for c in _candidates(topo, *g, memo=memo)):
            out.append(_hosts_imbalance(s, job, job_id, node_groups, cluster))
            groups = [g for g in groups if g[0].kind is not Kind.NODE]
        for group, members in groups:
            cands = _candidates(topo, group, members, ev.fabric, report, memo=memo)
            # late compute is not what a bad link or NIC does (that slows communication): a slow GPU on
            # a node with a bad NIC is two faults, so compute-late ranks never ride on fabric evidence
            blame = cands if members[0].kind == "comm" else [c for c in cands if c.kind not in NETWORK_KINDS]
            best, best_v = None, 0.0
            for c in blame:
                v = ev.fabric.get(c, 0.0)
                if v > best_v:
                    best, best_v = c, v
            if best is not None and best_v >= s.medium_evidence:
                if any(m.current for m in members):
                    ent = shared.setdefault(best, Shared(set(), set(), ev.why[best], best_v))
                    ent.ranks.update(m.rank for m in members)
                    ent.jobs.add(job)
                continue
            net = [c for c in cands if c.kind in NETWORK_KINDS and ev.llr.get(c, 0.0) > 0]
            if members[0].kind == "comm" and (net or best_v > 0):
                continue  # weak evidence explains it (congestion): hurt ranks ride on that finding
            wait = False
            if cross is not None and members[0].kind == "comm":
                # sharded: the ring may be slowed by a fault another shard holds (remote_evidence.py)
                verdict = _cross_shard(topo, cross, job, group, members)
                if not isinstance(verdict, str):
                    continue  # rides on the remote incident: visible as explained, no page here
                wait = verdict == WAIT
            f = _straggler_finding(topo, s, job, group, members, cands, net, ev, fresh_nodes, cluster)
            if wait:
                f.fire = False  # within the grace: an open one is kept, a new one waits for a remote incident
                f.evidence.append("waiting for another shard's fabric incident on this rail (cross-shard grace)")
            elif f.component.kind is Kind.GPU and not net and f.alertname == "StragglerRank" and \
                    _siblings_pending(f, report, members, ev):
                f.fire = False  # an open one is kept; a new one waits for the node-level decision
            out.append(f)
    return out, shared


def _siblings_pending(f: Finding, report: StragglerReport, members: list[Straggler], ev: Evidence) -> bool:
    """One GPU's StragglerRank with nothing but its lateness to show waits while other GPUs of its node
    compute late too (flagged in ``straggler_clear`` of the last steps): the hardware signature (DESIGN
    "Jobs, decoys and cost") is one GPU late while its siblings are not.  Several GPUs of one host
    computing late together are the node's to decide (SoftwareStraggler once most of its GPUs are
    persistent, or a node fault with evidence): a slow dataloader otherwise paged its GPUs one by one as
    each crossed the persistence bar first.  Compute lateness only: the siblings of one slow GPU wait for
    it in their collectives (late in comm at most), which is the signature, not a host problem.  A GPU
    with its own evidence (a clock throttle reason, an XID) does not wait, and an incident already open
    is kept (``keep``)."""
    if ev.llr.get(f.component, 0.0) > 0:
        return False
    node, gpu = members[0].node, members[0].gpu
    others = sorted(g for n, g in report.compute_late if n == node and g != gpu)
    if not others:
        return False
    f.evidence.append(f"waiting for the node-level decision: GPU(s) {', '.join(map(str, others))} of {node} "
                      "compute late too (one GPU late while its siblings are not is the hardware signature)")
    return True


def _cross_shard(topo: Topology, cross: CrossShard, job: str, group: Component,
                 members: list[Straggler]) -> RemoteIncident | str:
    """The remote incident explaining a comm-late group with no local evidence, else FIRE or WAIT."""
    rail = group.rail if group.kind in (Kind.RAIL, Kind.LEAF) else None
    if rail is None:
        nic = topo.nic_for_gpu(members[0].node, members[0].gpu) if members[0].node in topo.nodes else None
        rail = nic.rail if nic is not None else None
    if rail is None:
        return FIRE  # no rail known: nothing remote can be matched to it, and nothing to wait for
    return cross.judge(job, rail, group, tuple(sorted(m.rank for m in members)))


def _job_labels(lab: dict[str, str], job: str, job_id: str) -> dict[str, str]:
    """The job's labels on a finding about its ranks: its name and, when it sends one, its scheduler id."""
    lab["hpc_job"] = job
    if job_id:
        lab["job_id"] = job_id
    return lab


def _hosts_imbalance(s: DetectionSettings, job: str, job_id: str,
                     node_groups: list[tuple[Component, list[Straggler]]], cluster: str) -> Finding:
    """Several whole hosts late together with clean counters: load imbalance, not hardware."""
    ranks = tuple(sorted(m.rank for g in node_groups for m in g[1]))
    on = comp.job(job)
    return Finding("StageImbalance", on, _job_labels(on.labels(cluster), job, job_id),
                   [f"{len(node_groups)} whole hosts ({len(ranks)} ranks) late together, counters clean"],
                   hold_s=s.straggler_hold_s, ranks=ranks[:64], jobs=(job,), severity="info",
                   description="many ranks late together with clean counters: a stage or load "
                               "imbalance, not a fabric fault")


def _straggler_finding(topo: Topology, s: DetectionSettings, job: str, group: Component,
                       members: list[Straggler], cands: list[Component], net: list[Component], ev: Evidence,
                       fresh_nodes: set[str], cluster: str) -> Finding:
    """A straggler group no fabric component explains: StragglerRank, saying why the fabric is cleared."""
    ranks = tuple(sorted(m.rank for m in members))
    nodes = {m.node for m in members}
    if group.kind is Kind.RAIL and len(members) == 1:
        group = topo.gpu(members[0].node, members[0].gpu)
    lab = group.labels(cluster)
    if len(nodes) == 1:
        lab["node"] = members[0].node
    _job_labels(lab, job, members[0].job_id)
    kind = lateness_of(members)
    late = max(m.late_frac for m in members)
    evidence = [f"{len(ranks)} rank(s) late {late * 100:.1f}% of step in "
                f"{s.straggler_persist}+ of last {s.straggler_window} steps ({kind})"]
    gpu_why = [w for c in cands for w in ev.why.get(c, []) if w.startswith("GPU throttle")]
    if group.kind is Kind.NODE and not net and not gpu_why and kind == "compute":
        # every rank of one host late together, every component it uses clean: a dataloader, the CPU or
        # the host's software (DESIGN "Jobs, decoys and cost"), never a page.  A real host fault with no
        # counter evidence is missed by design: the pager is for what the fabric and GPUs can show.
        current = any(m.current for m in members)
        return Finding("SoftwareStraggler", group, lab, evidence, fire=current, keep=current,
                       hold_s=s.straggler_hold_s, ranks=ranks, jobs=(job,), severity="info",
                       description="all ranks of this host are late together while every component they use is "
                                   "clean (no link, NIC, GPU throttle or XID evidence): a software straggler "
                                   "(input pipeline, CPU, GC), not a fabric fault")
    if not net:
        if nodes <= fresh_nodes:
            desc = "no fabric evidence found: counters clean on " + ", ".join(
                sorted(c.id for c in cands if c.kind in NETWORK_KINDS)[:6])
        else:
            desc = "no fabric evidence found (some nodes sent no recent counters)"
        if gpu_why:
            desc += "; " + "; ".join(sorted(set(gpu_why)))
        desc += "; likely a compute straggler (GPU, host or input pipeline)"
    elif kind == "comm":
        desc = "weak fabric evidence only: " + ", ".join(f"{c} ({'+'.join(ev.why[c])})" for c in net[:4])
    else:
        desc = ("compute time late, which fabric evidence on its path does not explain ("
                + ", ".join(f"{c} ({'+'.join(ev.why[c])})" for c in net[:4])
                + " slows communication); likely a compute straggler (GPU, host or input pipeline)")
    current = any(m.current for m in members)  # a straggler that already stopped opens nothing
    # what the alert is about, read by the inhibitions: only comm lateness is hidden under a fabric alert
    # on its leaf, rail or node (deploy/alertmanager).  Fixed once the incident fires (incidents.FIXED_LABELS).
    lab["lateness"] = kind
    if len(ranks) == 1:
        lab["rank"] = str(ranks[0])  # as on JobHung: the rank the job's own logs name
    return Finding("StragglerRank", group, lab, evidence,
                   fire=current, keep=current, hold_s=s.straggler_hold_s, ranks=ranks, jobs=(job,),
                   description=desc)


def lateness_of(members: list[Straggler]) -> str:
    """A straggler group's lateness: "compute" when any member computes late (no fabric fault explains
    late compute, so such an alert is never hidden under one), else "comm"."""
    return "compute" if any(m.kind == "compute" for m in members) else "comm"


def ride_on_own_alerts(shared: dict[Component, Shared], findings: list[Finding],
                       open_keys: frozenset[Key]) -> None:
    """One fault, one alert: where the shared component (or, for a NIC, its link) already has its
    own evidence finding or open incident, the hurt ranks and jobs ride on that alert instead."""
    own: dict[Component, list[Finding]] = defaultdict(list)
    for f in findings:
        if f.alertname in EVIDENCE_ALERTS and (f.fire or f.keep):
            own[f.component].append(f)
            if f.component.kind is Kind.LINK:
                own[f.component.parent()].append(f)  # type: ignore[index]  # a link's parent: its NIC
    owned_by_incident: set[Component] = set()
    for alertname, component in open_keys:
        if alertname in EVIDENCE_ALERTS:
            owned_by_incident.add(component)
            if component.kind is Kind.LINK:
                owned_by_incident.add(component.parent())  # type: ignore[arg-type]  # a link's: its NIC
    for c in list(shared):
        if c in own or c in owned_by_incident:
            ent = shared.pop(c)
            for f in own.get(c, ()):
                f.ranks = tuple(sorted(set(f.ranks) | ent.ranks))
                f.jobs = tuple(sorted(set(f.jobs) | ent.jobs))


def shared_component_findings(topo: Topology, s: DetectionSettings, shared: dict[Component, Shared],
                              cluster: str) -> list[Finding]:
    out = []
    for c, ent in shared.items():
        lab = c.labels(cluster)
        jobs = sorted(ent.jobs)
        if len(jobs) == 1:
            lab["hpc_job"] = jobs[0]
        out.append(Finding(
            "SlowRanksSharedComponent", c, lab,
            [f"{len(ent.ranks)} slow rank(s) share {c}", "evidence: " + ", ".join(sorted(set(ent.why)))],
            hold_s=s.straggler_hold_s, ranks=tuple(sorted(ent.ranks)), jobs=tuple(jobs),
            description=f"slow ranks of {', '.join(jobs)} localized to {c} (log-odds {ent.v:.1f})"))
    return out


def stage_findings(s: DetectionSettings, report: StragglerReport, cluster: str) -> list[Finding]:
    """A whole pipeline stage (or a quarter of the ranks) late: StageImbalance (info), never a fabric alert."""
    out = []
    for sl in report.stages:
        on = comp.job(sl.job, sl.stage if sl.stage >= 0 else None)
        desc = ("whole pipeline stage late with clean counters: a partition imbalance, not a fabric fault"
                if sl.stage >= 0 else "many ranks late together in every step: load imbalance, not a fabric fault")
        out.append(Finding("StageImbalance", on, _job_labels(on.labels(cluster), sl.job, sl.job_id),
                           [f"stage {sl.stage} median compute +{sl.late_frac * 100:.1f}% of step"] if sl.stage >= 0
                           else ["more than a quarter of the ranks late together, persistently"],
                           hold_s=s.straggler_hold_s, ranks=sl.ranks[:64], jobs=(sl.job,), description=desc,
                           severity="info"))
    return out


def suspicion_of(s: DetectionSettings, ev: Evidence, shared: dict[Component, Shared]) -> dict[Component, float]:
    prior = s.prior_log_odds
    suspicion = {c: _sigmoid(prior + v) for c, v in ev.llr.items() if v > 0}
    for c, ent in shared.items():
        suspicion[c] = _sigmoid(prior + ent.v + 4.0)
    return suspicion


def _path(topo: Topology, node: str, gpu: int) -> list[Component]:
    return [c for k, c in topo.path_of_gpu(node, gpu).items() if k is not Kind.RAIL]


def _group(topo: Topology, lst: list[Straggler]) -> list[tuple[Component, list[Straggler]]]:
    """Split one job's persistent stragglers into (component, members)."""
    groups: list[tuple[Component, list[Straggler]]] = []
    # comm-late ranks of one rail on several hosts: a ring slowed by one component on that rail
    # (the rings of a rail-optimized job span units, so every rank of the rail waits for it).  On a
    # fabric that is not rail-optimized (a fat tree: rail None) the leaf the topology puts the NIC on
    # is the grain: the ranks behind one slow leaf are late together, whatever their GPU index.
    by_rail: dict[int, list[Straggler]] = defaultdict(list)
    by_own_leaf: dict[Component, list[Straggler]] = defaultdict(list)
    compute = []
    for st in lst:
        nic = topo.nic_for_gpu(st.node, st.gpu) if st.node in topo.nodes else None
        if st.kind == "comm" and nic is not None and nic.rail is not None:
            by_rail[nic.rail].append(st)
        elif st.kind == "comm" and nic is not None:
            by_own_leaf[topo.leaf_for(st.node, nic)].append(st)
        else:
            compute.append(st)
    for r, members in by_rail.items():
        leaves = {_leaf_of_rank(topo, m) for m in members}
        if len(leaves) == 1 and len({m.node for m in members}) >= 2:
            groups.append((next(iter(leaves)), members))
        else:
            groups.append((comp.rail(r), members))
    for lf, members in by_own_leaf.items():
        if len({m.node for m in members}) >= 2:
            groups.append((lf, members))
        else:
            compute.extend(members)  # one host behind the leaf: its own NIC, link or GPU, judged below
    lst = compute
    by_node: dict[str, list[Straggler]] = defaultdict(list)
    for st in lst:
        by_node[st.node].append(st)
    rest = []
    for name, members in by_node.items():
        spec = topo.nodes.get(name)
        gpus = {m.gpu for m in members}
        if spec is not None and len(gpus) >= max(2, math.ceil(0.75 * spec.gpus)):
            groups.append((comp.node(name), members))
        else:
            rest.extend(members)
    by_leaf: dict[Component, list[Straggler]] = defaultdict(list)
    singles = []
    for m in rest:
        nic = topo.nic_for_gpu(m.node, m.gpu) if m.node in topo.nodes else None
        if nic is None:
            singles.append(m)
            continue
        by_leaf[topo.leaf_for(m.node, nic)].append(m)
    for lf, members in by_leaf.items():
        if len({m.node for m in members}) >= 2:
            groups.append((lf, members))
        else:
            singles.extend(members)
    for m in singles:
        groups.append((topo.gpu(m.node, m.gpu), [m]))
    return groups


class _Localized:
    """What localization derives from one straggler report and the topology alone, kept on the report
    (``StragglerReport.localized``) for the ticks that reuse it (4 a second against one scored step):
    each job's groups and each group's path components.  Derived again when the topology's NIC maps
    change (a hello binds or pairs NICs) or a reload replaces it; evidence is never kept here."""

    def __init__(self, topo: Topology, version: int) -> None:
        self.topo, self.version = topo, version
        # keyed by the identity of the report's own objects (Stragglers, the group lists made here),
        # which live as long as the report that holds this
        self._groups: dict[tuple[int, ...], tuple[list[Straggler], list[tuple[Component, list[Straggler]]]]] = {}
        self._paths: dict[tuple[Component, int], tuple[list[Straggler], tuple[Component, ...]]] = {}
        self._nodes: dict[str, tuple[Component, ...]] = {}

    @staticmethod
    def of(topo: Topology, report: StragglerReport) -> _Localized:
        got = report.localized
        if not isinstance(got, _Localized) or got.topo is not topo or got.version != topo.index.version:
            got = report.localized = _Localized(topo, topo.index.version)
        return got

    def groups(self, lst: list[Straggler]) -> list[tuple[Component, list[Straggler]]]:
        key = tuple(map(id, lst))
        got = self._groups.get(key)
        if got is None:
            got = self._groups[key] = (lst, _group(self.topo, lst))  # lst kept: its ids stay its own
        return got[1]

    def node_network(self, node: str) -> tuple[Component, ...]:
        got = self._nodes.get(node)
        if got is None:
            got = self._nodes[node] = _node_network(self.topo, node)
        return got

    def path_components(self, group: Component, members: list[Straggler]) -> tuple[Component, ...]:
        key = (group, id(members))
        got = self._paths.get(key)
        if got is None or got[0] is not members:
            got = self._paths[key] = (members, _path_components(self.topo, group, members))
        return got[1]


def _path_components(topo: Topology, group: Component, members: list[Straggler]) -> tuple[Component, ...]:
    """The group, then every component on its members' paths, in the order they are candidates."""
    # an insertion-ordered set: a rail's group holds every slow rank of the rail (thousands in a big
    # job), and a list's membership test made this quadratic in them
    cands: dict[Component, None] = {group: None}
    for m in members:
        if m.node not in topo.nodes:
            continue
        p = topo.path_of_gpu(m.node, m.gpu)
        for k in PATH_KINDS:
            if k in p:
                cands.setdefault(p[k])
        # NVLinks of the GPU carry their evidence on the GPU (see fuse_evidence)
    return tuple(cands)


def _candidates(topo: Topology, group: Component, members: list[Straggler],
                evidence: dict[Component, float] | None = None, report: StragglerReport | None = None,
                memo: _Localized | None = None) -> list[Component]:
    cands: dict[Component, None] = dict.fromkeys(
        memo.path_components(group, members) if memo is not None else _path_components(topo, group, members))
    if group.kind in (Kind.RAIL, Kind.LEAF) and members and members[0].kind == "comm" and evidence:
        # a ring is as slow as its slowest link: any component of the rail with evidence explains it;
        # with no rail (a fat tree's leaf) the components the topology puts on that leaf
        for c in evidence:
            if c in cands:
                continue
            if group.rail is not None and _rail_of(topo, c) == group.rail:
                cands[c] = None
            elif group.rail is None and group.kind is Kind.LEAF and c.kind in NETWORK_KINDS and c.leaf == group.id:
                cands[c] = None
    if members and members[0].kind == "comm" and evidence and report is not None:
        # the uplinks and spines the job's ring crosses (uplink_paths.py): their evidence explains it too,
        # whichever of the ring's ranks are persistent yet (a few under one leaf, or one GPU)
        for c in crossed(topo, report, members[0].job, members[0].job_id, members, evidence):
            cands.setdefault(c)
    if group.kind is Kind.NODE and group.node in topo.nodes:
        for c in memo.node_network(group.node) if memo is not None else _node_network(topo, group.node):
            cands.setdefault(c)
    return list(cands)


def _node_network(topo: Topology, node: str) -> tuple[Component, ...]:
    """A node's links and NICs, link then NIC for each of its NICs: a whole host's candidates."""
    return tuple(c for nic in topo.nodes[node].nics for c in (topo.link(node, nic), topo.nic_component(node, nic)))


def _leaf_of_rank(topo: Topology, m: Straggler) -> Component:
    nic = topo.nic_for_gpu(m.node, m.gpu)
    return topo.leaf_for(m.node, nic) if nic is not None else topo.leaf(m.node, None)


def _rail_of(topo: Topology, c: Component) -> int | None:
    """The rail a component with evidence sits on, by the topology: a leaf's, or its NIC's."""
    if c.kind is Kind.LEAF:
        return c.rail
    if c.kind in (Kind.LINK, Kind.NIC, Kind.CONFIG) and c.device and c.node in topo.nodes:
        nic = topo.nic(c.node, c.device)
        if nic is not None:
            return nic.rail
    return None


__all__ = ["ALERT_LLR", "CorrelationResult", "correlate"]
