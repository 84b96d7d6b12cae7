"""The bounded on-disk spool: ordered, durable across restarts, bounded, corruption-tolerant."""

from __future__ import annotations

import os

from structlog.testing import capture_logs

from fabricmon.agent.spool import MemorySpool, Spool, frame
from fabricmon.batch import NodeBatch
from fabricmon.model import CounterDelta
from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb


def _payload(seq: int, pad: int = 0) -> bytes:
    b = NodeBatch("node-001", seq, float(seq), 1.0,
                  deltas=(CounterDelta("fabricmon_ib_port_errors_total", (("device", "mlx5_0"), ("pad", "x" * pad)),
                                       1.0),))
    return codec.encode_self_contained(b).SerializeToString()


def _drain(sp) -> list[int]:
    out, cur = [], 0
    for _ in range(10_000):
        nxt = sp.next_after(cur)
        if nxt is None:
            return out
        cur = nxt[0]
        assert pb.Batch.FromString(nxt[1]).seq == cur
        out.append(cur)
    raise AssertionError("spool iteration did not end")


def test_order_and_reload_after_restart(tmp_path):
    sp = Spool(tmp_path / "spool", 1 << 20)
    for seq in (5, 9, 10, 200):
        assert sp.append(seq, _payload(seq))
    assert _drain(sp) == [5, 9, 10, 200]
    again = Spool(tmp_path / "spool", 1 << 20)  # agent restarted
    assert again.seqs() == [5, 9, 10, 200] and again.max_seq == 200
    assert again.ack(9) == 2
    assert _drain(again) == [10, 200]
    assert sorted(os.listdir(tmp_path / "spool")) == [f"{10:020d}.batch", f"{200:020d}.batch"]


def test_bound_drops_oldest_with_counter_and_log(tmp_path):
    one = len(frame(_payload(1, pad=900)))
    sp = Spool(tmp_path, max_bytes=3 * one + 10)
    with capture_logs() as logs:
        for seq in range(1, 8):
            sp.append(seq, _payload(seq, pad=900))
    assert sp.seqs() == [5, 6, 7]
    assert sp.dropped_total == 4
    assert sp.bytes <= sp.max_bytes
    assert any(e["event"] == "spool_full_dropped_oldest" for e in logs)
    # a smaller bound on the next start trims at once
    smaller = Spool(tmp_path, max_bytes=one + 10)
    assert smaller.seqs() == [7] and smaller.dropped_total == 2


def test_batch_larger_than_the_bound_is_dropped(tmp_path):
    sp = Spool(tmp_path, max_bytes=200)
    assert not sp.append(1, _payload(1, pad=5000))
    assert sp.dropped_total == 1 and len(sp) == 0


def test_corrupt_truncated_and_leftover_files_are_skipped(tmp_path):
    sp = Spool(tmp_path, 1 << 20)
    for seq in (1, 2, 3, 4):
        sp.append(seq, _payload(seq))
    p2 = tmp_path / f"{2:020d}.batch"
    p2.write_bytes(p2.read_bytes()[:-3])  # truncated
    p3 = tmp_path / f"{3:020d}.batch"
    data = bytearray(p3.read_bytes())
    data[-1] ^= 0xFF  # bit rot
    p3.write_bytes(bytes(data))
    (tmp_path / f".{5:020d}.batch.abc.tmp").write_bytes(b"half")  # interrupted atomic write
    (tmp_path / f"{6:020d}.batch").write_bytes(b"garbage")
    (tmp_path / "README").write_text("not ours")
    with capture_logs() as logs:
        re = Spool(tmp_path, 1 << 20)
        assert _drain(re) == [1, 4]
    reasons = [e.get("reason", "") for e in logs if e["event"] == "spool_entry_skipped"]
    assert any("truncated" in r for r in reasons)
    assert any("checksum" in r for r in reasons)
    assert any("temporary" in r for r in reasons)
    assert any("magic" in r or "truncated" in r for r in reasons)
    assert re.corrupt_total == 4
    assert (tmp_path / "README").exists()
    assert not p2.exists() and not p3.exists()


def test_memory_spool_same_interface():
    sp = MemorySpool(max_bytes=10_000)
    for seq in range(1, 4):
        sp.append(seq, _payload(seq))
    assert not sp.append(2, _payload(2))  # out of order refused
    sp.discard(2)
    assert _drain(sp) == [1, 3]


def test_drops_are_counted_by_reason(tmp_path):
    one = len(frame(_payload(1, pad=900)))
    sp = Spool(tmp_path, max_bytes=2 * one + 10)
    for seq in range(1, 5):
        sp.append(seq, _payload(seq, pad=900))
    assert not sp.append(5, _payload(5, pad=50_000))
    st = sp.stats()
    assert (st["full_dropped_total"], st["too_large_total"], st["write_failed_total"]) == (2, 1, 0)
    assert st["dropped_total"] == 3 and st["max_bytes"] == 2 * one + 10


def test_a_failing_write_costs_that_batch_counted_never_raises(tmp_path):
    import errno

    sp = Spool(tmp_path, max_bytes=1 << 20)
    assert sp.append(1, _payload(1))
    real = sp._store
    for exc in (OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EIO, "I/O error"),
                RuntimeError("a writer bug")):
        def failing(seq, data, _e=exc):
            raise _e

        sp._store = failing
        with capture_logs() as logs:
            assert not sp.append(2, _payload(2))
        assert any(e["event"] == "spool_write_failed" for e in logs)
    sp._store = real
    assert sp.append(10, _payload(10))  # the disk came back: spooling goes on
    st = sp.stats()
    assert st["write_failed_total"] == 3 and st["dropped_total"] == 3
    assert sp.seqs() == [1, 10] and _drain(sp) == [1, 10]
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))
