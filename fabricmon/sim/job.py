"""A synthetic synchronous training job whose per-rank timings make stragglers findable.

Layout: one rank per GPU, ``rank = node_index * 8 + gpu``, ``local_rank = gpu``;
tensor parallel ``tp = 8`` inside a node (NVLink), pipeline ``pp`` stages of
consecutive nodes (default 1), data parallel across the ``dp = nodes / pp``
nodes of a stage.  Rail-optimized: GPU g's gradients are all-reduced in a ring
over the rail-g NICs of every node of its stage (8 rings per stage).

One step (all times in simulated seconds, deliberately simple):

1. compute: ``compute_seconds * N(1, jitter) * gpu_slow`` per GPU (a throttled
   GPU is ``magnitude`` times slower);
2. tensor-parallel collectives over NVLink inside the node: the node's 8 ranks
   leave them together, when the slowest GPU is done plus ``tp_seconds *
   tp_slow`` (NVLink faults raise ``tp_slow``); a rank waits there
   ``max(compute of its node) - own compute``;
3. data-parallel ring all-reduce on rail g: it starts when the last node of the
   stage is ready (the others wait), and moves ``2 (D-1)/D * grad_bytes`` per
   rank at the bandwidth of the *slowest* link in the ring (``link_gbps *
   efficiency * nic_bw``: a degraded link or leaf slows every ring through it);
4. synchronous training: every rank's step ends when the slowest ring of the
   whole job is done (the optimizer step and the next pipeline flush
   synchronize everyone), so ``step_seconds`` is the same for all ranks.

What each rank reports (the rank-timing line of DESIGN "Contract"):
``step_seconds`` (includes waiting) and ``comm_seconds`` = time inside
collectives including waiting in them = TP time + TP wait + ring wait + ring
transfer.  The step-end barrier is not a collective of the rank's groups, so
the time spent waiting for *other* rings of its stage is in neither comm nor
compute of the ring; ``step - comm`` is the rank's compute plus that barrier
wait.  With pipeline stages, a stage done early waits for the slowest one in
its p2p receives: that wait is communication.

Consequences (tested): a slow GPU arrives last everywhere, so its rank has the
*shortest* ``comm_seconds`` of its TP group and of its ring (DESIGN
"Correlation": the inversion), and its node's peers and its ring peers show
the wait; a slow link raises ``comm_seconds`` of exactly the ranks whose ring
traverses it (rail g of that link's stage), every other rank's comm stays put
and only its step time grows.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..rank_timing import Heartbeat, JobLayout, RankTiming, to_json
from .fault_state import Effects
from .hw import NGPU, NRAILS
from .rank_lines import RankLines
from .workload import Decoy


@dataclass(frozen=True)
class JobSpec:
    name: str = "llm-7b"
    pp: int = 1
    compute_seconds: float = 1.2
    jitter: float = 0.01  # relative standard deviation of a GPU's compute time
    tp_seconds: float = 0.06  # NVLink (tensor-parallel) collective time per step
    grad_bytes_per_rank: float = 9e9  # gradient bytes each rank all-reduces per step
    link_gbps: float = 400.0
    efficiency: float = 0.9  # share of the line rate NCCL reaches on a ring


def job_key(name: str, job_id: str | None = None) -> int:
    """A stable number for a job's random streams (``hash`` of a str changes between processes)."""
    return zlib.crc32(f"{name}\x00{job_id or ''}".encode())


