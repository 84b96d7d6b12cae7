"""Scenario ``jobs:`` and ``decoys:`` (DESIGN "Jobs, decoys and cost"): what runs on the cluster.

```yaml
jobs:
  - {name: llm-70b, nodes: [0, 31], pp: 4}
  - {name: vlm-13b, nodes: [node-032, node-033, node-040], pp: 1, start: 30, end: 840}
decoys:
  - {kind: stage_imbalance, job: llm-70b, stage: 3, magnitude: 1.12, start: 0}
  - {kind: seqlen_imbalance, job: vlm-13b, magnitude: 1.25, start: 100, end: 600}
  - {kind: host_pause, node: node-040, every: 20, pause: 1.5, start: 200, end: 700}
  - {kind: dataloader_slow, node: node-041, magnitude: 1.08, start: 300}
  - {kind: checkpoint, job: llm-70b, every: 300, pause: 25, start: 100}
  - {kind: job_restart, job: vlm-13b, start: 400, down: 90}
  - {kind: background_errors, node: node-012, rail: 2, rate: 0.3}
```

Decoys are software causes: none may raise a link, NIC, GPU, NVLink, rail, leaf, spine or config
alert; ``StageImbalance`` and ``SoftwareStraggler`` (info) are the only findings they may raise.
Parsed by ``configload.build`` like faults; every error names the file and key path.  The checks
that need the cluster (node names, a node in two jobs, pp dividing the node count) run in
``resolve_jobs`` and ``check_decoys``, called by ``Scenario.validate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..configload import ConfigError
from ..textcheck import label_text_ok
from .hw import NRAILS

DEFAULT_JOB = "llm-7b"

# kind -> keys it takes besides kind/start/end (a key that would change nothing is an error)
DECOY_KEYS: dict[str, frozenset[str]] = {
    "stage_imbalance": frozenset({"job", "stage", "magnitude"}),
    "seqlen_imbalance": frozenset({"job", "magnitude"}),
    "host_pause": frozenset({"node", "every", "pause"}),
    "dataloader_slow": frozenset({"node", "magnitude"}),
    "checkpoint": frozenset({"job", "every", "pause"}),
    "job_restart": frozenset({"job", "down", "nodes"}),
    "background_errors": frozenset({"node", "rail", "rate"}),
}
DECOY_REQUIRED: dict[str, tuple[str, ...]] = {
    "stage_imbalance": ("job", "stage"),
    "seqlen_imbalance": ("job",),
    "host_pause": ("node",),
    "dataloader_slow": ("node",),
    "checkpoint": ("job",),
    "job_restart": ("job", "down"),
    "background_errors": ("node", "rail"),
}
# defaults of the optional numbers, and what they mean
DECOY_DEFAULTS: dict[str, dict[str, float]] = {
    "stage_imbalance": {"magnitude": 1.12},   # the stage's compute-time multiplier
    "seqlen_imbalance": {"magnitude": 1.25},  # one random node (TP group) per step this much slower
    "host_pause": {"every": 20.0, "pause": 1.5},
    "dataloader_slow": {"magnitude": 1.08},   # the node's 8 ranks this much slower, counters clean
    "checkpoint": {"every": 300.0, "pause": 25.0},
    "job_restart": {},
    "background_errors": {"rate": 0.3},        # symbol errors per second on a healthy link
}
_DECOY_OPTIONAL = ("job", "node", "stage", "magnitude", "every", "pause", "down", "rail", "rate", "nodes", "end")


@dataclass(frozen=True)
class JobDef:
    """One training job: ``nodes`` is ``[first, last]`` (node indexes, inclusive) or a list of names."""

    name: str
    nodes: tuple[Any, ...] = ()
    pp: int = 1
    start: float = 0.0
    end: float | None = None
    job_id: str | None = None

    def validate(self, path: str, source: str) -> None:
        def fail(key: str, problem: str) -> ConfigError:
            return ConfigError(f"{source}: {path}.{key}: {problem} (job {self.name!r})")

        if not label_text_ok(self.name, 128):
            raise ConfigError(f"{source}: {path}.name: a job name is 1..128 printable characters, got {self.name!r}")
        if self.job_id is not None and not label_text_ok(self.job_id, 128):
            raise fail("job_id", f"1..128 printable characters, got {self.job_id!r}")
        if not self.nodes:
            raise fail("nodes", "required: [first, last] node indexes or a list of node names")
        ints = [isinstance(v, int) and not isinstance(v, bool) for v in self.nodes]
        if any(ints) and not (all(ints) and len(self.nodes) == 2):
            raise fail("nodes", "give two node indexes [first, last] or a list of node names, not a mix")
        if not any(ints) and not all(isinstance(v, str) and v for v in self.nodes):
            raise fail("nodes", "node names must be non-empty strings")
        if all(ints) and not 0 <= self.nodes[0] <= self.nodes[1]:
            raise fail("nodes", f"[first, last] needs 0 <= first <= last, got {list(self.nodes)}")
        if self.pp < 1:
            raise fail("pp", f"must be >= 1, got {self.pp}")
        if self.start < 0:
            raise fail("start", f"must be >= 0, got {self.start}")
        if self.end is not None and self.end <= self.start:
            raise fail("end", f"must be after start ({self.start}), got {self.end}")

    def node_names(self, names: list[str], index: dict[str, int], path: str, source: str) -> list[str]:
        """The job's nodes in rank order (range or list order), checked against the cluster."""
        if isinstance(self.nodes[0], int):
            first, last = self.nodes
            if last >= len(names):
                raise ConfigError(f"{source}: {path}.nodes: [{first}, {last}] is past the {len(names)}-node "
                                  f"cluster (job {self.name!r})")
            out = names[first:last + 1]
        else:
            out = list(self.nodes)
            for i, n in enumerate(out):
                if n not in index:
                    raise ConfigError(f"{source}: {path}.nodes[{i}]: {n} is not in the {len(names)}-node "
                                      f"cluster (job {self.name!r})")
            if len(set(out)) != len(out):
                raise ConfigError(f"{source}: {path}.nodes: a node is listed twice (job {self.name!r})")
        if len(out) % self.pp:
            raise ConfigError(f"{source}: {path}.pp: {self.pp} does not divide the job's {len(out)} nodes "
                              f"(job {self.name!r})")
        return out


