"""The worker plumbing of the parallel simulators (sim/sim_workers.py): errors reach the parent, nothing hangs."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from fabricmon.sim.sim_workers import SimWorkers, answering


def _unused(conn) -> None:  # pragma: no cover - never started here
    raise AssertionError


def test_a_workers_error_is_sent_and_raised_in_the_parent():
    parent, child = mp.Pipe()
    with answering(child):
        raise ValueError("fixture file missing")
    workers = SimWorkers(_unused, [], [], duration=10.0, interval=1.0, timeout=5.0)
    with pytest.raises(RuntimeError, match="simulation worker failed: ValueError: fixture file missing"):
        workers.recv(parent)


def test_a_closed_pipe_ends_a_worker_quietly_and_a_silent_one_times_out():
    parent, child = mp.Pipe()
    with answering(child):
        parent.close()
        child.recv()  # EOFError: the parent went away
    parent, child = mp.Pipe()
    workers = SimWorkers(_unused, [], [], duration=10.0, interval=1.0, timeout=0.01)
    with pytest.raises(TimeoutError, match="no answer in 0 s"):
        workers.recv(parent)
    child.close()
    workers.timeout = 5.0
    with pytest.raises(RuntimeError, match="exited without answering"):
        workers.recv(parent)


def test_steps_are_asked_ahead_up_to_the_scenarios_end():
    parent, child = mp.Pipe()
    workers = SimWorkers(_unused, [], [], duration=3.0, interval=1.0, ahead=2)
    workers.conns.append(parent)
    workers.ask_ahead(0.0)
    assert [child.recv(), child.recv()] == ["step", "step"] and not child.poll(0)
    workers.collected()
    workers.ask_ahead(1.0)
    assert child.recv() == "step" and not child.poll(0)  # the third and last step
    workers.collected()
    workers.ask_ahead(2.0)
    assert not child.poll(0)  # nothing past the end


def test_close_reads_the_unused_steps_and_gives_up_on_a_silent_worker():
    parent, child = mp.Pipe()
    workers = SimWorkers(_unused, [], [], duration=10.0, interval=1.0, ahead=2, timeout=600.0)
    workers.conns.append(parent)
    workers.ask_ahead(0.0)
    child.send(("part", []))
    child.send(("step", None, []))  # the first asked step answered (in two messages); the second never is
    workers.close(drain_s=0.2)  # returns: not the 600 s step timeout per unanswered step
    assert child.recv() == "step" and child.recv() == "step" and child.recv() == "stop"
    assert parent.closed