class SyntheticJob:
    """One synchronous job on ``node_names`` (its rank order).  ``index``: those nodes' rows in the
    cluster's arrays (default 0..n-1, the whole cluster).

    Randomness is keyed by (seed, job, step) and each decoy has its own stream, so a step's times do
    not depend on how often it was simulated (an unfinished step is simulated again next interval),
    on the interval, on ``--speed`` or on what else runs: tree and memory mode agree.
    """

    def __init__(self, node_names: list[str], spec: JobSpec = JobSpec(), *, seed: int = 0,
                 epoch: float = 0.0, start: float = 0.0, index: Sequence[int] | None = None,
                 job_id: str | None = None, decoys: Sequence[Decoy] = (), end: float = math.inf,
                 hangs: Sequence[tuple[float, float | None, str, int]] = ()) -> None:
        n = len(node_names)
        if spec.pp < 1 or n % spec.pp:
            raise ValueError(f"pp={spec.pp} must divide the {n} nodes")
        self.spec = spec
        self.job_id = job_id
        self.pp = spec.pp
        self.epoch = epoch
        self.seed = seed
        self.key = job_key(spec.name, job_id)
        self.decoys = tuple(decoys)
        self.end = end
        # rank_hang faults: (start, end or None, node, gpu): that rank never enters its next collective
        self.hangs = tuple(hangs)
        self.hung: tuple[int, int] | None = None  # (node position, gpu) while a hang holds the job
        self.nccl_ras = ""  # the RAS address its heartbeats announce (sim/ras_link.py), "" for none
        self.step = 0
        self.t = start  # simulated time the next step starts
        self.checkpoint_step = 0  # the step a restart returns to
        self.completed: list[tuple[float, float]] = []  # (simulated end, step seconds): the report's truth
        self.layout = JobLayout(spec.name, (("tp", NGPU), ("pp", spec.pp), ("dp", n // spec.pp)))
        self._place(node_names, index)
        self.last_step_seconds = self.nominal_step_seconds()

    def _place(self, node_names: list[str], index: Sequence[int] | None) -> None:
        n = len(node_names)
        self.names = list(node_names)
        self.n = n
        self.dp = n // self.pp
        self.index = np.arange(n) if index is None else np.asarray(index, dtype=np.int64)
        self.pos = {name: i for i, name in enumerate(self.names)}
        self._crossing_key: int | None = None  # _crossing: worked out again for the new nodes
        self._crossing_of = np.zeros(NRAILS, dtype=bool)
        d = self.dp
        self.ring_bytes = 2 * (d - 1) / d * self.spec.grad_bytes_per_rank if d > 1 else 0.0
        self.stage = np.arange(n) // self.dp
        self.dp_index = np.arange(n) % self.dp
        self._groups = [[(("tp", g), ("pp", int(self.stage[i])), ("dp", int(self.dp_index[i]))) for g in range(NGPU)]
                        for i in range(n)]

    def nominal_step_seconds(self) -> float:
        bw = self.spec.link_gbps * 1e9 / 8 * self.spec.efficiency
        return self.spec.compute_seconds + self.spec.tp_seconds + self.ring_bytes / bw

    def _rng(self, step: int, stream: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.key, step, stream])

    # ------------------------------------------------------------------ software (decoys)
    def _software(self, compute: np.ndarray, step: int, t0: float) -> tuple[np.ndarray, bool]:
        """Apply the decoys active at this step's start ``t0`` to its compute times (n, gpus); True when
        the step holds a checkpoint."""
        checkpoint = False
        span = max(self.last_step_seconds, 1e-3)
        for k, d in enumerate(self.decoys):
            if not d.active(t0, self.end):
                continue
            kind = d.kind
            if kind == "stage_imbalance":
                compute[self.stage == d.stage] *= d.value("magnitude")
            elif kind == "seqlen_imbalance":  # a different TP group (node) every step
                compute[int(self._rng(step, 100 + k).integers(self.n))] *= d.value("magnitude")
            elif kind == "dataloader_slow":
                i = self.pos.get(d.node or "")
                if i is not None:
                    compute[i] *= d.value("magnitude")
            elif kind in ("host_pause", "checkpoint"):
                every, pause = d.value("every"), d.value("pause")
                # does a pause (start + k * every) fall in this step?
                first = math.ceil((t0 - d.start) / every - 1e-9)
                if d.start + first * every < t0 + span:
                    if kind == "checkpoint":
                        compute += pause  # every rank stalls together: one long step
                        checkpoint = True
                    else:
                        i = self.pos.get(d.node or "")
                        if i is not None:
                            compute[i] += pause
        return compute, checkpoint

    # ------------------------------------------------------------------ physics
    def simulate_step(self, eff: Effects) -> dict[str, np.ndarray]:
        """One step's timings for every rank; arrays shaped (nodes, gpus) unless noted."""
        s = self.spec
        n, pp, dp = self.n, self.pp, self.dp
        ix = self.index
        step = self.step + 1
        compute = s.compute_seconds * eff.gpu_slow[ix] * (1 + s.jitter * self._rng(step).standard_normal((n, NGPU)))
        compute = np.maximum(compute, 0.01)
        checkpoint = False
        if self.decoys:
            compute, checkpoint = self._software(compute, step, self.t)
        tp_time = s.tp_seconds * eff.tp_slow[ix]  # (n,)
        node_max = compute.max(axis=1)
        tp_wait = node_max[:, None] - compute
        ready = node_max + tp_time  # (n,) when the node enters its rings
        ready_s = ready.reshape(pp, dp)
        ring_start = ready_s.max(axis=1)  # (pp,) the same for the 8 rings of a stage
        nic_bw = eff.nic_bw[ix, :NRAILS]
        if eff.uplink_bw is not None and eff.leaf_index is not None:
            # a ring that crosses its leaves' uplinks is as slow as what they still carry (sim/switches.py)
            nic_bw = nic_bw * np.where(self._crossing(eff.leaf_index), eff.uplink_bw[ix, :NRAILS], 1.0)
        bw = nic_bw.reshape(pp, dp, NRAILS).min(axis=1)  # (pp, rails): slowest link
        bytes_per_s = s.link_gbps * 1e9 / 8 * s.efficiency * np.maximum(bw, 1e-3)
        transfer = self.ring_bytes / bytes_per_s  # (pp, rails)
        ring_end = ring_start[:, None] + transfer
        step_seconds = float(ring_end.max())
        dp_wait = (ring_start[:, None] - ready_s).reshape(n)  # (n,)
        transfer_rank = np.repeat(transfer, dp, axis=0)  # (n, rails == gpus)
        # pipeline parallel: a stage that finishes early waits for the slowest stage in its p2p
        # send/recv, which is communication (a late stage shows as everyone else's comm)
        p2p_wait = np.repeat(step_seconds - ring_end.max(axis=1), dp)  # (n,)
        comm = tp_time[:, None] + tp_wait + dp_wait[:, None] + transfer_rank + p2p_wait[:, None]
        return {"compute": compute, "comm": comm, "step_seconds": np.float64(step_seconds),
                "transfer": transfer, "ready": ready, "checkpoint": checkpoint}

    def _crossing(self, leaf_index: np.ndarray) -> np.ndarray:
        """(rails,): whether the job's traffic on each rail crosses its leaves' uplinks: it has nodes under
        more than one leaf of that rail (DESIGN "The switch side": without forwarding tables, a job crosses
        every uplink of a leaf where it has nodes when it also has nodes under another leaf of the rail)."""
        key = id(leaf_index)  # one array per cluster; a move to other nodes resets the key (_place)
        if self._crossing_key != key:
            leaves = leaf_index[self.index, :NRAILS]
            self._crossing_of = np.array([len(set(leaves[:, r][leaves[:, r] >= 0].tolist())) > 1
                                          for r in range(NRAILS)])
            self._crossing_key = key
        return self._crossing_of

    def advance_to(self, t: float, eff: Effects) -> list[RankTiming]:
        """Run every step that ends at or before simulated time t; their RankTimings (ts = step end)."""
        out: list[RankTiming] = []
        while self.t < self.end:
            res = self.simulate_step(eff)
            step_s = float(res["step_seconds"])
            hang = self._hang(self.t + step_s)
            if hang is not None:
                h_start, h_end, pos, gpu = hang
                self.hung = (pos, gpu)
                if h_end is None or h_end > t:
                    break  # every peer waits in the collective the hung rank never enters
                self.t, self.hung = max(self.t, h_end), None  # released: the step starts over
                continue
            if self.t + step_s > t + 1e-9:
                # not finished by t: simulated again next time, with the faults active then
                break
            self.t += step_s
            self.step += 1
            self.last_step_seconds = step_s
            if res["checkpoint"]:
                self.checkpoint_step = self.step  # written only once the step completes
            self.completed.append((self.t, step_s))
            out.extend(self.timings(res, self.epoch + self.t))
        return out

    def _hang(self, step_end: float) -> tuple[float, float | None, int, int] | None:
        """The rank_hang that stops the step ending at ``step_end``, if any (it began before the step ends)."""
        for start, end, node, gpu in self.hangs:
            pos = self.pos.get(node)
            if pos is not None and start < step_end and (end is None or end > self.t):
                return start, end, pos, gpu
        return None

    def heartbeats(self, t: float) -> list[Heartbeat]:
        """Every rank's heartbeat at simulated time t (DESIGN "Jobs, decoys and cost"): its step, its
        collective sequence number (two collectives a step: the TP and the DP one) and whether it is inside
        one.  A hung job: the hung rank outside, its peers inside the next collective, all frozen."""
        ts = self.epoch + t
        name, job_id = self.spec.name, self.job_id or ""
        base = 2 * self.step
        out = []
        if self.hung is not None:
            hp, hg = self.hung
            for i in range(self.n):
                for g in range(NGPU):
                    stuck = i == hp and g == hg
                    out.append(Heartbeat(name, i * NGPU + g, self.step, base if stuck else base + 1, not stuck, ts,
                                         self.names[i], job_id, self.nccl_ras))
            return out
        share = self.spec.compute_seconds / max(self.last_step_seconds, 1e-6)
        phase = (t - self.t) / max(self.last_step_seconds, 1e-6)
        inside = phase > share  # past its compute: in the step's collectives
        for i in range(self.n):
            for g in range(NGPU):
                out.append(Heartbeat(name, i * NGPU + g, self.step, base + int(inside), inside, ts, self.names[i],
                                     job_id, self.nccl_ras))
        return out

    def restart(self, at: float, node_names: list[str] | None = None, index: Sequence[int] | None = None) -> None:
        """Every rank exited; the job comes back at simulated time ``at`` from its last checkpoint's step,
        on ``node_names`` when it moved (same count), under the same name."""
        self.t = at
        self.step = self.checkpoint_step
        if node_names is not None:
            self._place(node_names, index)

    def timings(self, res: dict, ts: float) -> list[RankTiming]:
        comm = np.round(res["comm"], 6).tolist()
        step_s = round(float(res["step_seconds"]), 6)
        name, step, job_id = self.spec.name, self.step, self.job_id or ""
        out = []
        for i in range(self.n):
            node = self.names[i]
            row = comm[i]
            groups = self._groups[i]
            base = i * NGPU
            for g in range(NGPU):
                # job_id as the heartbeats carry it: the job's identity wherever its ranks are matched
                out.append(RankTiming(name, base + g, g, step, step_s, row[g], ts, node, -1, groups[g], job_id))
        return out

    # ------------------------------------------------------------------ load it puts on the cluster
    def rail_bytes_per_second(self) -> np.ndarray:
        """(nodes, rails) average bytes/s per direction each rail NIC carries."""
        rate = self.ring_bytes / max(self.last_step_seconds, 1e-6)
        return np.full((self.n, NRAILS), rate)

    def nvlink_activity(self) -> np.ndarray:
        """(nodes,) NVLink load relative to a nominal step."""
        return np.full(self.n, self.nominal_step_seconds() / max(self.last_step_seconds, 1e-6))


def timing_lines(timings: list[RankTiming], *, include_node: bool = False) -> list[str]:
    """JSON lines for the rank intake (the agent adds ``node`` itself)."""
    if include_node:
        return [to_json(t) for t in timings]
    line = RankLines().line  # to_json(replace(t, node="")), the same bytes
    return [line(t) for t in timings]


def layout_line(job: SyntheticJob) -> str:
    import json

    return json.dumps({"job": job.layout.job, "layout": dict(job.layout.layout)}, separators=(",", ":"))