@dataclass(frozen=True)
class Decoy:
    kind: str
    start: float = 0.0
    end: float | None = None
    job: str | None = None
    node: str | None = None
    stage: int | None = None
    magnitude: float | None = None
    every: float | None = None
    pause: float | None = None
    down: float | None = None
    rail: int | None = None
    rate: float | None = None
    nodes: tuple[str, ...] | None = None  # job_restart: the nodes the job returns on (default: the same)

    # -- the fields validate() requires of the kinds that read them: typed, never None ---------------
    @property
    def the_node(self) -> str:
        if self.node is None:
            raise ValueError(f"decoy {self.kind}: node is required")
        return self.node

    @property
    def the_rail(self) -> int:
        if self.rail is None:
            raise ValueError(f"decoy {self.kind}: rail is required")
        return self.rail

    def validate(self, path: str, source: str) -> None:
        def fail(key: str, problem: str) -> ConfigError:
            return ConfigError(f"{source}: {path}.{key}: {problem}")

        if self.kind not in DECOY_KEYS:
            raise fail("kind", f"unknown decoy kind {self.kind!r} (known: {', '.join(DECOY_KEYS)})")
        takes = DECOY_KEYS[self.kind] | {"end"}
        if self.kind == "job_restart":
            takes = takes - {"end"}  # it happens once, at start
        for key in _DECOY_OPTIONAL:
            if getattr(self, key) is not None and key not in takes:
                raise fail(key, f"does not apply to {self.kind}")
        for key in DECOY_REQUIRED[self.kind]:
            if getattr(self, key) is None:
                raise fail(key, f"required for {self.kind}")
        if self.start < 0:
            raise fail("start", f"must be >= 0, got {self.start}")
        if self.end is not None and self.end <= self.start:
            raise fail("end", f"must be after start ({self.start}), got {self.end}")
        for key in ("magnitude", "every", "down", "rate"):
            v = getattr(self, key)
            if v is not None and not v > 0:
                raise fail(key, f"must be > 0, got {v}")
        if self.magnitude is not None and self.magnitude < 1:
            raise fail("magnitude", f"is a slow-down multiplier: must be >= 1, got {self.magnitude}")
        if self.pause is not None and not 0 < self.pause:
            raise fail("pause", f"must be > 0, got {self.pause}")
        if self.pause is not None and self.every is not None and self.pause >= self.every:
            raise fail("pause", f"must be shorter than every ({self.every}), got {self.pause}")
        if self.stage is not None and self.stage < 0:
            raise fail("stage", f"must be >= 0, got {self.stage}")
        if self.rail is not None and not 0 <= self.rail < NRAILS:
            raise fail("rail", f"rails are 0..{NRAILS - 1}, got {self.rail}")

    def value(self, key: str) -> float:
        v = getattr(self, key)
        return float(v) if v is not None else DECOY_DEFAULTS[self.kind][key]

    def active(self, t: float, job_end: float) -> bool:
        end = self.end if self.end is not None else job_end
        return self.start <= t < end

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind, "start": self.start}
        for key in _DECOY_OPTIONAL:
            v = getattr(self, key)
            if v is not None:
                d[key] = list(v) if isinstance(v, tuple) else v
        return d


