"""The simulated cluster's GPUs, vectorized over nodes: what the fake NVML shows (utilization, throttle
reasons, XIDs, each GPU's UUID) and each GPU's 18 NVLinks (tx/rx KiB and error counters, up or down).

The NVLink counters are true unbounded values, laid out ``(field, node, gpu, link)`` (``hw.NVL_FIELDS``).
``sim.cluster`` moves them with the job's NVLink load; the fault state says which links are down and which
GPUs throttle.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .hw import NGPU, NVLINK_KIB_S, NVLINKS


class Gpus:
    def __init__(self, n: int, uuid_bits: np.ndarray, load: np.ndarray, util: np.ndarray,
                 replay_errors: np.ndarray) -> None:
        self.n = n
        self.uuid_bits = uuid_bits  # (nodes, gpus, 3) random bits of each GPU's UUID
        self.load = load  # (nodes, gpus) NVLink utilization of the job
        self.util = util
        self.throttle = np.zeros((n, NGPU), dtype=np.int64)
        self.xid: dict[tuple[int, int], list[int]] = {}
        self.nvl = np.zeros((6, n, NGPU, NVLINKS), dtype=np.int64)  # hw.NVL_FIELDS
        self.nvl[4] = replay_errors
        self.nvl_up = np.ones((n, NGPU, NVLINKS), dtype=bool)

    def nvlink_traffic(self, rng: np.random.Generator, dt: np.ndarray, activity: np.ndarray,
                       down: Iterable[tuple[int, int, int]] = ()) -> None:
        """dt seconds of NVLink traffic at the job's load times ``activity`` (nodes,); the (node, gpu, link)s
        in ``down`` carry nothing."""
        shape = (self.n, NGPU, NVLINKS)
        load = self.load[:, :, None] * activity[:, None, None]
        tx = (NVLINK_KIB_S * load * dt * rng.uniform(0.9, 1.1, size=shape)).astype(np.int64)
        rx = (tx * rng.uniform(0.95, 1.05, size=shape)).astype(np.int64)
        self.nvl_up[:] = True
        for node, gpu, link in down:
            self.nvl_up[node, gpu, link] = False
        self.nvl[0] += tx * self.nvl_up  # a down link carries nothing: its counters stay flat
        self.nvl[1] += rx * self.nvl_up

    def uuid(self, node: int, gpu: int) -> str:
        a, b, c = (int(x) for x in self.uuid_bits[node, gpu])
        h = f"{a << 2 | (c & 3):016x}{b << 2 | (c >> 2 & 3):016x}"  # 128 random bits
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
