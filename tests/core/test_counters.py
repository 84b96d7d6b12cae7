"""Property tests of the counter delta logic: wrap, reset, saturation."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricmon.counters import CounterTracker, counter_delta, saturation_limit
from fabricmon.model import Semantics, reading


def _track(values, semantics, width, group="dev/1"):
    t = CounterTracker()
    totals, deltas = [], []
    for i, v in enumerate(values):
        samples, ds, sat = t.process([reading("fabricmon_rdma_hw_stat_total", v, semantics=semantics,
                                              width=width, group=group, device="mlx5_0", port="1", counter="x")],
                                     float(i))
        totals.append(samples[0].value)
        deltas.append(sum(d.delta for d in ds))
    return totals, deltas


increments32 = st.lists(st.integers(min_value=0, max_value=2**31 - 1), min_size=1, max_size=40)


@given(start=st.integers(min_value=0, max_value=2**32 - 1), incs=increments32)
def test_wrapping_counter_total_equals_true_count(start, incs):
    """A 32-bit register read after increments below 2^31 each: the total is exact."""
    raw, values = start, [start]
    for inc in incs:
        raw = (raw + inc) % 2**32
        values.append(raw)
    totals, deltas = _track(values, Semantics.WRAPPING, 32)
    assert totals[-1] == start + sum(incs)
    assert deltas[1:] == [float(i) for i in incs]
    assert all(b >= a for a, b in pairwise(totals))


@given(before=st.lists(st.integers(0, 2**40), min_size=1, max_size=10),
       after=st.lists(st.integers(0, 2**20), min_size=1, max_size=10))
def test_monotonic_reset_never_goes_backwards_or_spikes(before, after):
    """Driver reload: a 64-bit counter restarts near zero; the total keeps rising by what was counted since."""
    first = sorted(before)
    second = sorted(after)
    values = first + second
    totals, deltas = _track(values, Semantics.MONOTONIC, 64)
    assert all(b >= a for a, b in pairwise(totals))
    assert all(d >= 0 for d in deltas)
    # No delta ever exceeds what the raw values can justify: a reset counts ``new`` at most.
    for (prev, cur), d in zip(pairwise(values), deltas[1:], strict=True):
        assert d == (cur - prev if cur >= prev else cur)


@given(width=st.sampled_from([4, 8, 16]), incs=st.lists(st.integers(0, 2**17), min_size=1, max_size=30))
def test_saturating_counter_pins_and_reports_saturation(width, incs):
    limit = saturation_limit(width)
    t = CounterTracker()
    true, sat_flags, totals = 0, [], []
    for i, inc in enumerate([0, *incs]):
        true += inc
        raw = min(true, limit)  # hardware pins, never wraps
        samples, _, sat = t.process([reading("fabricmon_ib_port_errors_total", raw, semantics=Semantics.SATURATING,
                                             width=width, group="d/1", device="mlx5_0", port="1", counter="c")],
                                    float(i))
        totals.append(samples[0].value)
        sat_flags.append(sat[0].value)
    assert totals[-1] == min(true, limit)
    assert sat_flags[-1] == (1.0 if true >= limit else 0.0)
    assert all(b >= a for a, b in pairwise(totals))


@given(old=st.integers(0, 2**32 - 1), new=st.integers(0, 2**32 - 1))
def test_group_reset_turns_wraps_into_resets(old, new):
    d, was_reset = counter_delta(old, new, Semantics.WRAPPING, 32, group_reset=True)
    assert d >= 0
    if new < old:
        assert was_reset and d == new
    else:
        assert d == new - old


@settings(max_examples=50)
@given(base=st.integers(2**31, 2**32 - 1), small=st.integers(0, 1000))
def test_device_reset_detected_through_its_64bit_counters(base, small):
    """A wrapping hw counter in the upper half drops to a small value: wrap or reset?
    When the port's 64-bit data counter also went backwards it was a reset: no 2^32 spike."""
    t = CounterTracker()

    def poll(ts, data, hw):
        return t.process([
            reading("fabricmon_ib_port_receive_bytes_total", data, semantics=Semantics.MONOTONIC, group="mlx5_0/1",
                    device="mlx5_0", port="1"),
            reading("fabricmon_rdma_hw_stat_total", hw, semantics=Semantics.WRAPPING, width=32, group="mlx5_0/1",
                    device="mlx5_0", port="1", counter="out_of_sequence"),
        ], ts)

    poll(0.0, 10**15, base)
    samples, deltas, _ = poll(1.0, 5000, small)
    hw_delta = [d for d in deltas if d.family == "fabricmon_rdma_hw_stat_total"]
    assert sum(d.delta for d in hw_delta) == small
    assert hw_delta and all(d.reset for d in hw_delta)


def test_wrap_without_reset_evidence_is_a_wrap():
    t = CounterTracker()
    mk = lambda ts, data, hw: t.process([  # noqa: E731
        reading("fabricmon_ib_port_receive_bytes_total", data, semantics=Semantics.MONOTONIC, group="g",
                device="mlx5_0", port="1"),
        reading("fabricmon_rdma_hw_stat_total", hw, semantics=Semantics.WRAPPING, width=32, group="g",
                device="mlx5_0", port="1", counter="c"),
    ], ts)
    mk(0.0, 1000, 2**32 - 10)
    samples, deltas, _ = mk(1.0, 2000, 5)
    hw = [d for d in deltas if d.family == "fabricmon_rdma_hw_stat_total"][0]
    assert hw.delta == 15 and not hw.reset
    assert [s.value for s in samples if s.family == "fabricmon_rdma_hw_stat_total"] == [2**32 - 10 + 15]


def test_vanished_series_state_is_evicted_after_a_while():
    t = CounterTracker(evict_after_seconds=10)
    t.process([reading("fabricmon_ib_port_receive_bytes_total", 5, semantics=Semantics.MONOTONIC, device="a",
                       port="1")], 0.0)
    t.process([], 5.0)
    assert len(t) == 1
    t.process([], 11.0)
    assert len(t) == 0
