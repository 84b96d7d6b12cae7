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

from ..topology import Topology, gpu_id, leaf_id, link_id, nic_id
from .config import DetectionSettings
from .incidents import Finding
from .stragglers import StragglerReport

ALERT_LLR = {
    "FabricLinkDown": 6.0,
    "GPUXidFatal": 6.0,
    "NVLinkDown": 5.0,
    "FabricLeafDegraded": 4.0,
    "FabricLinkErrors": 3.0,
    "FabricLinkFlapping": 3.0,
    "FabricLinkDegraded": 3.0,
    "RDMARetransmits": 3.0,
    "FabricPFCStorm": 3.0,
    "NVLinkErrors": 3.0,
    "FabricConfigDrift": 2.0,
    "FabricCongestion": 1.5,
}
THROTTLE_LLR = 3.0
NETWORK_TYPES = ("link", "nic", "leaf", "rail", "spine", "config")
EVIDENCE_ALERTS = frozenset(ALERT_LLR)


@dataclass
class CorrelationResult:
    findings: list[Finding]
    suspicion: dict[tuple[str, str], float]  # (component_type, component) -> probability


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def component_type_of(component: str) -> str:
    if component.startswith("leaf-"):
        return "leaf"
    if component.startswith("rail"):
        return "rail"
    if component.startswith("spine-"):
        return "spine"
    parts = component.split("/")
    if len(parts) == 1:
        return "node"
    if len(parts) == 3:
        return "nvlink" if parts[1].startswith("gpu") else "link"
    return "gpu" if parts[1].startswith("gpu") else "nic"


@dataclass
class Evidence:
    """Fused counter evidence of one tick: log-likelihood ratios per component, and why."""

    llr: dict[str, float]  # fabric and GPU-throttle evidence
    fabric: dict[str, float]  # fabric evidence only: what SlowRanksSharedComponent may blame
    why: dict[str, list[str]]


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
    throttled: dict[str, set[str]],
    fresh_nodes: set[str],
    cluster: str,
    open_keys: frozenset[tuple[str, str, str]] = frozenset(),
) -> CorrelationResult:
    """``throttled``: gpu id -> active slow-down reasons; ``fresh_nodes``: nodes with recent counters;
    ``open_keys``: (alertname, component_type, component) of the open incidents (read-only)."""
    ev = fuse_evidence(findings, open_keys, throttled)
    attach_hurt_ranks(topo, findings, report)
    out, shared = localize_stragglers(topo, settings, report, throttled, ev, fresh_nodes, cluster)
    ride_on_own_alerts(shared, findings, open_keys)
    out.extend(shared_component_findings(topo, settings, shared, cluster))
    out.extend(stage_findings(settings, report, cluster))
    return CorrelationResult(out, suspicion_of(settings, ev, shared))


