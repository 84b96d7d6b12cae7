"""A stand-in training loop that reports each step to the node's fabricmon agent.

The real thing calls fabricmon.client.report_step (pip install fabricmon, standard library only)
from its loop; this file carries the same one-line protocol so the example runs in any Python image:
one JSON line per step to the agent's Unix socket, short timeout, never raising into the loop.
"""

import json
import os
import socket
import time

SOCKET = os.environ.get("FABRICMON_RANKS_SOCKET", "/run/fabricmon/ranks.sock")
JOB = os.environ.get("FABRICMON_JOB", "llm-7b")
RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
STEPS = int(os.environ.get("STEPS", "100"))


def report(line: dict) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.1)
            s.connect(SOCKET)
            s.sendall((json.dumps(line) + "\n").encode())
        return True
    except OSError:
        return False  # no agent on this node: training goes on


for step in range(STEPS):
    t0 = time.time()
    time.sleep(0.05)  # forward, backward, all-reduce
    comm = 0.01
    report({"job": JOB, "rank": RANK, "local_rank": LOCAL_RANK, "step": step,
            "step_seconds": time.time() - t0, "comm_seconds": comm, "ts": time.time()})
