"""Example: report per-rank step and communication time from a PyTorch training loop.

Not run in CI; imports without torch installed.

    timer = StepTimer()                 # fabricmon.client.StepTimer: job $SLURM_JOB_NAME, job_id
    for step, batch in enumerate(loader):   # $FABRICMON_JOB_ID / $SLURM_JOB_ID / $TORCHELASTIC_RUN_ID
        with timer.step(step):
            loss = model(batch)
            loss.backward()
            with timer.comm():          # each collective: coll_sn += 1, the heartbeat says "inside"
                all_reduce_grads(model)
            optimizer.step()

Each step sends one JSON line to the local fabricmon agent via
``fabricmon.client.report_step`` (Unix socket, HTTP fallback, short timeout,
never raises), tagged with the job's scheduler id; the timer's heartbeat thread
sends the rank's step and collective sequence number every 5 s, so a rank that
hangs before a collective is named by ``JobHung``.  With CUDA, times come from CUDA events so asynchronous kernels
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

from fabricmon.client import StepTimer

__all__ = ["StepTimer", "nccl_inspector_env"]


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


if __name__ == "__main__":  # a tiny CPU-only demonstration
    timer = StepTimer("example-job")
    for i in range(3):
        with timer.step(i):
            time.sleep(0.01)
            with timer.comm():
                time.sleep(0.005)
    timer.close()
    print("reported 3 steps (False results are fine without a running agent)")
