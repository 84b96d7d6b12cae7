"""Example: report per-rank step and communication time from a PyTorch training loop.

Not run in CI; imports without torch installed.

    timer = StepTimer(job="llm-7b")
    for step, batch in enumerate(loader):
        with timer.step(step):
            loss = model(batch)
            loss.backward()
            with timer.comm():          # the collective part, e.g. a manual all-reduce
                all_reduce_grads(model)
            optimizer.step()

Each step sends one JSON line to the local fabricmon agent via
``fabricmon.client.report_step`` (Unix socket, HTTP fallback, short timeout,
never raises).  With CUDA, times come from CUDA events so asynchronous kernels
are counted where they run; the step end synchronizes on the last event only.

NCCL Inspector (optional; the agent tails it with ``--nccl-inspector-dir``):
call ``nccl_inspector_env(dump_dir, plugin)`` before
``torch.distributed.init_process_group``.  From NCCL 2.30 the Inspector's dump
thread interval defaults to -1, which disables the dump thread: *nothing* is
written, not even at teardown, unless
``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS`` is set to 0 or more.
Send/Recv (``p2p_perf``) records are on by default (``NCCL_INSPECTOR_ENABLE_P2P=1``)
and exported as ``fabricmon_nccl_p2p_*``.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

from fabricmon.client import report_step

try:  # torch is optional: the example must import without it
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None


def _cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


def nccl_inspector_env(dump_dir: str, plugin: str, interval_us: int = 1_000_000) -> dict[str, str]:
    """Set the NCCL Inspector variables (values already in the environment win) and return them.

    ``interval_us``: how often the dump thread writes; one second matches the
    agent's poll.  Must be >= 0: NCCL 2.30's default of -1 writes nothing.
    """
    if interval_us < 0:
        raise ValueError("NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS must be >= 0 or nothing is dumped")
    wanted = {
        "NCCL_PROFILER_PLUGIN": plugin,
        "NCCL_INSPECTOR_ENABLE": "1",
        "NCCL_INSPECTOR_DUMP_DIR": dump_dir,
        "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": str(interval_us),
    }
    for k, v in wanted.items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in wanted}


class StepTimer:
    def __init__(self, job: str, rank: int | None = None, local_rank: int | None = None,
                 group: dict[str, int] | None = None, every: int = 1) -> None:
        self.job = job
        self.rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
        self.local_rank = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
        self.group = group
        self.every = max(1, every)
        self._comm_pairs: list = []
        self._comm_cpu = 0.0

    @contextmanager
    def comm(self):
        """Time the communication portion of a step (may be entered several times per step)."""
        if _cuda():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._comm_pairs.append((start, end))
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._comm_cpu += time.perf_counter() - t0

    @contextmanager
    def step(self, step: int):
        self._comm_pairs = []
        self._comm_cpu = 0.0
        if _cuda():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                end.synchronize()
                step_s = start.elapsed_time(end) / 1000.0
                comm_s = sum(a.elapsed_time(b) for a, b in self._comm_pairs) / 1000.0
                self._report(step, step_s, comm_s)
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._report(step, time.perf_counter() - t0, self._comm_cpu)

    def _report(self, step: int, step_s: float, comm_s: float) -> None:
        if step % self.every == 0:
            report_step(self.job, self.rank, step, step_s, comm_s, local_rank=self.local_rank, group=self.group)


if __name__ == "__main__":  # a tiny CPU-only demonstration
    timer = StepTimer("example-job")
    for i in range(3):
        with timer.step(i):
            time.sleep(0.01)
            with timer.comm():
                time.sleep(0.005)
    print("reported 3 steps (False results are fine without a running agent)")
