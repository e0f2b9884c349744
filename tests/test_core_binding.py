"""Each rank and probe actor on its own share of its host's cores (`orchestrator.core_binding`)."""

from __future__ import annotations

import os
import threading

import pytest

from orchestrator.core_binding import (
    BINDING_ENV,
    BindingError,
    Slot,
    bind_process,
    bind_slot,
    binding_mode,
    core_share,
    host_slots,
)


def test_slots_count_the_processes_of_each_host_in_rank_order():
    # two simulated nodes on one host share its cores; a second host counts its own
    assert host_slots(["a", "a", "b", "a"]) == [Slot(0, 3), Slot(1, 3), Slot(0, 1), Slot(2, 3)]


@pytest.mark.parametrize(
    ("cores", "count", "shares"),
    [
        (range(8), 8, [[i] for i in range(8)]),  # an 8-GPU node with 8 cores: one each
        (range(96), 8, [list(range(12 * i, 12 * i + 12)) for i in range(8)]),  # 12 each, contiguous
        (range(10), 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),  # the remainder to the first slots
        (range(2), 4, [[0], [1], [0], [1]]),  # more processes than cores: one core each, in turn
        ([5, 3, 9, 7], 2, [[3, 5], [7, 9]]),  # a container's cpuset, in core order
    ],
)
def test_shares_are_disjoint_contiguous_and_cover_the_cores(cores, count, shares):
    got = [core_share(list(cores), Slot(i, count)) for i in range(count)]
    assert got == shares
    if count <= len(list(cores)):
        assert sorted(c for share in got for c in share) == sorted(cores)


def test_a_slot_outside_its_count_is_refused():
    with pytest.raises(ValueError, match="not a slot"):
        core_share([0, 1], Slot(2, 2))
    with pytest.raises(ValueError, match="no cores"):
        core_share([], Slot(0, 1))


def test_the_binding_is_read_from_the_environment_and_a_bad_one_names_the_values(monkeypatch):
    monkeypatch.delenv(BINDING_ENV, raising=False)
    assert binding_mode() == "exclusive"
    monkeypatch.setenv(BINDING_ENV, "OFF")
    assert binding_mode() == "off"
    monkeypatch.setenv(BINDING_ENV, "numa")
    with pytest.raises(BindingError, match=r"AUTOTUNE_CORE_BINDING='numa'.*allowed: exclusive, off"):
        binding_mode()
    with pytest.raises(BindingError, match="allowed"):
        bind_slot(Slot(0, 1), "numa")


def test_off_binds_nothing():
    assert bind_slot(Slot(0, 1), "off") is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_binding_moves_every_thread_and_threads_started_later_inherit_it():
    before = os.sched_getaffinity(0)
    started = threading.Event()
    stop = threading.Event()
    seen: dict[str, set[int]] = {}

    def running() -> None:
        seen["early"] = os.sched_getaffinity(0)  # read on its own thread: before the binding
        started.set()
        stop.wait(10)
        seen["after"] = os.sched_getaffinity(threading.get_native_id())

    early = threading.Thread(target=running)
    early.start()
    started.wait(10)
    one = min(before)
    try:
        assert bind_process([one]) >= 2  # this thread and the one already running
        late = threading.Thread(target=lambda: seen.__setitem__("late", os.sched_getaffinity(0)))
        late.start()
        late.join(10)
        stop.set()
        early.join(10)
        assert seen["after"] == {one} and seen["late"] == {one}
    finally:
        stop.set()
        bind_process(sorted(before))
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_bind_slot_takes_its_share_of_the_allowed_cores():
    before = os.sched_getaffinity(0)
    try:
        cores = bind_slot(Slot(0, len(before)), "exclusive")
        assert cores == [min(before)] and os.sched_getaffinity(0) == {min(before)}
    finally:
        bind_process(sorted(before))