def fuse_evidence(findings: list[Finding], open_keys: frozenset[tuple[str, str, str]],
                  throttled: dict[str, set[str]]) -> Evidence:
    """Sum the LLR of this tick's evidence, and of open incidents still in their hold time (evidence
    fades with them); link evidence also counts for its NIC, NVLink evidence for its GPU."""
    llr: dict[str, float] = defaultdict(float)
    why: dict[str, list[str]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    items = [(f.alertname, f.component_type, f.component) for f in findings if f.fire or f.keep]
    items += sorted(open_keys)
    for alertname, ctype, component in items:
        v = ALERT_LLR.get(alertname)
        if v is None or (alertname, component) in seen:
            continue
        seen.add((alertname, component))
        comps = [component]
        if ctype == "link":
            node, dev, _ = component.split("/", 2)
            comps.append(nic_id(node, dev))
        elif ctype == "nvlink":
            comps.append(component.rsplit("/", 1)[0])
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
        comp = f.component
        if f.component_type == "nvlink":
            comp = comp.rsplit("/", 1)[0]
        hurt = by_comp.get(comp)
        if hurt:
            f.ranks = tuple(sorted({r for _, r in hurt} | set(f.ranks)))
            f.jobs = tuple(sorted({j for j, _ in hurt} | set(f.jobs)))


def localize_stragglers(topo: Topology, s: DetectionSettings, report: StragglerReport,
                        throttled: dict[str, set[str]], ev: Evidence, fresh_nodes: set[str],
                        cluster: str) -> tuple[list[Finding], dict[str, Shared]]:
    """Per job, group the persistent stragglers over the topology and blame each group: a component
    with medium evidence (``Shared``), else a compute straggler or a load imbalance (findings)."""
    out: list[Finding] = []
    shared: dict[str, Shared] = {}
    by_job: dict[str, list] = defaultdict(list)
    for st in report.stragglers:
        by_job[st.job].append(st)
    persistent = {(st.job, st.rank) for st in report.stragglers}
    for st in report.early:  # a throttled GPU's rank needs less persistence: the clock reason is evidence
        if (st.job, st.rank) not in persistent and throttled.get(gpu_id(st.node, st.gpu)):
            by_job[st.job].append(st)
    for job, lst in by_job.items():
        groups = _group(topo, lst)
        node_groups = [g for g in groups if g[0] == "node"]
        if len(node_groups) >= 2 and not any(
                ev.llr.get(c, 0.0) > 0 for g in node_groups for c in _candidates(topo, *g)):
            out.append(_hosts_imbalance(s, job, node_groups, cluster))
            groups = [g for g in groups if g[0] != "node"]
        for kind, comp, members in groups:
            cands = _candidates(topo, kind, comp, members, ev.fabric)
            # late compute is not what a bad link or NIC does (that slows communication): a slow GPU on
            # a node with a bad NIC is two faults, so compute-late ranks never ride on fabric evidence
            blame = cands if members[0].kind == "comm" else [
                c for c in cands if component_type_of(c) not in NETWORK_TYPES]
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
            net = [c for c in cands if component_type_of(c) in NETWORK_TYPES and ev.llr.get(c, 0.0) > 0]
            if members[0].kind == "comm" and (net or best_v > 0):
                continue  # weak evidence explains it (congestion): hurt ranks ride on that finding
            out.append(_straggler_finding(topo, s, job, kind, comp, members, cands, net, ev, fresh_nodes, cluster))
    return out, shared


def _hosts_imbalance(s: DetectionSettings, job: str, node_groups: list, cluster: str) -> Finding:
    """Several whole hosts late together with clean counters: load imbalance, not hardware."""
    ranks = tuple(sorted(m.rank for g in node_groups for m in g[2]))
    lab = {"hpc_job": job}
    if cluster:
        lab["cluster"] = cluster
    return Finding("StageImbalance", "job", job, lab,
                   [f"{len(node_groups)} whole hosts ({len(ranks)} ranks) late together, counters clean"],
                   hold_s=s.straggler_hold_s, ranks=ranks[:64], jobs=(job,), severity="info",
                   description="many ranks late together with clean counters: a stage or load "
                               "imbalance, not a fabric fault")


def _straggler_finding(topo: Topology, s: DetectionSettings, job: str, kind: str, comp: str, members: list,
                       cands: list[str], net: list[str], ev: Evidence, fresh_nodes: set[str],
                       cluster: str) -> Finding:
    """A straggler group no fabric component explains: StragglerRank, saying why the fabric is cleared."""
    ranks = tuple(sorted(m.rank for m in members))
    nodes = {m.node for m in members}
    if kind == "rail" and len(members) == 1:
        kind, comp = "gpu", gpu_id(members[0].node, members[0].gpu)
    lab = _labels(topo, kind, comp, members, cluster)
    lab["hpc_job"] = job
    late = max(m.late_frac for m in members)
    evidence = [f"{len(ranks)} rank(s) late {late * 100:.1f}% of step in "
                f"{s.straggler_persist}+ of last {s.straggler_window} steps ({members[0].kind})"]
    gpu_why = [w for c in cands for w in ev.why.get(c, []) if w.startswith("GPU throttle")]
    if kind == "node" and not net and not gpu_why and members[0].kind == "compute":
        # every rank of one host late together, every component it uses clean: a dataloader, the CPU or
        # the host's software (DESIGN "Jobs, decoys and cost"), never a page.  A real host fault with no
        # counter evidence is missed by design: the pager is for what the fabric and GPUs can show.
        current = any(m.current for m in members)
        return Finding("SoftwareStraggler", "node", comp, lab, evidence, fire=current, keep=current,
                       hold_s=s.straggler_hold_s, ranks=ranks, jobs=(job,), severity="info",
                       description="all ranks of this host are late together while every component they use is "
                                   "clean (no link, NIC, GPU throttle or XID evidence): a software straggler "
                                   "(input pipeline, CPU, GC), not a fabric fault")
    if not net:
        if nodes <= fresh_nodes:
            desc = "no fabric evidence found: counters clean on " + ", ".join(
                sorted(c for c in cands if component_type_of(c) in NETWORK_TYPES)[:6])
        else:
            desc = "no fabric evidence found (some nodes sent no recent counters)"
        if gpu_why:
            desc += "; " + "; ".join(sorted(set(gpu_why)))
        desc += "; likely a compute straggler (GPU, host or input pipeline)"
    elif members[0].kind == "comm":
        desc = "weak fabric evidence only: " + ", ".join(f"{c} ({'+'.join(ev.why[c])})" for c in net[:4])
    else:
        desc = ("compute time late, which fabric evidence on its path does not explain ("
                + ", ".join(f"{c} ({'+'.join(ev.why[c])})" for c in net[:4])
                + " slows communication); likely a compute straggler (GPU, host or input pipeline)")
    current = any(m.current for m in members)  # a straggler that already stopped opens nothing
    return Finding("StragglerRank", kind if kind != "rank" else "gpu", comp, lab, evidence,
                   fire=current, keep=current, hold_s=s.straggler_hold_s, ranks=ranks, jobs=(job,),
                   description=desc)


def ride_on_own_alerts(shared: dict[str, Shared], findings: list[Finding],
                       open_keys: frozenset[tuple[str, str, str]]) -> None:
    """One fault, one alert: where the shared component (or, for a NIC, its link) already has its
    own evidence finding or open incident, the hurt ranks and jobs ride on that alert instead."""
    own: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        if f.alertname in EVIDENCE_ALERTS and (f.fire or f.keep):
            own[f.component].append(f)
            if f.component_type == "link":
                own[f.component.rsplit("/", 1)[0]].append(f)
    owned_by_incident = set()
    for alertname, ctype, component in open_keys:
        if alertname in EVIDENCE_ALERTS:
            owned_by_incident.add(component)
            if ctype == "link":
                owned_by_incident.add(component.rsplit("/", 1)[0])
    for comp in list(shared):
        if comp in own or comp in owned_by_incident:
            ent = shared.pop(comp)
            for f in own.get(comp, ()):
                f.ranks = tuple(sorted(set(f.ranks) | ent.ranks))
                f.jobs = tuple(sorted(set(f.jobs) | ent.jobs))


def shared_component_findings(topo: Topology, s: DetectionSettings, shared: dict[str, Shared],
                              cluster: str) -> list[Finding]:
    out = []
    for comp, ent in shared.items():
        ctype = component_type_of(comp)
        lab = _labels_for_component(topo, comp, ctype, cluster)
        jobs = sorted(ent.jobs)
        if len(jobs) == 1:
            lab["hpc_job"] = jobs[0]
        out.append(Finding(
            "SlowRanksSharedComponent", ctype, comp, lab,
            [f"{len(ent.ranks)} slow rank(s) share {comp}", "evidence: " + ", ".join(sorted(set(ent.why)))],
            hold_s=s.straggler_hold_s, ranks=tuple(sorted(ent.ranks)), jobs=tuple(jobs),
            description=f"slow ranks of {', '.join(jobs)} localized to {comp} (log-odds {ent.v:.1f})"))
    return out


def stage_findings(s: DetectionSettings, report: StragglerReport, cluster: str) -> list[Finding]:
    """A whole pipeline stage (or a quarter of the ranks) late: StageImbalance (info), never a fabric alert."""
    out = []
    for sl in report.stages:
        comp = sl.job if sl.stage < 0 else f"{sl.job}/stage{sl.stage}"
        lab = {"hpc_job": sl.job}
        if cluster:
            lab["cluster"] = cluster
        desc = ("whole pipeline stage late with clean counters: a partition imbalance, not a fabric fault"
                if sl.stage >= 0 else "many ranks late together in every step: load imbalance, not a fabric fault")
        out.append(Finding("StageImbalance", "job", comp, lab,
                           [f"stage {sl.stage} median compute +{sl.late_frac * 100:.1f}% of step"] if sl.stage >= 0
                           else ["more than a quarter of the ranks late together, persistently"],
                           hold_s=s.straggler_hold_s, ranks=sl.ranks[:64], jobs=(sl.job,), description=desc,
                           severity="info"))
    return out


def suspicion_of(s: DetectionSettings, ev: Evidence, shared: dict[str, Shared]) -> dict[tuple[str, str], float]:
    prior = s.prior_log_odds
    suspicion = {(component_type_of(c), c): _sigmoid(prior + v) for c, v in ev.llr.items() if v > 0}
    for comp, ent in shared.items():
        suspicion[(component_type_of(comp), comp)] = _sigmoid(prior + ent.v + 4.0)
    return suspicion


def _path(topo: Topology, node: str, gpu: int) -> list[str]:
    p = topo.path_of_gpu(node, gpu)
    return [v for k, v in p.items() if k != "rail"]


def _group(topo: Topology, lst: list) -> list[tuple[str, str, list]]:
    """Split one job's persistent stragglers into (kind, component, members)."""
    groups: list[tuple[str, str, list]] = []
    # comm-late ranks of one rail on several hosts: a ring slowed by one component on that rail
    # (the rings of a rail-optimized job span units, so every rank of the rail waits for it)
    by_rail: dict[int, list] = defaultdict(list)
    compute = []
    for st in lst:
        nic = topo.nic_for_gpu(st.node, st.gpu) if st.node in topo.nodes else None
        if st.kind == "comm" and nic is not None:
            by_rail[nic.rail].append(st)
        else:
            compute.append(st)
    for rail, members in by_rail.items():
        leaves = {topo.leaf_of(m.node, rail) for m in members}
        if len(leaves) == 1 and len({m.node for m in members}) >= 2:
            groups.append(("leaf", next(iter(leaves)), members))
        else:
            groups.append(("rail", f"rail{rail}", members))
    lst = compute
    by_node: dict[str, list] = defaultdict(list)
    for st in lst:
        by_node[st.node].append(st)
    rest = []
    for node, members in by_node.items():
        spec = topo.nodes.get(node)
        gpus = {m.gpu for m in members}
        if spec is not None and len(gpus) >= max(2, math.ceil(0.75 * spec.gpus)):
            groups.append(("node", node, members))
        else:
            rest.extend(members)
    by_leaf: dict[str, list] = defaultdict(list)
    singles = []
    for m in rest:
        nic = topo.nic_for_gpu(m.node, m.gpu) if m.node in topo.nodes else None
        if nic is None:
            singles.append(m)
            continue
        by_leaf[topo.leaf_of(m.node, nic.rail)].append(m)
    for leaf, members in by_leaf.items():
        if len({m.node for m in members}) >= 2:
            groups.append(("leaf", leaf, members))
        else:
            singles.extend(members)
    for m in singles:
        groups.append(("gpu", gpu_id(m.node, m.gpu), [m]))
    return groups


def _candidates(topo: Topology, kind: str, comp: str, members: list, evidence: dict | None = None) -> list[str]:
    # an insertion-ordered set: a rail's group holds every slow rank of the rail (thousands in a big
    # job), and a list's membership test made this quadratic in them
    cands: dict[str, None] = {comp: None}
    for m in members:
        if m.node not in topo.nodes:
            continue
        p = topo.path_of_gpu(m.node, m.gpu)
        for k in ("link", "nic", "gpu", "leaf", "node"):
            if k in p:
                cands.setdefault(p[k])
        # NVLinks of the GPU carry their evidence on the GPU id (see correlate)
    if kind in ("rail", "leaf") and members and members[0].kind == "comm" and evidence:
        # a ring is as slow as its slowest link: any component of the rail with evidence explains it
        rail = comp[4:] if kind == "rail" else comp.rsplit("-r", 1)[-1]
        for c in evidence:
            if c not in cands and _rail_of(topo, c) == rail:
                cands[c] = None
    if kind == "node" and comp in topo.nodes:
        for nic in topo.nodes[comp].nics:
            for c in (link_id(comp, nic.device, nic.port), nic_id(comp, nic.device)):
                cands.setdefault(c)
    return list(cands)


def _rail_of(topo: Topology, comp: str) -> str:
    if comp.startswith("leaf-"):
        return comp.rsplit("-r", 1)[-1]
    parts = comp.split("/")
    if len(parts) >= 2 and parts[0] in topo.nodes and not parts[1].startswith("gpu"):
        nic = topo.nic(parts[0], parts[1])
        if nic is not None:
            return str(nic.rail)
    return ""


def _labels(topo: Topology, kind: str, comp: str, members: list, cluster: str) -> dict[str, str]:
    lab: dict[str, str] = {}
    m = members[0]
    nodes = {x.node for x in members}
    if len(nodes) == 1:
        lab["node"] = m.node
    if kind == "gpu":
        lab["gpu"] = str(m.gpu)
    nic = topo.nic_for_gpu(m.node, m.gpu) if m.node in topo.nodes else None
    if nic is not None and kind in ("gpu", "leaf", "rail"):
        lab["rail"] = str(nic.rail)
        if kind != "rail":
            lab["leaf"] = topo.leaf_of(m.node, nic.rail)
    if cluster:
        lab["cluster"] = cluster
    return lab


def _labels_for_component(topo: Topology, comp: str, ctype: str, cluster: str) -> dict[str, str]:
    lab: dict[str, str] = {}
    if cluster:
        lab["cluster"] = cluster
    if ctype == "leaf":
        lab["leaf"] = comp
        try:
            lab["rail"] = comp.rsplit("-r", 1)[1]
        except IndexError:
            pass
        return lab
    if ctype == "rail":
        lab["rail"] = comp[len("rail"):]
        return lab
    if ctype == "spine":  # a spine serves every rail of every unit: no node, rail or leaf label
        return lab
    parts = comp.split("/")
    node = parts[0]
    lab["node"] = node
    if node not in topo.nodes:
        return lab
    if ctype in ("link", "nic"):
        nic = topo.nic(node, parts[1])
        if nic is not None:
            lab["rail"] = str(nic.rail)
            lab["leaf"] = topo.leaf_of(node, nic.rail)
    elif ctype in ("gpu", "nvlink"):
        g = int(parts[1][3:])
        lab["gpu"] = str(g)
        nic = topo.nic_for_gpu(node, g)
        if nic is not None:
            lab["rail"] = str(nic.rail)
            lab["leaf"] = topo.leaf_of(node, nic.rail)
    return lab


__all__ = ["ALERT_LLR", "CorrelationResult", "component_type_of", "correlate", "leaf_id"]
