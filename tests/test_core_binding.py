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
    cpu_list,
    host_slots,
    physical_cores,
)


def test_slots_count_the_processes_of_each_host_in_rank_order():
    # two simulated nodes on one host share its cores; a second host counts its own
    assert host_slots(["a", "a", "b", "a"]) == [Slot(0, 3), Slot(1, 3), Slot(0, 1), Slot(2, 3)]


def single(cpus):
    return [[c] for c in cpus]


@pytest.mark.parametrize(
    ("cores", "count", "shares"),
    [
        (single(range(8)), 8, [[i] for i in range(8)]),  # an 8-GPU node with 8 cores: one each
        (single(range(96)), 8, [list(range(12 * i, 12 * i + 12)) for i in range(8)]),  # 12 each, contiguous
        (single(range(10)), 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),  # the remainder to the first slots
        (single(range(2)), 4, [[0], [1], [0], [1]]),  # more processes than cores: one core each, in turn
        # hyperthreads: siblings n apart stay together, each rank on its own physical cores
        ([[0, 4], [1, 5], [2, 6], [3, 7]], 2, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ],
)
def test_shares_are_disjoint_contiguous_and_cover_the_cores(cores, count, shares):
    got = [core_share(cores, Slot(i, count)) for i in range(count)]
    assert got == shares
    if count <= len(cores):
        assert sorted(c for share in got for c in share) == sorted(c for core in cores for c in core)


def test_a_slot_outside_its_count_is_refused():
    with pytest.raises(ValueError, match="not a slot"):
        core_share(single([0, 1]), Slot(2, 2))
    with pytest.raises(ValueError, match="no cores"):
        core_share([], Slot(0, 1))


def write_topology(root, siblings: dict[int, str], sockets: dict[int, int]):
    for cpu, text in siblings.items():
        base = root / f"cpu{cpu}" / "topology"
        base.mkdir(parents=True)
        (base / "thread_siblings_list").write_text(text + "\n")
        (base / "physical_package_id").write_text(f"{sockets[cpu]}\n")


def test_physical_cores_group_siblings_socket_by_socket(tmp_path):
    # 2 sockets x 2 cores x 2 threads, Linux numbering: first threads 0-3, their siblings 4-7
    siblings = {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"}
    sockets = {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0, 6: 1, 7: 1}
    write_topology(tmp_path, siblings, sockets)
    assert physical_cores(range(8), tmp_path) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # a cpuset that holds one thread of a core keeps that thread alone; unreadable CPUs stand alone
    assert physical_cores([0, 1, 5, 9], tmp_path) == [[0], [1, 5], [9]]
    shares = [core_share(physical_cores(range(8), tmp_path), Slot(i, 2)) for i in range(2)]
    assert shares == [[0, 1, 4, 5], [2, 3, 6, 7]]  # one socket each


def test_cpu_lists_read_as_the_kernel_writes_them():
    assert cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_list("5") == [5]


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
        assert cores is not None and min(before) in cores and os.sched_getaffinity(0) == set(cores)
    finally:
        bind_process(sorted(before))
