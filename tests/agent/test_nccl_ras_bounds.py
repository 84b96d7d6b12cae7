"""NCCL RAS parsing bounded in time and memory against hostile answers (issue 35 items 9 and 11).

Whatever listens on the RAS port answers, so a local user can send any document up to the 32 MiB byte
bound.  Each parse runs in a child process under a timeout, so a parser that backtracks fails the test
instead of holding CI, and so its peak RSS is its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from fabricmon.nccl_ras.status import MAX_DOCUMENT_BYTES, MAX_REPAIR_BYTES

CHILD = textwrap.dedent("""
    import resource, sys, time
    from fabricmon.nccl_ras.status import RasFormatError, parse_status
    head, unit, n, tail = sys.argv[1].encode(), sys.argv[2].encode(), int(sys.argv[3]), sys.argv[4].encode()
    data = head + unit * n + tail
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    try:
        parse_status(data)
        outcome = "ok"
    except RasFormatError as exc:
        outcome = exc.outcome
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024
    print(outcome, len(data), round(time.process_time() - t0, 3), grew)
""")


def _parse_in_child(head: str, unit: str, n: int, tail: str, timeout_s: float) -> tuple[str, int, float, int]:
    """(outcome, document bytes, CPU seconds of the parse, MiB its peak RSS grew by)."""
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, head, unit, str(n), tail], capture_output=True,
                             text=True, timeout=timeout_s, check=True).stdout.split()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"parsing {len(head) + len(unit) * n} bytes took over {timeout_s} s") from None
    return out[0], int(out[1]), float(out[2]), int(out[3])


def test_the_comma_repair_cannot_backtrack_on_a_hostile_answer():
    # "nvml_dev" then whitespace runs holding newlines, never "status": the old pattern \s*\n\s*"status"
    # tried every newline against the rest of the run (quadratic: ~400 KB held the agent for minutes);
    # this document is just under the repair bound, so the repair runs over all of it.
    n = (MAX_REPAIR_BYTES - 64) // 2
    outcome, size, cpu_s, _ = _parse_in_child('{"x": [{"nvml_dev": 1', " \n", n, "]}", timeout_s=30)
    assert (outcome, size > MAX_REPAIR_BYTES - 128) == ("bad_json", True)
    assert cpu_s < 3.0, f"the repair of {size} bytes took {cpu_s} s of CPU"


def test_a_hostile_answer_at_the_byte_bound_is_refused_without_a_repair_pass():
    n = (MAX_DOCUMENT_BYTES - 64) // 2
    outcome, size, cpu_s, _ = _parse_in_child('{"x": [{"nvml_dev": 1', " \n", n, "]}", timeout_s=30)
    assert (outcome, size > MAX_REPAIR_BYTES) == ("bad_json", True)
    assert cpu_s < 3.0, f"refusing {size} bytes took {cpu_s} s of CPU"


def test_32_mib_of_empty_objects_is_refused_before_it_fills_the_heap():
    # ~11 million {} decode into ~900 MiB of dicts (the agent went 55 -> 923 MiB; its DaemonSet limit is
    # 512Mi); counted from the bytes first, the document is refused before json builds anything.
    n = (MAX_DOCUMENT_BYTES - 64) // 3
    outcome, size, _, grew_mib = _parse_in_child('{"communicators": [', "{},", n, '{}], "ras": {}}', timeout_s=60)
    assert grew_mib < 100, f"parsing grew the heap by {grew_mib} MiB"
    assert (outcome, size > 32_000_000) == ("too_large", True)