@dataclass(frozen=True)
class ResolvedJob:
    name: str
    job_id: str | None
    nodes: tuple[str, ...]
    pp: int
    start: float
    end: float


def resolve_jobs(jobs: tuple[JobDef, ...], names: list[str], duration: float, source: str) -> list[ResolvedJob]:
    """The jobs on this cluster; without ``jobs:`` one job "llm-7b" on every node (today's behaviour)."""
    if not jobs:
        return [ResolvedJob(DEFAULT_JOB, None, tuple(names), 1, 0.0, duration)]
    index = {n: i for i, n in enumerate(names)}
    owner: dict[str, str] = {}
    seen: set[tuple[str, str | None]] = set()
    out = []
    for i, j in enumerate(jobs):
        path = f"jobs[{i}]"
        key = (j.name, j.job_id)
        if key in seen:
            raise ConfigError(f"{source}: {path}.name: job {j.name!r} is defined twice (give each a job_id to "
                              f"run two jobs of one name)")
        seen.add(key)
        nodes = j.node_names(names, index, path, source)
        for n in nodes:
            if n in owner:
                raise ConfigError(f"{source}: {path}.nodes: {n} is already in job {owner[n]!r} (job {j.name!r})")
            owner[n] = j.name
        if j.start >= duration:
            raise ConfigError(f"{source}: {path}.start: {j.start} is not before the end of the scenario "
                              f"(duration {duration}) (job {j.name!r})")
        out.append(ResolvedJob(j.name, j.job_id, tuple(nodes), j.pp, j.start,
                               min(j.end, duration) if j.end is not None else duration))
    return out


def check_decoys(decoys: tuple[Decoy, ...], jobs: list[ResolvedJob], names: list[str], source: str) -> None:
    by_name = {j.name: j for j in jobs}
    in_job = {n: j for j in jobs for n in j.nodes}
    index = set(names)
    for i, d in enumerate(decoys):
        path = f"decoys[{i}]"
        if d.job is not None:
            j = by_name.get(d.job)
            if j is None:
                raise ConfigError(f"{source}: {path}.job: no job named {d.job!r} (jobs: {', '.join(by_name)})")
            if d.stage is not None and d.stage >= j.pp:
                raise ConfigError(f"{source}: {path}.stage: job {j.name!r} has stages 0..{j.pp - 1}, got {d.stage}")
            if d.nodes is not None:
                for k, n in enumerate(d.nodes):
                    if n not in index:
                        raise ConfigError(f"{source}: {path}.nodes[{k}]: {n} is not in the cluster")
                    other = in_job.get(n)
                    if other is not None and other.name != j.name:
                        raise ConfigError(f"{source}: {path}.nodes[{k}]: {n} is in job {other.name!r}")
                if len(d.nodes) != len(j.nodes):
                    raise ConfigError(f"{source}: {path}.nodes: job {j.name!r} returns on as many nodes as it "
                                      f"has ({len(j.nodes)}), got {len(d.nodes)}")
        if d.node is not None:
            if d.node not in index:
                raise ConfigError(f"{source}: {path}.node: {d.node} is not in the {len(names)}-node cluster")
            if d.kind != "background_errors" and d.node not in in_job:
                raise ConfigError(f"{source}: {path}.node: {d.node} runs no job (a {d.kind} needs one)")
